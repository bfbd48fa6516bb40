"""Recipe configuration: TRL's `GRPOConfig` plus the fields of multi-turn tool use.

A recipe is one YAML file read by TRL's `TrlParser` into three dataclasses:
`RecipeArguments` (data and rewards), `AgenticGRPOConfig` (training and rollout) and
TRL's `ModelConfig` (model, dtype, LoRA). Every key is a documented field; an unknown
key stops the run at start-up with a suggestion (`read_recipe`).
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import sys
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import torch
import yaml
from trl import GRPOConfig, ModelConfig, TrlParser

from agentic_grpo.resources import find_shipped
from agentic_grpo.sandbox.config import SandboxConfig

# The sandbox owns the defaults of its budgets; the recipe's `sandbox` setting overrides them by name.
_SANDBOX_DEFAULTS = SandboxConfig.__dataclass_fields__
SANDBOX_LIMITS = ("memory_mb", "workspace_mb", "workspace_inodes", "cpu_cores", "max_processes")


# The sections of `AgenticGRPOConfig`'s own fields, in the order its docstring and `--help` show them.
SECTIONS: dict[str, tuple[str, ...]] = {
    "Rollout: the environment, the format and the budgets of one trajectory": (
        "environment", "environment_kwargs", "format", "format_kwargs", "max_turns", "max_tokens_per_turn",
        "max_tool_output_tokens",
    ),
    "Tools and sandbox": ("tool_timeout", "tool_workers", "sandbox"),
    "Rewards and evaluation": ("on_reward_error", "correctness_reward", "eval_before_after", "eval_questions"),
    "Credit and KL": ("kl_control", "read_prompt_once", "beta"),
    "Sub-agents": ("subagents",),
    "Logging and outputs": ("save_trajectories_steps", "overwrite_output_dir", "wandb_mode", "bf16"),
    "Canaries: checks that stop a silently wrong run": ("canary_logprob_limit",),
    "Asynchronous rollouts": ("async_rollouts",),
}  # fmt: skip


def _field(default: Any, help: str) -> Any:
    return field(default=default, metadata={"help": help})


@dataclass
class AgenticGRPOConfig(GRPOConfig):
    """GRPO training with multi-turn tool-use rollouts: TRL's `GRPOConfig` plus these sections.

    Rollout: `environment` (the tools), `environment_kwargs`, `format`, `format_kwargs`, `max_turns`,
    `max_tokens_per_turn`, `max_tool_output_tokens`.
    Tools and sandbox: `tool_timeout`, `tool_workers`, `sandbox` (mode and limits, one setting).
    Rewards and evaluation: `on_reward_error`, `correctness_reward`, `eval_before_after`, `eval_questions`.
    Credit and KL: `kl_control`, `read_prompt_once`.
    Sub-agents: `subagents`.
    Logging and outputs: `save_trajectories_steps`, `overwrite_output_dir`, `wandb_mode`.
    Canaries: `canary_logprob_limit` (agentic_grpo.canaries).
    Asynchronous rollouts: `async_rollouts`.

    Every field of TRL's `GRPOConfig` is inherited (learning rate, `num_generations`, `beta`,
    `max_completion_length`, vLLM, logging, ...); `max_completion_length` is the token budget of the whole
    trajectory after the prompt, model and tool tokens together. Experiments (`agentic_grpo.experimental`) are
    set under one key, `experimental`, and are not listed here.
    """

    # TRL defaults to bf16=True (a CPU refuses it) and beta=0.0 (no KL); ours decide bf16 from
    # the hardware and keep a KL penalty against the frozen reference on by default.
    bf16: bool | None = field(
        default=None,
        metadata={"help": "bf16 mixed precision; default: on when a CUDA GPU supports it, off on CPU."},
    )
    beta: float = field(
        default=0.04,
        metadata={"help": "KL coefficient against the frozen reference model (0 disables the reference)."},
    )

    # --- rollout
    environment: dict | str | None = _field(
        "agentic_grpo.tools.calculator:Calculator",
        "Tool environment class by import path (`module:Class`), one instance per trajectory; or MCP servers' "
        "tools: `{mcp: {command: [...]} or {url: ...} or a list of servers, class: module:Class (optional Python "
        "tools beside them)}`, a session per trajectory (docs/mcp.md); or `{rows: {name: environment, ...}}`, each "
        "row's `environment` column naming its own (docs/trl_environments.md).",
    )  # fmt: skip
    environment_kwargs: dict | str | None = _field(None, "Keyword arguments for the environment class's constructor.")
    format: str = _field(
        "react",
        "Trajectory format: `react` (Thought/Action/Observation/Final Answer), `artist` "
        "(<think>/<python>/<output>/<answer> tags), `tool_call` (the chat template's native <tool_call> JSON, "
        "Hermes/Qwen), or a format class by import path.",
    )  # fmt: skip
    format_kwargs: dict | str | None = _field(
        None,
        "Keyword arguments of the format class. ReAct: `instructions` (system prompt with {tools}), `examples` "
        "(few-shot as plain text), `example_turns` (few-shot as earlier chat turns: a list of {question, "
        "response}), `response_prefix`, `constrain_actions` (after `Action:` only a tool's name may follow), "
        "`constrain_arguments` (the call then opens the tool's JSON). ARTIST: `tool`, `instructions`, "
        "`response_prefix`. tool_call: `instructions`, `answer_pattern`. A misspelled key is refused.",
    )  # fmt: skip
    max_turns: int = _field(6, "Most model turns per trajectory (each may call a tool).")
    max_tokens_per_turn: int = _field(256, "Most tokens the model writes in one turn.")
    max_tool_output_tokens: int = _field(
        256, "Token budget of one tool output; longer output keeps head and tail around a cut marker."
    )

    # --- tools and sandbox
    tool_timeout: float = _field(
        _SANDBOX_DEFAULTS["timeout_s"].default,
        "Wall-clock seconds allowed per tool call; code tools: the sandbox's deadline, which kills the process "
        "tree and returns what the code printed.",
    )  # fmt: skip
    tool_workers: int = _field(16, "Tool calls run at once (threads; code runs sandboxed).")
    sandbox: dict | str | None = _field(
        "auto",
        "Sandbox of code-running tools: a mode (`auto`: strongest available, `bwrap`, `landlock`, or "
        "`unsafe-local`: no isolation, an explicit opt-in warned about every run), or a mapping of the mode and "
        f"limits: {{mode, {', '.join(SANDBOX_LIMITS)}}} (defaults: "
        + ", ".join(f"{name} {_SANDBOX_DEFAULTS[name].default}" for name in SANDBOX_LIMITS)
        + "; memory in MB per process, and the slot's total with a memory cgroup; workspace in MB, 0 = no cap), "
        "or any other field of `agentic_grpo.sandbox.config.SandboxConfig` (docs/sandbox.md).",
    )  # fmt: skip

    # --- rewards and evaluation
    on_reward_error: str = _field(
        "raise",
        "A reward function that raises: `raise` stops the run (after writing that step's trajectories), `none` "
        "logs the error and gives that reward `None` for the batch (left out of the sum, like a failed judge call).",
    )  # fmt: skip
    correctness_reward: str | None = _field(
        None,
        "The reward (by name, as logged under rewards/<name>) that decides correctness in evaluation "
        "(`eval_before_after`, `agentic-grpo eval`): a trajectory is correct when it pays at least 1. Default: "
        "the reward named `correctness`, if the recipe has one.",
    )  # fmt: skip
    eval_before_after: bool = _field(
        False,
        "Measure held-out accuracy (greedy pass@1 on the test split, same tools and rewards) before and after "
        "training, print both at the end and write them to `held_out.json`.",
    )  # fmt: skip
    eval_questions: int = _field(48, "Test questions `eval_before_after` uses (the first N of the split).")

    # --- credit and KL
    kl_control: dict | str | None = _field(
        None,
        "Adaptive KL: `{preset: tool_use|exploration|stable}` and/or `{target, factor, min, max}` (agentic_grpo."
        "kl_control). `beta` is multiplied by `factor` when the measured KL exceeds 1.5x `target` and divided "
        "when below 0.5x, within [min, max]; logged as `kl_coef`. Needs beta > 0. Unset: a fixed `beta`.",
    )  # fmt: skip
    read_prompt_once: bool = _field(
        False,
        "Score a microbatch with each distinct prompt read once (the rows of a GRPO group share their prompt) "
        "instead of once per row: the same log-probs and gradients to rounding, much less compute when prompts "
        "are long. Takes effect with several rows of a group in one microbatch (`per_device_train_batch_size` >= "
        "`num_generations`); not with gradient checkpointing or image inputs.",
    )  # fmt: skip

    # --- sub-agents
    subagents: list[dict] | str | None = _field(
        None,
        "Sub-agents the policy can call as tools: a list of `{name, description, ...}`. A call runs the "
        "sub-agent's whole rollout (its own `environment`, `format`, budgets) and returns its final answer. Who "
        "answers: `adapter: NAME` (a LoRA adapter on the policy's base model), `model: PATH` (a frozen model) or "
        "`endpoint: URL` + `endpoint_model` (an OpenAI-compatible server). All keys: "
        "agentic_grpo.subagents.SubAgentConfig.",
    )  # fmt: skip

    # --- logging and outputs
    save_trajectories_steps: int = _field(
        1, "Write every trajectory of every N-th step to `trajectories/step_N.jsonl` (0 = never)."
    )
    overwrite_output_dir: bool = _field(
        False,
        "Start over in an `output_dir` that already holds a run, deleting its run files (metrics, trajectories, "
        "checkpoints). Without it such a run is refused, unless `--resume_from_checkpoint` continues it.",
    )  # fmt: skip
    wandb_mode: str | None = _field(
        None,
        "Weights & Biases mode with `report_to: wandb`: `online`, `offline` (files under `output_dir/wandb`, "
        "upload later with `wandb sync`) or `disabled`. Default: the WANDB_MODE variable.",
    )  # fmt: skip

    # --- canaries
    canary_logprob_limit: float | None = _field(
        None,
        "Each training step compares every sampled token's log-prob as the sampler computed it with the "
        "trainer's (`canary/logprob_diff/{mean,max,share_over_0.5}`); a mean difference over this many nats per "
        "token stops the run, naming the likely causes (agentic_grpo.canaries). Default: where sampler and trainer "
        "both compute in fp32, 0.0001 on CPU and 0.001 on a GPU; 0.1 where either computes in bf16 or fp16 "
        "(half-precision weights, or `bf16` or `fp16` mixed precision). 0 "
        "turns the check off.",
    )  # fmt: skip

    # --- asynchronous rollouts
    async_rollouts: dict | str | None = _field(
        None,
        "Sample the next steps' trajectories in a background thread while this step trains (agentic_grpo."
        "async_rollouts, docs/async.md; one process, HF generation): `true`, or a mapping of `max_staleness` (the "
        "most optimizer steps between the weights that sample a trajectory and the step that trains on it; the "
        "sampler waits rather than run further ahead, and no trajectory is dropped; default 1; 0 samples each step "
        "with its own weights, overlapping nothing), "
        "`importance_weight_cap` (each token's weight, trainer over sampler probability after temperature, top-k "
        "and top-p, is truncated there; default 3, as TRL's `vllm_importance_sampling_clip_max`) and `timeout` "
        "(seconds the trainer waits for a step's trajectories before it stops, naming what the sampler is doing; "
        "default 1800).",
    )

    # --- experiments (agentic_grpo.experimental), out of `--help`
    experimental: dict | str | None = field(default=None, metadata={"help": argparse.SUPPRESS})

    def __post_init__(self) -> None:
        if self.bf16 is None:  # TRL defaults to bf16, which a CPU refuses
            self.bf16 = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
        elif self.bf16 and not torch.cuda.is_available() and not self.use_cpu:
            # transformers' own refusal ("You need to assign use_cpu") names neither the field nor the fix
            raise ValueError(
                "the recipe sets `bf16: true` (mixed precision on a GPU) and this machine has no CUDA GPU: run it on "
                "a GPU, or set `--bf16 false` to train in fp32 on the CPU (slow for models beyond a few hundred "
                "million parameters)"
            )
        if not torch.cuda.is_available():
            self.dataloader_pin_memory = False  # pinning needs an accelerator; without one it only warns
        super().__post_init__()
        for name in ("environment_kwargs", "format_kwargs", "kl_control", "experimental"):
            value = getattr(self, name)
            if isinstance(value, str):
                setattr(self, name, yaml.safe_load(value))
            if getattr(self, name) is None:
                setattr(self, name, {})
        if isinstance(self.environment, str) and self.environment.lstrip().startswith("{"):  # a mapping, as text
            self.environment = yaml.safe_load(self.environment)
        if isinstance(self.subagents, str):
            self.subagents = yaml.safe_load(self.subagents)
        self.subagents = list(self.subagents or [])
        self.sandbox = sandbox_settings(self.sandbox)
        if self.experimental:  # checked here; read through `experiments`
            self.experiments  # noqa: B018
        if self.max_turns < 1:
            raise ValueError("max_turns must be at least 1")
        if self.on_reward_error not in ("raise", "none"):
            raise ValueError(f"on_reward_error must be `raise` or `none`, got `{self.on_reward_error}`")
        if self.canary_logprob_limit is not None and self.canary_logprob_limit < 0:
            raise ValueError(
                f"canary_logprob_limit must be >= 0 (0 turns the check off), got {self.canary_logprob_limit}"
            )
        self.async_rollouts = async_settings(self.async_rollouts)
        if self.wandb_mode not in (None, "online", "offline", "disabled"):
            raise ValueError(f"wandb_mode must be `online`, `offline` or `disabled`, got `{self.wandb_mode}`")

    @property
    def experiments(self) -> Any:
        """The recipe's `experimental:` options (`agentic_grpo.experimental.ExperimentalConfig`, all off by
        default); the experimental package is imported here, so a run without experiments never loads it."""
        from agentic_grpo.experimental import ExperimentalConfig

        return ExperimentalConfig.from_recipe(self.experimental)


def refuse_unknown_keys(field_name: str, value: dict[str, Any], known: list[str]) -> None:
    """Refuse the first key of a recipe field's mapping that is not in `known`, with the closest known key."""
    for key in value:
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f"; did you mean `{close[0]}`?" if close else f"; the keys are {known}"
            raise ValueError(f"recipe field `{field_name}`: key `{key}` is not known{hint}")


