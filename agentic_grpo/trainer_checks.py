"""Set-ups the trainer refuses before a model loads, whoever builds it (the CLI or user code): layouts that would
train on wrong numbers, or crash at the first backward. `check_setup` runs them all, once: in `agentic_grpo.train.
prepare` before the model loads, or in the trainer when user code builds it."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from agentic_grpo.config import AgenticGRPOConfig
from agentic_grpo.shrinking_batch import filters_of


def check_setup(
    trainer_class: type, args: AgenticGRPOConfig, reward_funcs: list[Callable], rollout_parts: Any, peft: bool = False
) -> None:
    """Every set-up check of a run, before a model loads: the trainer's layout (`check_trainer_setup`), what the
    recipe's trajectory format and environment must offer, that `trainer_class` has the layers the recipe uses,
    and each layer's own `check_layer_setup(args, rollout_parts)`; raises ValueError with one clear message."""
    from agentic_grpo.vllm_backend import NO_CONSTRAINED_ACTIONS

    check_trainer_setup(args, reward_funcs, rollout_parts.all_agents(), peft=peft)
    if args.use_vllm and getattr(rollout_parts.trajectory_format, "action_choices", None):
        raise ValueError(NO_CONSTRAINED_ACTIONS)
    layers = {getattr(layer, "layer", None) for layer in trainer_class.__mro__}
    needed = {"subagents": rollout_parts.agents, "experimental": args.experimental, "async": args.async_rollouts,
              "cotraining": any(getattr(agent, "train", False) for agent in rollout_parts.all_agents())}  # fmt: skip
    missing = sorted(name for name, need in needed.items() if need and name not in layers)
    if missing:
        raise ValueError(
            f"this recipe uses {' and '.join(missing)}, which `{trainer_class.__name__}` has no layer for: build the "
            "trainer from `agentic_grpo.trainer_layers.trainer_class(args, rollout_parts)`"
        )
    for layer in trainer_class.__mro__:
        if "check_layer_setup" in vars(layer):
            layer.check_layer_setup(args, rollout_parts)


def _experiments(args: Any) -> Any:
    """The recipe's `experimental:` options (all off where `args` has none)."""
    from agentic_grpo.experimental import ExperimentalConfig

    return ExperimentalConfig.from_recipe(getattr(args, "experimental", None))


