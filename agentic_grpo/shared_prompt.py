"""Log-probabilities of a microbatch whose rows share prompts, each distinct prompt read once.

A GRPO group is G trajectories of one prompt. TRL scores a microbatch by reading every row whole, so a
prompt is read (forward and backward) once per row. With tool descriptions and worked examples the
prompt can be most of a trajectory's tokens, and reading it G times most of a training step. Here the
microbatch's distinct prompts are read once, with gradients, into a key/value cache; the cache is indexed
out to the rows (the indexing's backward sums the rows' gradients into the one read) and each row's
completion is read on top of it. That is the same function of the
weights, so log-probs and gradients equal TRL's to rounding (`tests/test_shared_prompt.py`), for one
prompt's cost per distinct prompt instead of one per row.

TRL (1.16) has no such path, and transformers' `DynamicCache` serves generation; this module only lays one
under TRL's fused log-prob head. Position ids are those of the whole-row read: the trainer numbers both from
the attention mask (`agentic_grpo.positions`), the cached read's new tokens taking the mask's last columns.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch


def shared_prompt_rows(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_width: int
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The first row of each distinct prompt and, per row, the index of its prompt among them; None when no
    two rows share a prompt (then reading rows whole costs the same)."""
    prompts = torch.cat([input_ids[:, :prompt_width], attention_mask[:, :prompt_width].to(input_ids.dtype)], dim=1)
    _, inverse = torch.unique(prompts, dim=0, return_inverse=True)
    distinct = int(inverse.max()) + 1
    if distinct == input_ids.size(0):
        return None
    rows = torch.arange(input_ids.size(0), device=input_ids.device)
    first = torch.full((distinct,), input_ids.size(0), device=input_ids.device).scatter_reduce(
        0, inverse, rows, reduce="amin"
    )
    return first, inverse


def cache_keyword(model: Any) -> str:
    """The name under which `model`'s forward takes a key/value cache: `cache` since transformers renamed
    `past_key_values` (the old name is still accepted there, with a warning, until 5.40)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(type(base).forward).parameters else "past_key_values"


def shared_prompt_logps(
    model: Any,
    config: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    logits_to_keep: int,
    compute_entropy: bool = False,
    cache_name: str = "cache",
) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """Per-token log-probs (and entropies) of the last `logits_to_keep` tokens of each row, as TRL's
    `_get_per_token_logps_and_entropies` computes them, with each distinct prompt read once.

    `model` is TRL's policy with its fused log-prob head (`trl.trainer.utils.add_fused_lm_head`), as wrapped
    for training; `config` its model config; `cache_name` its forward's cache keyword (`cache_keyword`).
    Returns None when no two rows share a prompt.
    """
    from transformers import DynamicCache

    # The cache holds the prompt but its last token: that token's hidden state predicts the first completion
    # token, so it is read with the completion (the fused head scores position t from position t - 1).
    head = input_ids.size(1) - logits_to_keep - 1
    if head < 1:
        return None
    shared = shared_prompt_rows(input_ids, attention_mask, head)
    if shared is None:
        return None
    first, inverse = shared
    cache = DynamicCache(config=config)
    model(
        input_ids=input_ids[first, :head], attention_mask=attention_mask[first, :head],
        use_cache=True, logits_to_keep=1, **{cache_name: cache},
    )  # fmt: skip
    cache.batch_select_indices(inverse)
    tail = input_ids[:, head:]
    labels = tail.masked_fill(attention_mask[:, head:] == 0, -100)
    labels[:, 0] = -100
    outputs = model(
        input_ids=tail, attention_mask=attention_mask, labels=labels, fused_lm_head=True, **{cache_name: cache}
    )
    logps = outputs.log_probs[:, -logits_to_keep:]
    entropies = outputs.entropy[:, -logits_to_keep:] if compute_entropy else None
    return logps, entropies


class ReadPromptOnce:
    """Trainer mixin: TRL's `_get_per_token_logps_and_entropies`, reading each distinct prompt of a microbatch
    once when `args.read_prompt_once` is set. Rows are read whole with MoE aux losses, image inputs, and
    gradient checkpointing (HF's checkpointed layers drop a cache they would write: the backward replay would
    write it twice)."""

    def _get_per_token_logps_and_entropies(
        self, model, input_ids, attention_mask, logits_to_keep, batch_size=None, compute_entropy=False,
        compute_aux_loss=False, **image_inputs,
    ):  # fmt: skip
        """TRL's, with each distinct prompt of a microbatch read once under `read_prompt_once`."""
        whole = functools.partial(super()._get_per_token_logps_and_entropies, model, logits_to_keep=logits_to_keep)
        if (
            not self.args.read_prompt_once or compute_aux_loss or self.args.gradient_checkpointing
            or any(value is not None for value in image_inputs.values())
        ):  # fmt: skip
            return whole(input_ids, attention_mask, batch_size=batch_size, compute_entropy=compute_entropy,
                         compute_aux_loss=compute_aux_loss, **image_inputs)  # fmt: skip
        unwrapped = self.accelerator.unwrap_model(model)
        config, cache_name = unwrapped.config, cache_keyword(unwrapped)
        chunk = batch_size or input_ids.size(0)  # TRL's memory bound on the rows read at once
        logps, entropies = [], []
        for start in range(0, input_ids.size(0), chunk):
            ids, mask = input_ids[start : start + chunk], attention_mask[start : start + chunk]
            read = shared_prompt_logps(model, config, ids, mask, logits_to_keep, compute_entropy, cache_name)
            read = read or whole(ids, mask, compute_entropy=compute_entropy)[:2]  # no two rows share a prompt
            logps.append(read[0])
            entropies.append(read[1])
        return torch.cat(logps), torch.cat(entropies) if compute_entropy else None, None