@dataclass(frozen=True)
class AsyncRollouts:
    """The recipe's `async_rollouts` settings (see the field's help)."""

    max_staleness: int = 1
    importance_weight_cap: float = 3.0
    timeout: float = 1800.0


def async_settings(value: Any) -> AsyncRollouts | None:
    """The recipe's `async_rollouts`: None when off (unset, `false`), the defaults for `true`, or a mapping's values
    (its YAML text on the command line); unknown keys and bad values refused in one line."""
    if isinstance(value, AsyncRollouts) or value is None:
        return value
    if isinstance(value, str):
        value = yaml.safe_load(value)
    if value is None or value is False:
        return None
    if value is True:
        return AsyncRollouts()
    if not isinstance(value, dict):
        raise ValueError(f"recipe field `async_rollouts`: `true`, `false` or a mapping, got {value!r}")
    refuse_unknown_keys("async_rollouts", value, [f.name for f in dataclasses.fields(AsyncRollouts)])
    settings = AsyncRollouts(**value)
    if not isinstance(settings.max_staleness, int) or settings.max_staleness < 0:
        raise ValueError(f"async_rollouts: max_staleness must be a whole number >= 0, got {settings.max_staleness!r}")
    if not isinstance(settings.importance_weight_cap, (int, float)) or settings.importance_weight_cap < 1:
        raise ValueError(f"async_rollouts: importance_weight_cap must be >= 1, got {settings.importance_weight_cap!r}")
    if not isinstance(settings.timeout, (int, float)) or settings.timeout <= 0:
        raise ValueError(f"async_rollouts: timeout must be > 0 seconds, got {settings.timeout!r}")
    return settings


