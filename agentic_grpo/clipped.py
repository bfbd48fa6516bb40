"""Which trajectories a token budget cut, from the rollout's finish reason rather than the last token.

TRL calls a completion truncated when its last token is not EOS. A multi-turn trajectory
often ends on a stop string (`Observation:`, `</python>`) or runs out of turns without
being cut at all, so that test mislabels them. Here a trajectory is truncated exactly when
its finish reason is `length`: a turn or the whole trajectory hit its token budget. This
drives `completions/clipped_ratio` (and the terminated-length metrics beside it) and
`mask_truncated_completions`, which we apply through the loss mask ourselves.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from agentic_grpo.trajectory import Trajectory


def is_truncated(trajectory: Trajectory) -> bool:
    """True when a token budget cut the trajectory (finish reason `length`)."""
    return trajectory.finish_reason == "length"


def masked_loss_mask(trajectory: Trajectory, mask_truncated: bool) -> list[int]:
    """The trajectory's loss mask; all zeros when `mask_truncated` and a budget cut it."""
    mask = trajectory.loss_mask
    return [0] * len(mask) if mask_truncated and is_truncated(trajectory) else mask


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
