"""Rewards as they were before the audit existed, kept to prove the audit catches their holes."""

from __future__ import annotations

from typing import Any

from agentic_grpo.rewards.rules import normalize_answer


class MathVerifyCorrectness:
    """The Correctness of commit e9c1b72: normalized text, else whatever math-verify proves equal.

    math-verify evaluates arithmetic, so `Final Answer: 504 * 766` was paid as 386064.
    """

    __name__ = "correctness"
    required_columns = ("answer",)

    def __call__(self, prompts: list, completions: list, trajectory: list, answer: list, **_: Any) -> list[float]:
        return [float(self.matches(t.final_answer, gold)) for t, gold in zip(trajectory, answer, strict=True)]

    def matches(self, predicted: str | None, gold: Any) -> bool:
        if predicted is None or gold is None:
            return False
        if normalize_answer(predicted) == normalize_answer(str(gold)):
            return True
        from math_verify import parse, verify

        try:
            return bool(verify(parse(str(gold), parsing_timeout=5), parse(predicted, parsing_timeout=5)))
        except Exception:  # noqa: BLE001 - an unparsable answer is a wrong answer
            return False


def longer_is_better(prompts: list, completions: list, trajectory: list, **_: Any) -> list[float]:
    """A reward with a preference a policy can game: the more the model writes, the more it pays (up to 1)."""
    return [min(1.0, len(t.completion_ids) / 400) for t in trajectory]
