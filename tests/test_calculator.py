"""The calculator evaluates arithmetic by AST and refuses everything else."""

import pytest

from agentic_grpo.tools.calculator import Calculator, evaluate
from agentic_grpo.trajectory import ToolCall


@pytest.mark.parametrize(
    ("expression", "value"),
    [("123 * 456", 56088), ("2 ** 10", 1024), ("(1 + 2) * -3", -9), ("7 / 2", 3.5), ("1,234 × 2", 2468), ("2^3", 8)],
)
def test_arithmetic(expression, value):
    assert evaluate(expression) == value


@pytest.mark.parametrize(
    "expression",
    ["__import__('os').system('id')", "open('/etc/passwd')", "x + 1", "[1] * 3", "1 if 1 else 2", "9 ** 9 ** 9",
     "1 / 0", "lambda: 1"],
)  # fmt: skip
def test_anything_but_arithmetic_is_refused(expression):
    with pytest.raises(ValueError):
        evaluate(expression)


def test_tool_returns_integers_without_decimal_point_and_errors_as_observations():
    env = Calculator()
    assert env.execute(ToolCall("calculator", {"expression": "6 / 3"}), 5).output == "2"
    result = env.execute(ToolCall("calculator", {"expression": "import os"}), 5)
    assert not result.ok and result.output.startswith("Error: ValueError")
