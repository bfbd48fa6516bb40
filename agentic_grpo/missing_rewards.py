"""A reward that has nothing to say (None) must not move the advantage.

TRL sums the weighted rewards with `nansum`, so a None (a failed judge call, `ToolSuccess`
on a trajectory without a call) counts as 0 whenever another reward scored the
trajectory: a correct trajectory whose judge call failed looks as bad as a wrong one.

The rule: before TRL's advantage computation, a missing value of reward k is replaced by
the mean of reward k over the other trajectories of the same group (the G samples of one
question). The term then pulls that trajectory neither above nor below its group. When
reward k is missing for the whole group it stays missing: `nansum` makes the term 0 for
every member, a constant that the group baseline removes (advantage 0 from that term).
A trajectory with no reward at all stays all-missing, for TRL's own rule (advantage 0).

With `multi_objective_aggregation: normalize_then_sum` TRL normalizes each reward within its
group. A filled value sits on the group's mean, but it also counts in the group's std, which it
lowers: the other members' normalized scores of that reward grow slightly (a missing value left
out of the std would leave them as they are).
"""

from __future__ import annotations

import torch


def fill_missing_with_group_mean(rewards_per_func: torch.Tensor, num_generations: int) -> torch.Tensor:
    """`rewards_per_func` (rows = trajectories, G consecutive rows per question; columns = rewards)
    with each NaN replaced by its reward's mean over the rest of the group, where the group has one.

    Rows where every reward is NaN (unscorable) and groups where a reward is NaN throughout are left as they are.
    """
    if rewards_per_func.numel() == 0 or num_generations < 1 or rewards_per_func.shape[0] % num_generations:
        return rewards_per_func
    grouped = rewards_per_func.view(-1, num_generations, rewards_per_func.shape[1])
    missing = torch.isnan(grouped)
    group_mean = torch.nanmean(grouped, dim=1, keepdim=True).expand_as(grouped)  # NaN where all are missing
    unscorable = missing.all(dim=2, keepdim=True).expand_as(grouped)
    filled = torch.where(missing & ~unscorable, group_mean, grouped)
    return filled.reshape(rewards_per_func.shape)


def raw_reward_means(rewards_per_func: torch.Tensor) -> tuple[list[float], list[float]]:
    """Mean and std of each reward over the trajectories it really scored (what `rewards/<name>/mean` should say)."""
    means, stds = [], []
    for column in rewards_per_func.T:
        given = column[~torch.isnan(column)]
        means.append(given.mean().item() if given.numel() else float("nan"))
        stds.append(given.std().item() if given.numel() > 1 else (0.0 if given.numel() else float("nan")))
    return means, stds
