"""From the rewards' values to advantages: each value checked where a reward returns it, a missing one filled
with its group's mean (`fill_missing_with_group_mean`), and credit for the turn that earned it, not just the
trajectory's outcome.

**What a reward may return**: one finite number, or None, per completion. TRL turns a reward's list into a tensor: a
string ends in a traceback that does not name the reward, and NaN reads as "no reward" without a word.
`checking_values` wraps a reward so that any other value stops the run naming the reward, the completion and the
value (or, under `on_reward_error: none`, gives None for the batch and says so). It also counts what the reward
scored, so a reward that never scores is reported: once in the log, at its first batch with no score at all, and in
the end-of-run summary (`scoring_summary`).

**Flat groups.** A group whose outcomes are all equal carries no signal, and its advantages are set to exactly 0
(`flat_groups`; TRL's float32 group mean leaves a one-signed residue). `assign_outcome_credit` does that step and
reports the share of flat groups, `frac_reward_zero_std`, with the mean per-turn reward the environment paid
(`credit/turn_reward/...`). Per-turn credit, which turns per-turn rewards into per-token advantages, is an
experiment: `agentic_grpo.experimental.turn_credit`.
"""

from __future__ import annotations

import functools
import inspect
import logging
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from agentic_grpo.trajectory import Trajectory

# Rewards within this much of each other (relative to their size, at least 1) are equal: float32 rounding of
# rewards of size 1 is ~1e-7, and a real difference this small carries no signal worth a policy step.
_FLAT = 1e-6


class RewardValueError(ValueError):
    """A reward returned something other than one finite number or None per completion."""


def checked(name: str, values: Any, expected: int) -> None:
    """Raise `RewardValueError` unless `values` holds `expected` values, each a finite number or None."""
    if not isinstance(values, list | tuple) or (expected and len(values) != expected):
        size = f" of {len(values)}" if isinstance(values, list | tuple) else ""
        raise RewardValueError(
            f"reward `{name}` returned a {type(values).__name__}{size}: a reward returns a list with one value per "
            f"completion ({expected}), each a number or None"
        )
    for i, value in enumerate(values):
        if value is None:
            continue
        try:
            number = None if isinstance(value, str | bytes) else float(value)  # bool, int, NumPy, 0-d tensor
        except (TypeError, ValueError):
            number = None
        if number is None or not math.isfinite(number):
            raise RewardValueError(
                f"reward `{name}` returned {value!r} for completion {i}: a reward returns a finite number, or None "
                "where it cannot score"
            )


def checking_values(func: Callable) -> Callable:
    """`func`, its values checked (`checked`) and counted; applying it twice changes nothing."""
    if getattr(func, "values_checked", False):
        return func
    name = func.__name__
    counts = {"scored": 0, "returned": 0, "warned": 0}

    def check(values: Any, kwargs: dict[str, Any]) -> Any:
        checked(name, values, len(kwargs.get("completions") or kwargs.get("prompts") or []))
        scored = sum(value is not None for value in values)
        counts["scored"] += scored
        counts["returned"] += len(values)
        if values and not scored and not counts["warned"]:
            counts["warned"] = 1
            logger.warning("reward `%s` scored none of the %d completions of a batch (it returned None for each)",
                           name, len(values))  # fmt: skip
        return values

    def scoring_summary() -> str | None:
        if counts["returned"] == 0 or counts["scored"] > 0:
            return None
        return f"reward `{name}` never scored: it returned None for all {counts['returned']} completions"

    if inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(getattr(func, "__call__", None)):  # noqa: B004

        @functools.wraps(func)
        async def checking(*args: Any, **kwargs: Any) -> Any:
            return check(await func(*args, **kwargs), kwargs)

    else:

        @functools.wraps(func)
        def checking(*args: Any, **kwargs: Any) -> Any:
            return check(func(*args, **kwargs), kwargs)

    checking.__name__ = name
    checking.values_checked = True
    checking.scoring_summary = scoring_summary
    checking.value_counts = counts  # summed over processes at the end (`agentic_grpo.train.add_up_reward_totals`)
    checking.needs_whole_groups = bool(getattr(func, "needs_whole_groups", False))
    return checking


