"""From the rewards' values to advantages: each value checked where a reward returns it, a missing one filled
with its group's mean (`fill_missing_with_group_mean`), and credit for the turn that earned it, not just the
trajectory's outcome.

**What a reward may return**: one finite number, or None, per completion. TRL turns a reward's list into a tensor: a
string ends in a traceback that does not name the reward, and NaN reads as "no reward" without a word.
`checking_values` wraps a reward so that any other value stops the run naming the reward, the completion and the
value (or, under `on_reward_error: none`, gives None for the batch and says so). It also counts what the reward
scored, so a reward that never scores is reported: once in the log, at its first batch with no score at all, and in
the end-of-run summary (`scoring_summary`).

**Turn-level advantages.** Notation, for one group (the G trajectories of one query): trajectory i has K_i model
turns k = 0..K_i-1 (K_i varies: trajectories stop when they answer); r_{i,k} is the reward paid for turn k
(`Trajectory.turn_rewards`); R_i the outcome reward (the recipe's rewards, weighted and summed as TRL does); A_i
TRL's GRPO advantage of R_i; s_{i,k} the environment's state hash before turn k (`ToolEnvironment.state_hash`);
lambda = `turn_lambda`, gamma = `turn_gamma`.

outcome (default, TRL's GRPO): every token of trajectory i gets A_i (exactly 0 in a group whose outcomes are
equal, `flat_groups`).

turn:
    G_{i,k} = sum_{j=k}^{K_i-1} gamma^(j-k) r_{i,j}          return of turn rewards from turn k on
    N_{i,k} = {i' != i in the group : K_{i'} > k}            the other members that reached turn k
    b_{i,k} = mean_{i' in N_{i,k}} G_{i',k}, or 0 when N_{i,k} is empty (no one else got that far)
    A_{i,k} = A_i + lambda * (G_{i,k} - b_{i,k})

anchor (GiGPO-style, state-grouped; works with outcome rewards alone):
    U_{i,k} = G_{i,k} + gamma^(K_i-1-k) R_i                  return with the outcome paid at the last turn
    S_{i,k} = {(i',k') : i' != i in the group, s_{i',k'} = s_{i,k} != None, R_{i'} scored}
    A_{i,k} = A_i + lambda * (U_{i,k} - mean_{(i',k') in S_{i,k}} U_{i',k'})   (the mean is 0 when S_{i,k} is
                                                                               empty; term 0 when R_i was not
                                                                               scored)

Why the baselines look like that. The turn-k baseline of trajectory i is built from the *other*
trajectories only (leave-one-out), so it is independent of everything trajectory i did from turn
k on, including whether it went on to turn k+1 or stopped: E[grad log pi(a_{i,k}) * baseline] = 0
and the estimate stays unbiased however the lengths vary. A per-turn-index mean that includes
trajectory i itself, or a per-turn-index std, depends on G_{i,k} and so biases every "take
another turn" decision (tests/test_advantages.py measures both by exact enumeration). GiGPO
uses the plain mean (and optionally the std) of its step groups; here the same leave-one-out
rule holds for anchors, and all turns of trajectory i itself are left out of its own anchor set.
An anchor state no other member visited gets a baseline of 0, as the `turn` estimator's turns that
no one else reached. GiGPO drops the step term there (nothing to compare with); that is biased, and
not by a little: on the stop/go problem of tests/test_advantages.py its expected gradient is about
three times the true one, against exactly the true one with the zero baseline.

Token-level: each model token of turn k gets A_{i,k}; tool-output tokens get 0 and stay masked
by TRL's `tool_mask` anyway.
"""

from __future__ import annotations

import functools
import inspect
import logging
import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from agentic_grpo.trajectory import Trajectory

ESTIMATORS = ("outcome", "turn", "anchor")
# Below this an advantage is zero: a flat group's advantages are set to exactly 0 (`flat_groups`).
_ZERO = 1e-6
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


@dataclass
class TurnData:
    """What the estimators need of one trajectory (small, so it can be gathered across processes)."""

    turn_rewards: list[float]
    """r_{i,k}, one per model turn (K_i = its length)."""
    outcome: float
    """R_i; NaN when no reward scored the trajectory."""
    advantage: float
    """A_i, TRL's outcome advantage."""
    states: list[str | None] | None = None
    """s_{i,k}, one per model turn (None entries: no state)."""

    @classmethod
    def of(cls, trajectory: Trajectory, advantage: float, weights: dict[str, float]) -> TurnData:
        rewards = list(trajectory.turn_rewards[: trajectory.turns])
        rewards += [0.0] * (trajectory.turns - len(rewards))
        states = list(trajectory.turn_states[: trajectory.turns])
        states += [None] * (trajectory.turns - len(states))
        return cls(rewards, outcome_reward(trajectory, weights), float(advantage), states)

    @property
    def turns(self) -> int:
        return len(self.turn_rewards)


