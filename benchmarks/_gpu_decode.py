"""The GPU check's `decode` phase: where one decoding step's time goes, on the LoRA phase's 7B shape.

One decoding step of a batch (the GRPO phases' G x questions rows) after a context of `context` tokens, timed
three ways on the same weights: the plain model, the model wrapped with PEFT LoRA on every linear layer (what the
`lora` phase samples with), and the same wrapper with its adapters disabled (the wrapper's Python without the
adapters' kernels). For each: wall-clock milliseconds per step, and from `torch.profiler` the device's busy
milliseconds per step and the kernels launched per step. Wall time far above busy time means the step is bound
by launching kernels, not by the GPU; `weights_read_ms` is the least a step can take, the weights read once at
the copy bandwidth measured on the machine.
"""

from __future__ import annotations

import time
from typing import Any

import torch

try:
    from agentic_grpo.benchmarks import _gpu_parts as parts
except ImportError:  # the checkout on the path, nothing installed (the GPU machine)
    from benchmarks import _gpu_parts as parts


def copy_bandwidth(device: torch.device) -> float | None:
    """Bytes per second of a device-to-device copy of 2 GiB, counting bytes read and written (CUDA only)."""
    if device.type != "cuda":
        return None
    source = torch.empty(2**30, dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    target.copy_(source)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(10):
        target.copy_(source)
    torch.cuda.synchronize()
    return 2 * 10 * source.numel() / (time.perf_counter() - start)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def time_steps(model: Any, batch: int, context: int, vocab: int, steps: int, device: torch.device) -> dict[str, Any]:
    """Wall ms per decoding step over `steps` steps, and the profiler's busy ms and kernels per step over 4."""
    from transformers import DynamicCache

    generator = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, vocab, (batch, context), generator=generator).to(device)
    token = torch.randint(0, vocab, (batch, 1), generator=generator).to(device)

    def run(count: int) -> None:
        cache = DynamicCache()
        model(input_ids=prompt, past_key_values=cache, use_cache=True, logits_to_keep=1)
        for _ in range(count):
            model(input_ids=token, past_key_values=cache, use_cache=True, logits_to_keep=1)

    with torch.no_grad():
        run(4)  # warm-up
        sync(device)
        start = time.perf_counter()
        run(0)
        sync(device)
        prefill = time.perf_counter() - start
        start = time.perf_counter()
        run(steps)
        sync(device)
        wall_ms = ((time.perf_counter() - start) - prefill) / steps * 1000
        figures: dict[str, Any] = {"wall_ms_per_step": round(wall_ms, 3)}
        figures.update(profile_steps(run, device))
    return figures


def profile_steps(run: Any, device: torch.device, steps: int = 4) -> dict[str, Any]:
    """The device's busy ms and the kernels launched per decoding step (CUDA only), from `torch.profiler`."""
    if device.type != "cuda":
        return {}
    from torch.profiler import ProfilerActivity, profile

    def busy(count: int) -> tuple[float, int]:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            run(count)
            torch.cuda.synchronize()
        kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        return sum(e.time_range.elapsed_us() for e in kernels) / 1000, len(kernels)

    try:
        prefill_ms, prefill_kernels = busy(0)
        total_ms, total_kernels = busy(steps)
    except Exception as exc:  # noqa: BLE001 - a profiler that cannot run leaves the wall-clock figures standing
        return {"profiler_error": f"{type(exc).__name__}: {exc}"[:500]}
    return {
        "busy_ms_per_step": round((total_ms - prefill_ms) / steps, 3),
        "kernels_per_step": round((total_kernels - prefill_kernels) / steps, 1),
    }


def decode_phase(shape: parts.Shape, tokenizer: Any, device: torch.device, batch: int, context: int, steps: int,
                 lora_targets: list[str]) -> dict[str, Any]:  # fmt: skip
    """Per-step decoding figures for the plain model, PEFT LoRA, and PEFT LoRA with its adapters disabled."""
    from peft import LoraConfig, get_peft_model

    model = parts.build_model(shape, tokenizer, torch.bfloat16, device).eval()
    vocab = model.get_input_embeddings().num_embeddings
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    bandwidth = copy_bandwidth(device)
    result: dict[str, Any] = {
        "shape": shape.name, "dtype": "bfloat16", "batch": batch, "context": context, "steps": steps,
        "weights_gb": round(weights / 1e9, 3),
        "copy_bandwidth_tb_s": round(bandwidth / 1e12, 2) if bandwidth else None,
        "weights_read_ms": round(weights / bandwidth * 1000, 3) if bandwidth else None,
    }  # fmt: skip
    result["plain"] = time_steps(model, batch, context, vocab, steps, device)
    model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=lora_targets))
    model.eval()
    result["peft_lora"] = time_steps(model, batch, context, vocab, steps, device)
    with model.disable_adapter():
        result["peft_lora_disabled"] = time_steps(model, batch, context, vocab, steps, device)
    plain, lora = result["plain"]["wall_ms_per_step"], result["peft_lora"]["wall_ms_per_step"]
    result["lora_over_plain"] = round(lora / plain, 2)
    del model
    return result
