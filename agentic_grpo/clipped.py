"""Which trajectories a token budget cut, from the rollout's finish reason rather than the last token.

TRL calls a completion truncated when its last token is not EOS. A multi-turn trajectory
often ends on a stop string (`Observation:`, `</python>`) or runs out of turns without
being cut at all, so that test mislabels them. Here a trajectory is truncated exactly when
its finish reason is `length`: a turn or the whole trajectory hit its token budget. This
drives `completions/clipped_ratio` (and the terminated-length metrics beside it) and
`mask_truncated_completions`, which we apply through the loss mask ourselves.
"""

from __future__ import annotations

from typing import Any

import torch

from agentic_grpo.trajectory import Trajectory


def is_truncated(trajectory: Trajectory) -> bool:
    """True when a token budget cut the trajectory (finish reason `length`)."""
    return trajectory.finish_reason == "length"


def masked_loss_mask(trajectory: Trajectory, mask_truncated: bool) -> list[int]:
    """The trajectory's loss mask; all zeros when `mask_truncated` and a budget cut it."""
    mask = trajectory.loss_mask
    return [0] * len(mask) if mask_truncated and is_truncated(trajectory) else mask


def log_clipped_metrics(trainer: Any, trajectories: list[Trajectory], mode: str) -> None:
    """Replace the `completions/*` values TRL just logged from its last-token test with finish-reason ones."""
    metrics = trainer._metrics[mode]
    if not metrics.get("completions/clipped_ratio"):
        return
    device = trainer.accelerator.device
    truncated = torch.tensor([is_truncated(t) for t in trajectories], dtype=torch.bool, device=device)
    lengths = torch.tensor([sum(t.loss_mask) for t in trajectories], dtype=torch.float32, device=device)
    truncated, lengths = trainer.accelerator.gather(truncated), trainer.accelerator.gather(lengths)
    metrics["completions/clipped_ratio"][-1] = truncated.float().mean().item()
    terminated = lengths[~truncated]
    if terminated.numel() == 0:
        terminated = torch.zeros(1, device=device)
    for name, value in (("mean", terminated.mean()), ("min", terminated.min()), ("max", terminated.max())):
        key = f"completions/{name}_terminated_length"
        if metrics.get(key):
            metrics[key][-1] = value.item()
