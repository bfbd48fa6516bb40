"""Run by tests/test_vllm_colocate.py in a process of its own (one vLLM engine per process): real GRPO steps of
a multi-turn tool rollout on the tiny model, sampled by a colocated vLLM engine through TRL's `VLLMGeneration`,
with what the engine did recorded around it. Writes OUT/result.json.

    python tests/vllm_colocate_run.py MODEL OUT '{"lora": false, "top_k": 0, "plant": null, ...}'

`plant` puts one bug in the vLLM path, which the run must catch:
- `skip_sync`: the weights are synced once, before the first rollout, never again (vLLM samples with step-0 weights);
- `raw_logprobs`: the engine reports log-probs of the raw logits (no temperature, no top-k/top-p), not of the
  distribution it sampled from, which TRL's importance-sampling correction divides by;
- `unmerged`: a LoRA policy's sync sends the base weights without the adapter's update.
"""

from __future__ import annotations

import functools
import hashlib
import json
import sys
import traceback
from pathlib import Path
from typing import Any

import torch

from tests.lockstep_support import LIMITS, EveryTurnCalls, Padded


def by_tokens(prompts, completions, trajectory, **_) -> list[float]:
    """A reward that varies with the sampled tokens, so that advantages (and the weights) move every step."""
    return [float(sum(t.completion_ids) % 5) for t in trajectory]


def rows() -> list[dict[str, Any]]:
    """Eight questions x 4; each question's tool answer is short (runs to max_turns) or long (ends after turn 1)."""
    pads = [1, 100, 1, 30, 1, 100, 2, 1]
    return [{"prompt": [{"role": "user", "content": f"Question {i}: what is {i} + {i}?"}], "pad": pads[i]}
            for i in range(len(pads)) for _ in range(4)]  # fmt: skip


def base_digest(model: Any) -> str:
    """A hash of every weight but the adapters' (the KL reference of a LoRA policy)."""
    digest = hashlib.sha256()
    for name, param in sorted(model.named_parameters()):
        if "lora_" not in name:
            digest.update(name.encode())
            digest.update(param.detach().float().cpu().numpy().tobytes())
    return digest.hexdigest()


def plant_raw_logprobs() -> None:
    from trl.generation import vllm_generation

    engine = vllm_generation.LLM
    vllm_generation.LLM = lambda **kwargs: engine(**{**kwargs, "logprobs_mode": "raw_logprobs"})


