"""A calculator that pays a per-turn reward for each new correct intermediate value of a multi-step problem.

The task (`agentic_grpo.tasks.shop_word_problems`) lists the values a correct solution computes
(`values`); a calculator call whose result is one of them, computed for the first time in this
trajectory, earns `value_reward` for the turn that made it. Paid once per value, so repeating a
good call earns nothing. The state (for the `anchor` advantage) is the set of values verified so far.
"""

from __future__ import annotations

from typing import Any

from agentic_grpo.tools.calculator import Calculator


class StepwiseCalculator(Calculator):
    """Exact arithmetic; a new correct intermediate value pays the turn `value_reward`.

    Args:
        value_reward: the reward of a turn whose call produced a new correct intermediate value.
    """

    def __init__(self, value_reward: float = 0.5) -> None:
        super().__init__()
        self.value_reward = value_reward
        self.expected: set[str] = set()
        self.verified: list[str] = []

    def reset(self, row: dict[str, Any]) -> None:
        self.expected = {str(v) for v in row.get("values") or []}
        self.verified = []

    def calculator(self, expression: str) -> str:
        """Evaluate an arithmetic expression exactly.

        Args:
            expression: Numbers with + - * / // % ** and parentheses, e.g. "123 * 456".
        """
        result = super().calculator(expression)
        if result in self.expected and result not in self.verified:
            self.verified.append(result)
            self.pay(("value", result), self.value_reward)
        return result

    def state_hash(self) -> str:
        """The set of intermediate values verified so far: what the next step depends on."""
        return "|".join(sorted(self.verified))
