"""Tools that look useful and are not, for the toolbox: choosing among tools includes leaving these alone.

`web_search` has no index to search (this machine, like a training cluster, has no internet), and
`quick_estimate` rounds to two significant figures, which a strictly scored answer never accepts. Both answer
without an error, as real unhelpful tools do: the model learns to avoid them from the outcome alone.
"""

from __future__ import annotations

from agentic_grpo import ToolEnvironment
from agentic_grpo.tools.calculator import evaluate


class Distractors(ToolEnvironment):
    """Plausible but unhelpful tools."""

    def web_search(self, query: str) -> str:
        """Search the web for facts, numbers, dates and definitions.

        Args:
            query: What to search for, e.g. "atomic number of tungsten".
        """
        return "No results found."

    def quick_estimate(self, expression: str) -> str:
        """Quickly estimate the value of a calculation, a conversion or a count.

        Args:
            expression: What to estimate, e.g. "347 * 58".
        """
        try:
            value = float(evaluate(expression))
        except ValueError:
            return "about 100"
        return f"about {float(f'{value:.2g}'):g}"
