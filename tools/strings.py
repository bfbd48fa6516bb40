"""String operations a small model cannot do in its head on unfamiliar words: reverse, length, vowel count."""

from __future__ import annotations

from agentic_grpo import ToolEnvironment

OPERATIONS = {
    "reverse": lambda text: text[::-1],
    "length": lambda text: str(len(text)),
    "count_vowels": lambda text: str(sum(c in "aeiouAEIOU" for c in text)),
    "uppercase": lambda text: text.upper(),
}


def apply(operation: str, text: str) -> str:
    """`operation` (one of `OPERATIONS`) applied to `text`; ValueError naming the operations otherwise."""
    key = operation.strip().lower().replace(" ", "_")
    if key not in OPERATIONS:
        raise ValueError(f"unknown operation `{operation}`; use one of {', '.join(OPERATIONS)}")
    return OPERATIONS[key](text)


class StringTools(ToolEnvironment):
    """Operations on text."""

    def string_tool(self, operation: str, text: str) -> str:
        """Apply a string operation to a word or text.

        Args:
            operation: One of "reverse", "length", "count_vowels", "uppercase".
            text: The text to work on, e.g. "qorvant".
        """
        return apply(operation, text)
