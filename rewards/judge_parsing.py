"""Reading a score out of whatever a judge model wrote.

Judge models, small ones especially, wrap their verdict in prose, code fences, half-valid
JSON or a "Score: 7/10" line. We try the structured reading first (a JSON object or list
anywhere in the text), then a labelled number, and only then give up: a guessed score
would be noise in the advantage, while None is left out of it by TRL. Every score is
normalised from the rubric's scale to [0, 1]; a number outside the scale is a parse
failure, not something to clamp. `score_schema` is the same verdict as a JSON schema, for
servers that can constrain their output to one.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

_NUMBER = r"[-+]?\d+(?:\.\d+)?"
# "Score: 7", "score = 7/10", "**Rating**: 0.8", "final score is 9 out of 10"
_LABELLED = re.compile(
    rf"(?:score|rating|grade|reward)\W{{0,6}}(?:is\W{{0,3}})?(?P<value>{_NUMBER})"
    rf"(?:\s*(?:/|out\s+of)\s*(?P<denominator>{_NUMBER}))?",
    re.IGNORECASE,
)
# "Attempt 2: 7", "Trajectory 2: 7", "trajectory #3 - score: 4/10", "[1] 6"
_GROUP_LINE = re.compile(
    rf"(?:attempt|trajectory|candidate|response|answer|#|\[)\s*#?\s*(?P<index>\d+)\]?\s*[:=\-)]*\s*"
    rf"(?:\**\s*(?:score|rating)?\s*\**\s*[:=]?\s*)(?P<value>{_NUMBER})(?:\s*(?:/|out\s+of)\s*(?P<denominator>{_NUMBER}))?",
    re.IGNORECASE,
)
_SCORE_KEYS = ("score", "rating", "grade", "reward")


def normalise(value: float, low: float, high: float, denominator: float | None = None) -> float | None:
    """Map `value` from [low, high] (or [0, denominator] for "7/10") to [0, 1]; None when outside."""
    if denominator is not None:
        if denominator <= 0:
            return None
        low, high = 0.0, denominator
    if not math.isfinite(value) or value < low or value > high:
        return None
    return (value - low) / (high - low)


def parse_score(text: str, low: float = 0.0, high: float = 10.0) -> float | None:
    """The judge's score for one trajectory, normalised to [0, 1], or None when there is none."""
    # The last verdict wins: judges reason first ("a score of 3 would be harsh") and conclude last.
    for obj in reversed(_json_candidates(text)):
        value = _score_of(obj)
        if value is not None:
            return normalise(value, low, high)
    labelled = list(_LABELLED.finditer(text))
    if labelled:
        match = labelled[-1]
        return normalise(float(match["value"]), low, high, _float_or_none(match["denominator"]))
    return None


def parse_group_scores(text: str, n: int, low: float = 0.0, high: float = 10.0) -> list[float | None]:
    """One normalised score per trajectory 1..n; None for each the judge did not (validly) score.

    Accepted shapes, in order: `{"scores": [..]}`, a bare JSON list of numbers, a list of
    `{"id"/"trajectory": i, "score": s}` objects, a `{"1": s, "2": s}` mapping, then lines
    such as `Trajectory 2: 7` or `[2] score 7/10`.
    """
    for obj in reversed(_json_candidates(text)):
        scores = _group_scores_of(obj, n)
        if scores is not None:
            return [None if s is None else normalise(s, low, high) for s in scores]
    found: dict[int, float | None] = {}
    for match in _GROUP_LINE.finditer(text):
        index = int(match["index"])
        if 1 <= index <= n and index not in found:
            found[index] = normalise(float(match["value"]), low, high, _float_or_none(match["denominator"]))
    return [found.get(i) for i in range(1, n + 1)]


def _json_candidates(text: str) -> list[Any]:
    """Every JSON object or list that decodes somewhere in `text`, outermost first."""
    decoder = json.JSONDecoder()
    found, position = [], 0
    while True:
        starts = [i for i in (text.find("{", position), text.find("[", position)) if i >= 0]
        if not starts:
            return found
        start = min(starts)
        try:
            obj, end = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            position = start + 1
            continue
        found.append(obj)
        position = end


def _score_of(obj: Any) -> float | None:
    if isinstance(obj, dict):
        for key, value in obj.items():
            if str(key).lower() in _SCORE_KEYS:
                return _as_float(value)
    return None


def _group_scores_of(obj: Any, n: int) -> list[float | None] | None:
    if isinstance(obj, dict):
        for key, value in obj.items():
            if str(key).lower() in ("scores", "ratings", "grades") and isinstance(value, (list, dict)):
                return _group_scores_of(value, n)
        by_index = {_as_int(k): _score_of(v) if isinstance(v, dict) else _as_float(v) for k, v in obj.items()}
        if any(i is not None and 1 <= i <= n for i in by_index):
            return [by_index.get(i) for i in range(1, n + 1)]
        return None
    if isinstance(obj, list) and obj:
        if all(isinstance(v, dict) for v in obj):
            by_index = {}
            for position, item in enumerate(obj, start=1):
                index = next((_as_int(item[k]) for k in ("id", "index", "trajectory") if k in item), position)
                by_index.setdefault(index, _score_of(item))
            return [by_index.get(i) for i in range(1, n + 1)]
        if all(_as_float(v) is not None for v in obj):
            return [_as_float(obj[i]) if i < len(obj) else None for i in range(n)]
    return None


def _as_float(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        match = re.fullmatch(rf"\s*({_NUMBER})\s*", value)
        return float(match[1]) if match else None
    return None


def _as_int(value: Any) -> int | None:
    number = _as_float(value)
    return int(number) if number is not None and number == int(number) else None


def _float_or_none(text: str | None) -> float | None:
    return None if text is None else float(text)


def score_schema(mode: str, n: int, low: float, high: float) -> dict:
    """The JSON schema of a verdict: `{"score": s}`, or `{"scores": [s1, ..., sn]}` in group mode.

    An integer scale of up to 100 steps is an enum (every grammar engine supports it); otherwise a number with
    bounds. A short optional `reason` follows the score, so a reply cut at `max_tokens` still holds the score.
    """
    if low.is_integer() and high.is_integer() and high - low <= 100:
        score: dict = {"type": "integer", "enum": list(range(int(low), int(high) + 1))}
    else:
        score = {"type": "number", "minimum": low, "maximum": high}
    reason = {"type": "string", "maxLength": 200}
    if mode == "group":
        scores = {"type": "array", "items": score, "minItems": n, "maxItems": n}
        return {"type": "object", "properties": {"scores": scores, "reason": reason}, "required": ["scores"]}
    return {"type": "object", "properties": {"score": score, "reason": reason}, "required": ["score"]}