# --- missing rewards ------------------------------------------------------------------------------
# A reward that has nothing to say (None) must not move the advantage.
#
# TRL sums the weighted rewards with `nansum`, so a None (a failed judge call, `ToolSuccess`
# on a trajectory without a call) counts as 0 whenever another reward scored the
# trajectory: a correct trajectory whose judge call failed looks as bad as a wrong one.
#
# The rule: before TRL's advantage computation, a missing value of reward k is replaced by
# the mean of reward k over the other trajectories of the same group (the G samples of one
# question). The term then pulls that trajectory neither above nor below its group. When
# reward k is missing for the whole group it stays missing: `nansum` makes the term 0 for
# every member, a constant that the group baseline removes (advantage 0 from that term).
# A trajectory with no reward at all stays all-missing, for TRL's own rule (advantage 0).
#
# With `multi_objective_aggregation: normalize_then_sum` TRL normalizes each reward within its
# group. A filled value sits on the group's mean, but it also counts in the group's std, which it
# lowers: the other members' normalized scores of that reward grow slightly (a missing value left
# out of the std would leave them as they are).


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


def outcome_reward(trajectory: Trajectory, weights: dict[str, float]) -> float:
    """R_i: the total TRL's advantage was computed from (`Trajectory.reward`: a missing reward counted as its
    group's mean), else sum_f w_f r_f over the rewards that scored it; NaN when no reward scored it."""
    given = [(name, value) for name, value in trajectory.rewards.items() if value is not None]
    if not given:
        return math.nan
    if trajectory.reward is not None:
        return trajectory.reward
    return sum(weights.get(name, 1.0) * value for name, value in given)


def flat_groups(outcomes: Sequence[float], group_size: int) -> list[bool]:
    """Per trajectory: whether every scored outcome R of its group (consecutive runs of `group_size`) is the same,
    so that the group carries no outcome signal.

    Their advantages must be exactly 0, and TRL's are not: it divides each reward's distance from the group's
    float32 mean by the group's std, and for equal rewards that are no binary fraction (0.2, a judge's 0.7) the mean
    misses them by a rounding residue of ~1e-8 that the division turns into advantages of 1e-4 to 1e-3, all of one
    sign. Adam divides the gradient's scale away, so a batch of such groups would move the policy a real step on
    rounding noise (and TRL counts none of them in `frac_reward_zero_std`)."""
    if len(outcomes) % group_size:
        raise ValueError(f"{len(outcomes)} trajectories do not split into groups of {group_size}")
    flat = []
    for start in range(0, len(outcomes), group_size):
        flat += [all_equal(outcomes[start : start + group_size])] * group_size
    return flat


def all_equal(rewards: Sequence[float]) -> bool:
    """Whether the scored (not NaN) `rewards` are one value, to within float32 rounding: a group without signal."""
    scored = [r for r in rewards if not math.isnan(r)]
    if not scored:
        return True
    return max(scored) - min(scored) <= _FLAT * max([1.0, *(abs(r) for r in scored)])


def turn_reward_means(turn_rewards: Sequence[Sequence[float]], max_turns: int | None = None) -> dict[str, float]:
    """The environment's per-turn payments (`Trajectory.turn_rewards`, one list per trajectory): the mean at each
    turn k over the trajectories that reached it (`credit/turn_reward/turn_k`), and the mean sum
    (`credit/turn_reward/sum`)."""
    metrics: dict[str, float] = {}
    deepest = max((len(rewards) for rewards in turn_rewards), default=0)
    for k in range(min(deepest, max_turns or deepest)):
        reached = [rewards[k] for rewards in turn_rewards if len(rewards) > k]
        metrics[f"credit/turn_reward/turn_{k + 1}"] = sum(reached) / len(reached)
    metrics["credit/turn_reward/sum"] = sum(sum(rewards) for rewards in turn_rewards) / max(1, len(turn_rewards))
    return metrics


def assign_outcome_credit(
    trajectories: Sequence[Trajectory],
    outcome_advantages: torch.Tensor,
    weights: dict[str, float],
    *,
    group_size: int,
    gather: Callable[[list[Any]], list[Any]],
    process_index: int,
    max_turns: int | None = None,
) -> dict[str, float]:
    """Set the outcome advantages of this process's trajectories in flat groups (`flat_groups`) to exactly 0, in
    `outcome_advantages` itself, and return the step's metrics: `frac_reward_zero_std` (the share of flat
    groups) and `turn_reward_means`.

    Every process's outcomes are gathered first (rank order = TRL's global order), so a group split over
    processes is judged whole; each process then zeroes its own rows, as TRL slices its advantages.
    """
    local = [(outcome_reward(t, weights), list(t.turn_rewards[: t.turns])) for t in trajectories]
    everyone = gather(local)
    flat = flat_groups([outcome for outcome, _ in everyone], group_size)
    first = process_index * len(local)
    silent_here = torch.tensor(flat[first : first + len(local)], device=outcome_advantages.device)
    outcome_advantages.masked_fill_(silent_here, 0.0)
    metrics = turn_reward_means([rewards for _, rewards in everyone], max_turns)
    metrics["frac_reward_zero_std"] = sum(flat) / max(1, len(flat))
    return metrics


logger = logging.getLogger(__name__)
