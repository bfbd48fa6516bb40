"""Environments written for TRL's `environment_factory`, run here unchanged.

TRL's contract (`GRPOTrainer(environment_factory=...)`, TRL 1.16): a plain class built with no arguments whose
public methods are the tools (type hints and Google-style docstrings, sync or async); `reset(**columns)` gets the
dataset row's columns and may return a string, which TRL appends to the last user message before generation; an
optional `get_reward()` scores the finished rollout from the environment's own state, and TRL adds it as a
reward of weight 1 named after the class.

This project's contract is `ToolEnvironment` (`reset(row)`, one instance per trajectory, the same tool
convention). `as_tool_environment(cls)` makes a TRL environment class into one:

- the same tools and schemas (the class's public methods but `reset`, `get_reward` and `close`); an async tool
  is run to completion in the tool's worker thread;
- `reset(row)` calls `reset(**row)`; a string it returns is appended to the trajectory's last user message
  (`reset_observation`, read by the rollout manager before the first turn);
- `get_reward()`, where defined, is read when the trajectory ends (`final_reward`, kept in
  `Trajectory.environment_reward`); the trainer adds the reward that pays it, with weight 1 and the class's name,
  as TRL does (`with_environment_reward`).

A recipe's `environment:` and the trainer's `environment_factory` take either contract: a class that does not
derive from `ToolEnvironment` and defines `reset` is taken as TRL's.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Callable
from typing import Any, ClassVar

from agentic_grpo.environment import RESERVED, ToolEnvironment

TRL_HOOKS = ("reset", "get_reward", "close")
"""Methods of a TRL environment that are not tools."""


def is_trl_environment(cls: Any) -> bool:
    """Whether `cls` (a class) is written to TRL's contract: it defines `reset` and does not derive from
    `ToolEnvironment`."""
    return (
        inspect.isclass(cls)
        and not issubclass(cls, ToolEnvironment)
        and inspect.isfunction(getattr(cls, "reset", None))
    )


class TRLEnvironment(ToolEnvironment):
    """A TRL environment (`wrapped`, a class) under the `ToolEnvironment` contract: one instance per trajectory."""

    wrapped: ClassVar[type]

    def __init__(self, instance: Any = None, **kwargs: Any) -> None:
        super().__init__()
        self.inner = instance if instance is not None else type(self).wrapped(**kwargs)
        self.reset_observation: str | None = None

    @classmethod
    def tools(cls) -> dict[str, Callable]:
        return {
            name: member
            for name, member in inspect.getmembers(cls.wrapped, predicate=inspect.isfunction)
            if not name.startswith("_") and name not in TRL_HOOKS
        }

    def __getattr__(self, name: str) -> Any:
        """A tool: the wrapped instance's method (an async one run to completion here, in the tool's thread)."""
        if name.startswith("_") or name not in type(self).tools():
            raise AttributeError(name)
        method = getattr(self.__dict__["inner"], name)
        if not inspect.iscoroutinefunction(method):
            return method

        @functools.wraps(method)
        def run(*args: Any, **kwargs: Any) -> Any:
            return asyncio.run(method(*args, **kwargs))

        return run

    def reset(self, row: dict[str, Any]) -> None:
        observation = self.inner.reset(**row)
        self.reset_observation = observation if isinstance(observation, str) and observation else None

    def final_reward(self) -> float | None:
        """The wrapped environment's `get_reward()` for the trajectory just ended (None where it defines none)."""
        get_reward = getattr(self.inner, "get_reward", None)
        if get_reward is None:
            return None
        value = get_reward()
        if inspect.isawaitable(value):
            value = asyncio.run(value)
        return None if value is None else float(value)

    def close(self) -> None:
        close = getattr(self.inner, "close", None)
        if callable(close):
            close()


@functools.cache
def as_tool_environment(cls: type) -> type[TRLEnvironment]:
    """The `ToolEnvironment` class that runs TRL environment class `cls`; raises ValueError on a tool whose name
    this contract reserves."""
    clash = sorted(name for name, _ in inspect.getmembers(cls, predicate=inspect.isfunction)
                   if name in RESERVED and name not in TRL_HOOKS)  # fmt: skip
    if clash:
        raise ValueError(f"`{cls.__name__}` has tools named {clash}, which this project's environments reserve: "
                         "rename them")  # fmt: skip
    return type(cls.__name__, (TRLEnvironment,), {"wrapped": cls, "__module__": cls.__module__,
                                                 "__doc__": cls.__doc__})  # fmt: skip


def tool_environment_factory(factory: Callable[[], Any]) -> Callable[[], ToolEnvironment]:
    """A factory of `ToolEnvironment`s from a factory of either contract (a TRL environment's instances are
    wrapped; the factory is probed once, as TRL probes it)."""
    probe = factory()
    if isinstance(probe, ToolEnvironment) or not is_trl_environment(type(probe)):
        return factory
    wrapper = as_tool_environment(type(probe))
    first = [probe]

    def build() -> ToolEnvironment:
        return wrapper(first.pop() if first else factory())

    build.environment_class = wrapper  # what the trainer reads the tools and the reward from
    return build


def environment_reward(name: str) -> Callable[..., list[float | None]]:
    """A reward function named `name` that pays each trajectory what its environment paid for it
    (`Trajectory.environment_reward`: a TRL environment's `get_reward()`), None where it paid nothing."""

    def reward(completions: list[Any], trajectory: list[Any] | None = None, **_: Any) -> list[float | None]:
        if trajectory is None:
            return [None] * len(completions)
        return [t.environment_reward for t in trajectory]

    reward.__name__ = reward.__qualname__ = name
    return reward


def with_environment_reward(environment_class: Any, reward_funcs: list[Callable], args: Any) -> list[Callable]:
    """`reward_funcs` plus, where the environment is a TRL one with `get_reward`, a reward named after its class
    with weight 1 (appended to `args.reward_weights` when those are set), as TRL adds it; unchanged where a reward
    of that name is already there."""
    wrapped = getattr(environment_class, "wrapped", None)
    if wrapped is None or not callable(getattr(wrapped, "get_reward", None)):
        return reward_funcs
    name = wrapped.__name__
    if name in [getattr(func, "__name__", None) for func in reward_funcs]:
        return reward_funcs
    weights = getattr(args, "reward_weights", None)
    if weights is not None and len(weights) == len(reward_funcs):
        args.reward_weights = [*weights, 1.0]
    return [*reward_funcs, environment_reward(name)]