def main(model_dir: str, out: str, options: dict[str, Any]) -> None:
    from datasets import Dataset
    from peft import LoraConfig

    from agentic_grpo.config import AgenticGRPOConfig
    from agentic_grpo.trainer import AgenticGRPOTrainer
    from agentic_grpo.vllm_backend import reloaded_into_kernels

    plant = options.get("plant")
    if plant == "raw_logprobs":
        plant_raw_logprobs()
    args = AgenticGRPOConfig(
        output_dir=out, num_generations=4, per_device_train_batch_size=8, steps_per_generation=1,
        max_steps=options.get("steps", 3), learning_rate=options.get("learning_rate", 3e-3), beta=0.04,
        temperature=options.get("temperature", 0.8), top_k=options.get("top_k", 0), top_p=options.get("top_p", 1.0),
        max_turns=LIMITS["max_turns"], max_tokens_per_turn=LIMITS["max_tokens_per_turn"],
        max_completion_length=LIMITS["max_completion_tokens"], max_tool_output_tokens=LIMITS["max_tool_output_tokens"],
        use_vllm=True, vllm_mode="colocate", vllm_gpu_memory_utilization=0.3, vllm_max_model_length=512,
        vllm_importance_sampling_mode=options.get("importance_sampling_mode", "sequence_mask"),
        canary_logprob_limit=options.get("canary_limit", 0.02), gradient_checkpointing=False, report_to=[],
        save_strategy="no", logging_steps=1, save_trajectories_steps=0, seed=0,
        model_init_kwargs={"dtype": options.get("dtype", "float32")},
    )  # fmt: skip
    peft_config = None
    if options.get("lora"):
        peft_config = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules="all-linear")
    trainer = AgenticGRPOTrainer(
        model=model_dir, reward_funcs=[by_tokens], args=args, train_dataset=Dataset.from_list(rows()),
        peft_config=peft_config, environment_factory=Padded, trajectory_format=EveryTurnCalls(),
    )  # fmt: skip
    vllm = trainer.vllm_generation
    record: dict[str, Any] = {"syncs": [], "loaded_tensors": 0, "rollouts": [], "engine_calls": [], "error": None,
                              "weights": sum(1 for _ in vllm._iter_named_params())}  # fmt: skip

    # What the engine did: every weight sync (at which optimizer step), every tensor loaded, every sample.
    sync = vllm.sync_weights

    def counted_sync() -> None:
        record["syncs"].append(trainer.state.global_step)
        if plant == "skip_sync" and len(record["syncs"]) > 1:
            return
        sync()

    vllm.sync_weights = counted_sync
    runner = vllm.llm.llm_engine.model_executor.driver_worker.model_runner
    load = runner.model.load_weights

    def counted_load(weights):
        weights = list(weights)
        record["loaded_tensors"] += len(weights)
        return load(weights)

    runner.model.load_weights = counted_load
    if plant == "unmerged":
        model = vllm.model

        def base_only():
            for name, param in model.named_parameters():
                name = name.removeprefix("base_model.model.").replace(".base_layer", "")
                if "lora_" not in name:
                    yield vllm._fix_param_name_to_vllm(name), param.data

        # Loaded as the backend loads into vLLM's CPU build: through the layer-wise reload.
        vllm._iter_named_params = functools.partial(reloaded_into_kernels, vllm, base_only)
    engine_generate = vllm.llm.generate

    def recorded_generate(prompts, sampling_params=None, **kwargs):
        outputs = engine_generate(prompts, sampling_params=sampling_params, **kwargs)
        record["engine_calls"].append([
            {"ids": list(o.outputs[0].token_ids),
             "logprobs": [next(iter(lp.values())).logprob for lp in o.outputs[0].logprobs]}
            for o in outputs
        ])  # fmt: skip
        return outputs

    vllm.llm.generate = recorded_generate
    rollout = trainer.rollout_func

    def recorded_rollout(prompts, trl_trainer):
        calls_before = len(record["engine_calls"])
        result = rollout(prompts, trl_trainer)
        record["rollouts"].append({
            "step": trainer.state.global_step,
            "engine_calls": [calls_before, len(record["engine_calls"])],
            "segments": [[(s.role, list(s.token_ids)) for s in t.completion_segments] for t in result["trajectory"]],
            "completion_ids": result["completion_ids"], "env_mask": result["env_mask"],
            "logprobs": result["logprobs"], "turns": [t.turns for t in result["trajectory"]],
        })  # fmt: skip
        return result

    trainer.rollout_func = recorded_rollout
    before = base_digest(trainer.model)
    try:
        trainer.train()
    except Exception as exc:  # the planted runs end here; the record says how
        record["error"] = f"{type(exc).__name__}: {exc}"
        record["traceback"] = traceback.format_exc()
    record["base_unchanged"] = base_digest(trainer.model) == before
    record["metrics"] = (
        [json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines()]
        if (Path(out) / "metrics.jsonl").exists()
        else []
    )
    record["dtype"] = str(next(trainer.model.parameters()).dtype)
    record["engine_dtype"] = str(trainer.vllm_generation.llm.llm_engine.model_config.dtype)
    Path(out, "result.json").write_text(json.dumps(record))


if __name__ == "__main__":
    torch.manual_seed(0)
    main(sys.argv[1], sys.argv[2], json.loads(sys.argv[3]))
