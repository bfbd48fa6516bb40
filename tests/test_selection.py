"""Tool-selection and routing metrics: counted right on hand-made trajectories, recorded from a real routing
rollout (sub-agents generating on a tiny model), and paid by the `ToolChoice` reward by the same rule."""

from __future__ import annotations

import pytest

from agentic_grpo.config import AgenticGRPOConfig
from agentic_grpo.rewards.selection import ToolChoice
from agentic_grpo.rollout_metrics import selection_counts, selection_metrics
from agentic_grpo.run_parts import build_rollout_parts
from agentic_grpo.trajectory import Segment, ToolCall, ToolResult, Trajectory
from tests.scripted import ScriptedBackend, case_prompt

NAMES = ["calculator", "lookup", "python"]


def made(*calls: str) -> Trajectory:
    """A trajectory that called these tools, in order."""
    trajectory = Trajectory(prompt="q", segments=[Segment("prompt", [1], "q")])
    trajectory.tool_calls = [(ToolCall(name, {}), ToolResult("ok")) for name in calls]
    return trajectory


def test_selection_accuracy_wrong_and_no_tool_rates_and_calls_per_tool():
    trajectories = [made("lookup"), made("lookup", "lookup"), made("calculator", "lookup"), made(), made("python"),
                    made("invented"), made("calculator")]  # fmt: skip
    rows = [{"expected_tools": ["lookup"]}] * 4 + [{"expected_tools": "python"}, {"expected_tools": ["calculator"]},
                                                   {"question": "no expectation"}]  # fmt: skip
    metrics = selection_metrics(selection_counts(trajectories, rows, NAMES), NAMES)

    # Six rows name a tool: right = lookup, lookup+lookup, python; wrong = calculator+lookup, invented; none = one.
    assert metrics["tools/selection_accuracy"] == pytest.approx(3 / 6)
    assert metrics["tools/wrong_tool_rate"] == pytest.approx(2 / 6)
    assert metrics["tools/no_tool_rate"] == pytest.approx(1 / 6)
    # Calls per trajectory over all seven trajectories, the row without an expectation included.
    assert metrics["tools/calls/lookup"] == pytest.approx(4 / 7)
    assert metrics["tools/calls/calculator"] == pytest.approx(2 / 7)
    assert metrics["tools/calls/python"] == pytest.approx(1 / 7)
    assert metrics["tools/calls/_unknown"] == pytest.approx(1 / 7)
    assert "routing/accuracy" not in metrics  # no sub-agents


def test_rows_that_name_no_tool_give_no_rates_and_counts_add_across_processes():
    metrics = selection_metrics(selection_counts([made("lookup")], [{"question": "q"}], NAMES), NAMES)
    assert set(metrics) == {f"tools/calls/{n}" for n in [*NAMES, "_unknown"]}
    one = selection_counts([made("lookup")], [{"expected_tools": ["lookup"]}], NAMES)
    two = selection_counts([made("python")], [{"expected_tools": ["lookup"]}], NAMES)
    summed = [a + b for a, b in zip(one, two, strict=True)]  # what the trainer's gather adds up
    assert selection_metrics(summed, NAMES)["tools/selection_accuracy"] == 0.5


def test_routing_accuracy_is_the_first_subagent_asked():
    agents = ["ask_units", "ask_dates"]
    names = ["calculator", *agents]
    trajectories = [made("ask_units"), made("calculator", "ask_units"), made("ask_dates", "ask_units"), made(),
                    made("ask_dates")]  # fmt: skip
    rows = [{"expected_tools": ["ask_units"]}] * 4 + [{"expected_tools": ["calculator"]}]
    metrics = selection_metrics(selection_counts(trajectories, rows, names, agents), names)
    assert metrics["routing/accuracy"] == pytest.approx(2 / 4)  # the fifth row expects no sub-agent
    assert metrics["tools/selection_accuracy"] == pytest.approx(1 / 5)  # only the first used expected tools alone


def test_tool_choice_pays_the_selection_rule_and_nothing_without_an_expectation():
    reward = ToolChoice()
    scores = reward([None] * 4, [None] * 4, trajectory=[made("lookup"), made("lookup", "python"), made(),
                    made("lookup")], expected_tools=[["lookup"], ["lookup"], ["lookup"], None])  # fmt: skip
    assert scores == [1.0, 0.0, 0.0, None]


def test_a_routing_rollout_records_which_specialist_each_trajectory_asked(tmp_path, tiny_model_dir, tokenizer):
    """The orchestrator's turns are scripted (a tiny random model writes no well-formed call); its two
    specialists are real nested rollouts on a tiny frozen model, answering in one turn."""

    def specialist(name):
        return {"name": name, "description": f"The {name} specialist.", "model": tiny_model_dir,
                "format": "tests.subagent_support:CallingFormat", "format_kwargs": {"tool": None}, "max_turns": 1,
                "max_tokens_per_turn": 12}  # fmt: skip

    config = AgenticGRPOConfig(output_dir=str(tmp_path), report_to=[], environment="agentic_grpo.environment:ToolEnvironment",
                               max_completion_length=600, max_tokens_per_turn=64,
                               subagents=[specialist("ask_units"), specialist("ask_dates")])  # fmt: skip
    parts = build_rollout_parts(config)

    def ask(agent):
        return f'Action: {agent}\nAction Input: {{"task": "Convert 3 miles to km."}}\nObservation:'

    done = "Final Answer: 4.83<|im_end|>"
    scripts = {"right": [ask("ask_units"), done], "wrong": [ask("ask_dates"), ask("ask_units"), done],
               "silent": [done]}  # fmt: skip
    cases = ["right", "wrong", "silent", "right"]
    rows = [{"case": c, "expected_tools": ["ask_units"]} for c in cases]
    manager = parts.rollout_manager(tokenizer)
    try:
        trajectories, _ = manager.rollout([case_prompt(c) for c in cases], rows, ScriptedBackend(tokenizer, scripts))
    finally:
        manager.close()

    assert [[c.delegation.agent for c in t.children] for t in trajectories] == [
        ["ask_units"], ["ask_dates", "ask_units"], [], ["ask_units"]]  # fmt: skip
    names = ["ask_units", "ask_dates"]
    metrics = selection_metrics(selection_counts(trajectories, rows, names, names), names)
    assert metrics["routing/accuracy"] == pytest.approx(2 / 4)
    assert metrics["tools/calls/ask_units"] == pytest.approx(3 / 4)
    assert metrics["tools/calls/ask_dates"] == pytest.approx(1 / 4)
