"""The ids the model sampled are the ids trained on: no decode/re-encode anywhere in between."""

from __future__ import annotations

from agentic_grpo.backends import TrainerBackend
from tests.helpers import build_trainer

SCORED: list = []  # the trajectories TRL handed the reward, in the batch's order


def zero(prompts, completions, trajectory, **_):
    SCORED[:] = trajectory
    return [0.0] * len(prompts)


def test_model_segments_are_exactly_the_sampled_ids(tiny_model_dir, tmp_path):
    question = [{"role": "user", "content": "What is 123 * 45?"}]
    rows = [{"prompt": question, "question": "q", "answer": "5535"}] * 4
    trainer = build_trainer(tiny_model_dir, tmp_path, [zero], rows, stepped_by_hand=False, max_completion_length=64,
                            max_tokens_per_turn=16, max_turns=3, save_trajectories_steps=0)  # fmt: skip
    raw_outputs = []
    model = trainer.model
    original_generate = model.generate

    def recording_generate(*args, **kwargs):
        output = original_generate(*args, **kwargs)
        raw_outputs.append((kwargs["input_ids"].shape[1], output.tolist()))
        return output

    model.generate = recording_generate
    trainer.generation_backend = TrainerBackend(trainer)
    trainer.model.train()
    inputs = trainer.generate_and_score(rows)

    # Every model segment is a prefix of what `generate` returned for that row in that turn.
    sampled = [[row[width:] for row in output] for width, output in raw_outputs]
    for row, trajectory in enumerate(SCORED):
        model_segments = [s for s in trajectory.segments if s.role == "model"]
        assert model_segments, "each trajectory has at least one model turn"
        for turn, segment in enumerate(model_segments):
            candidates = sampled[turn]
            assert any(ids[: len(segment.token_ids)] == segment.token_ids for ids in candidates)
        n = len(trajectory.completion_ids)
        assert inputs["completion_ids"][row, :n].tolist() == trajectory.completion_ids
    # And the first turn, where every row is live, matches row by row.
    first_turn = sampled[0]
    for row, trajectory in enumerate(SCORED):
        segment = trajectory.segments[1]
        assert first_turn[row][: len(segment.token_ids)] == segment.token_ids
