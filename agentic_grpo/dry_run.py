"""`agentic-grpo train --config RECIPE --dry-run`: will this recipe fit its GPU? Answered on any machine.

The recipe is read as for training, its model is built on the meta device from its config (no weights, no hub:
`agentic_grpo.memory_estimate`), and the estimated GPU memory of one training process is printed part by part. A
recipe whose peak exceeds the card (`--gpu_memory_gb`, default 80) is refused: exit status 1 and a message that
names the biggest part and what to change. The launch (processes and ZeRO/FSDP sharding) comes from
`--accelerate_config`, else from the accelerate config the recipe's comments launch it with
(`--config_file accelerate_configs/X.yaml`), else one process.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from typing import Any

from agentic_grpo.memory_estimate import GIB, Launch, MemoryEstimate, ModelFacts

DRY_RUN_FLAGS = ("--dry-run", "--dry_run")
DEFAULT_GPU_MEMORY_GB = 80.0
DEFAULT_PROMPT_TOKENS = 1024  # a system prompt with tool descriptions and a question; `--prompt_tokens` overrides

ADVICE = {
    "weights": "shard the model across GPUs with ZeRO-3 or FSDP (`--accelerate_config deepspeed_zero3` or `fsdp`), "
    "or load it in 4-bit (`load_in_4bit: true` with `use_peft: true`)",
    "LoRA adapter": "lower `lora_r` or target fewer modules (`lora_target_modules`)",
    "optimizer state": "train a LoRA adapter (`use_peft: true`), or shard the optimizer across GPUs with ZeRO-3 or "
    "FSDP (`--accelerate_config deepspeed_zero3` or `fsdp`)",
    "gradients": "train a LoRA adapter (`use_peft: true`), or shard the gradients across GPUs with ZeRO-2/3 or FSDP",
    "reference model": "train a LoRA adapter (the reference is then the base with adapters off, no copy), shard "
    "it with ZeRO-3 or FSDP, or drop the KL term (`beta: 0`)",
    "activations": "turn on `gradient_checkpointing`, lower `per_device_train_batch_size` (raise "
    "`gradient_accumulation_steps` to keep the batch) or `max_completion_length`",
    "logits": "lower `per_device_train_batch_size` or `max_completion_length`",
    "KV cache (generate)": "lower `per_device_train_batch_size` x `steps_per_generation` or `max_completion_length`, "
    "or generate with vLLM (`use_vllm: true`)",
    "gathered weights (generate)": "generate with vLLM (`use_vllm: true`), or set `ds3_gather_for_generation: false` "
    "(much slower generation)",
    "vLLM (colocate)": "lower `vllm_gpu_memory_utilization`, or set `vllm_enable_sleep_mode: true` so that vLLM's "
    "memory is free while training",
}
SHARDING = {"single": "no sharding", "ddp": "DDP, nothing sharded", "zero1": "ZeRO-1: optimizer sharded",
            "zero2": "ZeRO-2: optimizer and gradients sharded", "zero3": "ZeRO-3: everything sharded",
            "fsdp": "FSDP: everything sharded"}  # fmt: skip


@dataclass
class DryRun:
    """A recipe's memory estimate with what it was computed from."""

    recipe: str
    estimate: MemoryEstimate
    facts: ModelFacts
    launch: Launch
    config: Any
    prompt_tokens: int


def wants_dry_run(argv: list[str]) -> bool:
    return any(arg in DRY_RUN_FLAGS for arg in argv)


def main(argv: list[str]) -> int:
    """Print the estimate of the recipe in `argv`; 0 when it fits its card, 1 when not, 2 for a bad recipe."""
    try:
        result = dry_run(argv)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(report(result), flush=True)
    if not result.estimate.fits:
        print(f"error: {refusal(result)}", file=sys.stderr)
        return 1
    return 0


def dry_run(argv: list[str]) -> DryRun:
    """Read the recipe (`--config` and overrides, as `train` does; its data and plug-ins are not loaded) and
    estimate one process's GPU memory."""
    import torch
    from trl import get_peft_config

    from agentic_grpo.config import read_recipe
    from agentic_grpo.memory_estimate import estimate, launch_from_accelerate_config, model_facts
    from agentic_grpo.models import model_init_kwargs
    from agentic_grpo.resources import find_shipped

    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument(*DRY_RUN_FLAGS, action="store_true")
    parser.add_argument("--gpu_memory_gb", type=float, default=DEFAULT_GPU_MEMORY_GB)
    parser.add_argument("--prompt_tokens", type=int, default=DEFAULT_PROMPT_TOKENS)
    parser.add_argument("--num_processes", type=int)
    parser.add_argument("--accelerate_config")
    own, rest = parser.parse_known_args(argv)
    if not torch.cuda.is_available():  # the recipe's `bf16: true` is refused on a CPU; here it is only read
        rest += ["--use_cpu", "true"]
    _, config, model_config = read_recipe(rest)
    recipe = rest[rest.index("--config") + 1] if "--config" in rest else "(command line)"
    accelerate_config = own.accelerate_config or documented_accelerate_config(recipe)
    processes = own.num_processes or 1
    launch = Launch(processes, "ddp" if processes > 1 else "single")
    if accelerate_config:
        path = find_shipped(accelerate_config, "accelerate_configs", ".yaml")
        launch = launch_from_accelerate_config(path, own.num_processes)
    dtype = model_init_kwargs(config, model_config).get("dtype")
    quantized = 4 if model_config.load_in_4bit else 8 if model_config.load_in_8bit else None
    facts = model_facts(
        model_config.model_name_or_path or "",
        str(dtype).removeprefix("torch.") if dtype not in (None, "auto") else None,
        get_peft_config(model_config),
        zero3=launch.strategy == "zero3",
    )
    result = estimate(config, facts, launch, own.gpu_memory_gb, own.prompt_tokens, quantized)
    return DryRun(recipe, result, facts, launch, config, own.prompt_tokens)


