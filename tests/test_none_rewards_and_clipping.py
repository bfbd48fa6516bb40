"""Through TRL's real advantage computation: a None reward is neutral, and `clipped_ratio` / truncation
masking follow the finish reason (a token budget cut the trajectory), not TRL's last-token test."""

from __future__ import annotations

import math

import pytest
import torch

from agentic_grpo.advantages import fill_missing_with_group_mean
from tests.helpers import build_trainer
from tests.scripted import case_prompt

CALL = 'Thought: multiply.\nAction: calculator\nAction Input: {"expression": "12 * 34"}\nObservation:'


def correctness(prompts, completions, trajectory, answer, **_):
    return [float(t.final_answer == a) for t, a in zip(trajectory, answer, strict=True)]


def judge(prompts, completions, trajectory, **_):
    """A judge whose call failed (None) on cases named `*-nojudge`; else it gives 1.0 to any answer."""
    return [None if "nojudge" in str(t.prompt) else 1.0 for t in trajectory]


def make_trainer(model_dir, output_dir, scripts, rewards, weights, **overrides):
    rows = [{"prompt": case_prompt(name), "question": name, "answer": "408"} for name in scripts]
    settings = dict(
        environment="agentic_grpo.tools.calculator:Calculator", max_completion_length=160, max_tokens_per_turn=40,
        max_turns=2, beta=0.0, save_trajectories_steps=0, reward_weights=weights,
    )  # fmt: skip
    trainer = build_trainer(model_dir, output_dir, rewards, rows, scripts=scripts, **{**settings, **overrides})
    return trainer, rows


def test_a_failed_judge_call_is_neutral_not_zero(tiny_model_dir, tmp_path):
    scripts = {
        "a-nojudge": ["Final Answer: 408<|im_end|>"],  # right; its judge call failed
        "b": ["Final Answer: 408<|im_end|>"],  # right
        "c": ["Final Answer: 408<|im_end|>"],  # right
        "d": ["Final Answer: 407<|im_end|>"],  # wrong
    }
    trainer, rows = make_trainer(tiny_model_dir, tmp_path, scripts, [correctness, judge], [1.0, 0.5])
    advantages = trainer.generate_and_score(rows)["advantages"].tolist()
    # nansum would score a = 1.0 against b = c = 1.5: a right answer pushed below its group's mean.
    assert advantages[0] > 0
    assert advantages[0] == pytest.approx(advantages[1]) == pytest.approx(advantages[2])
    assert advantages[3] < 0
    metrics = trainer._metrics["train"]
    assert metrics["rewards/judge/mean"][-1] == 1.0  # the logged mean covers only the real judge scores


def test_a_reward_missing_for_the_whole_group_adds_nothing(tiny_model_dir, tmp_path):
    scripts = {
        f"{c}-nojudge": [f"Final Answer: {a}<|im_end|>"] for c, a in zip("abcd", [408, 408, 407, 407], strict=True)
    }
    with_judge, rows = make_trainer(tiny_model_dir, tmp_path / "1", scripts, [correctness, judge], [1.0, 0.5])
    alone, _ = make_trainer(tiny_model_dir, tmp_path / "2", scripts, [correctness], [1.0])
    assert with_judge.generate_and_score(rows)["advantages"].tolist() == pytest.approx(
        alone.generate_and_score(rows)["advantages"].tolist()
    )


def test_an_unscorable_trajectory_has_no_reward_and_no_advantage(tiny_model_dir, tmp_path):
    def scorer(prompts, completions, trajectory, answer, **_):  # no score at all for the `*-nojudge` case
        return [
            None if "nojudge" in str(t.prompt) else float(t.final_answer == a)
            for t, a in zip(trajectory, answer, strict=True)
        ]

    scripts = {
        c: [f"Final Answer: {a}<|im_end|>"] for c, a in (("a-nojudge", 408), ("b", 408), ("c", 407), ("d", 408))
    }
    trainer, rows = make_trainer(tiny_model_dir, tmp_path, scripts, [scorer, judge], [1.0, 0.5],
                                 save_trajectories_steps=1)  # fmt: skip
    advantages = trainer.generate_and_score(rows)["advantages"].tolist()
    assert advantages[0] == 0.0 and advantages[2] < 0 < advantages[1]
    import json

    records = [json.loads(line) for line in (tmp_path / "trajectories" / "step_000001.jsonl").read_text().splitlines()]
    assert "reward" not in records[0]  # None, not a made-up 0
    assert [r["reward"] for r in records[1:]] == [1.5, 0.5, 1.5]


def test_group_mean_fill_leaves_unscorable_rows_and_all_missing_groups():
    nan = float("nan")
    rewards = torch.tensor([[1.0, nan], [1.0, 1.0], [0.0, 0.0], [nan, nan], [1.0, nan], [0.0, nan]])
    filled = fill_missing_with_group_mean(rewards, 3)
    assert filled[0, 1].item() == 0.5  # the mean of the rest of its group
    assert torch.isnan(filled[3]).all()  # no reward at all: TRL's rule applies (advantage 0)
    assert torch.isnan(filled[4:, 1]).all() and not math.isnan(filled[4, 0].item())  # missing group-wide


TRUNCATION_SCRIPTS = {
    "eos": ["Final Answer: 408<|im_end|>"],
    "stop": ["Final Answer: 408\nObservation:"],  # answered, and the turn ended on the stop string
    "turns": [CALL, CALL],  # out of turns, its last turn ended on the stop string
    "cut": ["Thought:" + " and so on" * 40],  # cut by max_tokens_per_turn
}


SEEN: list = []  # the trajectories TRL handed the rewards, in the batch's order


def recording(prompts, completions, trajectory, **_):
    SEEN[:] = trajectory
    return [0.0] * len(trajectory)


def test_clipped_ratio_counts_only_trajectories_a_budget_cut(tiny_model_dir, tmp_path):
    trainer, rows = make_trainer(tiny_model_dir, tmp_path, TRUNCATION_SCRIPTS, [correctness, recording], [1.0, 0.0])
    trainer.generate_and_score(rows)
    assert [t.finish_reason for t in SEEN] == ["final_answer", "final_answer", "max_turns", "length"]
    assert trainer._metrics["train"]["completions/clipped_ratio"][-1] == 0.25  # TRL's last-token test says 0.75


def test_mask_truncated_completions_masks_exactly_the_cut_trajectories(tiny_model_dir, tmp_path):
    trainer, rows = make_trainer(
        tiny_model_dir, tmp_path, TRUNCATION_SCRIPTS, [correctness], [1.0], mask_truncated_completions=True
    )
    inputs = trainer.generate_and_score(rows)
    trained = (inputs["tool_mask"] * inputs["completion_mask"]).sum(dim=1).tolist()
    assert trained[3] == 0  # cut: masked out of the loss
    assert all(n > 0 for n in trained[:3])  # ended on EOS, on a stop string, or out of turns: trained on
