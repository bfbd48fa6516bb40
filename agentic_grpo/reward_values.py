"""What a reward may return, checked where it returns it: one finite number, or None, per completion.

TRL turns a reward's list into a tensor: a string ends in a traceback that does not name the reward, and NaN reads
as "no reward" without a word. `checking_values` wraps a reward so that any other value stops the run naming the
reward, the completion and the value (or, under `on_reward_error: none`, gives None for the batch and says so).
It also counts what the reward scored, so a reward that never scores is reported: once in the log, at its first
batch with no score at all, and in the end-of-run summary (`scoring_summary`).
"""

from __future__ import annotations

import functools
import inspect
import logging
import math
from collections.abc import Callable
from typing import Any

import torch

logger = logging.getLogger(__name__)


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
