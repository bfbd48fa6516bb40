"""What a reward may return, checked where it returns it: one finite number, or None, per completion.

TRL turns a reward's list into a tensor: a string ends in a traceback that does not name the reward, and NaN reads
as "no reward" without a word. `checking_values` wraps a reward so that any other value stops the run naming the
reward, the completion and the value (or, under `on_reward_error: none`, gives None for the batch and says so).
It also counts what the reward scored, so a reward that never scores is reported: once in the log, at its first
batch with no score at all, and in the end-of-run summary (`scoring_summary`).
"""

from __future__ import annotations

import functools
import inspect
import logging
import math
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)


class RewardValueError(ValueError):
    """A reward returned something other than one finite number or None per completion."""


def checked(name: str, values: Any, expected: int) -> None:
    """Raise `RewardValueError` unless `values` holds `expected` values, each a finite number or None."""
    if not isinstance(values, list | tuple) or (expected and len(values) != expected):
        size = f" of {len(values)}" if isinstance(values, list | tuple) else ""
        raise RewardValueError(
            f"reward `{name}` returned a {type(values).__name__}{size}: a reward returns a list with one value per "
            f"completion ({expected}), each a number or None"
        )
    for i, value in enumerate(values):
        if value is None:
            continue
        try:
            number = None if isinstance(value, str | bytes) else float(value)  # bool, int, NumPy, 0-d tensor
        except (TypeError, ValueError):
            number = None
        if number is None or not math.isfinite(number):
            raise RewardValueError(
                f"reward `{name}` returned {value!r} for completion {i}: a reward returns a finite number, or None "
                "where it cannot score"
            )


def checking_values(func: Callable) -> Callable:
    """`func`, its values checked (`checked`) and counted; applying it twice changes nothing."""
    if getattr(func, "values_checked", False):
        return func
    name = func.__name__
    counts = {"scored": 0, "returned": 0, "warned": 0}

    def check(values: Any, kwargs: dict[str, Any]) -> Any:
        checked(name, values, len(kwargs.get("completions") or kwargs.get("prompts") or []))
        scored = sum(value is not None for value in values)
        counts["scored"] += scored
        counts["returned"] += len(values)
        if values and not scored and not counts["warned"]:
            counts["warned"] = 1
            logger.warning("reward `%s` scored none of the %d completions of a batch (it returned None for each)",
                           name, len(values))  # fmt: skip
        return values

    def scoring_summary() -> str | None:
        if counts["returned"] == 0 or counts["scored"] > 0:
            return None
        return f"reward `{name}` never scored: it returned None for all {counts['returned']} completions"

    if inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(getattr(func, "__call__", None)):  # noqa: B004

        @functools.wraps(func)
        async def checking(*args: Any, **kwargs: Any) -> Any:
            return check(await func(*args, **kwargs), kwargs)

    else:

        @functools.wraps(func)
        def checking(*args: Any, **kwargs: Any) -> Any:
            return check(func(*args, **kwargs), kwargs)

    checking.__name__ = name
    checking.values_checked = True
    checking.scoring_summary = scoring_summary
    checking.needs_whole_groups = bool(getattr(func, "needs_whole_groups", False))
    return checking
