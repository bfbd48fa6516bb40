"""Run by tests/test_vllm_server.py on two CPU processes (accelerate launch, cpu_2proc): GRPO steps of a LoRA policy
whose multi-turn rollouts are sampled by a vLLM server (vLLM's CPU build, started by the test), each process
sending its own live trajectories, the adapter synced to the server by file. Writes OUT/rank{N}.json.

    accelerate launch --config_file accelerate_configs/cpu_2proc.yaml tests/vllm_server_run.py MODEL OUT URL [plant]

`plant` `never_loaded`: the adapter is never loaded, and requests keep naming the server's base model.
"""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path
from typing import Any

import torch

from tests.lockstep_support import LIMITS, EveryTurnCalls, Padded
from tests.vllm_colocate_run import by_tokens, rows


def main(model_dir: str, out: str, url: str, plant: str | None = None) -> None:
    from datasets import Dataset
    from peft import LoraConfig

    from agentic_grpo.config import AgenticGRPOConfig
    from agentic_grpo.launch import use_cpu_when_distributed_without_gpu
    from agentic_grpo.trainer import AgenticGRPOTrainer

    use_cpu_when_distributed_without_gpu()
    args = AgenticGRPOConfig(
        output_dir=out, num_generations=4, per_device_train_batch_size=8, steps_per_generation=1, max_steps=2,
        learning_rate=3e-2, beta=0.04, temperature=0.8, max_turns=LIMITS["max_turns"],
        max_tokens_per_turn=LIMITS["max_tokens_per_turn"], max_completion_length=LIMITS["max_completion_tokens"],
        max_tool_output_tokens=LIMITS["max_tool_output_tokens"], use_vllm=True, vllm_mode="server",
        vllm_server_base_url=url, vllm_server_timeout=60, canary_logprob_limit=0.02, gradient_checkpointing=False,
        report_to=[], save_strategy="no", logging_steps=1, save_trajectories_steps=0, seed=0,
    )  # fmt: skip
    trainer = AgenticGRPOTrainer(
        model=model_dir, reward_funcs=[by_tokens], args=args, train_dataset=Dataset.from_list(rows()),
        peft_config=LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules="all-linear"),
        environment_factory=Padded, trajectory_format=EveryTurnCalls(),
    )  # fmt: skip
    rank = trainer.accelerator.process_index
    server = trainer.vllm_generation
    record: dict[str, Any] = {"rank": rank, "syncs": [], "requests": [], "rollouts": [], "error": None}

    sync = server.sync_weights

    def counted_sync() -> None:
        record["syncs"].append(trainer.state.global_step)
        if plant == "never_loaded":
            trainer.accelerator.wait_for_everyone()
            return
        sync()

    server.sync_weights = counted_sync
    generate = server.generate

    def recorded_generate(prompts, images, num_generations):
        record["requests"].append({"live": len(prompts), "model": server.served, "step": trainer.state.global_step})
        return generate(prompts, images, num_generations)

    server.generate = recorded_generate
    rollout = trainer.rollout_func

    def recorded_rollout(prompts, trl_trainer):
        result = rollout(prompts, trl_trainer)
        record["rollouts"].append({
            "step": trainer.state.global_step, "turns": [t.turns for t in result["trajectory"]],
            "env_mask": result["env_mask"], "logprobs": result["logprobs"],
            "roles": [[s.role for s in t.completion_segments for _ in s.token_ids] for t in result["trajectory"]],
        })  # fmt: skip
        return result

    trainer.rollout_func = recorded_rollout
    try:
        trainer.train()
    except Exception as exc:
        record["error"] = f"{type(exc).__name__}: {exc}"
        record["traceback"] = traceback.format_exc()
    metrics = Path(out) / "metrics.jsonl"
    record["metrics"] = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.exists() else []
    record["adapters_left"] = sorted(p.name for p in (Path(out) / "vllm_adapters").glob("*"))
    Path(out, f"rank{rank}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    torch.manual_seed(0)
    main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] if len(sys.argv) > 4 else None)
