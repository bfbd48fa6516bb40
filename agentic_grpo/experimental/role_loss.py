"""A co-trained role's share of the GRPO loss over its child trajectories (`agentic_grpo.experimental.cotrain`).

The loss is TRL's own (`GRPOTrainer._compute_loss`, the policy's): the role's children are a batch of TRL's layout
(prompts left-padded, completions right-padded, tool tokens out of the loss through `tool_mask`), read under the
role's LoRA adapter, with the role's advantages, old and reference log-probs. Clipping, `delta`, the KL against
the base model (adapters disabled), the entropy quantile and the loss type are the run's, as for the policy. What
TRL logs for the batch goes under `roles/<name>/` (`AgenticGRPOTrainer.metrics_under`).

A role's loss is normalised over all its samples in the micro-batch (`together`), but may be computed one sample
(or any share) at a time, each share's backward on its own: TRL's loss of a share is scaled to its part of the
whole, as each loss type sums over samples:

    grpo: mean over samples of each one's token mean  -> x samples in the share / samples together
    bnpo: token sum / the share's trained tokens       -> x the share's tokens / the tokens together
    dapo: token sum / the role's trained tokens in the generation batch (`num_items_in_batch`): as it is
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from agentic_grpo.subagents.adapters import adapter_active

LOSS_TYPES = ("grpo", "bnpo", "dapo")
"""The loss types whose share of a batch is a known part of the whole (module docstring)."""


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
    batch = trl_batch(samples, pad_id, device)
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    attention = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    return ids, attention, batch["completion_ids"].size(1)


def trl_batch(samples: list[ChildSample], pad_id: int, device: Any) -> dict[str, torch.Tensor]:
    """The samples' ids and masks as TRL's loss takes a batch: `prompt_ids`/`prompt_mask` left-padded,
    `completion_ids`/`completion_mask` right-padded, and `tool_mask`, the loss mask (tool tokens are read, not
    trained)."""
    prompt_width = max(len(s.prompt_ids) for s in samples)
    width = max(len(s.completion_ids) for s in samples)
    prompt_ids = torch.full((len(samples), prompt_width), pad_id, dtype=torch.long)
    prompt_mask = torch.zeros_like(prompt_ids)
    completion_ids = torch.full((len(samples), width), pad_id, dtype=torch.long)
    completion_mask = torch.zeros_like(completion_ids)
    for i, s in enumerate(samples):
        prompt_ids[i, prompt_width - len(s.prompt_ids) :] = torch.tensor(s.prompt_ids)
        prompt_mask[i, prompt_width - len(s.prompt_ids) :] = 1
        completion_ids[i, : len(s.completion_ids)] = torch.tensor(s.completion_ids)
        completion_mask[i, : len(s.completion_ids)] = 1
    batch = {
        "prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": completion_ids,
        "completion_mask": completion_mask, "tool_mask": completion_tensor(samples, "loss_mask", width, "cpu").long(),
    }  # fmt: skip
    return {name: value.to(device) for name, value in batch.items()}


def completion_tensor(samples: list[ChildSample], values: str, width: int, device: Any) -> torch.Tensor:
    """A per-token field of the samples (`loss_mask`, `old_logps`, `ref_logps`), right-padded to `width`."""
    out = torch.zeros((len(samples), width), dtype=torch.float32)
    for i, s in enumerate(samples):
        row = getattr(s, values)
        out[i, : len(row)] = torch.tensor(row, dtype=torch.float32)
    return out.to(device)


def role_loss(
    trainer: Any, model: Any, role: str, adapter: str, together: list[ChildSample], samples: list[ChildSample]
) -> torch.Tensor:
    """The share of `samples` (some of `together`, the role `role`'s samples in one micro-batch) in that role's
    loss: TRL's loss under the role's LoRA `adapter`, scaled as the module docstring says; what TRL logs for it goes
    under `roles/<role>/`. Co-training runs in one process, so the collectives of TRL's metrics meet no other
    process that calls them less often."""
    device = trainer.accelerator.device
    inputs: dict[str, Any] = trl_batch(samples, trainer.processing_class.pad_token_id, device)
    width = inputs["completion_ids"].size(1)
    inputs["advantages"] = torch.tensor([s.advantage for s in samples], dtype=torch.float32, device=device)
    if samples[0].old_logps is not None:
        inputs["old_per_token_logps"] = completion_tensor(samples, "old_logps", width, device)
    if trainer.beta != 0.0:
        inputs["ref_per_token_logps"] = completion_tensor(samples, "ref_logps", width, device)
    inputs["num_items_in_batch"] = torch.tensor(max(samples[0].role_tokens, 1.0), device=device)
    if getattr(trainer, "use_vllm", False) and getattr(trainer, "vllm_importance_sampling_correction", False):
        inputs["importance_sampling_ratio"] = torch.ones((len(samples), width), device=device)  # sampled here
    mode = "train" if trainer.model.training else "eval"
    with (
        adapter_active(trainer.accelerator.unwrap_model(model), adapter),
        trainer.metrics_under(f"roles/{role}/", mode),
    ):
        loss = trainer._compute_loss(model, inputs)
    if trainer.loss_type == "grpo":
        loss = loss * (len(samples) / len(together))
    elif trainer.loss_type == "bnpo":
        loss = loss * (sum(sum(s.loss_mask) for s in samples) / max(sum(sum(s.loss_mask) for s in together), 1))
    return loss
