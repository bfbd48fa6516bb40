"""Rule rewards on real trajectories."""

from __future__ import annotations

import pytest

from agentic_grpo.rewards.rules import Correctness, FormatAdherence, LengthPenalty, ToolSuccess, normalize_answer
from agentic_grpo.trajectory import Segment, ToolCall, ToolResult, Trajectory


def trajectory(answer=None, turns=2, malformed=0, calls=(), model_tokens=10):
    return Trajectory(
        prompt="q",
        segments=[Segment("prompt", [1], "q"), Segment("model", list(range(model_tokens)), "x")],
        tool_calls=[(ToolCall("calculator", {}), r) for r in calls],
        final_answer=answer,
        finish_reason="final_answer" if answer is not None else "max_turns",
        turns=turns,
        malformed_turns=malformed,
    )


@pytest.mark.parametrize(
    ("predicted", "gold"),
    [("56088", "56088"), ("56,088", "56088"), ("$56088$", "56088"), ("The answer is 56088.", "56088"),
     ("56088.0", "56088"), ("56088 pens", "56088"), ("$56,088.", "56088"), ("\\boxed{56088}", "56088"),
     ("1/2", "\\frac{1}{2}"), ("0.5", "\\frac{1}{2}"), ("\\frac{1}{2}", "1/2"), ("12 square meters", "12"),
     ("386064 pens in all", "386064"), ("x^2 + 1", "1 + x^2")],
)  # fmt: skip
def test_correct_answers_match(predicted, gold):
    reward = Correctness()
    assert reward(None, None, trajectory=[trajectory(predicted)], answer=[gold]) == [1.0]


@pytest.mark.parametrize(("predicted", "gold"), [("56087", "56088"), (None, "1"), ("five hundred", "500")])
def test_wrong_or_missing_answers_do_not(predicted, gold):
    assert Correctness()(None, None, trajectory=[trajectory(predicted)], answer=[gold]) == [0.0]


@pytest.mark.parametrize(
    ("predicted", "gold"),
    [("504 * 766", "386064"), ("504*766", "386064"), ("504 x 766 = 386064", "386064"), ("386064 or 12", "386064"),
     ("386064 386064", "386064"), ("about 386064", "386064"), ("386064 " + "very " * 50 + "sure", "386064"),
     ("1/2", "0.5"), ("1 - 1/2", "\\frac{1}{2}"), ("\\frac{2}{2} - \\frac{1}{2}", "1/2"),
     ("386064 is wrong", "386064"), ("386064 or more", "386064"), ("386064 not", "386064"),
     ("386064 more or less", "386064"), ("0.25+0.25", "\\frac{1}{2}"), ("0.25 + 0.25", "0.5")],
)  # fmt: skip
def test_restating_the_question_is_not_an_answer(predicted, gold):
    """A numeric reference is matched by a number, never by arithmetic that evaluates to it (the echo hole)."""
    assert Correctness()(None, None, trajectory=[trajectory(predicted)], answer=[gold]) == [0.0]


def test_exact_match_only_without_math_verify():
    assert Correctness(math_verify=False)(None, None, trajectory=[trajectory("1/2")], answer=["\\frac{1}{2}"]) == [0.0]
    assert normalize_answer(" Final Answer: 1,234. ") == "1234"


def test_format_adherence_counts_parsed_turns_and_needs_an_answer():
    scores = FormatAdherence()(None, None, trajectory=[trajectory("1", 2, 0), trajectory("1", 4, 1), trajectory()])
    assert scores == [1.0, 0.75, 0.0]


def test_tool_success_is_none_without_calls():
    ok, bad = ToolResult("1"), ToolResult("Error", error="boom")
    scores = ToolSuccess()(None, None, trajectory=[trajectory(calls=[ok, bad]), trajectory()])
    assert scores == [0.5, None]


def test_length_penalty_grows_past_free_tokens():
    penalty = LengthPenalty(free_tokens=10, max_tokens=20)
    scores = penalty(None, None, trajectory=[trajectory(model_tokens=n) for n in (5, 15, 40)])
    assert scores == [0.0, -0.5, -1.0]
    with pytest.raises(ValueError):
        LengthPenalty(free_tokens=10, max_tokens=5)
