"""Through TRL's real GRPO loss: tool-output tokens contribute exactly nothing to the gradient."""

from __future__ import annotations

import pytest

from tests.helpers import build_trainer
from tests.scripted import case_prompt

CALL = 'Thought: multiply.\nAction: calculator\nAction Input: {"expression": "12 * 34"}\nObservation:'
SCRIPTS = {
    "right": [CALL, "Final Answer: 408<|im_end|>"],
    "wrong": [CALL, "Final Answer: 407<|im_end|>"],
    "direct": ["Final Answer: 408<|im_end|>"],
    "twice": [CALL, CALL, "Final Answer: 1<|im_end|>"],
}


SCORED: list = []  # the trajectories TRL handed the reward, in the batch's order


def exact(prompts, completions, trajectory, answer, **_):
    SCORED[:] = trajectory
    return [float(t.final_answer == a) for t, a in zip(trajectory, answer, strict=False)]


@pytest.fixture
def trainer_and_batch(tiny_model_dir, tmp_path):
    rows = [{"prompt": case_prompt(name), "question": name, "answer": "408"} for name in SCRIPTS]
    trainer = build_trainer(
        tiny_model_dir, tmp_path, [exact], rows, scripts=SCRIPTS, environment="agentic_grpo.tools.calculator:Calculator",
        max_completion_length=160, max_tokens_per_turn=80, beta=0.04, save_trajectories_steps=0,
    )  # fmt: skip
    return trainer, rows


def test_tool_tokens_get_zero_gradient_and_model_tokens_do_not(trainer_and_batch):
    trainer, rows = trainer_and_batch
    inputs = trainer.generate_and_score(rows)
    env_mask = inputs["tool_mask"] * inputs["completion_mask"]
    assert (inputs["tool_mask"] == 0).any(), "the batch must contain tool tokens"
    assert inputs["advantages"].abs().sum() > 0

    captured = {}

    # TRL scores tokens with a fused LM head (no logits tensor), so watch the final hidden states.
    def keep_hidden(module, args, output):
        output.retain_grad()
        captured["hidden"] = output

    handle = trainer.model.model.norm.register_forward_hook(keep_hidden)
    try:
        loss = trainer.compute_loss(trainer.model, inputs)
        loss.backward()
    finally:
        handle.remove()
    hidden = captured["hidden"]
    completion_len = inputs["completion_ids"].shape[1]
    # The hidden state just before completion token j is what predicts it.
    grad = hidden.grad[:, -completion_len - 1 : -1, :].abs().sum(-1)
    tool_positions = (inputs["tool_mask"] == 0) & (inputs["completion_mask"] == 1)
    assert grad[tool_positions].sum().item() == 0.0
    trained = env_mask.bool() & (inputs["advantages"].abs() > 0).unsqueeze(1)
    assert (grad[trained] > 0).all()


def test_env_mask_returned_to_trl_matches_trajectory_segments(trainer_and_batch):
    trainer, rows = trainer_and_batch
    inputs = trainer.generate_and_score(rows)
    for row, trajectory in enumerate(SCORED):
        n = len(trajectory.completion_ids)
        assert inputs["completion_ids"][row, :n].tolist() == trajectory.completion_ids
        assert inputs["tool_mask"][row, :n].tolist() == trajectory.loss_mask
        assert inputs["completion_mask"][row, :n].sum().item() == n