def outcome_reward(trajectory: Trajectory, weights: dict[str, float]) -> float:
    """R_i: the total TRL's advantage was computed from (`Trajectory.reward`: a missing reward counted as its
    group's mean), else sum_f w_f r_f over the rewards that scored it; NaN when no reward scored it."""
    given = [(name, value) for name, value in trajectory.rewards.items() if value is not None]
    if not given:
        return math.nan
    if trajectory.reward is not None:
        return trajectory.reward
    return sum(weights.get(name, 1.0) * value for name, value in given)


def discounted_returns(rewards: Sequence[float], gamma: float, final: float = 0.0) -> list[float]:
    """G_k = sum_{j>=k} gamma^(j-k) rewards[j] + gamma^(K-1-k) final, for k = 0..K-1."""
    returns, running = [0.0] * len(rewards), final
    for k in range(len(rewards) - 1, -1, -1):
        running = rewards[k] + (running if k == len(rewards) - 1 else gamma * running)
        returns[k] = running
    return returns


def outcome_advantages(group: Sequence[TurnData], lam: float = 1.0, gamma: float = 1.0) -> list[list[float]]:
    """A_{i,k} = A_i for every turn: TRL's GRPO."""
    return [[d.advantage] * d.turns for d in group]


def turn_advantages(group: Sequence[TurnData], lam: float = 1.0, gamma: float = 1.0) -> list[list[float]]:
    """A_{i,k} = A_i + lambda (G_{i,k} - mean of G_{i',k} over the other members that reached turn k, or 0)."""
    returns = [discounted_returns(d.turn_rewards, gamma) for d in group]
    # Per turn index: the sum and count over every member that reached it; leave-one-out subtracts i's own.
    totals: dict[int, float] = defaultdict(float)
    counts: dict[int, int] = defaultdict(int)
    for member in returns:
        for k, value in enumerate(member):
            totals[k] += value
            counts[k] += 1
    advantages = []
    for d, member in zip(group, returns, strict=True):
        row = []
        for k, value in enumerate(member):
            others = counts[k] - 1
            # With no one else at turn k the baseline is 0, not "no term": dropping the term would bias it.
            term = value - ((totals[k] - value) / others if others else 0.0)
            row.append(d.advantage + lam * term)
        advantages.append(row)
    return advantages


def anchor_advantages(group: Sequence[TurnData], lam: float = 1.0, gamma: float = 1.0) -> list[list[float]]:
    """A_{i,k} = A_i + lambda (U_{i,k} - mean of U over the other members' turns taken from the same state)."""
    returns = [discounted_returns(d.turn_rewards, gamma, 0.0 if math.isnan(d.outcome) else d.outcome) for d in group]
    # state -> member -> (sum, count) of that member's returns from that state
    by_state: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(lambda: [0.0, 0]))
    for i, d in enumerate(group):
        if math.isnan(d.outcome):
            continue  # an unscored return is no baseline for anyone
        for k, state in enumerate(d.states or []):
            if state is not None:
                cell = by_state[state][i]
                cell[0] += returns[i][k]
                cell[1] += 1
    advantages = []
    for i, d in enumerate(group):
        row = []
        states = d.states or [None] * d.turns
        for k in range(d.turns):
            term = 0.0
            if states[k] is not None and not math.isnan(d.outcome):
                members = by_state[states[k]]
                total = sum(s for j, (s, _) in members.items() if j != i)
                count = sum(c for j, (_, c) in members.items() if j != i)
                # No other member took a turn from this state: a baseline of 0, as the `turn` estimator's, which
                # keeps the estimate unbiased (dropping the term instead would bias every decision to go on).
                term = returns[i][k] - total / count if count else returns[i][k]
            row.append(d.advantage + lam * term)
        advantages.append(row)
    return advantages


ESTIMATOR_FUNCTIONS: dict[str, Callable[..., list[list[float]]]] = {
    "outcome": outcome_advantages,
    "turn": turn_advantages,
    "anchor": anchor_advantages,
}


def per_turn_advantages(
    data: Sequence[TurnData], group_size: int, estimator: str, lam: float = 1.0, gamma: float = 1.0
) -> list[list[float]]:
    """A_{i,k} for every trajectory of a batch whose groups are consecutive runs of `group_size` (TRL's order)."""
    if estimator not in ESTIMATOR_FUNCTIONS:
        raise ValueError(f"advantage must be one of {', '.join(ESTIMATORS)}, got `{estimator}`")
    if len(data) % group_size:
        raise ValueError(f"{len(data)} trajectories do not split into groups of {group_size}")
    function = ESTIMATOR_FUNCTIONS[estimator]
    out: list[list[float]] = []
    for start in range(0, len(data), group_size):
        out.extend(function(data[start : start + group_size], lam, gamma))
    return out


