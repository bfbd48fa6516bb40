"""The rollout metrics of a training batch: tool calls, errors, turns, trainable tokens, time and tool choice.

`tools/*`, `trajectories/*`, `tokens/trainable_ratio` and `time/generation`, `time/tools` (DESIGN.md's metric
names), returned as a dict that the trainer logs with TRL's own; and `completions/clipped_ratio` with the
terminated lengths, from finish reasons (`clipped_metrics`).

Tool choice (`selection_counts`, `selection_metrics`): did the agent pick the right tool, or the right specialist?
Counts over trajectories and their rows.

A row names the tools (or sub-agents) that should answer it in the column `expected_tools`: a name or a
list of names (`agentic_grpo.tools.toolbox_tasks` writes it; so can a user's own data). Rows without it
count only towards the per-tool call counts. Over the trajectories whose row names some:

- `tools/selection_accuracy`: the trajectory called tools, and every call named an expected tool;
- `tools/wrong_tool_rate`: it called some tool that is not expected (an unknown name included);
- `tools/no_tool_rate`: it called no tool; the three add up to 1;
- `routing/accuracy` (rows whose expected names include a sub-agent): the first sub-agent the trajectory
  called is an expected one (no sub-agent call counts as wrong);
- `tools/calls/<name>`: calls to each tool per trajectory, over all trajectories (`_unknown`: names that are no
  tool). The cost of a route, sub-agent tokens per trajectory, is `subagents/tokens_per_trajectory`.

The trainer sums the counts over processes before dividing; `agentic-grpo eval` reports the same rates.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from agentic_grpo.rollout import RolloutStats
from agentic_grpo.trajectory import Trajectory, is_truncated


def rollout_metrics(
    trajectories: list[Trajectory], stats: RolloutStats, sum_over_processes: Callable[[list[float]], list[float]]
) -> dict[str, float]:
    """A batch's tool, trajectory, token and time metrics, its counts summed over all processes before dividing
    (`sum_over_processes` is collective: every process calls it)."""
    calls = [r for t in trajectories for _, r in t.tool_calls]
    counts = [
        len(trajectories),
        len(calls),
        sum(not r.ok for r in calls),
        sum(r.timed_out for r in calls),
        sum(r.truncated for r in calls),
        sum(t.invalid for t in trajectories),
        sum(t.turns for t in trajectories),
        sum(sum(t.loss_mask) for t in trajectories),
        sum(len(t.loss_mask) for t in trajectories),
        sum(bool(t.tool_calls) for t in trajectories),
        sum(t.final_answer is not None for t in trajectories),
        stats.generation_seconds,
        stats.tool_seconds,
        1.0,
    ]
    (n, n_calls, errors, timeouts, truncated, invalid, turns, trainable, tokens, with_call, answered,
     gen_s, tool_s, procs) = sum_over_processes([float(c) for c in counts])  # fmt: skip
    return {
        "tools/calls_per_trajectory": n_calls / n,
        "tools/call_rate": with_call / n,
        "tools/error_rate": errors / n_calls if n_calls else 0.0,
        "tools/timeout_rate": timeouts / n_calls if n_calls else 0.0,
        "tools/truncated_rate": truncated / n_calls if n_calls else 0.0,
        "trajectories/invalid_rate": invalid / n,
        "trajectories/answered_rate": answered / n,
        "trajectories/turns_mean": turns / n,
        "tokens/trainable_ratio": trainable / tokens if tokens else 0.0,
        "time/generation": gen_s / procs,
        "time/tools": tool_s / procs,
    }


def clipped_metrics(
    trajectories: list[Trajectory], gather: Callable[[torch.Tensor], torch.Tensor]
) -> dict[str, float]:
    """`completions/clipped_ratio` and the terminated-length metrics beside it, from finish reasons over every
    process's trajectories (`gather` is collective): the values that replace those TRL logged from its
    last-token test."""
    truncated = torch.tensor([is_truncated(t) for t in trajectories], dtype=torch.bool)
    lengths = torch.tensor([sum(t.loss_mask) for t in trajectories], dtype=torch.float32)
    truncated, lengths = gather(truncated).cpu(), gather(lengths).cpu()
    terminated = lengths[~truncated]
    if terminated.numel() == 0:
        terminated = torch.zeros(1)
    return {
        "completions/clipped_ratio": truncated.float().mean().item(),
        "completions/mean_terminated_length": terminated.mean().item(),
        "completions/min_terminated_length": terminated.min().item(),
        "completions/max_terminated_length": terminated.max().item(),
    }


EXPECTED_TOOLS_COLUMN = "expected_tools"
UNKNOWN_TOOL = "_unknown"
# The counts `selection_counts` returns, in this order (then one call count per tool name, then the unknown ones).
COUNTS = ("trajectories", "expecting", "right", "wrong", "none", "routing", "routed_right")


def expected_tools(row: dict[str, Any]) -> set[str]:
    """The tool names the row expects (empty when it names none)."""
    value = row.get(EXPECTED_TOOLS_COLUMN)
    if not value:
        return set()
    return {value} if isinstance(value, str) else {str(name) for name in value}


def selection_counts(
    trajectories: Sequence[Trajectory], rows: Sequence[dict[str, Any]], tool_names: Sequence[str],
    agent_names: Sequence[str] = (),
) -> list[float]:  # fmt: skip
    """The `COUNTS`, then the calls to each of `tool_names` (in that order), then calls to any other name:
    fixed-length, so processes can sum them element-wise."""
    known = {name: k for k, name in enumerate(tool_names)}
    agents = set(agent_names)
    counts = dict.fromkeys(COUNTS, 0)
    calls = [0] * (len(tool_names) + 1)
    for trajectory, row in zip(trajectories, rows, strict=True):
        counts["trajectories"] += 1
        called = [call.name for call, _ in trajectory.tool_calls]
        for name in called:
            calls[known.get(name, len(tool_names))] += 1
        expected = expected_tools(row)
        if not expected:
            continue
        counts["expecting"] += 1
        if not called:
            counts["none"] += 1
        elif all(name in expected for name in called):
            counts["right"] += 1
        else:
            counts["wrong"] += 1
        if expected & agents:
            counts["routing"] += 1
            first = next((name for name in called if name in agents), None)
            counts["routed_right"] += first in expected
    return [float(counts[name]) for name in COUNTS] + [float(n) for n in calls]


def selection_metrics(counts: Sequence[float], tool_names: Sequence[str], prefix: str = "") -> dict[str, float]:
    """Metric name -> value from (summed) `selection_counts`; rates whose denominator is 0 are left out.

    `prefix=""` gives the training names (`tools/selection_accuracy`); evaluation reports the same keys.
    """
    values = dict(zip(COUNTS, counts, strict=False))
    metrics = {}
    n = values["trajectories"]
    for name, calls in zip([*tool_names, UNKNOWN_TOOL], counts[len(COUNTS) :], strict=True):
        if n:
            metrics[f"{prefix}tools/calls/{name}"] = calls / n
    if values["expecting"]:
        metrics[f"{prefix}tools/selection_accuracy"] = values["right"] / values["expecting"]
        metrics[f"{prefix}tools/wrong_tool_rate"] = values["wrong"] / values["expecting"]
        metrics[f"{prefix}tools/no_tool_rate"] = values["none"] / values["expecting"]
    if values["routing"]:
        metrics[f"{prefix}routing/accuracy"] = values["routed_right"] / values["routing"]
    return metrics


def tool_names_of(parts: Any) -> list[str]:
    """The names a policy can call: its environment's tools, then its sub-agents (a `RolloutParts`)."""
    return [*parts.environment.tools(), *(agent.name for agent in parts.agents)]


def batch_selection_metrics(
    trajectories: list[Trajectory],
    rows: list[dict[str, Any]],
    parts: Any,
    sum_over_processes: Callable[[list[float]], list[float]],
) -> dict[str, float]:
    """A training batch's selection metrics, counts summed over processes (collective: every process calls it)."""
    names = tool_names_of(parts)
    local = selection_counts(trajectories, rows, names, [a.name for a in parts.agents])
    return selection_metrics(sum_over_processes([float(c) for c in local]), names)