def documented_accelerate_config(recipe: str) -> str | None:
    """The accelerate config a recipe's comments launch it with (`--accelerate_config NAME` or `--config_file
    X.yaml`), if any."""
    from agentic_grpo.resources import find_shipped

    try:
        text = find_shipped(recipe, "recipes", ".yaml").read_text()
    except ValueError:
        return None
    found = re.search(r"--accelerate_config\s+(\S+)|--config_file\s+(\S+\.ya?ml)", text)
    return (found.group(1) or found.group(2)) if found else None


def report(result: DryRun) -> str:
    """The estimate as a table, with its model, launch, lengths and total against the card."""
    facts, launch, config, estimate = result.facts, result.launch, result.config, result.estimate
    trains = (
        f"LoRA: {facts.trainable / 1e6:.1f}M trainable ({facts.trainable_dtype})"
        if facts.trainable != facts.parameters
        else "full fine-tuning"
    )
    rows = config.per_device_train_batch_size * config.steps_per_generation
    generation = f"vLLM {config.vllm_mode}" if config.use_vllm else "HF generate"
    lines = [
        f"Dry run of recipe {result.recipe}: estimated GPU memory of one training process (no weights allocated)",
        f"  model:   {facts.name} ({facts.source}), {facts.parameters / 1e9:.2f}e9 parameters in {facts.dtype}; "
        f"{trains}",
        f"  launch:  {launch.processes} process{'es' if launch.processes > 1 else ''}, {SHARDING[launch.strategy]} "
        f"({launch.source}); card: {estimate.card_gb:g} GB",
        f"  lengths: microbatch of {config.per_device_train_batch_size} rows x ({result.prompt_tokens} prompt + "
        f"{config.max_completion_length} completion) tokens; rollout of {rows} rows per process ({generation})",
        "",
        f"  {'part':<28}{'GiB':>8}  {'held':<9} how",
    ]
    for part in estimate.parts:
        lines.append(f"  {part.name:<28}{part.bytes / GIB:>8.2f}  {part.phase:<9} {part.how}")
    if not config.beta:
        lines.append(f"  {'reference model':<28}{0:>8.2f}  {'-':<9} beta 0: no KL term, no reference")
    elif facts.trainable != facts.parameters:
        lines.append(f"  {'reference model':<28}{0:>8.2f}  {'-':<9} LoRA: the base with adapters off, no copy")
    lines.append("")
    for phase in ("rollout", "training"):
        lines.append(f"  {'at the height of ' + phase:<28}{estimate.phase_bytes(phase) / GIB:>8.2f}")
    share = estimate.peak / (estimate.card_gb * GIB)
    verdict = "does NOT fit" if estimate.peak > estimate.card_gb * GIB else "fits"
    if estimate.blockers:
        verdict += ", but the run cannot start: " + "; ".join(estimate.blockers)
    lines.append(f"  {'peak':<28}{estimate.peak / GIB:>8.2f}  = {share:.0%} of {estimate.card_gb:g} GB: {verdict}")
    lines += [f"  note: {note}" for note in estimate.notes]
    return "\n".join(lines)


def refusal(result: DryRun) -> str:
    """Why the recipe cannot run on its card: the biggest part at the peak and what to change."""
    estimate = result.estimate
    if estimate.blockers:
        return f"recipe `{result.recipe}` cannot run: " + "; ".join(estimate.blockers)
    biggest = estimate.biggest()
    advice = ADVICE.get(biggest.name, "use a GPU with more memory (`--gpu_memory_gb`)")
    return (
        f"recipe `{result.recipe}` does not fit one {estimate.card_gb:g} GB GPU: about {estimate.peak / GIB:.1f} GiB "
        f"per process at the height of its {estimate.peak_phase}. The biggest part is {biggest.name} "
        f"({biggest.bytes / GIB:.1f} GiB): {advice}. (--gpu_memory_gb sets the card; docs/dry_run.md lists what "
        "the estimate assumes.)"
    )
