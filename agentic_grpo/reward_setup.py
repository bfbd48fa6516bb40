"""A recipe's `rewards:` list turned into TRL reward functions, checked at start-up.

TRL calls each reward as `func(prompts=..., completions=..., completion_ids=..., **columns)`
and only then finds out that a parameter has no column, or that a recipe option was
misspelled. Here every entry is checked before the model loads: its options against the
constructor (with "did you mean"), its required parameters against the data's columns.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable
from typing import Any

import torch

from agentic_grpo.advantages import checking_values
from agentic_grpo.plugins import PluginError, check_options, import_object

logger = logging.getLogger(__name__)

# What TRL (and our rollout) pass every reward besides the dataset's columns.
PASSED_BY_TRAINER = {
    "prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric", "trajectory",
}  # fmt: skip
ENTRY_KEYS = ("type", "weight", "name")


def build_rewards(specs: Any) -> tuple[list[Callable], list[float]]:
    """Reward callables and their weights from a recipe's `rewards:` list."""
    if not specs:
        raise ValueError(
            "recipe field `rewards` is empty: name at least one, e.g. `{type: agentic_grpo.rewards.rules:Correctness}`"
        )
    if not isinstance(specs, list):
        raise ValueError(f"recipe field `rewards` must be a list of `{{type: module:Class, weight: w, ...}}`, got "
                         f"{specs!r:.120}")  # fmt: skip
    funcs, weights, names = [], [], set()
    for position, spec in enumerate(specs):
        if not isinstance(spec, dict) or "type" not in spec:
            raise ValueError(f"reward #{position + 1} must be a mapping with a `type` key, got {spec!r}")
        spec = dict(spec)
        path, weight, name = spec.pop("type"), spec.pop("weight", 1.0), spec.pop("name", None)
        if not isinstance(weight, (int, float)) or isinstance(weight, bool):
            raise ValueError(f"reward `{path}`: weight must be a number, got {weight!r}")
        target = import_object(path, what="reward")
        if not isinstance(target, type) and spec:
            raise PluginError(
                f"reward `{path}` is a function and takes no options; got {sorted(spec)} "
                f"(an entry's own keys are {', '.join(ENTRY_KEYS)})"
            )
        if isinstance(target, type):
            check_options(target, spec, f"reward `{path}`", extra=ENTRY_KEYS)
        try:
            func = target(**spec) if isinstance(target, type) else target
        except (TypeError, ValueError, OSError) as exc:
            raise PluginError(f"reward `{path}`: {exc}") from exc
        if not callable(func):
            raise PluginError(f"reward `{path}` is not callable")
        name = name or getattr(func, "__name__", None) or type(func).__name__
        if name in names:
            raise ValueError(f"two rewards are named `{name}`: give each a distinct `name`")
        names.add(name)
        if isinstance(target, type):
            func.__name__ = name
        funcs.append(func)
        weights.append(float(weight))
    return funcs, weights


def required_columns(func: Callable) -> list[str]:
    """Dataset columns a reward needs: its `required_columns`, and parameters without a default."""
    needed = set(getattr(func, "required_columns", ()))
    call = func if inspect.isfunction(func) or inspect.ismethod(func) else getattr(func, "__call__", func)  # noqa: B004
    try:
        parameters = inspect.signature(call).parameters.values()
    except (TypeError, ValueError):
        return sorted(needed)
    for p in parameters:
        if p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            needed.add(p.name)
    return sorted(needed - PASSED_BY_TRAINER)


def check_reward_columns(rewards: list[Callable], columns: list[str], where: str) -> None:
    """Fail at start-up, naming the reward and the column, when a reward needs a column the data lacks."""
    for func in rewards:
        missing = [c for c in required_columns(func) if c not in columns]
        if missing:
            raise ValueError(
                f"reward `{func.__name__}` needs column(s) {missing}, which the {where} lacks (it has {columns}); "
                "add them to the data, or give the parameter a default"
            )


