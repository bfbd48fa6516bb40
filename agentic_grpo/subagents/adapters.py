"""Generation under a chosen LoRA adapter of the policy's one PeftModel, without disturbing the policy.

Sub-agents that run on the policy's base model are named adapters on the same PeftModel, so the base
weights exist once. A sub-agent selects its adapter for one `generate` call at a time and puts back what
it found: the active adapter, every parameter's `requires_grad` (PEFT's `set_adapter` changes it, and a
co-training trainer must not find its adapters frozen or thawed behind its back) and train/eval mode.
Generation runs in eval mode (no dropout masks on sampled tokens) and without gradients.

A lock per model serialises these calls: two sub-agents on the same model run in parallel threads (one
job per sub-agent per parent turn), and neither an adapter switch nor TRL's unwrapping for generation
(which changes the model's generation config for the call) may happen in the middle of another
sub-agent's `generate`. The parent's own generation never overlaps them: its turn loop generates, then
waits for the turn's tool calls (sub-agents included) before it generates again.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from agentic_grpo.backends import TrainerBackend, TransformersBackend
from agentic_grpo.models import is_peft_model

BASE = "__base__"
"""The adapter name that means "the base model, every adapter disabled" (PEFT's own name for it)."""

_locks: weakref.WeakKeyDictionary[Any, threading.RLock] = weakref.WeakKeyDictionary()
_locks_guard = threading.Lock()


def model_lock(model: Any) -> threading.RLock:
    """The lock every sub-agent generation on `model` holds (one per model object)."""
    with _locks_guard:
        if model not in _locks:
            _locks[model] = threading.RLock()
        return _locks[model]


@contextlib.contextmanager
def generating_as(model: Any, adapter: str | None) -> Iterator[Any]:
    """`model` in eval mode, generating under `adapter` (None: as it is; `BASE`: adapters disabled, or as it is when
    it has none), then restored.

    Hold `model_lock(model)` around it when other threads may generate on the same model.
    """
    # Each module's own mode comes back, not one mode for all: during a rollout the trainer keeps the root in
    # train mode with every module below it in eval (no dropout while sampling), and `model.train(True)` would
    # switch dropout back on for every later turn of the policy.
    modes = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        if adapter is None or (adapter == BASE and not is_peft_model(model)):
            yield model  # a model without adapters is its own base (the untrained policy, evaluated)
        elif not is_peft_model(model):
            raise ValueError(
                f"a sub-agent asks for LoRA adapter `{adapter}`, but the policy is not a PEFT model: train with "
                "`use_peft: true` (adapters share the policy's base weights), or give the sub-agent a `model` of its own"
            )
        elif adapter == BASE:
            with model.disable_adapter():
                yield model
        else:
            with adapter_active(model, adapter):
                yield model
    finally:
        for module, training in modes:
            module.training = training


@contextlib.contextmanager
def adapter_active(model: Any, adapter: str) -> Iterator[None]:
    """`adapter` is the active LoRA adapter of PeftModel `model` for the block; every parameter keeps its
    `requires_grad` (PEFT's `set_adapter` freezes the others), so co-trained adapters stay trainable and a
    forward under `adapter` builds the graph of its parameters alone."""
    if adapter not in model.peft_config:
        raise ValueError(f"the policy has no LoRA adapter `{adapter}` (it has: {', '.join(model.peft_config)})")
    previous = model.active_adapters
    if len(previous) != 1:
        raise ValueError(f"the policy has several active adapters {previous}; a sub-agent can only switch from one")
    grads = {name: p.requires_grad for name, p in model.named_parameters()}
    model.set_adapter(adapter)
    _restore_requires_grad(model, grads)
    try:
        yield
    finally:
        model.set_adapter(previous[0])
        _restore_requires_grad(model, grads)


def _restore_requires_grad(model: Any, grads: dict[str, bool]) -> None:
    for name, p in model.named_parameters():
        if p.requires_grad != grads.get(name, p.requires_grad):
            p.requires_grad_(grads[name])


def attach_adapter(model: Any, name: str, path: str | None, trainable: bool = False) -> None:
    """Add LoRA adapter `name` to the policy's PeftModel, frozen (or `trainable`: its parameters require grad, for
    co-training): loaded from `path`, or new with the config of the policy's own adapter (a new adapter starts
    as the base model: its B matrices are zero).

    The active adapter, the trainable parameters and train/eval mode stay as they were. Does nothing when the
    model already has an adapter of that name.
    """
    if not is_peft_model(model):
        raise ValueError(
            f"sub-agent adapter `{name}` needs a PEFT policy (`use_peft: true`): its adapters share the policy's base "
            "weights. Give the sub-agent a `model` of its own instead, or train the policy with LoRA"
        )
    if name in model.peft_config:
        return
    if path is not None and not Path(path, "adapter_config.json").is_file():
        raise ValueError(
            f"sub-agent adapter `{name}`: {path} holds no saved adapter (no adapter_config.json): train it first (a "
            "run with `use_peft: true` saves its adapter in its output_dir), or give the right `adapter_path`"
        )
    import copy

    was_training = model.training
    with model_lock(model):
        grads = {n: p.requires_grad for n, p in model.named_parameters()}
        if path is not None:
            model.load_adapter(path, adapter_name=name, is_trainable=trainable)  # puts the model in eval mode
        else:
            config = copy.deepcopy(model.peft_config[model.active_adapter])
            config.inference_mode = not trainable
            if hasattr(config, "init_lora_weights"):  # the policy's may have been made random; a new one is the base
                config.init_lora_weights = True
            model.add_adapter(name, config)
        for n, p in model.named_parameters():  # the others as they were; the new adapter's as asked
            p.requires_grad_(grads[n] if n in grads else trainable)
    model.train(was_training)


def restore_policy_adapter(model: Any, checkpoint: str) -> None:
    """Load the policy's own adapter ("default", saved at the checkpoint's top level) from `checkpoint` into
    `model`'s PeftModel. Some transformers releases (5.19, which vLLM's CPU build pins) load only the adapters of a
    checkpoint's subfolders when it has any (the sub-agents' adapters, frozen or co-trained), and the resumed
    policy would go on from a fresh adapter."""
    path = Path(checkpoint)
    if is_peft_model(model) and any((path / f).is_file() for f in ("adapter_model.safetensors", "adapter_model.bin")):
        model.load_adapter(str(path), "default", is_trainable=True)


class _OnAdapter:
    """Mixin for a backend on the policy's model: every `generate` holds the model's lock and runs under `adapter`."""

    adapter: str | None = None
    model: Any
    policy_backend: Any = None
    """The trained policy's backend, which sub-agents of this backend's sub-agent derive theirs from."""
    record_logprobs: bool = False
    """Also return each new token's sampling log-prob (one forward pass more per call), for a trainer of sub-agents."""

    def generate(self, batch: list[list[int]], stop: list[str], max_new_tokens: int, **kwargs: Any) -> list[Any]:
        generations = super().generate(batch, stop, max_new_tokens, **kwargs)  # type: ignore[misc]
        # The kept-cache decoding loop records them as it samples; a forward pass only where it did not run.
        if self.record_logprobs and any(g.token_ids and g.logprobs is None for g in generations):
            self._add_logprobs(batch, generations)
        return generations

    def _add_logprobs(self, batch: list[list[int]], generations: list[Any]) -> None:
        """The log-prob of every new token under this adapter at the sampling temperature (before top-k/top-p,
        as TRL computes its per-token log-probs), from one forward pass over context + new tokens."""
        import torch

        config = self.generation_config  # type: ignore[attr-defined]
        temperature = config.temperature if config.do_sample and config.temperature else 1.0
        rows = [ids + g.token_ids for ids, g in zip(batch, generations, strict=True)]
        width = max(len(r) for r in rows)
        input_ids = torch.zeros((len(rows), width), dtype=torch.long)
        attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, row in enumerate(rows):  # right padding: each row's positions start at 0
            input_ids[i, : len(row)] = torch.tensor(row)
            attention_mask[i, : len(row)] = 1
        with self._generating_model() as model:
            logits = model(input_ids=input_ids.to(model.device), attention_mask=attention_mask.to(model.device)).logits
        logprobs = torch.log_softmax(logits.float() / temperature, dim=-1).cpu()
        for i, (context, generation) in enumerate(zip(batch, generations, strict=True)):
            positions = torch.arange(len(context) - 1, len(context) - 1 + len(generation.token_ids))
            chosen = torch.tensor(generation.token_ids)
            generation.logprobs = logprobs[i, positions, chosen].tolist()

    @contextlib.contextmanager
    def _generating_model(self) -> Iterator[Any]:
        # The lock is taken on the model the backend holds (the trainer's, possibly wrapped) before unwrapping:
        # TRL's unwrapping itself changes the model (its generation config, gradient checkpointing) for the call.
        with (
            model_lock(self.model),
            super()._generating_model() as model,  # type: ignore[misc]
            generating_as(model, self.adapter),
        ):
            yield model


class AdapterBackend(_OnAdapter, TransformersBackend):
    """HF `generate` on a model held in this process, under `adapter` (a fresh backend: no state shared with the parent's)."""

    def __init__(
        self, model: Any, tokenizer: Any, generation_config: Any, eos_token_ids: list[int], adapter: str | None
    ):
        super().__init__(model, tokenizer, generation_config, eos_token_ids)
        self.adapter = adapter


class TrainerAdapterBackend(_OnAdapter, TrainerBackend):
    """HF `generate` on the policy a trainer is training (unwrapped as for the policy's own turns), under `adapter`."""

    def __init__(self, trainer: Any, adapter: str | None, generation_config: Any = None) -> None:
        super().__init__(trainer)
        self.adapter = adapter
        if generation_config is not None:
            self.generation_config = generation_config
