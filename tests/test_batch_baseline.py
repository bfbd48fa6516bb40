"""`advantage_baseline: batch`: each reward against the mean of the step's other trajectories, over the step's std,
by hand and through the real trainer (scripted turns, real rewards, real TRL advantages to differ from)."""

from __future__ import annotations

import pytest
import torch

from agentic_grpo.advantages import batch_baseline_advantages
from tests.credit_support import build_trainer, rows


def test_the_baseline_is_the_mean_of_every_other_trajectory():
    advantages = batch_baseline_advantages([1.0, 0.0, 0.0, 0.0])
    std = torch.tensor([1.0, 0.0, 0.0, 0.0]).std().item()  # 0.5
    expected = [(1 - 0) / std] + [(0 - 1 / 3) / std] * 3
    assert advantages.tolist() == pytest.approx(expected, abs=1e-3)
    assert batch_baseline_advantages([0.5, 0.5]).tolist() == [0.0, 0.0]
    assert batch_baseline_advantages([2.0]).tolist() == [0.0]  # nothing to compare with


def test_a_group_that_all_chose_alike_is_pushed_down_when_the_step_did_better():
    # group A (paid once), group B (every sample the same wrong choice): GRPO's group mean gives B nothing
    advantages = batch_baseline_advantages([0.5, 0.0, 0.0, 0.0] + [0.0] * 4)
    assert (advantages[4:] < 0).all() and len(set(advantages[4:].tolist())) == 1
    assert advantages[0] > 0


def test_the_trainer_trains_on_the_batch_baseline(tiny_model_dir, tmp_path):
    trainer = build_trainer(tiny_model_dir, str(tmp_path), "outcome", advantage_baseline="batch")
    inputs = trainer._generate_and_score_completions(rows(answer="1000"))  # three scripts answer 1000, one 7
    rewards = [1.0, 1.0, 1.0, 0.0]
    assert inputs["advantages"].tolist() == pytest.approx(batch_baseline_advantages(rewards).tolist())
    group = build_trainer(tiny_model_dir, str(tmp_path / "group"), "outcome")._generate_and_score_completions(
        rows(answer="1000")
    )["advantages"]
    assert not torch.allclose(group, inputs["advantages"])  # TRL's group baseline differs on the same rewards


def test_an_unknown_baseline_is_refused(tmp_path):
    from agentic_grpo.config import AgenticGRPOConfig

    with pytest.raises(ValueError, match="advantage_baseline must be `group` or `batch`"):
        AgenticGRPOConfig(output_dir=str(tmp_path), advantage_baseline="global")
