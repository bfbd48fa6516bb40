"""The GPU check: real GRPO steps on Qwen2.5-shaped models with random weights, and what CPU tests cannot show.

Made for a GPU machine with torch, transformers, accelerate and peft and nothing else this project depends on:
it imports neither trl, datasets, wandb, openai nor reasoning-gym, nor any module of ours that does (the
`RolloutLimits` are given in full for that reason: a missing field's default is read from the recipe config,
which imports trl). No model hub: the models are built from a config, the tokenizer is the tests'
(`agentic_grpo.models.build_tiny_model`). Phases, in this order:

- `fp32_identity`: on the 1.5B shape in fp32 (TF32 off), one seeded multi-turn rollout three ways: kept keys
  and values with a shrinking batch, with the full batch, and every context read whole (HF `generate`). The
  tokens and the generator's final state must be the same: the random-number argument of
  `agentic_grpo.shrinking_batch`, which tests/test_kv_reuse.py checks on CPU kernels only.
- `decode`: where one decoding step's time goes on the 7B shape: the plain model, PEFT LoRA, and PEFT LoRA with
  its adapters disabled; wall and device-busy milliseconds per step, kernels per step (`benchmarks/_gpu_decode.py`).
- `lora`: the 7B shape in bf16 with LoRA; `full`: the 1.5B shape in bf16, full fine-tuning with gradient
  checkpointing. Each: one rollout with plain `generate` (`reuse_cache=False, shrink_batch=False`), then GRPO
  steps: our rollout (G per question, calculator environment, ReAct format), a rule reward, group-normalized
  advantages, the clipped policy-gradient loss on the model's tokens with the sampling log-probs as the old
  log-probs, AdamW. Reported: peak memory, step time, rollout tokens/s ours against plain `generate` on the
  same prompts and seed (step 1's), and the sampler-trainer gap: |the log-prob the sampler recorded - the
  training forward's| per model token, before the update.

A random model never writes a well-formed call, so every turn is answered with an error observation and a
trajectory goes on until a turn hits its token budget or the turn limit: the multi-turn cost is real. So that
turns end at different lengths, as real ones do, 1 token id in `eos_every` counts as an end of turn.

`--deadline` bounds the run: a phase or step that would start too late is skipped, and `skipped` says which.
The JSON goes to `--out` after every phase and step, so a run cut short keeps what it measured.

    bash scripts/gpu_check.sh --out gpu.json          # Qwen2.5 shapes on the GPU
    bash scripts/gpu_check.sh --tiny --out gpu.json   # tiny shapes on CPU, the same code path (the tests)
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import resource
import sys
import tempfile
import time
import traceback
from collections import Counter
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

if not __package__:  # run as a file: the checkout's packages, and not this folder's modules as top-level names
    sys.path[:1] = [str(Path(__file__).resolve().parents[1])]

import torch

try:
    from agentic_grpo.benchmarks import _gpu_decode as decoding
    from agentic_grpo.benchmarks import _gpu_parts as parts
except ImportError:  # the checkout on the path, nothing installed (the GPU machine)
    from benchmarks import _gpu_decode as decoding
    from benchmarks import _gpu_parts as parts

ABSENT_ON_THE_GPU_MACHINE = ("trl", "datasets", "wandb", "openai", "reasoning_gym", "gguf", "math_verify")
PHASES = ("fp32_identity", "decode", "lora", "full")
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@dataclass(frozen=True)
class Plan:
    lora_shape: parts.Shape = parts.QWEN_7B
    full_shape: parts.Shape = parts.QWEN_1P5B
    identity_shape: parts.Shape = parts.QWEN_1P5B
    questions: int = 2  # per step, each `group` times
    group: int = 8
    turns: int = 4
    turn_tokens: int = 256
    observation_tokens: int = 96
    identity_turn_tokens: int = 64
    identity_eos_every: int = 24  # shorter turns than training's: many reach the turn limit in few tokens
    steps: int = 3
    eos_every: int = 96
    micro_batch_lora: int = 1  # rows per training forward: the 7B's activations without checkpointing are large
    micro_batch_full: int = 2
    lr_lora: float = 1e-5
    lr_full: float = 1e-6
    temperature: float = 1.0
    clip: float = 0.2
    deadline_s: float = 400.0
    first_rollout_s: float = 60.0  # what a phase's first rollout is assumed to need, before one is measured
    decode_context: int = 512
    decode_steps: int = 32


FULL_PLAN = Plan()
TINY = parts.TINY_SHAPE
TINY_PLAN = Plan(TINY, TINY, TINY, group=4, turns=3, turn_tokens=16, identity_turn_tokens=16, identity_eos_every=8,
                 steps=2, eos_every=8, micro_batch_lora=2, deadline_s=600.0, first_rollout_s=0.0,
                 decode_context=16, decode_steps=4)  # fmt: skip


STARTED = time.monotonic()


def log(message: str) -> None:
    print(f"[{time.monotonic() - STARTED:5.0f} s] {message}", file=sys.stderr, flush=True)


class Memory:
    """Peak memory: CUDA's allocated bytes since the last `reset`; on CPU the process's peak RSS (never reset)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.kind = "torch.cuda.max_memory_allocated" if self.cuda else "peak RSS of the process (not per phase)"

    def reset(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()

    def peak_gb(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
            return round(torch.cuda.max_memory_allocated() / 2**30, 3)
        return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 2**30, 3)

    def now_gb(self) -> float | None:
        return round(torch.cuda.memory_allocated() / 2**30, 3) if self.cuda else None


class Deadline:
    """Skips what would start too late to finish in time, and records what it skipped."""

    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds
        self.skipped: list[dict[str, str]] = []

    def allows(self, what: str, needs: float) -> bool:
        left = self.end - time.monotonic()
        if left >= needs:
            return True
        self.skipped.append(
            {"what": what, "why": f"{left:.0f} s left before the deadline, about {needs:.0f} s needed"}
        )
        log(f"skipped {what}: deadline")
        return False


def rollout(model: Any, tokenizer: Any, plan: Plan, rows: list[dict[str, str]], seed: int, turn_tokens: int,
            eos: list[int], reuse: bool = True, shrink: bool = True) -> tuple[list[Any], dict[str, Any]]:  # fmt: skip
    """One seeded rollout of `rows` x G through `RolloutManager` and `TransformersBackend`; trajectories, figures."""
    from transformers import GenerationConfig

    from agentic_grpo.backends import TransformersBackend
    from agentic_grpo.formats import load_format
    from agentic_grpo.rollout import RolloutLimits, RolloutManager

    calculator = parts.calculator_class()
    config = GenerationConfig(do_sample=True, temperature=plan.temperature, top_p=1.0, top_k=None,
                              pad_token_id=tokenizer.pad_token_id, eos_token_id=eos)  # fmt: skip
    backend = TransformersBackend(model, tokenizer, config, eos, reuse_cache=reuse, shrink_batch=shrink)
    trajectory_format = load_format("react", calculator.tool_schemas())
    limits = RolloutLimits(max_turns=plan.turns, max_tokens_per_turn=turn_tokens,
                           max_completion_tokens=plan.turns * (turn_tokens + plan.observation_tokens),
                           max_tool_output_tokens=plan.observation_tokens, tool_timeout=10.0,
                           tool_workers=8)  # fmt: skip
    manager = RolloutManager(calculator, trajectory_format, tokenizer, limits)
    repeated = [row for row in rows for _ in range(plan.group)]
    prompts = [trajectory_format.prompt_messages(row["question"]) for row in repeated]
    model.eval()
    torch.manual_seed(seed)
    start = time.perf_counter()
    try:
        trajectories, stats = manager.rollout(prompts, repeated, backend)
    finally:
        manager.close()
    seconds = time.perf_counter() - start
    tokens = sum(map(parts.model_tokens, trajectories))
    turns = [t.turns for t in trajectories]
    figures = {
        "seconds": round(seconds, 3), "generation_seconds": round(stats.generation_seconds, 3),
        "model_tokens": tokens, "tokens_per_s": round(tokens / stats.generation_seconds, 1),
        "trajectories": len(trajectories), "prompt_tokens": len(trajectories[0].prompt_ids),
        "longest_trajectory_tokens": max(len(t.prompt_ids) + len(t.completion_ids) for t in trajectories),
        "turns_mean": round(sum(turns) / len(turns), 2), "turns_min": min(turns), "turns_max": max(turns),
        "finish_reasons": dict(Counter(t.finish_reason for t in trajectories)),
    }  # fmt: skip
    return trajectories, figures


def rng_state(device: torch.device) -> torch.Tensor:
    return torch.cuda.get_rng_state(device) if device.type == "cuda" else torch.random.get_rng_state()


def first_difference(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def fp32_identity(plan: Plan, tokenizer: Any, device: torch.device) -> dict[str, Any]:
    """The same seeded rollout with a shrinking batch, the full batch and whole reads: the same tokens?"""
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32 here, whatever a library set before
    torch.backends.cudnn.allow_tf32 = False
    model = parts.build_model(plan.identity_shape, tokenizer, torch.float32, device)
    eos = parts.end_of_turn_ids(tokenizer, model.config.vocab_size, plan.identity_eos_every)
    rows = parts.questions(0, plan.questions)
    runs = {}
    ways = [("shrinking_batch", True, True), ("full_batch", True, False), ("whole_read", False, False)]
    for name, reuse, shrink in ways:
        trajectories, figures = rollout(model, tokenizer, plan, rows, 7, plan.identity_turn_tokens, eos, reuse, shrink)
        kept = [(t.completion_ids, [s.role for s in t.segments], t.finish_reason) for t in trajectories]
        runs[name] = (kept, rng_state(device), figures)
    del model
    free(device)

    def compare(a: str, b: str) -> dict[str, Any]:
        (left, left_rng, _), (right, right_rng, _) = runs[a], runs[b]
        differing = [i for i, (x, y) in enumerate(zip(left, right, strict=True)) if x != y]
        # Where each differing trajectory parts ways, of how many tokens: late, a rounding flip; at 0, a broken path.
        where = [(first_difference(left[i][0], right[i][0]), len(left[i][0])) for i in differing]
        return {"same_tokens": not differing, "trajectories_differing": len(differing),
                "first_differing_token_of": where[:8],
                "same_generator_state": bool(torch.equal(left_rng, right_rng))}  # fmt: skip

    return {
        "shape": plan.identity_shape.name, "dtype": "float32", "tf32": False, "turn_tokens": plan.identity_turn_tokens,
        "rollout": runs["shrinking_batch"][2],
        "shrinking_vs_full_batch": compare("shrinking_batch", "full_batch"),
        "kept_keys_vs_whole_read": compare("full_batch", "whole_read"),
    }  # fmt: skip


def grpo_phase(plan: Plan, tokenizer: Any, device: torch.device, memory: Memory, deadline: Deadline, lora: bool,
               save: Any) -> dict[str, Any]:  # fmt: skip
    """Plain `generate` once, then `plan.steps` GRPO steps; `save(result)` after each, for a run cut short."""
    shape = plan.lora_shape if lora else plan.full_shape
    name = "lora" if lora else "full"
    micro_batch = plan.micro_batch_lora if lora else plan.micro_batch_full
    memory.reset()
    model = parts.build_model(shape, tokenizer, torch.bfloat16, device)
    if lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=LORA_TARGETS))
    else:  # checkpointing applies in train mode only: generation in eval mode keeps its cache
        if hasattr(model, "activation_checkpointing_enable"):  # its name from transformers 5.2x on
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=plan.lr_lora if lora else plan.lr_full)
    vocab = model.get_input_embeddings().num_embeddings
    eos = parts.end_of_turn_ids(tokenizer, vocab, plan.eos_every)
    budget = plan.turns * plan.turn_tokens
    result: dict[str, Any] = {
        "shape": asdict(shape), "dtype": "bfloat16", "tuning": "lora r=16 on every linear layer" if lora else "full",
        "gradient_checkpointing": not lora, "optimizer": "AdamW (states in the parameters' dtype)",
        "micro_batch": micro_batch, "group": plan.group, "questions_per_step": plan.questions, "turns": plan.turns,
        "turn_tokens": plan.turn_tokens, "end_of_turn_ids": len(eos),
        "parameters_m": round(sum(p.numel() for p in model.parameters()) / 1e6, 1),
        "trainable_parameters_m": round(sum(p.numel() for p in trainable) / 1e6, 2), "weights_gb": memory.now_gb(),
        "steps": [],
    }  # fmt: skip
    log(f"{name}: {shape.name}, {result['parameters_m']}M parameters; warm-up")
    for reuse in (False, True):  # kernels, allocator, library handles: untimed, for both paths
        rollout(model, tokenizer, replace(plan, turns=2), parts.questions(-1, 1), 0, 8, eos, reuse, reuse)

    rows = parts.questions(1, plan.questions)
    if deadline.allows(f"{name}: plain generate rollout", plan.first_rollout_s):
        log(f"{name}: plain generate rollout ...")
        memory.reset()
        _, plain = rollout(model, tokenizer, plan, rows, 1001, plan.turn_tokens, eos, reuse=False, shrink=False)
        result["plain_generate_rollout"] = {**plain, "peak_memory_gb": memory.peak_gb()}
        save(result)
    gaps = []
    needs = result.get("plain_generate_rollout", {}).get("seconds", plan.first_rollout_s) * 1.3
    for step in range(1, plan.steps + 1):
        if not deadline.allows(f"{name}: GRPO step {step}", needs):
            break
        log(f"{name}: GRPO step {step} ...")
        rows = parts.questions(step, plan.questions)
        memory.reset()
        trajectories, figures = rollout(model, tokenizer, plan, rows, 1000 + step, plan.turn_tokens, eos)
        rollout_peak = memory.peak_gb()
        repeated = [row for row in rows for _ in range(plan.group)]
        rewards = [parts.rule_reward(t, row, budget) for t, row in zip(trajectories, repeated, strict=True)]
        memory.reset()
        start = time.perf_counter()
        advantages = parts.group_advantages(rewards, plan.group)
        loss, step_gaps = parts.grpo_update(model, optimizer, trajectories, advantages, micro_batch, plan.temperature,
                                            plan.clip, tokenizer.pad_token_id)  # fmt: skip
        if device.type == "cuda":
            torch.cuda.synchronize()
        train_seconds = time.perf_counter() - start
        gaps.append(step_gaps)
        result["steps"].append({
            "step": step, "rollout": figures, "train_seconds": round(train_seconds, 3),
            "step_seconds": round(figures["seconds"] + train_seconds, 3), "loss": loss,
            "reward_mean": sum(rewards) / len(rewards), "peak_memory_rollout_gb": rollout_peak,
            "peak_memory_train_gb": memory.peak_gb(),
            "trained_tokens": sum(len(t.prompt_ids) + len(t.completion_ids) for t in trajectories),
        })  # fmt: skip
        needs = (figures["seconds"] + train_seconds) * 1.3
        summarize(result, gaps)
        save(result)
    del model, optimizer, trainable
    free(device)
    return result


