"""The GRPO loss of a co-trained role over its child trajectories (`agentic_grpo.subagents.cotrain`).

TRL's loss works on its own batch of the policy's rows; a role's children are another batch, under another LoRA
adapter, so the same clipped surrogate is written here for them: ratio against the old log-probs (stored at
generation, or the current ones detached), TRL's epsilons and `delta`, KL against the base model (adapters
disabled) with the run's `beta`, aggregated as the run's `loss_type` and scaled for gradient accumulation as
TRL scales the policy's:

    grpo: sum over samples of (token losses . mask) / (mask sum), / samples in the micro-batch, / accumulation
    bnpo: (token losses . mask) summed / the role's trained tokens in the micro-batch, / accumulation
    dapo: (token losses . mask) summed / (the role's trained tokens in the generation batch, per process and
          accumulation window)

Each is a sum over samples, so a micro-batch's loss can be computed (and back-propagated) one sample at a time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from agentic_grpo.subagents.adapters import adapter_active


@dataclass
class ChildSample:
    """One child trajectory of a trained role, ready for the loss (travels with its root's row in TRL's batch)."""

    role: str
    prompt_ids: list[int]
    completion_ids: list[int]
    loss_mask: list[int]
    reward: float
    """The root's reward; after `assign_advantages`, plus the role's own rewards (`role_scores`, filled)."""
    role_scores: tuple[float, ...] = ()
    """Each of the role's own rewards of this child, weighted; NaN where the reward gave None."""
    advantage: float = 0.0
    role_tokens: float = 0.0
    """The role's trainable tokens in the whole generation batch, over every process (the `dapo` normalizer)."""
    old_logps: list[float] | None = None
    ref_logps: list[float] | None = None
    sampling_logps: list[float] | None = None
    """The sampler's log-prob of each completion token (0.0 on tool tokens), for the sampler-trainer canary."""


def padded(samples: list[ChildSample], pad_id: int, device: Any) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Prompt ids left-padded and completion ids right-padded (TRL's layout): ids, attention mask, completion width."""
    prompt_width = max(len(s.prompt_ids) for s in samples)
    width = max(len(s.completion_ids) for s in samples)
    ids = torch.full((len(samples), prompt_width + width), pad_id, dtype=torch.long)
    attention = torch.zeros_like(ids)
    for i, s in enumerate(samples):
        start = prompt_width - len(s.prompt_ids)
        row = s.prompt_ids + s.completion_ids
        ids[i, start : start + len(row)] = torch.tensor(row)
        attention[i, start : start + len(row)] = 1
    return ids.to(device), attention.to(device), width


def completion_tensor(samples: list[ChildSample], values: str, width: int, device: Any) -> torch.Tensor:
    """A per-token field of the samples (`loss_mask`, `old_logps`, `ref_logps`), right-padded to `width`."""
    out = torch.zeros((len(samples), width), dtype=torch.float32)
    for i, s in enumerate(samples):
        row = getattr(s, values)
        out[i, : len(row)] = torch.tensor(row, dtype=torch.float32)
    return out.to(device)


def role_loss(
    trainer: Any, model: Any, adapter: str, together: list[ChildSample], samples: list[ChildSample]
) -> tuple[torch.Tensor, float, float]:
    """The share of `samples` (some of `together`, a role's samples in one micro-batch) in that role's loss, under
    its LoRA `adapter` and normalised over `together`, as the module docstring says; with the KL summed over their
    trained tokens and the count of those tokens."""
    args = trainer.args
    mode = "train" if trainer.model.training else "eval"
    device = trainer.accelerator.device
    ids, attention, width = padded(samples, trainer.processing_class.pad_token_id, device)
    with adapter_active(trainer.accelerator.unwrap_model(model), adapter):
        logps, _, _ = trainer._get_per_token_logps_and_entropies(model, ids, attention, width)
    mask = completion_tensor(samples, "loss_mask", width, device)
    advantages = torch.tensor([s.advantage for s in samples], dtype=torch.float32, device=device).unsqueeze(1)
    stored = samples[0].old_logps is not None
    old = completion_tensor(samples, "old_logps", width, device) if stored else logps.detach()
    ratio = torch.exp(logps - old)
    clipped = torch.clamp(ratio, 1 - trainer.epsilon_low, 1 + trainer.epsilon_high)
    if args.delta is not None:
        ratio = torch.clamp(ratio, max=args.delta)
    per_token = -torch.min(ratio * advantages, clipped * advantages)
    kl_sum = 0.0
    if trainer.beta != 0.0:
        ref = completion_tensor(samples, "ref_logps", width, device)
        kl = torch.exp(ref - logps) - (ref - logps) - 1
        per_token = per_token + trainer.beta * kl
        kl_sum = (kl * mask).sum().item()
    accumulation = trainer.current_gradient_accumulation_steps if mode == "train" else 1.0
    if trainer.loss_type == "grpo":
        loss = ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).sum() / len(together) / accumulation
    elif trainer.loss_type == "bnpo":
        tokens = max(float(sum(sum(s.loss_mask) for s in together)), 1.0)
        loss = (per_token * mask).sum() / tokens / accumulation
    else:  # dapo: the role's tokens of the whole generation batch, per process and accumulation window
        normalizer = max(samples[0].role_tokens, 1.0) / trainer.accelerator.num_processes
        if mode == "train":
            normalizer = normalizer * accumulation / args.steps_per_generation
        loss = (per_token * mask).sum() / normalizer
    return loss, kl_sum, mask.sum().item()
