"""Per-turn rewards folded into the outcome: the control arm of the credit benchmark.

`TurnRewardSum` gives a trajectory the sum of its per-turn rewards as one more scalar reward.
Trained with outcome-only GRPO, it carries the same extra information as the experimental `turn`
and `anchor` estimators (agentic_grpo.experimental.turn_credit) but no credit assignment: every turn of the trajectory gets the same share.
Put it after any reward plug-in that pays per-turn rewards itself (rewards run in recipe order).
"""

from __future__ import annotations

from typing import Any

from agentic_grpo.trajectory import Trajectory


class TurnRewardSum:
    """sum_k r_{i,k}: the trajectory's per-turn rewards (`Trajectory.turn_rewards`) added up."""

    __name__ = "turn_reward_sum"

    def __call__(self, prompts: list, completions: list, trajectory: list[Trajectory], **_: Any) -> list[float]:
        return [float(sum(t.turn_rewards)) for t in trajectory]
