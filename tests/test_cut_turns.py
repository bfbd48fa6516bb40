"""A turn cut by `max_tokens_per_turn` is unfinished: no final answer, no tool call, finish reason `length`.

Played with scripted text through the real tokenizer, `cut_generation` and each format's parser:
the script runs past the turn budget, as a model that rambles on after its answer does.
"""

from __future__ import annotations

import pytest

from agentic_grpo.formats import load_format
from agentic_grpo.rewards.rules import Correctness, FormatAdherence
from agentic_grpo.rollout import RolloutLimits, RolloutManager
from agentic_grpo.tools.calculator import Calculator
from tests.scripted import ScriptedBackend, case_prompt

RAMBLE = " and so on" * 40


def roll(tokenizer, fmt_name, script, turn_marker="Observation:", **fmt_kwargs):
    fmt = load_format(fmt_name, Calculator.tool_schemas(), **fmt_kwargs)
    manager = RolloutManager(Calculator, fmt, tokenizer, RolloutLimits(max_turns=3, max_tokens_per_turn=24))
    backend = ScriptedBackend(tokenizer, {"cut": script}, turn_marker=turn_marker)
    try:
        [trajectory], _ = manager.rollout([case_prompt("cut")], [{}], backend)
    finally:
        manager.close()
    return trajectory


@pytest.mark.parametrize(
    ("fmt_name", "text", "kwargs"),
    [
        ("react", "Final Answer: 77,750" + RAMBLE, {}),
        ("react", "Thought: it is big" + RAMBLE + "\nFinal Answer: 77", {}),
        ("artist", "<answer>77,750</answer>" + RAMBLE, {"tool": "calculator"}),
        ("tool_call", "The answer is 77,750" + RAMBLE, {}),
    ],
)
def test_a_cut_turn_is_not_a_final_answer(tokenizer, fmt_name, text, kwargs):
    trajectory = roll(tokenizer, fmt_name, [text], **kwargs)
    assert trajectory.finish_reason == "length"
    assert trajectory.final_answer is None and trajectory.turns == 1
    rewards = [r(None, None, trajectory=[trajectory], answer=["77750"]) for r in (Correctness(), FormatAdherence())]
    assert rewards == [[0.0], [0.0]]


def test_a_cut_off_python_block_is_never_run(tokenizer):
    cut_code = "<python>12 * 34 " + "+ 1 " * 60 + "</python>"
    trajectory = roll(tokenizer, "artist", [cut_code], turn_marker="<output>", tool="calculator")
    assert trajectory.finish_reason == "length" and trajectory.tool_calls == []


def test_a_cut_react_tool_call_is_never_run(tokenizer):
    cut_call = 'Action: calculator\nAction Input: {"expression": "12 * 3' + "4" * 60 + '"}\nObservation:'
    trajectory = roll(tokenizer, "react", [cut_call])
    assert trajectory.finish_reason == "length" and trajectory.tool_calls == []


def test_a_complete_turn_within_the_budget_still_answers(tokenizer):
    trajectory = roll(tokenizer, "react", ["Final Answer: 77,750<|im_end|>"])
    assert trajectory.finish_reason == "final_answer" and trajectory.final_answer == "77,750"


@pytest.mark.parametrize(
    ("fmt_name", "call", "runs"),
    [
        ("react", 'Thought: multiply\nAction: calculator\nAction Input: {"expression": "12 * 34"}', True),
        ("react", "Thought: multiply\nAction: calculator\nAction Input: 12 * 34", False),  # a bare value may be cut
        ("react", 'Action: calculator\nAction Input: {"expression": "12 * 34"} and then', False),
        ("tool_call", '<tool_call>{"name": "calculator", "arguments": {"expression": "12 * 34"}}</tool_call>', True),
        ("tool_call", '<tool_call>{"name": "calculator", "arguments": {"expression": "12 * 34"}}', False),
    ],
)
def test_a_whole_call_that_fills_the_turn_budget_exactly_is_run(tokenizer, fmt_name, call, runs):
    budget = len(tokenizer(call, add_special_tokens=False)["input_ids"])
    fmt = load_format(fmt_name, Calculator.tool_schemas())
    limits = RolloutLimits(max_turns=3, max_tokens_per_turn=budget)
    manager = RolloutManager(Calculator, fmt, tokenizer, limits)
    marker = "Observation:" if fmt_name == "react" else "<tool_response>"
    backend = ScriptedBackend(tokenizer, {"cut": [call + RAMBLE, "Final Answer: 408<|im_end|>"]}, turn_marker=marker)
    try:
        [trajectory], _ = manager.rollout([case_prompt("cut")], [{}], backend)
    finally:
        manager.close()
    if not runs:
        assert trajectory.finish_reason == "length" and trajectory.tool_calls == []
        return
    assert [result.output for _, result in trajectory.tool_calls] == ["408"]
    observation = trajectory.segments[2].text
    assert "408" in observation and (marker in observation)
    if fmt_name == "tool_call":  # the model's turn did not end with EOS: the template's end-of-turn is added
        assert observation.startswith("<|im_end|>")
    assert trajectory.turns == 2
