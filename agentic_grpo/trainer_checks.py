"""Set-ups the trainer refuses before a model loads, whoever builds it (the CLI or user code): layouts that would
train on wrong numbers, or crash at the first backward."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from agentic_grpo.config import AgenticGRPOConfig


def check_trainer_setup(args: AgenticGRPOConfig, reward_funcs: list[Callable], agents: Sequence[Any] = ()) -> None:
    """Refuse set-ups that would train on wrong numbers or crash, whoever builds the trainer (CLI or user code);
    `agents`: the recipe's sub-agents, the whole tree."""
    trained = [agent.name for agent in agents if getattr(agent, "train", False)]
    if trained and args.world_size > 1:
        # Each role's forward and the policy's go through one DDP-wrapped model before one backward, and DDP
        # marks the shared LoRA parameters ready twice: the first backward fails.
        raise ValueError(
            f"co-trained sub-agents ({trained}, `train: true`) train in one process only, and this launch has "
            f"{args.world_size}: launch one process, or freeze the sub-agents (drop `train: true`)"
        )
    sharded_vllm = args.use_vllm and (args.vllm_mode == "server" or args.vllm_tensor_parallel_size > 1)
    if sharded_vllm and args.world_size > 1:
        # TRL gathers every process's prompts for each generate call and hands each process the slice at
        # `process_index * len(its prompts)`, which is only right when every process has the same number of
        # live trajectories at every turn; in a multi-turn rollout they finish at different turns.
        raise ValueError(
            f"vLLM in `{args.vllm_mode}` mode with tensor_parallel_size {args.vllm_tensor_parallel_size} across "
            f"{args.world_size} processes would hand some process another process's completions (processes have "
            "different numbers of live trajectories per turn): use `vllm_mode: colocate` with "
            "`vllm_tensor_parallel_size: 1` (one engine per process), or a single training process"
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
