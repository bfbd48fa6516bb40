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

TRL's `environment_factory` may also be a mapping `{name: factory}`, each dataset row naming its environment in
the column `environment`, so one run mixes tasks. `environment_per_row(factories)` gives the trainer's factory for
it: each trajectory builds the environment its row names (either contract), with that environment's tools only (a
call to another's is an unknown tool); `add_prompts` describes to each row only its environment's tools. Each TRL
environment with `get_reward` adds a reward named after its class that pays its own trajectories (None for the
others: their groups have it nowhere, and TRL's sum skips it), as TRL does.
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


def tool_environment_factory(
    factory: Callable[[], Any] | dict[str, Callable[[], Any]],
) -> Callable[[], ToolEnvironment]:
    """A factory of `ToolEnvironment`s from a factory of either contract (a TRL environment's instances are
    wrapped; the factory is probed once, as TRL probes it), or from a mapping of named ones (`environment_per_row`)."""
    if isinstance(factory, dict):
        return environment_per_row(factory)
    probe = factory()
    if isinstance(probe, ToolEnvironment) or not is_trl_environment(type(probe)):
        return factory
    wrapper = as_tool_environment(type(probe))
    first = [probe]

    def build() -> ToolEnvironment:
        return wrapper(first.pop() if first else factory())

    build.environment_class = wrapper  # what the trainer reads the tools and the reward from
    return build


def environment_reward(name: str, rows_of: tuple[str, ...] | None = None) -> Callable[..., list[float | None]]:
    """A reward function named `name` that pays each trajectory what its environment paid for it
    (`Trajectory.environment_reward`: a TRL environment's `get_reward()`), None where it paid nothing; with
    `rows_of`, only trajectories whose row names one of those environments (`ENVIRONMENT_COLUMN`)."""

    def reward(completions: list[Any], trajectory: list[Any] | None = None, **columns: Any) -> list[float | None]:
        if trajectory is None:
            return [None] * len(completions)
        if rows_of is None:
            return [t.environment_reward for t in trajectory]
        names = columns.get(ENVIRONMENT_COLUMN) or [None] * len(trajectory)
        return [t.environment_reward if n in rows_of else None for t, n in zip(trajectory, names, strict=True)]

    reward.__name__ = reward.__qualname__ = name
    return reward


def with_environment_reward(environment_class: Any, reward_funcs: list[Callable], args: Any) -> list[Callable]:
    """`reward_funcs` plus, where the environment is a TRL one with `get_reward`, a reward named after its class
    with weight 1 (appended to `args.reward_weights` when those are set), as TRL adds it; unchanged where a reward
    of that name is already there."""
    per_row = getattr(environment_class, "classes", None)
    paying: dict[str, tuple[str, ...] | None] = {}  # reward name -> the environments whose rows it pays
    for env_name, cls in (per_row or {None: environment_class}).items():
        wrapped = getattr(cls, "wrapped", None)
        if wrapped is not None and callable(getattr(wrapped, "get_reward", None)):
            rows = (*(paying.get(wrapped.__name__) or ()), env_name) if per_row else None
            paying[wrapped.__name__] = rows
    known = [getattr(func, "__name__", None) for func in reward_funcs]
    added = [environment_reward(name, rows) for name, rows in paying.items() if name not in known]
    weights = getattr(args, "reward_weights", None)
    if added and weights is not None and len(weights) == len(reward_funcs):
        args.reward_weights = [*weights, *[1.0] * len(added)]
    return [*reward_funcs, *added]


ENVIRONMENT_COLUMN = "environment"
"""The column naming a row's environment when there are several (TRL's)."""


class EnvironmentOfRow(ToolEnvironment):
    """The environment a trajectory's row names, among `factories` (`environment_per_row`); it delegates every
    call to that environment, so only its tools run."""

    factories: ClassVar[dict[str, Callable[[], ToolEnvironment]]]
    classes: ClassVar[dict[str, type[ToolEnvironment]]]

    def __init__(self) -> None:
        super().__init__()
        self.inner: ToolEnvironment | None = None
        self.reset_observation: str | None = None

    @classmethod
    def tools(cls) -> dict[str, Callable]:
        """Every environment's tools (what the trajectory format may parse); each trajectory runs its own."""
        return {name: tool for env in cls.classes.values() for name, tool in env.tools().items()}

    def reset(self, row: dict[str, Any]) -> None:
        name = row.get(ENVIRONMENT_COLUMN)
        if name not in self.factories:
            raise ValueError(
                f"a row's `{ENVIRONMENT_COLUMN}` is {name!r}; the environments are {sorted(self.factories)}"
            )
        self.inner = self.factories[name]()
        if self.inner.needs_sandbox:
            self.inner.sandbox, self.inner.workspace = self.sandbox, self.workspace
        self.inner.reset(row)
        self.reset_observation = getattr(self.inner, "reset_observation", None)

    def execute(self, call: Any, timeout: float) -> Any:
        return self.inner.execute(call, timeout)

    def take_payments(self) -> list[tuple[str, float]]:
        return self.inner.take_payments() if self.inner is not None else []

    def state_hash(self) -> str | None:
        return self.inner.state_hash() if self.inner is not None else None

    def final_reward(self) -> float | None:
        final_reward = getattr(self.inner, "final_reward", None)
        return final_reward() if final_reward is not None else None

    def wait_idle(self, timeout: float) -> bool:
        return self.inner.wait_idle(timeout) if self.inner is not None else True

    def close(self) -> None:
        if self.inner is not None:
            self.inner.close()


def environment_per_row(factories: dict[str, Callable[[], Any]]) -> Callable[[], ToolEnvironment]:
    """The factory of `EnvironmentOfRow`s over named factories of either contract (each probed once, as TRL
    probes them); raises ValueError when two environments have tools of one name with different schemas."""
    if not factories:
        raise ValueError("environment_factory: the mapping of environments is empty")
    built = {name: tool_environment_factory(factory) for name, factory in factories.items()}
    classes = {}
    for name, make in built.items():
        cls = getattr(make, "environment_class", None)
        if cls is None:  # a factory of ToolEnvironments: its class, from an instance
            probe = make()
            cls = type(probe)
            probe.close()
        classes[name] = cls
    schemas: dict[str, tuple[str, dict]] = {}  # tool -> (first environment with it, its schema)
    for name, cls in classes.items():
        for schema in cls.tool_schemas():
            tool = schema["function"]["name"]
            first, seen = schemas.setdefault(tool, (name, schema))
            if seen != schema:  # the trajectory format reads a call's arguments by the tool's name
                raise ValueError(f"environments `{first}` and `{name}` both have a tool `{tool}`, with other "
                                 "arguments or descriptions: rename one")  # fmt: skip
    router = type("EnvironmentOfRow", (EnvironmentOfRow,), {
        "factories": built, "classes": classes, "needs_sandbox": any(c.needs_sandbox for c in classes.values()),
    })  # fmt: skip

    def build() -> ToolEnvironment:
        return router()

    build.environment_class = router
    return build
