"""The toolbox: eight real tools (two distractors), tasks that name the tool each should use, a disjoint split."""

from __future__ import annotations

import pytest

from agentic_grpo.tasks import split_of
from agentic_grpo.tools.toolbox import MathToolbox, Toolbox
from agentic_grpo.tools.toolbox_tasks import EXPECTED_TOOLS, toolbox_tasks
from agentic_grpo.trajectory import ToolCall


def run(tool: str, **arguments):
    return Toolbox().execute(ToolCall(tool, arguments, ""), timeout=5)


def test_the_toolbox_has_eight_tools_and_the_math_toolbox_keeps_its_two():
    assert list(Toolbox.tools()) == ["calculator", "convert_units", "date_calculator", "lookup", "string_tool",
                                     "python", "web_search", "quick_estimate"]  # fmt: skip
    assert set(MathToolbox.tools()) == {"calculator", "python"}
    assert Toolbox.needs_sandbox and len(Toolbox.tool_schemas()) == 8


@pytest.mark.parametrize(
    ("tool", "arguments", "output"),
    [
        ("calculator", {"expression": "214 * 37"}, "7918"),
        ("convert_units", {"query": "37 miles to km"}, "59.55 km"),
        ("convert_units", {"query": "212 degrees fahrenheit in celsius"}, "100 celsius"),
        ("convert_units", {"query": "3 weeks to hours"}, "504 h"),
        ("date_calculator", {"query": "days from 2024-01-05 to 2024-03-01"}, "56"),
        ("date_calculator", {"query": "weekday of 2021-06-15"}, "Tuesday"),
        ("lookup", {"query": "atomic number of tungsten"}, "74"),
        ("lookup", {"query": "What is the chemical symbol of gold?"}, "Au"),
        ("lookup", {"query": "iron"}, "iron: symbol Fe, atomic number 26, atomic mass 55.85"),
        ("string_tool", {"operation": "reverse", "text": "qorvant"}, "tnavroq"),
        ("string_tool", {"operation": "count vowels", "text": "qorvant"}, "2"),
        ("web_search", {"query": "atomic number of tungsten"}, "No results found."),
        ("quick_estimate", {"expression": "347 * 58"}, "about 20000"),
    ],
)
def test_each_tool_answers(tool, arguments, output):
    result = run(tool, **arguments)
    assert result.ok and result.output == output


@pytest.mark.parametrize(
    ("tool", "arguments", "message"),
    [
        ("convert_units", {"query": "37 parsecs to km"}, "unknown unit `parsecs`"),
        ("convert_units", {"query": "5 kg to km"}, "cannot convert mass (kg) to length (km)"),
        ("convert_units", {"query": "a lot of miles"}, 'write the query as "<number> <unit> to <unit>"'),
        ("date_calculator", {"query": "days from 2024-02-30 to 2024-03-01"}, "`2024-02-30` is not a date"),
        ("date_calculator", {"query": "how long until Easter"}, "found 0 date(s)"),
        ("lookup", {"query": "atomic number of unobtainium"}, "no element named"),
        ("string_tool", {"operation": "shuffle", "text": "abc"}, "unknown operation `shuffle`"),
        ("calculator", {"expression": "import os"}, "not an arithmetic expression"),
        ("lookup", {"question": "iron"}, "bad arguments for `lookup`: missing query"),
        ("string_tool", {"operation": "reverse", "text": 12}, "`text` should be string, got int"),
        ("no_such_tool", {}, "unknown tool `no_such_tool`"),
        ("conversion", {}, "unknown tool `conversion`. Did you mean `convert_units`? Available tools: calculator,"),
        ("date", {}, "Did you mean `date_calculator`?"),
    ],
)
def test_bad_input_is_an_observation_not_a_crash(tool, arguments, message):
    result = run(tool, **arguments)
    assert not result.ok and message in result.output


@pytest.mark.parametrize(
    ("name", "meant"),
    [("Calculator", "calculator"), ("unit_converter", "convert_units"), ("string", "string_tool"),
     ("date_calc", "date_calculator"), ("mole", None), ("teleport", None), ("", None)],
)  # fmt: skip
def test_an_unknown_tool_name_suggests_the_tool_it_most_likely_meant(name, meant):
    from agentic_grpo.environment import closest_tool_name

    assert closest_tool_name(name, sorted(Toolbox.tools())) == meant
    if meant is None:
        assert "Did you mean" not in run(name).output


def test_python_runs_in_the_sandbox_slot_of_the_trajectory():
    from agentic_grpo.sandbox import SandboxConfig, SandboxPool

    pool = SandboxPool(SandboxConfig(timeout_s=10))
    toolbox = Toolbox()
    slot = pool.acquire()
    toolbox.sandbox, toolbox.workspace = slot, slot.workspace
    try:
        result = toolbox.execute(ToolCall("python", {"code": "print(sum(range(101)))"}, ""), timeout=10)
        broken = toolbox.execute(ToolCall("python", {"code": "print(1/0)"}, ""), timeout=10)
    finally:
        pool.release(slot)
        pool.close()
    assert result.ok and result.output == "5050"
    assert not broken.ok and "ZeroDivisionError" in broken.output


def test_every_task_names_its_tool_and_every_kind_comes_in_turn():
    splits = toolbox_tasks(num_train=60, num_test=12, seed=0)
    kinds = [row["kind"] for row in splits["test"]]
    assert kinds == list(EXPECTED_TOOLS) * 2  # the first N test rows cover every kind evenly
    for row in splits["train"] + splits["test"]:
        assert row["expected_tools"] == EXPECTED_TOOLS[row["kind"]]
        assert row["answer"] and " " not in row["answer"]  # a number or one word: strictly checkable


def test_answers_are_what_the_expected_tool_gives():
    rows = toolbox_tasks(num_train=40, num_test=10, seed=3, kinds=["dates", "lookup"])
    for row in rows["train"] + rows["test"]:  # these tools read the question itself as their query
        assert run(row["expected_tools"][0], query=row["question"]).output == row["answer"], row


def test_train_and_test_never_share_a_task_whatever_the_seed():
    first, second = toolbox_tasks(600, 48, seed=0), toolbox_tasks(600, 48, seed=1)
    train = {row["question"] for split in (first, second) for row in split["train"]}
    test = [row["question"] for split in (first, second) for row in split["test"]]
    assert not train & set(test)
    assert len(set(first["test"][i]["question"] for i in range(48))) == 48  # test rows are distinct
    assert split_of("toolbox:lookup:gold:symbol", 0.2) == split_of("toolbox:lookup:gold:symbol", 0.2)


def test_a_routing_mix_names_its_specialists_and_bad_options_are_refused():
    rows = toolbox_tasks(30, 6, kinds=["arithmetic", "units"], expected={"units": "ask_units"})["test"]
    assert {(r["kind"], tuple(r["expected_tools"])) for r in rows} == {("arithmetic", ("calculator",)),
                                                                        ("units", ("ask_units",))}  # fmt: skip
    with pytest.raises(ValueError, match="unknown kind"):
        toolbox_tasks(kinds=["poetry"])
    with pytest.raises(ValueError, match="`expected` names kind `dates`"):
        toolbox_tasks(kinds=["units"], expected={"dates": "ask_dates"})
    with pytest.raises(ValueError, match="too few facts"):
        toolbox_tasks(num_train=10, num_test=500, kinds=["lookup"])
