"""The rollout metrics of a training batch: tool calls, errors, turns, trainable tokens and time.

`tools/*`, `trajectories/*`, `tokens/trainable_ratio` and `time/generation`, `time/tools` (DESIGN.md's metric
names), returned as a dict that the trainer logs with TRL's own; and `completions/clipped_ratio` with the
terminated lengths, from finish reasons (`clipped_metrics`).
"""

from __future__ import annotations

from collections.abc import Callable

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