def sandbox_settings(value: dict | str | None) -> dict[str, Any]:
    """The recipe's `sandbox` as a mapping `{mode, <limit>: value}`: a plain mode (`bwrap`) or a mapping (its YAML
    text on the command line); an unknown key is refused with a suggestion, bad values by `SandboxConfig`."""
    if isinstance(value, str):
        loaded = yaml.safe_load(value) if value.lstrip().startswith("{") else value
        value = {"mode": loaded} if isinstance(loaded, str) else loaded
    value = dict(value or {})
    if "timeout_s" in value:
        raise ValueError("recipe field `sandbox`: the sandbox's time limit is the recipe's `tool_timeout`")
    refuse_unknown_keys("sandbox", value, [f.name for f in dataclasses.fields(SandboxConfig) if f.name != "timeout_s"])
    SandboxConfig(**value)  # raises on a bad mode or limit
    return value


@dataclass
class RecipeArguments:
    """What to train on and how to score it."""

    dataset: dict | str | None = field(
        default=None,
        metadata={
            "help": "Data: `{generator: module:function, num_train: N, num_test: N, seed: S}` for generated "
            "tasks, or `datasets.load_dataset` arguments (`{path: json, data_files: train.jsonl}`) with an optional "
            "`test_split` fraction. Rows need a `question` column; rewards may need `answer`."
        },
    )
    rewards: list[dict] | str | None = field(
        default=None,
        metadata={
            "help": "Reward functions: a list of `{type: module:Class, weight: w, name: n, ...}`; other keys "
            "are the class's constructor arguments."
        },
    )

    def __post_init__(self) -> None:
        if isinstance(self.rewards, str):  # its YAML text, from the command line: `--rewards '[{type: ...}]'`
            self.rewards = yaml.safe_load(self.rewards)


