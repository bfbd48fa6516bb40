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
the attention mask (`agentic_grpo.shrinking_batch`), the cached read's new tokens taking the mask's last columns.
The trainer takes this path under `read_prompt_once` (`agentic_grpo.chunked_logps.ChunkedLogps`, which also reads
the loss's rows in pieces on the prompts read once).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from agentic_grpo.shrinking_batch import cache_keyword


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


def cached(config: Any, keys_values: Sequence[torch.Tensor]) -> Any:
    """A `DynamicCache` holding `keys_values` (per layer in order: keys of layer 0, values of layer 0, ...)."""
    from transformers import DynamicCache

    cache = DynamicCache(config=config)
    for layer in range(len(keys_values) // 2):
        cache.update(keys_values[2 * layer], keys_values[2 * layer + 1], layer)
    return cache


def joined_columns(parts: Sequence[Sequence[torch.Tensor]]) -> tuple[torch.Tensor, ...]:
    """Keys and values read in pieces of columns (each as `read_prompts` returns them), joined per layer tensor
    along the columns; a single piece as it is."""
    return (
        tuple(parts[0]) if len(parts) == 1 else tuple(torch.cat(layer, dim=-2) for layer in zip(*parts, strict=True))
    )


def read_prompts(
    model: Any,
    config: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    before: Sequence[Sequence[torch.Tensor]] = (),
    cache_name: str | None = None,
) -> tuple[torch.Tensor, ...]:
    """The keys and values of the tokens `input_ids`, per layer in order (keys of layer 0, values of layer 0, keys of
    layer 1, ...), each (rows, key/value heads, columns, head size). `before`: the keys and values of the columns
    that come before them, in pieces of columns as this returns them (`attention_mask` covers those and these)."""
    parts = list(before)
    cache = cached(config, joined_columns(parts) if parts else ())
    cache_name = cache_name or cache_keyword(model)
    model(input_ids=input_ids, attention_mask=attention_mask, use_cache=True, logits_to_keep=1, **{cache_name: cache})
    columns = input_ids.size(1)
    # With keys and values before them, a layer's tensors are theirs and these: keep these alone, not a view of both.
    return tuple(
        tensor[:, :, -columns:].clone() if parts else tensor
        for layer in cache.layers
        for tensor in (layer.keys, layer.values)
    )


def read_on_prompts(
    model: Any,
    config: Any,
    logits_to_keep: int,
    compute_entropy: bool,
    cache_name: str,
    tail: torch.Tensor,
    attention_mask: torch.Tensor,
    picks: torch.Tensor,
    *keys_values: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log-probs (and entropies, else None) of the last `logits_to_keep` tokens of each row, whose
    `tail` (its columns after its prompt but the prompt's last token) is read on the cached prompt `picks[row]`
    of `keys_values` (`read_prompts`); `attention_mask` covers the prompt's and the tail's columns."""
    cache = cached(config, [tensor[picks] for tensor in keys_values])
    labels = tail.masked_fill(attention_mask[:, -tail.size(1) :] == 0, -100)
    labels[:, 0] = -100
    outputs = model(
        input_ids=tail, attention_mask=attention_mask, labels=labels, fused_lm_head=True, **{cache_name: cache}
    )
    logps = outputs.log_probs[:, -logits_to_keep:]
    entropies = outputs.entropy[:, -logits_to_keep:] if compute_entropy else None
    return logps, entropies


def shared_prompt_logps(
    model: Any,
    config: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    logits_to_keep: int,
    compute_entropy: bool = False,
    cache_name: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """Per-token log-probs (and entropies) of the last `logits_to_keep` tokens of each row, as TRL's
    `_get_per_token_logps_and_entropies` computes them, with each distinct prompt read once.

    `model` is TRL's policy with its fused log-prob head (`trl.trainer.utils.add_fused_lm_head`), as wrapped
    for training; `config` its model config; `cache_name` its forward's cache keyword (default: `cache_keyword`).
    Returns None when no two rows share a prompt.
    """
    # The cache holds the prompt but its last token: that token's hidden state predicts the first completion
    # token, so it is read with the completion (the fused head scores position t from position t - 1).
    head = input_ids.size(1) - logits_to_keep - 1
    if head < 1:
        return None
    shared = shared_prompt_rows(input_ids, attention_mask, head)
    if shared is None:
        return None
    first, inverse = shared
    cache_name = cache_name or cache_keyword(model)
    keys_values = read_prompts(model, config, input_ids[first, :head], attention_mask[first, :head], (), cache_name)
    return read_on_prompts(
        model, config, logits_to_keep, compute_entropy, cache_name, input_ids[:, head:], attention_mask, inverse,
        *keys_values,
    )  # fmt: skip
