"""`answer_lost_rate` and the per-kind split of an evaluation, on hand-built trajectories."""

from __future__ import annotations

from agentic_grpo.eval_breakdown import answer_in_observations, kind_breakdown
from agentic_grpo.trajectory import ToolCall, ToolResult, Trajectory

TOOLS = ["string_tool", "lookup"]


def called(name: str, output: str) -> Trajectory:
    return Trajectory(
        prompt="q", segments=[], tool_calls=[(ToolCall(name=name, arguments={}), ToolResult(output=output))]
    )


def test_the_answer_counts_only_as_a_whole_word_or_number():
    assert answer_in_observations(called("lookup", " 26\n"), 26)
    assert answer_in_observations(called("string_tool", "Reversed: IDULECEG."), "iduleceg")  # case and punctuation
    assert answer_in_observations(called("lookup", "28.09 u"), "28.09")
    assert not answer_in_observations(called("lookup", "26"), 6)
    assert not answer_in_observations(called("lookup", "6.5"), 6)
    assert not answer_in_observations(called("lookup", "12.25"), "2.25")
    assert not answer_in_observations(Trajectory(prompt="q", segments=[]), 6)  # no tool, no observation
    assert not answer_in_observations(called("lookup", "anything"), "")
    assert not answer_in_observations(called("lookup", "None"), None)  # a row without a reference answer


def test_kinds_split_accuracy_selection_and_the_answers_lost_after_the_tool_gave_them():
    rows = [
        {"kind": "strings", "answer": "olleh", "expected_tools": ["string_tool"]},
        {"kind": "strings", "answer": "dlrow", "expected_tools": ["string_tool"]},
        {"kind": "lookup", "answer": "Fe", "expected_tools": ["lookup"]},
        {"kind": "lookup", "answer": "Cu", "expected_tools": ["lookup"]},
    ]
    trajectories = [
        called("string_tool", "olleh"),  # the tool gave it, the final answer was wrong: lost
        called("string_tool", "dlrow"),  # gave it, written: right
        called("string_tool", "error"),  # wrong tool
        Trajectory(prompt="q", segments=[]),  # no call
    ]
    correct = [False, True, False, False]
    metrics = kind_breakdown(trajectories, rows, correct, TOOLS)
    assert metrics["answer_lost_rate"] == 1 / 4
    assert metrics["kinds/strings/trajectories"] == 2
    assert metrics["kinds/strings/accuracy"] == 0.5
    assert metrics["kinds/strings/answer_lost_rate"] == 0.5
    assert metrics["kinds/strings/tools/selection_accuracy"] == 1.0
    assert metrics["kinds/lookup/accuracy"] == 0.0
    assert metrics["kinds/lookup/answer_lost_rate"] == 0.0
    assert metrics["kinds/lookup/tools/selection_accuracy"] == 0.0
    assert metrics["kinds/lookup/tools/wrong_tool_rate"] == 0.5
    assert metrics["kinds/lookup/tools/no_tool_rate"] == 0.5
    assert metrics["kinds/lookup/tools/calls/string_tool"] == 0.5
    assert "kinds/lookup/tools/calls/lookup" not in metrics  # a tool a kind never called is left out


def test_rows_without_kinds_or_answers_add_nothing_they_cannot_measure():
    trajectories = [called("lookup", "Fe")]
    assert kind_breakdown(trajectories, [{"answer": "Fe"}], [False], TOOLS) == {"answer_lost_rate": 1.0}
    assert kind_breakdown(trajectories, [{"question": "q"}], [False], TOOLS) == {}
