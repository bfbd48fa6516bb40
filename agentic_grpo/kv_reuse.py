"""Generation that does not re-read what it has read: each trajectory's keys and values kept across turns.

A rollout calls `generate` once per turn with each live trajectory's whole context. Started from scratch,
HF `generate` reads all of it again every turn, and reads the G identical copies of each prompt G times:
profiled on the CPU demo (SmolLM2-135M, 8 questions x G=4, 3 turns), reading contexts ("prefill") was 74%
of the rollout's model time and the token-by-token decoding the rest.

`ContextCache` keeps, for every sequence the last call generated, the keys and values of each token the
model was fed. The next call looks up, per row, the longest stored prefix of its context, lays the stored
keys and values into one left-padded batch cache (position ids come from the mask, as `generate` computes
them), and hands `generate` only the tokens it has not seen: the end of the last turn and the tool
observation. Contexts never seen (the prompts, on the first turn) are read once per
distinct context. Sampling, logits processing and stopping stay HF `generate`'s own, on a batch of the
same rows in the same order, so a fixed seed draws the same random numbers as a generation from scratch.

What can differ is floating point: a context read in pieces sums in another order than one read whole,
so logits agree to rounding (about 1e-6 here), and a token is only sampled differently when that
changes which token wins: rare, and `tests/test_kv_reuse.py` checks token-for-token equality.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

CONTEXT_READING_PROCESSORS = {
    "repetition_penalty": 1.0, "no_repeat_ngram_size": 0, "encoder_repetition_penalty": 1.0, "min_length": 0,
}  # fmt: skip
"""Settings whose processors read the whole padded batch (or its width): the padding differs from a whole read."""


@dataclass
class _Entry:
    """Keys and values of every token of `ids` (per layer: kv_heads x len(ids) x head_dim)."""

    ids: list[int]
    keys: list[torch.Tensor]
    values: list[torch.Tensor]


@dataclass
class ContextCache:
    """The keys and values of the sequences the last `generate` call produced, for the next call to extend."""

    entries: list[_Entry] = field(default_factory=list)

    def clear(self) -> None:
        self.entries = []

    def match(self, ids: list[int]) -> tuple[_Entry | None, int]:
        """The stored entry sharing the longest prefix with `ids`, and that length (at most len(ids) - 1:
        `generate` needs at least one token to read)."""
        best, best_length = None, 0
        limit = len(ids) - 1
        for entry in self.entries:
            n = min(limit, len(entry.ids))
            length = next((i for i in range(n) if entry.ids[i] != ids[i]), n)
            if length > best_length:
                best, best_length = entry, length
        return best, best_length


def why_not_reusable(model: Any, generation_config: Any) -> str | None:
    """Why kept keys and values cannot be reused with this model and config (None when they can)."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    if getattr(generation_config, "use_cache", None) is False:
        return "generation config sets use_cache=False"
    implementation = getattr(generation_config, "cache_implementation", None)
    if implementation not in (None, "dynamic"):
        return f"generation config asks for cache_implementation={implementation!r}"
    for name, neutral in CONTEXT_READING_PROCESSORS.items():
        value = getattr(generation_config, name, None)
        if value is not None and value != neutral:
            return f"`{name}`={value} reads the whole context, padding holes included"
    if getattr(model.config, "is_encoder_decoder", False):
        return "encoder-decoder model"
    try:
        layers = DynamicCache(config=model.config).layers
    except Exception as exc:  # noqa: BLE001 - a model whose cache cannot be built here is simply not reused
        return f"no dynamic cache for this model ({type(exc).__name__}: {exc})"
    # Sliding-window layers drop old keys; recurrent or indexed layers hold state that is not per-token keys
    # and values: neither can be cut per row and re-laid into a batch.
    odd = {type(layer).__name__ for layer in layers if type(layer) is not DynamicLayer}
    if odd:
        return f"cache layers {sorted(odd)} are not plain per-token keys and values"
    return None


def _positions(mask: torch.Tensor) -> torch.Tensor:
    """Position ids as `generate` derives them from an attention mask: the count of real tokens before each."""
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