def guard_rewards(rewards: list[Callable], on_reward_error: str) -> list[Callable]:
    """The rewards, each with its values checked (`agentic_grpo.advantages`), as the recipe field
    `on_reward_error` wants them: raising for `raise`, each returning None for a batch it raises on (a bad value
    included) for `none`. Guarding twice changes nothing (the CLI and the trainer both call it)."""
    guarded = []
    for reward in rewards:
        if getattr(reward, "none_on_error", False) or isinstance(reward, str | torch.nn.Module):
            guarded.append(reward)  # guarded already, or a reward model TRL scores itself
        elif on_reward_error == "raise":
            guarded.append(checking_values(reward))
        else:
            guarded.append(returning_none_on_error(checking_values(reward)))
    return guarded


def check_reward_values_present(rewards: list[Callable], rows: Any, where: str) -> None:
    """Fail at start-up, naming the reward, the column and the row, when a row has no value (None) in a column a
    reward needs: the reward would score against a gold answer of None."""
    for func in rewards:
        for column in required_columns(func):
            empty = [i for i, value in enumerate(rows[column]) if value is None]
            if empty:
                first = {k: v for k, v in rows[empty[0]].items() if k != "prompt"} if hasattr(rows, "features") else {}
                shown = f": {str(first)[:160]}" if first else ""
                raise ValueError(
                    f"reward `{func.__name__}` needs column `{column}`, which is empty in {len(empty)} row(s) of the "
                    f"{where} (the first{shown}): fill them, or drop those rows"
                )


def returning_none_on_error(func: Callable) -> Callable:
    """`func`, but a raised exception is logged and the batch gets `None` (no reward) instead; the wrapper's
    `errors` counts them and its `error_summary()` is a line for the end-of-run summary."""
    failures: list[str] = []

    def fallback(exc: Exception, kwargs: dict[str, Any]) -> list[None]:
        logger.error("reward `%s` raised %s: %s; it gives None for this batch", func.__name__, type(exc).__name__, exc)
        failures.append(f"{type(exc).__name__}: {exc}")
        return [None] * len(kwargs.get("completions") or kwargs.get("prompts") or [])

    def error_summary() -> str | None:
        if not failures:
            return None
        return (f"reward `{func.__name__}` raised in {len(failures)} batch(es), which got no `{func.__name__}` "
                f"reward (`on_reward_error: none`); the first: {failures[0]}")  # fmt: skip

    if inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(getattr(func, "__call__", None)):  # noqa: B004

        @functools.wraps(func)
        async def guarded_async(*args: Any, **kwargs: Any) -> list:
            try:
                return await func(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - the recipe asked for None instead of a crash
                return fallback(exc, kwargs)

        guarded_async.error_summary = error_summary
        return _marked(guarded_async, func)

    @functools.wraps(func)
    def guarded(*args: Any, **kwargs: Any) -> list:
        try:
            return func(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - the recipe asked for None instead of a crash
            return fallback(exc, kwargs)

    guarded.error_summary = error_summary
    return _marked(guarded, func)


def score_trajectories(
    rewards: list, trajectories: list[Any], rows: list[dict[str, Any]]
) -> dict[str, list[float | None]]:
    """Every reward's score of every trajectory (None where a reward gave none), called as TRL calls the recipe's
    rewards: prompts, completions, completion ids, `trajectory=` and each row's columns (a column some row lacks
    is None there); async rewards awaited. The one way rewards are called outside TRL's own step (evaluation,
    the reward audit, co-trained roles)."""
    import asyncio

    columns = {key: [row.get(key) for row in rows] for key in {k: None for row in rows for k in row}}
    inputs = {
        "prompts": [t.prompt for t in trajectories],
        "completions": [[{"role": "assistant", "content": t.completion_text}] for t in trajectories],
        "completion_ids": [t.completion_ids for t in trajectories],
        "trajectory": trajectories,
        **columns,
    }
    scores = {}
    for func in rewards:
        values = func(**inputs)
        if inspect.isawaitable(values):
            values = asyncio.run(values)
        scores[func.__name__] = [None if v is None else float(v) for v in values]
    return scores


def _marked(guarded: Callable, func: Callable) -> Callable:
    """The wrapper named as `func` and carrying what the trainer's start-up checks read from it: a group-mode
    judge's `needs_whole_groups` is a property of its class, which `functools.wraps` does not copy."""
    guarded.__name__ = func.__name__
    guarded.none_on_error = True
    guarded.needs_whole_groups = bool(getattr(func, "needs_whole_groups", False))
    return guarded
