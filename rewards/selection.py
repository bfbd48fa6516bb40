"""A reward for choosing the tool (or sub-agent) the task names: the shaping term of the toolbox and routing
recipes.

With eight tools, a small model rarely reaches a right answer by a wrong route, so correctness alone says
little about which choice was wrong. `ToolChoice` pays the choice itself, by the rule of the metric
`tools/selection_accuracy` (`agentic_grpo.rollout_metrics`): the trajectory called tools and every call named one the
row's `expected_tools` column lists. It pays nothing for the answer; recipes weigh it below `Correctness`.
"""

from __future__ import annotations

from typing import Any

from agentic_grpo.rollout_metrics import EXPECTED_TOOLS_COLUMN, expected_tools
from agentic_grpo.trajectory import Trajectory


class ToolChoice:
    """1.0 when every tool call named an expected tool (at least one call), 0.0 otherwise; None for a row that
    names no expected tool."""

    __name__ = "tool_choice"
    required_columns = (EXPECTED_TOOLS_COLUMN,)

    def __call__(self, prompts: list, completions: list, trajectory: list[Trajectory], **columns: Any):
        scores: list[float | None] = []
        for t, wanted in zip(trajectory, columns[EXPECTED_TOOLS_COLUMN], strict=True):
            expected = expected_tools({EXPECTED_TOOLS_COLUMN: wanted})
            called = [call.name for call, _ in t.tool_calls]
            scores.append(None if not expected else float(bool(called) and all(n in expected for n in called)))
        return scores
