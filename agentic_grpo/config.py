"""Recipe configuration: TRL's `GRPOConfig` plus the fields of multi-turn tool use.

A recipe is one YAML file read by TRL's `TrlParser` into three dataclasses:
`RecipeArguments` (data and rewards), `AgenticGRPOConfig` (training and rollout) and
TRL's `ModelConfig` (model, dtype, LoRA). Every key is a documented field; an unknown
key stops the run at start-up with a suggestion (`read_recipe`).
"""

from __future__ import annotations

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

# The sandbox owns the defaults of its budgets; the recipe fields that set them take those defaults.
_SANDBOX_DEFAULTS = SandboxConfig.__dataclass_fields__


@dataclass
class AgenticGRPOConfig(GRPOConfig):
    """GRPO training with multi-turn tool-use rollouts.

    Inherits every field of TRL's `GRPOConfig` (learning rate, `num_generations`,
    `beta`, `max_completion_length`, vLLM, logging, ...). `max_completion_length` is the
    token budget of the whole trajectory after the prompt, model and tool tokens together.
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
    environment: str = field(
        default="agentic_grpo.tools.calculator:Calculator",
        metadata={"help": "Tool environment class by import path (`module:Class`), one instance per trajectory."},
    )
    environment_kwargs: dict | str | None = field(
        default=None, metadata={"help": "Keyword arguments for the environment class's constructor."}
    )
    format: str = field(
        default="react",
        metadata={
            "help": "Trajectory format: `react` (Thought/Action/Observation/Final Answer), `artist` "
            "(<think>/<python>/<output>/<answer> tags), `tool_call` (the chat template's native <tool_call> JSON, "
            "Hermes/Qwen), or a format class by import path."
        },
    )
    format_kwargs: dict | str | None = field(
        default=None,
        metadata={
            "help": "Keyword arguments of the format class. ReAct: `instructions` (system prompt with {tools}), "
            "`examples` (few-shot as plain-text strings in the system prompt), `example_turns` (few-shot as earlier "
            "chat turns: a list of {question, response}), `response_prefix`. ARTIST: `tool`, `instructions`, "
            "`response_prefix`. tool_call: `instructions`, `answer_pattern`. A misspelled key is refused."
        },
    )
    subagents: list[dict] | str | None = field(
        default=None,
        metadata={
            "help": "Sub-agents the policy can call as tools: a list of `{name, description, ...}`. A call runs the "
            "sub-agent's whole rollout (its own `environment`, `format`, budgets) and returns its final answer. Who "
            "answers: `adapter: NAME` (a LoRA adapter on the policy's base model), `model: PATH` (a frozen model) or "
            "`endpoint: URL` + `endpoint_model` (an OpenAI-compatible server). All keys: "
            "agentic_grpo.subagents.SubAgentConfig."
        },
    )
    max_turns: int = field(default=6, metadata={"help": "Most model turns per trajectory (each may call a tool)."})
    max_tokens_per_turn: int = field(default=256, metadata={"help": "Most tokens the model writes in one turn."})
    max_tool_output_tokens: int = field(
        default=256,
        metadata={"help": "Token budget of one tool output; longer output keeps head and tail around a cut marker."},
    )
    tool_timeout: float = field(
        default=_SANDBOX_DEFAULTS["timeout_s"].default,
        metadata={"help": "Wall-clock seconds allowed per tool call; code tools: the sandbox's deadline, which kills "
                  "the process tree and returns what the code printed."},
    )  # fmt: skip
    tool_workers: int = field(default=16, metadata={"help": "Tool calls run at once (threads; code runs sandboxed)."})
    advantage: str = field(
        default="outcome",
        metadata={
            "help": "Advantage estimator (formulas in agentic_grpo.advantages): `outcome` (TRL's GRPO: one advantage "
            "per trajectory), `turn` (plus turn_lambda x the return of per-turn rewards from each turn on, against "
            "the leave-one-out mean of the other group members that reached that turn), `anchor` (plus turn_lambda "
            "x each turn's return, outcome included, against the other members' turns taken from the same "
            "environment state; needs an environment with `state_hash`)."
        },
    )
    advantage_baseline: str = field(
        default="group",
        metadata={
            "help": "What a trajectory's reward is compared with: `group` (TRL's GRPO: the mean of its own group, "
            "over the group's std), or `batch` (the mean of every other trajectory of the step, over the step's "
            "std; REINFORCE++): a group whose samples all chose alike and earned less than the step's other "
            "questions then pushes that choice down (agentic_grpo.advantages.batch_baseline_advantages)."
        },
    )
    turn_lambda: float = field(
        default=1.0, metadata={"help": "Weight of the turn-level term of the `turn` and `anchor` advantages."}
    )
    turn_gamma: float = field(
        default=1.0,
        metadata={"help": "Discount of later turns' rewards in the `turn` and `anchor` returns, in (0, 1]."},
    )
    sandbox: str = field(
        default="auto",
        metadata={
            "help": "Sandbox for code-running tools: `auto` (strongest available), `bwrap`, `landlock`, or "
            "`unsafe-local` (no isolation: an explicit opt-in, warned about every run)."
        },
    )
    sandbox_memory_mb: int = field(
        default=_SANDBOX_DEFAULTS["memory_mb"].default,
        metadata={"help": "Memory limit of sandboxed code, in MB (address space per process; with a memory cgroup "
                  "also the slot's total)."},
    )  # fmt: skip
    sandbox_workspace_mb: int = field(
        default=_SANDBOX_DEFAULTS["workspace_mb"].default,
        metadata={"help": "Total size of a trajectory's sandbox workspace, in MB (0 = no total cap)."},
    )
    sandbox_workspace_inodes: int = field(
        default=_SANDBOX_DEFAULTS["workspace_inodes"].default,
        metadata={"help": "Most files and directories in a trajectory's sandbox workspace (with the size cap)."},
    )
    sandbox_cpu_cores: float = field(
        default=_SANDBOX_DEFAULTS["cpu_cores"].default,
        metadata={"help": "CPU one sandbox slot may use at once, in cores (a cgroup quota where one is in force)."},
    )
    sandbox_max_processes: int = field(
        default=_SANDBOX_DEFAULTS["max_processes"].default,
        metadata={"help": "Most processes and threads alive at once in one sandbox slot."},
    )
    read_prompt_once: bool = field(
        default=False,
        metadata={
            "help": "Score a microbatch with each distinct prompt read once (the rows of a GRPO group share their "
            "prompt) instead of once per row: the same log-probs and gradients to rounding, much less compute when "
            "prompts are long. Takes effect with several rows of a group in one microbatch "
            "(`per_device_train_batch_size` >= `num_generations`); not with gradient checkpointing or image inputs."
        },
    )
    spread_first_action: bool = field(
        default=False,
        metadata={
            "help": "In training rollouts, hold the first action of a GRPO group's G trajectories to G different "
            "choices (each tool's name G/n times, in a random order per group), so every group compares every "
            "tool; the rest of each turn is sampled. For exploration where a model's sharp preferences keep a "
            "group from ever trying the right tool. The held names are not the policy's samples (off-policy, "
            "as `action_temperature` is); evaluation and greedy decoding are unchanged, and the training "
            "rollouts' `tools/*` metrics count the held choices. Needs `format_kwargs: {constrain_actions: true}`."
        },
    )
    guide_first_action: int = field(
        default=0,
        metadata={
            "help": "In training rollouts, hold the first action of this many of a GRPO group's G trajectories to "
            "the tool its row expects (the `expected_tools` column); the other trajectories choose for themselves. "
            "Every group then has a sample on the right tool to compare the others with, where a small model's "
            "sharp preferences keep a group from trying it (the held name is not the policy's sample: off-policy, "
            "as `action_temperature` is). Rows that name no tool are not held. Evaluation is unchanged; the "
            "training rollouts' `tools/*` metrics count the held choices. Needs "
            "`format_kwargs: {constrain_actions: true}`, below `num_generations`, not with `spread_first_action`."
        },
    )
    action_token_weight: float = field(
        default=1.0,
        metadata={
            "help": "Multiply the advantage of the tokens that write a tool's name in an action slot (ReAct's "
            "`Action: <name>`) by this, so the choice of tool weighs that many tokens in the loss; the thought, "
            "arguments and answer keep weight 1. The name is one or two of the ~50 tokens a trajectory trains, and "
            "averaged with them it barely moves the choice (agentic_grpo.action_weight). Needs "
            "`format_kwargs: {constrain_actions: true}` (the format's action slot says where the names are). On "
            "the toolbox, 10 made the policy drift faster (benchmarks/RUNS.md)."
        },
    )
    choice_gradient_weight: float = field(
        default=0.0,
        metadata={
            "help": "Add to the loss the exact policy gradient, times this, of the tool-choice reward at each "
            "trajectory's first action slot: the probability the slot gives the row's expected tools (the "
            "`expected_tools` column), over the tools' first tokens. Where GRPO learns a choice only from the "
            "tools a group sampled, this lowers every wrong tool in proportion to its probability in that context, "
            "sampled or not (agentic_grpo.choice_gradient). Supervised by the rows' expected tools, as `ToolChoice` "
            "is. 0: off. Needs `format_kwargs: {constrain_actions: true, canonical_actions: true}`."
        },
    )
    curriculum_column: str | None = field(
        default=None,
        metadata={
            "help": "Draw training prompts by kind, the kinds the policy does worst on most often: this names the "
            "dataset column holding each row's kind. Each kind's score is a moving mean of `curriculum_reward` "
            "over its trajectories (a value in [0, 1]); a kind comes in proportion to 1 - score + 0.15, and a "
            "batch's prompts are of different kinds where there are enough kinds. Replaces the dataset's order "
            "(`shuffle_dataset` is ignored); needs `max_steps`. See agentic_grpo.curriculum."
        },
    )
    curriculum_reward: str | None = field(
        default=None,
        metadata={
            "help": "The reward (by name, as logged under rewards/<name>) whose mean per kind steers "
            "`curriculum_column`; unset: the weighted sum of all rewards."
        },
    )
    save_trajectories_steps: int = field(
        default=1,
        metadata={"help": "Write every trajectory of every N-th step to `trajectories/step_N.jsonl` (0 = never)."},
    )
    kl_preset: str | None = field(
        default=None,
        metadata={
            "help": "Adaptive KL controller preset: `tool_use`, `exploration` or `stable` (see "
            "agentic_grpo.kl_control). Unset with no `kl_target`: a fixed `beta`."
        },
    )
    kl_target: float | None = field(
        default=None,
        metadata={
            "help": "Adaptive KL: the KL (per token) to hold. `beta` is multiplied by `kl_factor` when the measured "
            "KL exceeds 1.5x this and divided when below 0.5x; logged as `kl_coef`. Needs beta > 0."
        },
    )
    kl_factor: float | None = field(default=None, metadata={"help": "Adaptive KL: the multiplicative step (> 1)."})
    kl_min: float | None = field(default=None, metadata={"help": "Adaptive KL: the lowest coefficient (> 0)."})
    kl_max: float | None = field(default=None, metadata={"help": "Adaptive KL: the highest coefficient."})
    eval_before_after: bool = field(
        default=False,
        metadata={
            "help": "Measure held-out accuracy (greedy pass@1 on the test split, same tools and rewards) before "
            "and after training, print both at the end and write them to `held_out.json`."
        },
    )
    eval_questions: int = field(
        default=48, metadata={"help": "Test questions used by `eval_before_after` (the first N of the split)."}
    )
    overwrite_output_dir: bool = field(
        default=False,
        metadata={
            "help": "Start over in an `output_dir` that already holds a run, deleting its run files (metrics, "
            "trajectories, checkpoints). Without it such a run is refused, unless `--resume_from_checkpoint` "
            "continues it."
        },
    )
    on_reward_error: str = field(
        default="raise",
        metadata={
            "help": "A reward function that raises: `raise` stops the run (after writing that step's "
            "trajectories), `none` logs the error and gives that reward `None` for the batch (left out of the "
            "sum, like a failed judge call)."
        },
    )
    wandb_mode: str | None = field(
        default=None,
        metadata={
            "help": "Weights & Biases mode with `report_to: wandb`: `online`, `offline` (files under "
            "`output_dir/wandb`, upload later with `wandb sync`) or `disabled`. Default: the WANDB_MODE variable."
        },
    )

    def __post_init__(self) -> None:
        if self.bf16 is None:  # TRL defaults to bf16, which a CPU refuses
            self.bf16 = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
        if not torch.cuda.is_available():
            self.dataloader_pin_memory = False  # pinning needs an accelerator; without one it only warns
        super().__post_init__()
        for name in ("environment_kwargs", "format_kwargs"):
            value = getattr(self, name)
            if isinstance(value, str):
                setattr(self, name, yaml.safe_load(value))
            if getattr(self, name) is None:
                setattr(self, name, {})
        if isinstance(self.subagents, str):
            self.subagents = yaml.safe_load(self.subagents)
        self.subagents = list(self.subagents or [])
        if self.max_turns < 1:
            raise ValueError("max_turns must be at least 1")
        if self.advantage not in ("outcome", "turn", "anchor"):
            raise ValueError(f"advantage must be `outcome`, `turn` or `anchor`, got `{self.advantage}`")
        if self.advantage_baseline not in ("group", "batch"):
            raise ValueError(f"advantage_baseline must be `group` or `batch`, got `{self.advantage_baseline}`")
        if not 0.0 < self.turn_gamma <= 1.0:
            raise ValueError(f"turn_gamma must be in (0, 1], got {self.turn_gamma}")
        if self.turn_lambda < 0:
            raise ValueError(f"turn_lambda must be >= 0, got {self.turn_lambda}")
        if self.on_reward_error not in ("raise", "none"):
            raise ValueError(f"on_reward_error must be `raise` or `none`, got `{self.on_reward_error}`")
        if not 0 <= self.guide_first_action < self.num_generations:
            raise ValueError(
                f"guide_first_action must be from 0 to num_generations - 1 ({self.num_generations - 1}): one "
                f"trajectory of a group at least chooses for itself; got {self.guide_first_action}"
            )
        if self.guide_first_action and self.spread_first_action:
            raise ValueError("guide_first_action and spread_first_action both hold first actions: set one of them")
        if self.action_token_weight <= 0:
            raise ValueError(f"action_token_weight must be above 0, got {self.action_token_weight}")
        if self.choice_gradient_weight < 0:
            raise ValueError(f"choice_gradient_weight must be 0 (off) or above, got {self.choice_gradient_weight}")
        if self.curriculum_column is not None and self.max_steps <= 0:
            raise ValueError("curriculum_column draws prompts without end (no epochs): set max_steps")
        if self.curriculum_reward is not None and self.curriculum_column is None:
            raise ValueError("curriculum_reward steers a curriculum: set curriculum_column too")
        if self.wandb_mode not in (None, "online", "offline", "disabled"):
            raise ValueError(f"wandb_mode must be `online`, `offline` or `disabled`, got `{self.wandb_mode}`")


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


RECIPE_TYPES = (RecipeArguments, AgenticGRPOConfig, ModelConfig)


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
    parser = TrlParser(RECIPE_TYPES, allow_abbrev=False)
    return parser.parse_args_and_config(argv)


def check_recipe_keys(recipe: Any, path: Path | str) -> None:
    if not isinstance(recipe, dict):
        raise ValueError(f"recipe `{path}` must be a YAML mapping of field: value")
    known = {f.name for t in RECIPE_TYPES for f in fields(t)} | {"env"}
    for key in recipe:
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f"; did you mean `{close[0]}`?" if close else "; `--help` lists every field"
            where = "the command line" if path == "command line" else f"recipe `{path}`"
            raise ValueError(f"{where}: field `{key}` is not known{hint}")