RECIPE_TYPES = (RecipeArguments, AgenticGRPOConfig, ModelConfig)


TRAIN_DESCRIPTION = (
    "Train an LLM agent with GRPO on multi-turn tool-use trajectories. A recipe (YAML) sets the fields below; any "
    "field can be overridden on the command line (`--max_steps 10`). Without arguments: the offline CPU demo."
)


def recipe_parser(prog: str | None = None, for_help: bool = False) -> TrlParser:
    """TRL's parser of the three recipe dataclasses. With `for_help`, `--help` shows a description, `--config`
    first, then this project's fields in their sections, then TRL's and the model's fields."""
    if not for_help:
        return TrlParser(RECIPE_TYPES, prog=prog, allow_abbrev=False)
    parser = TrlParser(RECIPE_TYPES, prog=prog, allow_abbrev=False, description=TRAIN_DESCRIPTION,
                       usage="%(prog)s [--config RECIPE] [--FIELD VALUE ...]")  # fmt: skip
    # TRL reads `--config` itself before argparse sees the arguments; it is added here for the help text only.
    recipe = parser.add_argument_group("Recipe")
    recipe.add_argument("--config", metavar="RECIPE", help="A recipe: a YAML file, or a shipped recipe's name "
                        "(`cpu_demo`, `cpu_toolbox`, ...). The fields below override it.")  # fmt: skip
    recipe.add_argument("--accelerate_config", metavar="CONFIG", help="Run under `accelerate launch` with this "
                        "config: a YAML file or a shipped one's name (`single_gpu`, `multi_gpu`, `deepspeed_zero2`, "
                        "`deepspeed_zero3`, `fsdp`, `multi_node`, `cpu_2proc`).")  # fmt: skip
    recipe.add_argument("--dry-run", action="store_true", help="Train nothing: print the recipe's estimated GPU "
                        "memory per process (model built on the meta device, no weights) and exit 1 when it cannot "
                        "fit the card (`--gpu_memory_gb`, default 80; also `--prompt_tokens`, `--num_processes`; docs/dry_run.md).")  # fmt: skip
    data = parser.add_argument_group("Data and rewards")
    sections = {title: parser.add_argument_group(title) for title in SECTIONS}
    ours = {name: title for title, names in SECTIONS.items() for name in names}
    ours.update({f.name: "data" for f in fields(RecipeArguments)})
    rest = parser._optionals  # argparse keeps ungrouped options here: what TRL and the model config add
    for action in list(rest._group_actions):
        section = ours.get(action.dest)
        if section is not None:
            rest._group_actions.remove(action)
            (data if section == "data" else sections[section])._group_actions.append(action)
    rest.title = "TRL's GRPOConfig and ModelConfig (training, generation, vLLM, model, LoRA, logging)"
    groups = parser._action_groups
    ordered = [recipe, data, *sections.values()]
    parser._action_groups = [g for g in groups if g not in ordered and g is not rest] + ordered + [rest]
    return parser


