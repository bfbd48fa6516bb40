"""The core's advantage step (agentic_grpo.advantages): a group whose outcomes are equal gets advantages of exactly
0, where TRL's float32 rounding leaves a one-signed residue, and the environment's per-turn payments are logged."""

from __future__ import annotations

import pytest
import torch

from agentic_grpo.advantages import assign_outcome_credit, flat_groups, turn_reward_means
from agentic_grpo.trajectory import Segment, Trajectory


def trajectory(turns: int) -> Trajectory:
    return Trajectory(prompt="q", segments=[Segment("prompt", [1, 2], "")], turns=turns)


def trls_group_advantages(rewards: list[float], group_size: int) -> torch.Tensor:
    """TRL's GRPO advantages (`scale_rewards="group"`), in float32 with TRL's own functions."""
    from trl.trainer.utils import nanstd

    grouped = torch.tensor(rewards, dtype=torch.float32).view(-1, group_size)
    mean = torch.nanmean(grouped, dim=1, keepdim=True)
    return ((grouped - mean) / (nanstd(grouped, dim=1).unsqueeze(1) + 1e-4)).view(-1)


def test_a_group_of_equal_rewards_gets_exactly_zero_advantages_where_trls_rounding_leaves_some():
    rewards = [0.2] * 8 + [1.2] * 8 + [0.0] * 4 + [1.5] * 4  # flat, flat (no binary fractions), a real split
    trl = trls_group_advantages(rewards, 8)
    # The residue guarded against: equal rewards, advantages of ~1e-4 to 1e-3, all of one sign per group.
    assert trl[:16].abs().min() > 1e-5 and len({a > 0 for a in trl[:8].tolist()}) == 1
    batch = [trajectory(1) for _ in rewards]
    for t, r in zip(batch, rewards, strict=True):
        t.rewards = {"correctness": r}
    advantages = trl.clone()
    metrics = assign_outcome_credit(
        batch, advantages, {"correctness": 1.0}, group_size=8, gather=lambda local: local, process_index=0
    )
    assert advantages[:16].tolist() == [0.0] * 16
    assert advantages[16:].tolist() == trl[16:].tolist()  # a real split is untouched
    assert metrics["frac_reward_zero_std"] == pytest.approx(2 / 3)


def test_a_flat_group_split_over_two_processes_is_judged_whole():
    """Rank 1 holds two rewards of 1.0 of a group whose other half, on rank 0, scored 0.0: not flat, whatever
    rank 1's own rows say; the next group, 0.5 throughout, is flat on both."""
    rewards = [0.0, 0.0, 1.0, 1.0, 0.5, 0.5, 0.5, 0.5]
    batch = [trajectory(1) for _ in rewards]
    for t, r in zip(batch, rewards, strict=True):
        t.rewards = {"correctness": r}
    everyone = [(r, []) for r in rewards]
    for rank in range(4):
        advantages = torch.full((2,), 0.25)
        metrics = assign_outcome_credit(
            batch[2 * rank : 2 * rank + 2], advantages, {"correctness": 1.0}, group_size=4,
            gather=lambda local: everyone, process_index=rank,
        )  # fmt: skip
        assert advantages.tolist() == ([0.25, 0.25] if rank < 2 else [0.0, 0.0])
        assert metrics["frac_reward_zero_std"] == 0.5


def test_the_environments_per_turn_payments_are_averaged_over_the_trajectories_that_reached_each_turn():
    metrics = turn_reward_means([[0.5, 0.0], [0.0, 0.5], [0.0], [0.0]])
    assert metrics["credit/turn_reward/turn_1"] == pytest.approx(0.5 / 4)
    assert metrics["credit/turn_reward/turn_2"] == pytest.approx(0.5 / 2)
    assert metrics["credit/turn_reward/sum"] == pytest.approx(1.0 / 4)
    assert "credit/turn_reward/turn_2" not in turn_reward_means([[0.5, 0.0]], max_turns=1)


def test_flat_groups_ignore_unscored_members_and_see_a_real_difference_however_small_the_rewards():
    nan = float("nan")
    assert flat_groups([0.7, nan, 0.7, 0.7], 4) == [True] * 4  # a judge that failed once: the rest agree
    assert flat_groups([nan] * 2, 2) == [True] * 2
    assert flat_groups([0.01, 0.02], 2) == [False] * 2
    assert flat_groups([1000.0, 1000.0 + 1e-4], 2) == [True] * 2  # float32 rounding at that size
    with pytest.raises(ValueError, match="groups of 4"):
        flat_groups([0.0] * 6, 4)


def test_a_training_batch_of_flat_groups_moves_no_weight(tiny_model_dir, tmp_path):
    """A real generation whose rewards are all 0.2: the policy's loss and every gradient are exactly 0 (TRL's
    rounding residue alone would push every sampled completion up or down, and Adam would make that a step)."""
    from tests.helpers import build_trainer, trainer_loss_and_grads
    from tests.scripted import case_prompt

    def constant(prompts, completions, **_):
        return [0.2] * len(prompts)

    rows = [{"prompt": case_prompt("a"), "question": "a", "answer": "1"}] * 8
    trainer = build_trainer(
        tiny_model_dir, tmp_path, [constant], rows, environment="agentic_grpo.tools.calculator:Calculator",
        num_generations=8, per_device_train_batch_size=8, max_completion_length=32, max_tokens_per_turn=16,
        max_turns=2, beta=0.0, save_trajectories_steps=0,
    )  # fmt: skip
    inputs = trainer.generate_and_score(rows)
    assert inputs["advantages"].tolist() == [0.0] * 8
    assert trainer.logged_values("frac_reward_zero_std")[-1] == 1.0
    loss, grads = trainer_loss_and_grads(trainer, inputs)
    assert grads and all(g.abs().max() == 0 for g in grads.values())
    assert loss.item() == 0.0