def token_advantages(
    trajectories: Sequence[Trajectory], per_turn: Sequence[Sequence[float]], width: int
) -> torch.Tensor:
    """(B, width): each model token of turn k gets A_{i,k}; tool tokens and padding get 0."""
    out = torch.zeros(len(trajectories), width, dtype=torch.float32)
    for row, (trajectory, values) in enumerate(zip(trajectories, per_turn, strict=True)):
        turn, position = 0, 0
        for segment in trajectory.completion_segments:
            end = position + len(segment.token_ids)
            if end > width:
                raise ValueError(f"trajectory {row} has {end}+ completion tokens but the batch is {width} wide")
            if segment.trainable:
                out[row, position:end] = values[turn]
                turn += 1
            position = end
        if turn != len(values):
            raise ValueError(f"trajectory {row} has {turn} model segments but {len(values)} turn advantages")
    return out


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


def credit_metrics(
    data: Sequence[TurnData], group_size: int, lam: float = 1.0, gamma: float = 1.0, max_turns: int | None = None
) -> dict[str, float]:
    """Per-turn reward means (over trajectories that reached the turn), their sum, and for each estimator the
    share of groups whose every turn advantage is 0 (`frac_reward_zero_std`: no learning signal)."""
    metrics: dict[str, float] = {}
    deepest = max((d.turns for d in data), default=0)
    for k in range(min(deepest, max_turns or deepest)):
        reached = [d.turn_rewards[k] for d in data if d.turns > k]
        metrics[f"credit/turn_reward/turn_{k + 1}"] = sum(reached) / len(reached)
    metrics["credit/turn_reward/sum"] = sum(sum(d.turn_rewards) for d in data) / max(1, len(data))
    has_states = any(s is not None for d in data for s in d.states or [])
    groups = max(1, len(data) // group_size)
    for estimator in ESTIMATORS:
        if estimator == "anchor" and not has_states:
            continue
        values = per_turn_advantages(data, group_size, estimator, lam, gamma)
        silent = sum(
            all(abs(a) < _ZERO for row in values[start : start + group_size] for a in row)
            for start in range(0, len(values), group_size)
        )
        metrics[f"credit/frac_reward_zero_std/{estimator}"] = silent / groups
    return metrics


def assign_turn_credit(
    trajectories: Sequence[Trajectory],
    outcome_advantages: torch.Tensor,
    weights: dict[str, float],
    *,
    estimator: str,
    lam: float,
    gamma: float,
    group_size: int,
    width: int,
    gather: Callable[[list[Any]], list[Any]],
    process_index: int,
    max_turns: int | None = None,
) -> tuple[torch.Tensor | None, dict[str, float]]:
    """This process's (B, width) token advantages (None for `outcome`: TRL's stay) and the step's credit metrics.

    Every process's `TurnData` is gathered first (rank order = TRL's global order), so a group split over
    processes is estimated whole; each process then keeps its own rows, as TRL slices its advantages. The
    outcome advantages of flat groups (`flat_groups`) are set to 0 first, in `outcome_advantages` itself; the
    metrics' `frac_reward_zero_std` is the share of groups that are flat.
    """
    local = [TurnData.of(t, a, weights) for t, a in zip(trajectories, outcome_advantages.tolist(), strict=True)]
    everyone = gather(local)
    flat = flat_groups([d.outcome for d in everyone], group_size)
    for data, silent in zip(everyone, flat, strict=True):
        if silent:
            data.advantage = 0.0
    first = process_index * len(local)
    silent_here = torch.tensor(flat[first : first + len(local)], device=outcome_advantages.device)
    outcome_advantages.masked_fill_(silent_here, 0.0)
    metrics = credit_metrics(everyone, group_size, lam, gamma, max_turns)
    metrics["frac_reward_zero_std"] = sum(flat) / max(1, len(flat))
    if estimator == "outcome":
        return None, metrics
    mine = per_turn_advantages(everyone, group_size, estimator, lam, gamma)[first : first + len(local)]
    for trajectory, values in zip(trajectories, mine, strict=True):
        trajectory.turn_advantages = list(values)
    tokens = token_advantages(trajectories, mine, width)
    return tokens.to(outcome_advantages.device), metrics


logger = logging.getLogger(__name__)