def check_trainer_setup(
    args: AgenticGRPOConfig, reward_funcs: list[Callable], agents: Sequence[Any] = (), peft: bool = False
) -> None:
    """Refuse set-ups that would train on wrong numbers or crash, whoever builds the trainer (CLI or user code);
    `agents`: the recipe's sub-agents, the whole tree; `peft`: the policy is a LoRA adapter."""
    check_saves_between_cycles(args)
    trained = [agent.name for agent in agents if getattr(agent, "train", False)]
    if trained and not _experiments(args).cotrain_subagents:
        raise ValueError(
            f"sub-agent(s) {trained} set `train: true`: co-training is an experiment (agentic_grpo.experimental, "
            "docs/subagents.md); turn it on with `experimental: {cotrain_subagents: true}`, or freeze them (drop "
            "`train: true`)"
        )
    if trained and args.world_size > 1:
        # Each role's forward and the policy's go through one DDP-wrapped model before one backward, and DDP
        # marks the shared LoRA parameters ready twice: the first backward fails.
        raise ValueError(
            f"co-trained sub-agents ({trained}, `train: true`) train in one process only, and this launch has "
            f"{args.world_size}: launch one process, or freeze the sub-agents (drop `train: true`)"
        )
    sharded_vllm = args.use_vllm and args.vllm_mode == "colocate" and args.vllm_tensor_parallel_size > 1
    if sharded_vllm and args.world_size > 1:
        # TRL gathers the prompts of a tensor-parallel group for each generate call and hands each process the
        # slice at its rank, which is only right when every process has the same number of live trajectories at
        # every turn; in a multi-turn rollout they finish at different turns.
        raise ValueError(
            f"vLLM with tensor_parallel_size {args.vllm_tensor_parallel_size} across {args.world_size} processes "
            "would hand some process another process's completions (processes have different numbers of live "
            "trajectories per turn): use `vllm_tensor_parallel_size: 1` (one engine per process), or "
            "`vllm_mode: server` (each process sends its own trajectories), or a single training process"
        )
    if args.use_vllm and args.vllm_mode == "server" and not peft:
        import torch

        if not torch.cuda.is_available():
            raise ValueError(
                "vLLM server mode with full weights syncs them to the server over NCCL, which needs CUDA, and this "
                "machine has none: train a LoRA adapter (`use_peft: true`), which reaches the server by file "
                "(agentic_grpo.vllm_server), or use `vllm_mode: colocate`"
            )
    if args.use_vllm and args.vllm_mode == "colocate" and getattr(args, "vllm_enable_sleep_mode", False):
        check_sleep_mode_available()
    filtered = filters_of(args).named()
    sequence_level = getattr(args, "vllm_importance_sampling_mode", None) in ("sequence_mask", "sequence_truncate")
    if args.use_vllm and getattr(args, "vllm_importance_sampling_correction", False) and sequence_level and filtered:
        # vLLM reports the filtered distribution's log-probs (`agentic_grpo.shrinking_batch`), TRL's ratio
        # divides the trainer's unfiltered probability by it: below 1 for every sampled token, and its product over
        # a whole trajectory is near 0, so every sequence is masked or scaled to nothing.
        raise ValueError(
            f"vLLM samples from the distribution left after {', '.join(filtered)}, and TRL's sequence-level "
            f"importance-sampling correction (`vllm_importance_sampling_mode: {args.vllm_importance_sampling_mode}`) "
            "multiplies, over each trajectory, the trainer's unfiltered probability of each token over that "
            "filtered one: every factor is below 1, the product is near 0, and no trajectory trains. Use "
            "`vllm_importance_sampling_mode: token_truncate`, or drop the filters, or set "
            "`vllm_importance_sampling_correction: false`"
        )
    sharded = sharded_policy(args)
    on_policy = [agent.name for agent in agents if getattr(agent, "on_policy_model", False)]
    if sharded and on_policy:
        # A sub-agent's turns run inside the parent's tool turn, only on the processes whose trajectories called
        # it: under a sharded policy each of its forward passes is a collective the other processes never join.
        raise ValueError(
            f"sub-agents on the policy's model ({on_policy}) generate only on the processes that call them, and "
            f"under {sharded} every forward pass needs all {args.world_size} processes: launch with DDP or "
            "DeepSpeed ZeRO-2 (accelerate_configs/multi_gpu.yaml, deepspeed_zero2.yaml), or give the sub-agents a "
            "`model` of their own"
        )
    if sharded == "FSDP" and args.use_vllm and peft:
        raise ValueError(
            "vLLM with a LoRA policy under FSDP: the weight sync would merge the adapter into the sharded base "
            "weights in place (they drift in bf16, and they are the KL reference): use DeepSpeed ZeRO-3 or DDP "
            "with vLLM, or `use_vllm: false`"
        )
    group_rewards = [getattr(f, "__name__", repr(f)) for f in reward_funcs if getattr(f, "needs_whole_groups", False)]
    if not group_rewards or args.world_size == 1:
        return
    layouts = [("training", args.per_device_train_batch_size * args.steps_per_generation, args.num_generations,
                "per_device_train_batch_size x steps_per_generation", "num_generations")]  # fmt: skip
    if getattr(args, "eval_strategy", "no") != "no":
        eval_group = getattr(args, "num_generations_eval", None) or args.num_generations
        layouts.append(("evaluation", args.per_device_eval_batch_size, eval_group, "per_device_eval_batch_size",
                        "num_generations_eval"))  # fmt: skip
    for phase, per_process, group, held_by, group_field in layouts:
        if per_process % group:
            raise ValueError(
                f"reward(s) {group_rewards} score each query's {group} samples together, but in {phase} each of "
                f"the {args.world_size} processes holds {per_process} samples ({held_by}), which splits some "
                f"groups across processes: make that a multiple of {group_field}"
            )


