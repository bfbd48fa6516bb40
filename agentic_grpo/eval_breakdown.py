"""Where an evaluation loses its answers: per kind of question, and after a tool already gave the answer.

`answer_lost_rate` counts the trajectories a tool's observation handed the reference answer to and whose final
answer was still wrong: accuracy lost after the right call (a model that copies the prompt example's
answer instead of the observation's, say), which selection accuracy and accuracy alone cannot tell apart
from a wrong call. `kinds/<kind>/...` splits accuracy, selection and that rate by the rows' `kind` column,
as the recipes' task generators write it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from agentic_grpo.rollout_metrics import selection_counts, selection_metrics
from agentic_grpo.trajectory import Trajectory


def answer_in_observations(trajectory: Trajectory, answer: Any) -> bool:
    """Whether a tool's output holds `answer` as a whole word or number (`6` is not in `26` or `6.5`)."""
    text = "" if answer is None else str(answer).strip()
    if not text:
        return False
    pattern = re.compile(rf"(?<![\w.]){re.escape(text)}(?![\w]|\.\d)", re.IGNORECASE)
    return any(pattern.search(result.output) for _, result in trajectory.tool_calls)


def answers_lost(
    trajectories: Sequence[Trajectory], rows: Sequence[dict[str, Any]], correct: Sequence[bool]
) -> list[bool]:
    """Per trajectory: its observations held the row's `answer` and its final answer was wrong."""
    return [
        not right and answer_in_observations(t, row["answer"])
        for t, row, right in zip(trajectories, rows, correct, strict=True)
    ]


def kind_breakdown(
    trajectories: Sequence[Trajectory],
    rows: Sequence[dict[str, Any]],
    correct: Sequence[bool],
    tool_names: Sequence[str],
    agent_names: Sequence[str] = (),
    column: str = "kind",
) -> dict[str, float]:
    """`answer_lost_rate` (rows with an `answer`), and `kinds/<kind>/{trajectories,accuracy,answer_lost_rate,
    tools/selection_accuracy,...}` when the rows carry `column`; empty for rows with neither."""
    metrics: dict[str, float] = {}
    has_answer = bool(rows) and all("answer" in row for row in rows)
    lost = answers_lost(trajectories, rows, correct) if has_answer else []
    if has_answer:
        metrics["answer_lost_rate"] = sum(lost) / len(lost)
    if not rows or not all(column in row for row in rows):
        return metrics
    for kind in sorted({str(row[column]) for row in rows}):
        picked = [i for i, row in enumerate(rows) if str(row[column]) == kind]
        these = [trajectories[i] for i in picked]
        their_rows = [rows[i] for i in picked]
        prefix = f"kinds/{kind}/"
        metrics[prefix + "trajectories"] = len(picked)  # k of each question with pass@k
        metrics[prefix + "accuracy"] = sum(correct[i] for i in picked) / len(picked)
        if has_answer:
            metrics[prefix + "answer_lost_rate"] = sum(lost[i] for i in picked) / len(picked)
        counts = selection_counts(these, their_rows, tool_names, agent_names)
        for name, value in selection_metrics(counts, tool_names, prefix=prefix).items():
            if "/tools/calls/" not in name or value:  # the calls a kind never made add only noise
                metrics[name] = value
    return metrics