def _read_contexts(model: Any, contexts: list[list[int]], pad_id: int) -> list[_Entry]:
    """Keys and values of each context, read in one left-padded forward pass."""
    from transformers import DynamicCache

    width = max(len(c) for c in contexts)
    input_ids = torch.full((len(contexts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(contexts), width), dtype=torch.long)
    for row, ids in enumerate(contexts):
        input_ids[row, width - len(ids) :] = torch.tensor(ids)
        mask[row, width - len(ids) :] = 1
    cache = DynamicCache(config=model.config)
    model(
        input_ids=input_ids.to(model.device),
        attention_mask=mask.to(model.device),
        position_ids=_positions(mask).to(model.device),
        past_key_values=cache,
        use_cache=True,
        logits_to_keep=1,
    )
    return [
        _Entry(
            list(ids),
            [layer.keys[row, :, width - len(ids) :].clone() for layer in cache.layers],
            [layer.values[row, :, width - len(ids) :].clone() for layer in cache.layers],
        )
        for row, ids in enumerate(contexts)
    ]


def generate_reusing(
    model: Any, batch: list[list[int]], store: ContextCache, generation_config: Any, tokenizer: Any
) -> list[list[int]]:
    """HF `generate` on `batch`, reading only what `store` does not hold; returns each row's new tokens
    (padded after its end, as `generate` returns them) and leaves in `store` what this call read and wrote."""
    from transformers import DynamicCache

    pad_id = tokenizer.pad_token_id
    matches = [store.match(ids) for ids in batch]
    unseen = sorted({tuple(ids[:-1]) for ids, (_, n) in zip(batch, matches, strict=True) if n == 0 and len(ids) > 1})
    if unseen:  # each distinct context once: the G copies of a prompt are read together
        store.entries.extend(_read_contexts(model, [list(c) for c in unseen], pad_id))
        matches = [store.match(ids) for ids in batch]

    # Every row's unread tokens end the batch, the same number for each: rows with fewer re-read a few of their
    # held tokens. A row is then padding on the left and its tokens in one run, as when read whole, so a stop
    # string can still span the end of the context and the start of the new tokens.
    fresh = max(len(ids) - n for ids, (_, n) in zip(batch, matches, strict=True))
    matches = [(entry, max(0, min(n, len(ids) - fresh))) for ids, (entry, n) in zip(batch, matches, strict=True)]
    held = max(n for _, n in matches)
    width = held + fresh
    input_ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for row, ids in enumerate(batch):
        input_ids[row, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
        mask[row, width - len(ids) :] = 1
    cache = DynamicCache(config=model.config)  # `generate` extends it in place: read back below
    if held:
        reference = next(entry for entry, n in matches if entry is not None)
        for layer in range(len(reference.keys)):
            kv_heads, _, head_dim = reference.keys[layer].shape
            keys = reference.keys[layer].new_zeros((len(batch), kv_heads, held, head_dim))
            values = torch.zeros_like(keys)
            for row, (entry, n) in enumerate(matches):
                if n:
                    keys[row, :, held - n :] = entry.keys[layer][:, :n]
                    values[row, :, held - n :] = entry.values[layer][:, :n]
            cache.update(keys.to(model.device), values.to(model.device), layer)
    output = model.generate(
        input_ids=input_ids.to(model.device),
        attention_mask=mask.to(model.device),
        past_key_values=cache,
        generation_config=generation_config,
        tokenizer=tokenizer,
        use_cache=True,
    )
    sequences = output.sequences if hasattr(output, "sequences") else output
    new_tokens = sequences[:, width:].cpu().tolist()
    layers = cache.layers
    fed = layers[0].keys.shape[-2] - width  # the last sampled token was never fed back
    entries = [
        _Entry(
            list(ids) + new_tokens[row][:fed],
            [layer.keys[row, :, width - len(ids) : width + fed].clone() for layer in layers],
            [layer.values[row, :, width - len(ids) : width + fed].clone() for layer in layers],
        )
        for row, ids in enumerate(batch)
    ]
    store.entries = entries  # trajectories not in this batch have finished: their entries go
    return new_tokens