def read_recipe(argv: list[str] | None = None) -> tuple[RecipeArguments, AgenticGRPOConfig, ModelConfig]:
    """Parse `--config recipe.yaml` plus command-line overrides; unknown keys fail with a suggestion."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--config" in argv:
        position = argv.index("--config") + 1
        if position == len(argv):
            raise ValueError("--config needs a recipe: a YAML file or a shipped recipe's name (e.g. `cpu_demo`)")
        path = find_shipped(argv[position], "recipes", ".yaml")
        argv[position] = str(path)
        check_recipe_keys(yaml.safe_load(path.read_text()) or {}, path)
    flags = {a[2:].split("=")[0].replace("-", "_"): None for a in argv if a.startswith("--") and a != "--config"}
    check_recipe_keys(flags, "command line")
    return recipe_parser().parse_args_and_config(argv)


def check_recipe_keys(recipe: Any, path: Path | str) -> None:
    if not isinstance(recipe, dict):
        raise ValueError(f"recipe `{path}` must be a YAML mapping of field: value")
    known = {f.name for t in RECIPE_TYPES for f in fields(t)} | {"env"}
    for key in recipe:
        if key in known:
            continue
        from agentic_grpo.experimental import ExperimentalConfig  # only to point a misplaced option to its key

        where = "the command line" if path == "command line" else f"recipe `{path}`"
        if key in {f.name for f in fields(ExperimentalConfig)}:
            raise ValueError(f"{where}: `{key}` is an experimental option: set it under `experimental:` "
                             "(agentic_grpo.experimental)")  # fmt: skip
        close = difflib.get_close_matches(key, known, n=1)
        hint = f"; did you mean `{close[0]}`?" if close else "; `--help` lists every field"
        raise ValueError(f"{where}: field `{key}` is not known{hint}")
