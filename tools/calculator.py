"""A calculator tool: arithmetic evaluated by walking the AST, never `eval`.

Only numbers, + - * / // % ** and parentheses are accepted; exponents and results are
bounded so a hostile expression cannot hang or exhaust the trainer's memory.
"""

from __future__ import annotations

import ast
import operator

from agentic_grpo import ToolEnvironment

_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
MAX_EXPONENT = 100
MAX_DIGITS = 1000


def evaluate(expression: str) -> int | float:
    """The value of an arithmetic expression; ValueError for anything else."""
    expression = expression.replace("×", "*").replace("÷", "/").replace("^", "**").replace(",", "")
    if len(expression) > 500:
        raise ValueError("expression is too long")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise ValueError(f"not an arithmetic expression: {expression!r}") from None
    return _walk(tree.body)


def _walk(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_walk(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _walk(node.left), _walk(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise ValueError(f"exponent {right} is too large (at most {MAX_EXPONENT})")
        if isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)) and right == 0:
            raise ValueError("division by zero")
        value = _BINARY[type(node.op)](left, right)
        if isinstance(value, int) and abs(value) >= 10**MAX_DIGITS:
            raise ValueError("result is too large")
        return value
    raise ValueError(f"unsupported element `{type(node).__name__}`: use numbers, + - * / // % ** and parentheses")


class Calculator(ToolEnvironment):
    """Exact arithmetic."""

    def calculator(self, expression: str) -> str:
        """Evaluate an arithmetic expression exactly.

        Args:
            expression: Numbers with + - * / // % ** and parentheses, e.g. "123 * 456".
        """
        value = evaluate(expression)
        if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
            value = int(value)
        return str(value)
