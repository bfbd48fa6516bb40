"""What a rollout needs from a recipe, built once: `RolloutParts` (the environment class, the format, the
budgets, the sandbox settings and the sub-agents), and the check of a recipe's environment class.

`agentic_grpo.run_parts.build_rollout_parts` builds them from a recipe; training, evaluation, the benchmarks
and the reward audit receive them.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agentic_grpo.environment import ToolEnvironment
from agentic_grpo.formats import TrajectoryFormat
from agentic_grpo.plugins import PluginError, import_object
from agentic_grpo.rollout import RolloutLimits, RolloutManager
from agentic_grpo.trl_environment import as_tool_environment, environment_per_row, is_trl_environment


def load_environment(path: str | dict | type, allow_no_tools: bool = False) -> type[ToolEnvironment]:
    """The environment class named by a recipe (or given), checked to be a `ToolEnvironment` with valid tool
    schemas; one without tools only when `allow_no_tools` (an agent whose tools are sub-agents, or none). A class
    written for TRL's `environment_factory` comes back wrapped (`agentic_grpo.trl_environment`); a mapping names
    MCP servers (`{mcp: ..., class: ...}`), whose tools join the class's, if any (`agentic_grpo.mcp_environment`)."""
    if isinstance(path, dict) and ROWS_KEY in path:
        return environments_of_rows(path)
    if isinstance(path, dict):
        from agentic_grpo.mcp_environment import environment_parts, with_mcp_servers

        python, servers = environment_parts(path)
        base = ToolEnvironment if python is None else load_environment(python, allow_no_tools=True)
        cls = with_mcp_servers(base, servers)  # starts each server once, to ask for its tools
        if not cls.tools() and not allow_no_tools:
            raise PluginError(f"environment `{path}` has no tools: its MCP servers offer none")
        return cls
    cls = path if isinstance(path, type) else import_object(path, what="environment")
    if is_trl_environment(cls):  # written for TRL's `environment_factory`: run under this contract
        cls = as_tool_environment(cls)
    if not (isinstance(cls, type) and issubclass(cls, ToolEnvironment)):
        raise PluginError(f"environment `{path}` is neither a subclass of agentic_grpo.ToolEnvironment nor an "
                          "environment written for TRL's `environment_factory` (a class with `reset`)")  # fmt: skip
    if not cls.tools() and not allow_no_tools:
        raise PluginError(f"environment `{path}` has no tools: add public methods with type hints and docstrings")
    check_reset(cls)
    try:
        cls.tool_schemas()
    except TypeError as exc:  # names the tool and the fix: one line, not transformers' chained traceback
        raise PluginError(str(exc)) from None
    return cls


ROWS_KEY = "rows"
"""`environment: {rows: {name: environment, ...}}`: each row's `environment` column names its environment."""


def environments_of_rows(value: dict[str, Any]) -> type[ToolEnvironment]:
    """The environment class of `environment: {rows: {name: environment}}` (each an import path or an MCP mapping):
    every trajectory runs the one its row names (`agentic_grpo.trl_environment.environment_per_row`)."""
    named = value[ROWS_KEY]
    if set(value) != {ROWS_KEY} or not isinstance(named, dict) or not named:
        raise PluginError(
            f"recipe field `environment`: `{ROWS_KEY}` maps each name a row's `environment` column may hold to an "
            "environment (an import path, or an MCP mapping), and stands alone"
        )
    classes = {str(name): load_environment(spec) for name, spec in named.items()}
    try:
        return environment_per_row(classes).environment_class
    except ValueError as exc:
        raise PluginError(f"recipe field `environment`: {exc}") from None


@dataclass
class RolloutParts:
    """What a rollout needs from a recipe (see `build_rollout_parts`)."""

    environment: type[ToolEnvironment]
    environment_kwargs: dict[str, Any]
    trajectory_format: TrajectoryFormat
    limits: RolloutLimits
    sandbox: Any = None
    """The `SandboxConfig` of code-running environments (None when the environment runs no code)."""
    environment_factory: Callable[[], ToolEnvironment] | None = field(default=None, repr=False)
    """Overrides `environment(**environment_kwargs)`, for user code that builds environments itself."""
    agents: list[Any] = field(default_factory=list)
    """Sub-agents the policy can call as tools (recipe field `subagents`: `agentic_grpo.subagents.SubAgent`),
    each with parts of its own."""

    @property
    def environment_builder(self) -> Callable[[], ToolEnvironment]:
        """What builds one environment per trajectory: the user's factory, or the recipe's class with its
        arguments."""
        return self.environment_factory or functools.partial(self.environment, **self.environment_kwargs)

    def sandbox_pool(self, rank: int = 0) -> Any:
        """A slot pool for this process (None when the environment runs no code)."""
        if self.sandbox is None:
            return None
        from agentic_grpo.sandbox import SandboxPool

        return SandboxPool(self.sandbox, rank=rank)

    def rollout_manager(self, tokenizer: Any, sandbox_pool: Any = None) -> RolloutManager:
        return RolloutManager(
            self.environment_builder, self.trajectory_format, tokenizer, self.limits, sandbox_pool, agents=self.agents
        )

    def all_agents(self) -> list[Any]:
        """Every sub-agent of the tree below these parts: children before their own sub-agents."""
        return [found for agent in self.agents for found in (agent, *agent.parts.all_agents())]


def check_reset(cls: type[ToolEnvironment]) -> None:
    """Refuse a `ToolEnvironment.reset` that cannot take the one argument the rollout gives it (the row)."""

    try:
        inspect.signature(cls.reset).bind(None, {})
    except TypeError:
        raise PluginError(
            f"`{cls.__name__}.reset{inspect.signature(cls.reset)}` cannot be called as `reset(row)`: a ToolEnvironment's "
            "`reset` takes the dataset row, one dict (`def reset(self, row: dict) -> None`, then `row['answer']`); a "
            "class written for TRL's `reset(**columns)` must not derive from ToolEnvironment (docs/trl_environments.md)"
        ) from None
