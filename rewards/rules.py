"""Rule-based rewards, each a small class a recipe names by import path.

Every reward follows TRL's contract: called with `prompts`, `completions` and the
dataset columns (plus `trajectory`, the rollout record) as lists, it returns one float
per completion, or None where it has nothing to say.
"""

from __future__ import annotations

import re
import threading
from decimal import Decimal, InvalidOperation
from typing import Any

from agentic_grpo.trajectory import Trajectory

_NUMBER = re.compile(r"^[-+]?\d+(?:\.\d+)?$")
# A number as a final answer may carry a `$`, thousands commas, a `%`, up to three unit words and a
# trailing period ("$1,234.", "386064 pens", "12 square meters"); nothing else, and no operator.
_PLAIN_NUMBER = re.compile(
    r"^\$?\s*(?P<number>[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?)\s*%?"
    r"(?:\s+(?P<words>[A-Za-z]+(?:[- ][A-Za-z]+){0,2}))?\s*[.!]?$"
)
# Words after a number that hedge, negate or add to it: "386064 or more", "386064 is wrong" state no answer.
_NOT_UNITS = frozenset(
    "or and not no nor is isnt was are were be wrong incorrect false true correct right more less fewer than "
    "over under about approximately approx around roughly nearly almost maybe perhaps possibly probably likely "
    "guess at least most plus minus times divided by to of if but else either then so ish".split()
)  # fmt: skip
# Arithmetic written out, by kind: `504 * 766`, `1 - 1/2`, `\frac{1}{2}`, `3 \times 4`, `2^{10}`, `\sqrt{2}`.
_OPERATOR_KINDS = {
    "+": re.compile(r"(?<=[\w)}\].])\s*\+\s*(?=[\w({\[\\.])"),
    "-": re.compile(r"(?<=[\w)}\].])\s*-\s*(?=[\w({\[\\.])"),
    "*": re.compile(r"(?<=[\w)}\].])\s*(?:\*(?!\*)|×|·|\\times|\\cdot)\s*(?=[\w({\[\\.])"),
    "/": re.compile(r"(?<=[\w)}\].])\s*(?:/|÷|\\div)\s*(?=[\w({\[\\.])|\\d?frac"),
    "^": re.compile(r"(?<=[\w)}\].])\s*(?:\^|\*\*)\s*(?=[\w({\[\\.])"),
    "sqrt": re.compile(r"\\sqrt"),
}


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


def plain_number(text: str) -> Decimal | None:
    """The number a final answer states, when the answer is a number and nothing more, else None.

    "386,064", "$386064.", "386064 pens" and "The answer is 386064" state 386064;
    "504 * 766", "386064 or 386065", "about 386064" and a number buried in prose state none.
    """
    text = str(text).strip().strip("*`'\" ")
    text = re.sub(r"^(?:the\s+)?(?:final\s+)?answer\s*(?:is|:)\s*", "", text, flags=re.IGNORECASE)
    boxed = re.fullmatch(r"\$*\s*\\boxed\{(.*)\}\s*\$*", text)
    text = (boxed.group(1) if boxed else text).strip().strip("$").strip()
    found = _PLAIN_NUMBER.match(text)
    if not found or any(word in _NOT_UNITS for word in re.split(r"[- ]", (found["words"] or "").lower())):
        return None
    try:
        return Decimal(found["number"].replace(",", ""))
    except InvalidOperation:
        return None


def arithmetic_operators(text: str) -> dict[str, int]:
    """How many arithmetic operations of each kind `text` writes out (`1/2`: one `/`; `504 * 766 + 1`: one `*`
    and one `+`; `-5`: none). `\\frac` counts as `/`, `**` as `^`."""
    return {kind: len(pattern.findall(str(text))) for kind, pattern in _OPERATOR_KINDS.items()}


def writes_more_arithmetic(answer: str, reference: str) -> bool:
    """True when the answer writes out an operation the reference does not (by kind and count): math-verify would
    then evaluate the model's arithmetic (`0.25+0.25` for `\\frac{1}{2}`), which restates instead of answering."""
    reference_counts = arithmetic_operators(reference)
    return any(n > reference_counts[kind] for kind, n in arithmetic_operators(answer).items())


class Correctness:
    """1.0 when the final answer matches the reference answer, else 0.0.

    A numeric reference (`386064`, `0.5`) is matched only by a final answer that is that
    number: commas, `$`, a unit word or a trailing period are fine, arithmetic is not
    (`504 * 766` restates the question; it does not answer it). Other references
    (`\\frac{1}{2}`, `x^2 + 1`) match on normalized text, then through math-verify, and
    only when the answer writes out no operation the reference does not (by kind and count).

    Args:
        math_verify: let `math-verify` prove a symbolic answer equal to a symbolic reference
            (e.g. `0.5` or `2/4` for `\\frac{1}{2}`). Numeric references never go through it.
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
        gold_number = plain_number(str(gold))
        if gold_number is not None:
            stated = plain_number(predicted)
            return stated is not None and stated == gold_number
        if normalize_answer(predicted) == normalize_answer(str(gold)):
            return True
        if not self.math_verify or writes_more_arithmetic(predicted, str(gold)):
            return False  # math-verify would evaluate the model's arithmetic: `1 - 1/2` is not an answer
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
