"""Rule-based rewards, each a small class a recipe names by import path.

Every reward follows TRL's contract: called with `prompts`, `completions` and the
dataset columns (plus `trajectory`, the rollout record) as lists, it returns one float
per completion, or None where it has nothing to say.
"""

from __future__ import annotations

import re
import threading
from typing import Any

from agentic_grpo.trajectory import Trajectory

_NUMBER = re.compile(r"^[-+]?\d+(?:\.\d+)?$")


def normalize_answer(text: str) -> str:
    """Lower-case, drop `$`, thousands separators, surrounding punctuation and an `answer is` lead-in."""
    text = str(text).strip().lower()
    text = re.sub(r"^(?:the\s+)?(?:final\s+)?answer\s*(?:is|:)\s*", "", text)
    text = text.replace("$", "").replace("\\boxed", "").strip("{}").strip()
    text = re.sub(r"(?<=\d),(?=\d{3}\b)", "", text)
    text = text.strip(" .。!*`'\"")
    if _NUMBER.match(text):
        number = float(text)
        return str(int(number)) if number.is_integer() else repr(number)
    return re.sub(r"\s+", " ", text)


class Correctness:
    """1.0 when the final answer matches the reference answer, else 0.0.

    Args:
        math_verify: also accept answers that `math-verify` proves equal (e.g. `1/2` and `0.5`).
    """

    __name__ = "correctness"
    required_columns = ("answer",)

    def __init__(self, math_verify: bool = True) -> None:
        self.math_verify = math_verify

    def __call__(self, prompts: list, completions: list, trajectory: list[Trajectory], answer: list, **_: Any):
        return [float(self.matches(t.final_answer, gold)) for t, gold in zip(trajectory, answer, strict=True)]

    def matches(self, predicted: str | None, gold: Any) -> bool:
        if predicted is None or gold is None:
            return False
        if normalize_answer(predicted) == normalize_answer(str(gold)):
            return True
        if not self.math_verify:
            return False
        from math_verify import parse, verify

        # math-verify's own timeout uses SIGALRM, which only the main thread may set.
        timeout = 5 if threading.current_thread() is threading.main_thread() else None
        try:
            return bool(
                verify(
                    parse(str(gold), parsing_timeout=timeout),
                    parse(predicted, parsing_timeout=timeout),
                    timeout_seconds=timeout,
                )
            )
        except Exception:  # noqa: BLE001 - an unparsable answer is a wrong answer
            return False


class FormatAdherence:
    """Share of turns the format could parse, and 0 without a final answer.

    1.0 for a trajectory whose every turn parsed and that ended with a final answer.
    """

    __name__ = "format"

    def __call__(self, prompts: list, completions: list, trajectory: list[Trajectory], **_: Any):
        scores = []
        for t in trajectory:
            if t.final_answer is None or t.turns == 0:
                scores.append(0.0)
            else:
                scores.append((t.turns - t.malformed_turns) / t.turns)
        return scores


class ToolSuccess:
    """Share of tool calls that ran without error; None for trajectories that called no tool."""

    __name__ = "tool_success"

    def __call__(self, prompts: list, completions: list, trajectory: list[Trajectory], **_: Any):
        return [
            sum(result.ok for _, result in t.tool_calls) / len(t.tool_calls) if t.tool_calls else None
            for t in trajectory
        ]


class LengthPenalty:
    """A penalty, from 0 down to -1, for model tokens beyond `free_tokens`, reaching -1 at `max_tokens`.

    Args:
        free_tokens: model-written tokens that cost nothing.
        max_tokens: model-written tokens at which the penalty is -1.
    """

    __name__ = "length_penalty"

    def __init__(self, free_tokens: int = 256, max_tokens: int = 1024) -> None:
        if not 0 <= free_tokens < max_tokens:
            raise ValueError("LengthPenalty needs 0 <= free_tokens < max_tokens")
        self.free_tokens, self.max_tokens = free_tokens, max_tokens

    def __call__(self, prompts: list, completions: list, trajectory: list[Trajectory], **_: Any):
        scores = []
        for t in trajectory:
            written = sum(t.loss_mask)
            over = max(0, written - self.free_tokens) / (self.max_tokens - self.free_tokens)
            scores.append(-min(1.0, over))
        return scores
