"""Per-turn credit (`experimental: {advantage: turn | anchor}`): the environment's per-turn rewards, and for
`anchor` its states, turned into per-token advantages, so the turn that earned a reward gets the credit and not
the whole trajectory. Kept out of the core until it shows a gain over outcome-only GRPO (docs/mechanisms.md).

Notation, for one group (the G trajectories of one query): trajectory i has K_i model
turns k = 0..K_i-1 (K_i varies: trajectories stop when they answer); r_{i,k} is the reward paid for turn k
(`Trajectory.turn_rewards`); R_i the outcome reward (the recipe's rewards, weighted and summed as TRL does); A_i
TRL's GRPO advantage of R_i; s_{i,k} the environment's state hash before turn k (`ToolEnvironment.state_hash`);
lambda = `turn_lambda`, gamma = `turn_gamma` (options under `experimental:`).

outcome (default, TRL's GRPO): every token of trajectory i gets A_i (exactly 0 in a group whose outcomes are
equal, `agentic_grpo.advantages.flat_groups`).

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
another turn" decision (tests/test_turn_estimators.py measures both by exact enumeration). GiGPO
uses the plain mean (and optionally the std) of its step groups; here the same leave-one-out
rule holds for anchors, and all turns of trajectory i itself are left out of its own anchor set.
An anchor state no other member visited gets a baseline of 0, as the `turn` estimator's turns that
no one else reached. GiGPO drops the step term there (nothing to compare with); that is biased, and
not by a little: on the stop/go problem of tests/test_turn_estimators.py its expected gradient is about
three times the true one, against exactly the true one with the zero baseline.

Token-level: each model token of turn k gets A_{i,k}; tool-output tokens get 0 and stay masked
by TRL's `tool_mask` anyway.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from agentic_grpo.advantages import outcome_reward
from agentic_grpo.trajectory import Trajectory

ESTIMATORS = ("outcome", "turn", "anchor")
# Below this a turn advantage is zero (`silent_group_shares`).
ZERO = 1e-6
ANCHOR_NEEDS_STATE = (
    "experimental `advantage: anchor` groups turns by the environment's state, but `{name}` defines no "
    "`state_hash()`: add one to the environment, or use `advantage: turn`"
)


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


def silent_group_shares(
    data: Sequence[TurnData], group_size: int, lam: float = 1.0, gamma: float = 1.0
) -> dict[str, float]:
    """For each estimator, the share of groups whose every turn advantage is 0 (no learning signal):
    `credit/frac_reward_zero_std/<estimator>` (`anchor` only where the environment has states)."""
    metrics: dict[str, float] = {}
    has_states = any(s is not None for d in data for s in d.states or [])
    groups = max(1, len(data) // group_size)
    for estimator in ESTIMATORS:
        if estimator == "anchor" and not has_states:
            continue
        values = per_turn_advantages(data, group_size, estimator, lam, gamma)
        silent = sum(
            all(abs(a) < ZERO for row in values[start : start + group_size] for a in row)
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
) -> tuple[torch.Tensor | None, dict[str, float]]:
    """This process's (B, width) token advantages (None for `outcome`: TRL's stay) and the estimators'
    `silent_group_shares`, from the outcome advantages of the core's advantage step (flat groups already 0).

    Every process's `TurnData` is gathered first (rank order = TRL's global order), so a group split over
    processes is estimated whole; each process then keeps its own rows, as TRL slices its advantages. Each
    trajectory's `turn_advantages` are set, for its saved record.
    """
    local = [TurnData.of(t, a, weights) for t, a in zip(trajectories, outcome_advantages.tolist(), strict=True)]
    everyone = gather(local)
    metrics = silent_group_shares(everyone, group_size, lam, gamma)
    if estimator == "outcome":
        return None, metrics
    first = process_index * len(local)
    mine = per_turn_advantages(everyone, group_size, estimator, lam, gamma)[first : first + len(local)]
    for trajectory, values in zip(trajectories, mine, strict=True):
        trajectory.turn_advantages = list(values)
    tokens = token_advantages(trajectories, mine, width)
    return tokens.to(outcome_advantages.device), metrics
