"""Reading scores out of judge answers: JSON first, then a labelled number; always in [0, 1] or None."""

import pytest

from agentic_grpo.rewards.judge_parsing import normalise, parse_group_scores, parse_score


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ('{"score": 7}', 0.7),
        ('Sure!\n```json\n{"reason": "uses the tool well", "score": 8.5}\n```', 0.85),
        ('{"Score": "4"}', 0.4),
        ("Score: 7/10", 0.7),
        ("**Rating**: 6", 0.6),
        ("The final score is 9 out of 10.", 0.9),
        ("score 3/5", 0.6),
        ('A score of 2 would be harsh. {"score": 9}', 0.9),
        ("I would give it a 3. Score: 4", 0.4),
    ],
)
def test_score_is_read_and_normalised(answer, expected):
    assert parse_score(answer) == pytest.approx(expected)


@pytest.mark.parametrize("answer", ["The agent did well.", "Score: 11", '{"score": -1}', '{"score": true}', ""])
def test_answer_without_a_valid_score_gives_none(answer):
    assert parse_score(answer) is None


def test_score_scale_is_configurable():
    assert parse_score('{"score": 3}', low=1, high=5) == pytest.approx(0.5)
    assert parse_score('{"score": 0.25}', low=0, high=1) == pytest.approx(0.25)


def test_normalise_rejects_out_of_range_and_nan():
    assert normalise(10.5, 0, 10) is None
    assert normalise(float("nan"), 0, 10) is None
    assert normalise(2, 0, 10, denominator=4) == pytest.approx(0.5)


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ('{"reason": "x", "scores": [1, 5, 10]}', [0.1, 0.5, 1.0]),
        ("[3, 4, 5]", [0.3, 0.4, 0.5]),
        ('[{"id": 2, "score": 5}, {"id": 1, "score": 9}, {"id": 3, "score": 0}]', [0.9, 0.5, 0.0]),
        ('{"1": 4, "2": 6, "3": 8}', [0.4, 0.6, 0.8]),
        ("Attempt 1: 7\nAttempt 2: score 3/10\nAttempt 3 - 10", [0.7, 0.3, 1.0]),
    ],
)
def test_group_scores_are_read_in_order(answer, expected):
    assert parse_group_scores(answer, 3) == pytest.approx(expected)


def test_group_scores_missing_or_invalid_entries_are_none():
    assert parse_group_scores('{"scores": [4, 12]}', 3) == [pytest.approx(0.4), None, None]
    assert parse_group_scores("no idea", 2) == [None, None]
