"""A recipe, built once into what a run needs: `build_recipe`.

`build_recipe` reads a recipe and builds its rollout side (`RolloutParts`: the environment,
the format, the budgets, the sandbox), its rewards with their weights, and its data, and runs
every check that does not need the model (options, columns, weights). Training
(`agentic_grpo.train.prepare`), evaluation (`agentic-grpo eval`, `eval_before_after`), the
benchmarks and the reward audit all start from it; none of them rebuilds a part on its own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

from agentic_grpo.formats import load_format
from agentic_grpo.plugins import PluginError, check_options
from agentic_grpo.rollout import RolloutLimits
from agentic_grpo.rollout_parts import RolloutParts, load_environment


@dataclass
class BuiltRecipe:
    """A recipe turned into what a run needs, once (`build_recipe`)."""

    recipe: Any
    """The `RecipeArguments` (data and reward specs)."""
    config: Any
    """The `AgenticGRPOConfig`; its `reward_weights` are the rewards' weights."""
    model_config: Any
    """TRL's `ModelConfig` (model path, dtype, LoRA)."""
    rollout_parts: RolloutParts
    rewards: list[Callable]
    """Reward functions, in recipe order; with `on_reward_error: none` each gives None when it raises."""
    train: Any = None
    """The training `Dataset` (None when built with `load_data=False`)."""
    test: Any = None
    """The held-out `Dataset`, or None when the recipe has no test split."""


def build_recipe(argv: list[str], load_data: bool = True, reward_specs: list[dict] | None = None) -> BuiltRecipe:
    """Read a recipe (`--config PATH_OR_NAME` plus overrides) and build its parts, rewards and data, checked.

    `reward_specs` replaces the recipe's `rewards:` list (the reward audit points judges at another endpoint).

    Raises ValueError (or `PluginError`, a ValueError) with one message naming what is wrong, before any
    model is loaded: an unknown field or option, a plug-in that does not import, a column a reward needs.
    """
    from agentic_grpo.config import read_recipe
    from agentic_grpo.data import check_columns, load_task_data, with_training_seed
    from agentic_grpo.reward_setup import (
        build_rewards,
        check_reward_columns,
        check_reward_values_present,
        guard_rewards,
    )

    recipe, config, model_config = read_recipe(argv)
    parts = build_rollout_parts(config)
    rewards, weights = build_rewards(recipe.rewards if reward_specs is None else reward_specs)
    if config.reward_weights is not None and len(config.reward_weights) != len(rewards):
        raise ValueError(f"`reward_weights` has {len(config.reward_weights)} values for {len(rewards)} rewards")
    config.reward_weights = weights
    built = BuiltRecipe(recipe, config, model_config, parts, guard_rewards(rewards, config.on_reward_error))
    if load_data:
        # The training seed is decided here, once, so the run can record it (run.json) and a resume reuse it.
        resume = getattr(config, "resume_from_checkpoint", None)
        if isinstance(resume, str) and resume.lower() in ("last", "true"):
            resume = config.output_dir
        recipe.dataset = with_training_seed(recipe.dataset, resume or None)
        built.train, built.test = load_task_data(recipe.dataset)
        for where, rows in (("training data", built.train), ("test data", built.test)):
            if rows is not None:
                check_columns(rows, ["question"], where)
                check_reward_columns(rewards, rows.column_names, where)
                check_reward_values_present(rewards, rows, where)
    return built


def build_rollout_parts(config: Any, tools_required: bool = True, environment: type | None = None) -> RolloutParts:
    """The rollout side of a recipe's `AgenticGRPOConfig` (sub-agents included); raises ValueError naming what is
    wrong. `tools_required=False` for a sub-agent, which may be a model that only answers; `environment`: a class
    instead of the recipe's (the trainer's `environment_factory`)."""
    agents: list[Any] = []
    if getattr(config, "subagents", None):  # the sub-agent package loads only for a recipe that has sub-agents
        from agentic_grpo.subagents.spec import build_subagents

        agents = build_subagents(config.subagents, config, build_rollout_parts)
    environment = load_environment(environment or config.environment, allow_no_tools=True)
    kwargs = dict(config.environment_kwargs or {})
    check_options(getattr(environment, "wrapped", environment), kwargs,
                  f"environment `{config.environment}` (recipe field `environment_kwargs`)")  # fmt: skip
    clash = sorted(set(environment.tools()) & {a.name for a in agents})
    if clash:
        raise PluginError(f"sub-agent name(s) {clash} are also tools of `{config.environment}`: rename the sub-agent")
    schemas = environment.tool_schemas() + [agent.tool_schema() for agent in agents]
    if not schemas and tools_required:
        raise PluginError(f"environment `{config.environment}` has no tools: add public methods with type hints and "
                          "docstrings, or sub-agents (recipe field `subagents`)")  # fmt: skip
    format_kwargs = dict(config.format_kwargs or {})
    try:
        trajectory_format = load_format(config.format, schemas, **format_kwargs)
    except ValueError:
        from agentic_grpo.experimental import ExperimentalConfig  # only to point a misplaced option to its key

        misplaced = sorted(set(format_kwargs) & {f.name for f in fields(ExperimentalConfig)})
        if misplaced:
            raise PluginError(f"format_kwargs {misplaced} are experimental options: set them under `experimental:` "
                              "(agentic_grpo.experimental)") from None  # fmt: skip
        raise
    if getattr(config, "experimental", None):  # the experimental package loads only for a recipe that uses it
        from agentic_grpo.experimental import ExperimentalConfig
        from agentic_grpo.experimental.action_slot import tune_action_slot

        tune_action_slot(trajectory_format, ExperimentalConfig.from_recipe(config.experimental))
    sandbox = None
    if environment.needs_sandbox or any(a.parts.sandbox is not None for a in agents):
        from agentic_grpo.sandbox.config import SandboxConfig

        # The sandbox owns the deadline of code tools: `tool_timeout` is its per-command limit.
        sandbox = SandboxConfig(timeout_s=config.tool_timeout, **config.sandbox)
    return RolloutParts(
        environment, kwargs, trajectory_format, RolloutLimits.from_config(config), sandbox, agents=agents
    )
