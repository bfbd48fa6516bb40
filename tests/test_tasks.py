"""Generated tasks: deterministic, correct answers, and train and test never share a problem."""

import re

from agentic_grpo.tasks import multiplication_word_problems, split_of


def operands(row):
    a, b = (int(x) for x in re.findall(r"\d+", row["question"]))
    return min(a, b), max(a, b)


def test_same_seed_same_rows_and_answers_are_products():
    first, again = multiplication_word_problems(50, 10, seed=3), multiplication_word_problems(50, 10, seed=3)
    assert first == again and len(first["train"]) == 50 and len(first["test"]) == 10
    for row in first["train"] + first["test"]:
        a, b = operands(row)
        assert int(row["answer"]) == a * b


def test_no_test_problem_is_ever_in_any_training_set():
    test = {operands(r) for r in multiplication_word_problems(10, 48, seed=0)["test"]}
    for seed in range(5):
        train = {operands(r) for r in multiplication_word_problems(500, 0, seed=seed)["train"]}
        assert not test & train
    assert all(split_of(f"{min(a, b)}x{max(a, b)}") == "test" for a, b in test)