def generation_cycle(args: Any) -> int:
    """Optimizer steps from one generation's first step to the next generation's (the cycle's length): TRL trains
    on each generated batch over `steps_per_generation x num_iterations` micro-steps."""
    micro_steps = args.steps_per_generation * getattr(args, "num_iterations", 1)
    per_step = getattr(args, "gradient_accumulation_steps", 1)
    return math.lcm(micro_steps, per_step) // per_step


INSIDE_A_CYCLE = (
    "TRL does not save the generated batch that the rest of a cycle trains on, so a run resumed inside one would "
    "generate another and not continue exactly"
)


def check_saves_between_cycles(args: Any) -> None:
    """Refuse a save schedule with checkpoints inside a generation cycle (see `INSIDE_A_CYCLE`)."""
    cycle = generation_cycle(args)
    strategy = getattr(args, "save_strategy", "no")
    if cycle == 1 or getattr(strategy, "value", strategy) != "steps":
        return
    every = (
        args.save_steps if args.save_steps >= 1 or args.max_steps <= 0 else math.ceil(args.max_steps * args.save_steps)
    )
    if int(every) % cycle:
        raise ValueError(
            f"`save_steps` {args.save_steps} puts checkpoints inside generation cycles: a cycle, from one generation "
            f"to the next, spans {cycle} optimizer steps (steps_per_generation {args.steps_per_generation} x "
            f"num_iterations {args.num_iterations} micro-steps, gradient_accumulation_steps "
            f"{args.gradient_accumulation_steps} a step), and "
            f"{INSIDE_A_CYCLE}: make save_steps a multiple of {cycle}"
        )


def check_resume_between_cycles(args: Any, checkpoint: str | Path) -> None:
    """Refuse to resume from a checkpoint saved inside a generation cycle (see `INSIDE_A_CYCLE`)."""
    cycle = generation_cycle(args)
    state = Path(checkpoint) / "trainer_state.json"
    if cycle == 1 or not state.is_file():
        return
    step = json.loads(state.read_text())["global_step"]
    if step % cycle:
        raise ValueError(
            f"`{checkpoint}` was saved at step {step}, inside a generation cycle of {cycle} optimizer steps, and "
            f"{INSIDE_A_CYCLE}: resume from a checkpoint at a multiple of {cycle} steps"
        )


def check_sleep_mode_available() -> None:
    """Refuse `vllm_enable_sleep_mode` where vLLM's platform cannot sleep (its CPU build: sleep mode frees and
    remaps device memory through CUDA's allocator), before an engine starts and fails on its first `sleep`."""
    from vllm.platforms import current_platform

    if not current_platform.is_sleep_mode_available():
        raise ValueError(
            f"`vllm_enable_sleep_mode: true`, but vLLM on this machine ({current_platform.device_name}) has no sleep "
            "mode: it offloads and restores device memory through CUDA's allocator. Set "
            "`vllm_enable_sleep_mode: false` (on a CPU, engine and trainer share host memory, so sleeping frees "
            "nothing a GPU would lose)"
        )


def sharded_policy(args: Any) -> str | None:
    """`FSDP` or `DeepSpeed ZeRO-3` when this launch shards the policy's weights over several processes (from the
    training arguments, or the environment `accelerate launch` sets), else None."""
    if args.world_size <= 1:
        return None
    if getattr(args, "fsdp", None) or os.environ.get("ACCELERATE_USE_FSDP", "").lower() == "true":
        return "FSDP"
    stage = os.environ.get("ACCELERATE_DEEPSPEED_ZERO_STAGE")
    config = getattr(args, "deepspeed", None) or os.environ.get("ACCELERATE_DEEPSPEED_CONFIG_FILE")
    if stage is None and config:
        if not isinstance(config, dict):
            config = json.loads(Path(config).read_text())
        stage = str(config.get("zero_optimization", {}).get("stage", ""))
    return "DeepSpeed ZeRO-3" if stage == "3" else None
