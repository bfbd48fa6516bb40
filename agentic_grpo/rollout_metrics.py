"""The rollout metrics of a training batch: tool calls, errors, turns, trainable tokens and time.

`tools/*`, `trajectories/*`, `tokens/trainable_ratio` and `time/generation`, `time/tools` (DESIGN.md's metric
names), appended to the trainer's metrics so TRL logs them with its own.
"""

from __future__ import annotations

from typing import Any

import torch

from agentic_grpo.rollout import RolloutStats
from agentic_grpo.trajectory import Trajectory


def log_rollout_metrics(trainer: Any, trajectories: list[Trajectory], stats: RolloutStats) -> None:
    """A trainer's tool, trajectory, token and time metrics, summed over all processes before dividing (every
    process calls it: the gather is collective)."""
    calls = [r for t in trajectories for _, r in t.tool_calls]
    counts = torch.tensor(
        [
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
        ],
        dtype=torch.float64,
        device=trainer.accelerator.device,
    )
    (n, n_calls, errors, timeouts, truncated, invalid, turns, trainable, tokens, with_call, answered,
     gen_s, tool_s, procs) = trainer.accelerator.gather(counts).view(-1, counts.numel()).sum(0).tolist()  # fmt: skip
    metrics = trainer._metrics["train" if trainer.model.training else "eval"]
    metrics["tools/calls_per_trajectory"].append(n_calls / n)
    metrics["tools/call_rate"].append(with_call / n)
    metrics["tools/error_rate"].append(errors / n_calls if n_calls else 0.0)
    metrics["tools/timeout_rate"].append(timeouts / n_calls if n_calls else 0.0)
    metrics["tools/truncated_rate"].append(truncated / n_calls if n_calls else 0.0)
    metrics["trajectories/invalid_rate"].append(invalid / n)
    metrics["trajectories/answered_rate"].append(answered / n)
    metrics["trajectories/turns_mean"].append(turns / n)
    metrics["tokens/trainable_ratio"].append(trainable / tokens if tokens else 0.0)
    metrics["time/generation"].append(gen_s / procs)
    metrics["time/tools"].append(tool_s / procs)
    if trainer.sandbox_pool is not None:  # sandbox/downgraded, sandbox/cgroup: a silent fallback shows in the logs
        for name, value in trainer.sandbox_pool.metrics().items():
            metrics[name].append(value)