def summarize(result: dict[str, Any], gaps: list[torch.Tensor]) -> None:
    """The phase's headline figures from its steps (the first step's rollout is on the plain rollout's prompts)."""
    steps = result["steps"]
    peaks = [s["peak_memory_rollout_gb"] for s in steps] + [s["peak_memory_train_gb"] for s in steps]
    plain = result.get("plain_generate_rollout")
    if plain:
        peaks.append(plain["peak_memory_gb"])
    ours = steps[0]["rollout"]["tokens_per_s"]
    later = [s["step_seconds"] for s in steps[1:]] or [steps[0]["step_seconds"]]  # the first warms caches
    result.update({
        "peak_memory_gb": max(peaks), "step_seconds": [s["step_seconds"] for s in steps],
        "step_seconds_after_first": round(sum(later) / len(later), 3),
        "rollout_tokens_per_s": {"ours": ours, "plain_generate": plain["tokens_per_s"] if plain else None,
                                 "ours_over_plain": round(ours / plain["tokens_per_s"], 3) if plain else None},
        "logprob_gap": parts.gap_summary(torch.cat(gaps)),
    })  # fmt: skip


def free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def environment(device: torch.device, memory: Memory) -> dict[str, Any]:
    import accelerate
    import peft
    import transformers

    cuda = device.type == "cuda"
    return {
        "device": torch.cuda.get_device_name(device) if cuda else f"cpu ({platform.machine()})",
        "gpu_memory_gb": round(torch.cuda.get_device_properties(device).total_memory / 2**30, 1) if cuda else None,
        "torch": torch.__version__, "cuda": torch.version.cuda, "transformers": transformers.__version__,
        "peft": peft.__version__, "accelerate": accelerate.__version__, "python": platform.python_version(),
        "torch_threads": torch.get_num_threads(), "memory_measure": memory.kind,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="agentic-grpo bench gpu", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=None, help="where to write the JSON (it is printed too)")
    parser.add_argument("--tiny", action="store_true", help="tiny shapes and few tokens, on CPU: seconds")
    parser.add_argument("--device", default=None, help="default: cuda, or cpu with --tiny")
    parser.add_argument("--steps", type=int, default=None, help="GRPO steps per phase (default: 3, --tiny 2)")
    parser.add_argument("--deadline", type=float, default=None,
                        help="seconds after which nothing new starts (default: 400, --tiny 600)")  # fmt: skip
    parser.add_argument("--phases", nargs="+", default=list(PHASES), choices=PHASES,
                        help="which phases to run (default: all)")  # fmt: skip
    args = parser.parse_args(argv)
    plan = TINY_PLAN if args.tiny else FULL_PLAN
    plan = replace(plan, steps=args.steps or plan.steps, deadline_s=args.deadline or plan.deadline_s)
    device = torch.device(args.device or ("cpu" if args.tiny else "cuda"))
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("no CUDA device here: the full check needs a GPU (`--tiny` runs on CPU)")
    if args.tiny and device.type == "cpu":  # tiny tensors gain nothing from threads, which a busy machine stalls
        torch.set_num_threads(1)
    begun = time.perf_counter()
    memory, deadline = Memory(device), Deadline(plan.deadline_s)
    report: dict[str, Any] = {"benchmark": "gpu", "mode": "tiny" if args.tiny else "full",
                              **environment(device, memory), "deadline_s": plan.deadline_s,
                              "complete": False, "phases": {}, "skipped": deadline.skipped}  # fmt: skip

    def write() -> None:
        report["seconds"] = round(time.perf_counter() - begun, 1)
        if args.out is not None:
            args.out.write_text(json.dumps(report, indent=2) + "\n")

    def save(phase: str, result: dict[str, Any]) -> None:
        report["phases"][phase] = result
        write()

    with tempfile.TemporaryDirectory(prefix="agentic-grpo-gpu-") as directory:
        tokenizer = parts.tests_tokenizer(Path(directory))
    for phase in [p for p in PHASES if p in args.phases]:
        if not deadline.allows(phase, (2 if phase in ("lora", "full") else 1) * plan.first_rollout_s):
            continue
        log(f"{phase} ...")
        try:
            if phase == "fp32_identity":
                save(phase, fp32_identity(plan, tokenizer, device))
            elif phase == "decode":
                save(phase, decoding.decode_phase(plan.lora_shape, tokenizer, device, plan.group * plan.questions,
                                                  plan.decode_context, plan.decode_steps, LORA_TARGETS))  # fmt: skip
            else:
                save(phase, grpo_phase(plan, tokenizer, device, memory, deadline, phase == "lora",
                                       lambda result, phase=phase: save(phase, result)))  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - one phase's failure (out of memory, say) must not cost the others
            log(traceback.format_exc())
            report["phases"].setdefault(phase, {})["error"] = f"{type(exc).__name__}: {exc}"[:2000]
        free(device)  # after the handler: its traceback no longer holds the failed phase's tensors
    report["imported_absent_packages"] = sorted(n for n in ABSENT_ON_THE_GPU_MACHINE if sys.modules.get(n) is not None)
    failed = [phase for phase, result in report["phases"].items() if "error" in result]
    report["complete"] = not deadline.skipped and not failed
    write()
    print(json.dumps(report, indent=2))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
