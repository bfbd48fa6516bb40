"""Generation that does not re-read what it has read: each trajectory's keys and values kept across turns.

A rollout calls `generate` once per turn with each live trajectory's whole context. Started from scratch,
HF `generate` reads all of it again every turn, and reads the G identical copies of each prompt G times,
so as the turns add up, reading contexts ("prefill") can take most of a rollout's model time, more than
the token-by-token decoding.

`ContextCache` keeps, for every sequence the last call generated, the keys and values of each token the
model was fed. The next call looks up, per row, the longest stored prefix of its context, lays the stored
keys and values into one left-padded batch cache (position ids come from the mask, as `generate` computes
them), and hands `generate` only the tokens it has not seen: the end of the last turn and the tool
observation. Contexts never seen (the prompts, on the first turn) are read once per
distinct context, and the prefix they all share (system prompt, tool descriptions, worked examples) once. Sampling, logits processing and stopping stay HF `generate`'s own, on a batch of the
same rows in the same order, so a fixed seed draws the same random numbers as a generation from scratch.

What can differ is floating point: a context read in pieces sums in another order than one read whole,
so logits agree to rounding, and a token is only sampled differently when that changes which token
wins. In fp32 that is rare, and `tests/test_kv_reuse.py` checks token-for-token equality. In bf16 the
rounding is coarse (a read through any `DynamicCache` differs from a whole read by up to a few tenths
of a logit), so sampled trajectories can part ways; each is still a sample of the same policy.
"""

from __future__ import annotations

import copy
import functools
import os
from dataclasses import dataclass, field
from typing import Any

import torch

from agentic_grpo.shrinking_batch import (
    cache_keyword,
    needs_lockstep,
    position_ids_from_mask,
    sample_shrinking,
    stop_string_criteria,
)

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

    def match(self, batch: list[list[int]]) -> list[tuple[_Entry | None, int]]:
        """For each row of `batch`, the stored entry sharing the longest prefix with it (the first such entry on a
        tie), and that length (at most len(row) - 1: `generate` needs at least one token to read; None, 0 when
        no entry shares a token)."""
        if not self.entries:
            return [(None, 0)] * len(batch)
        # Every entry against a row at once: a scan in Python costs entries x shared prefix per row, and all of a
        # batch's entries share the system prompt, so a large batch would spend seconds here per turn.
        width = max(len(entry.ids) for entry in self.entries)
        table = torch.full((len(self.entries), width), -1, dtype=torch.long)  # -1: no token id, never matches
        for i, entry in enumerate(self.entries):
            table[i, : len(entry.ids)] = torch.tensor(entry.ids, dtype=torch.long)
        found = []
        for ids in batch:
            n = min(len(ids) - 1, width)
            if n <= 0:
                found.append((None, 0))
                continue
            same = (table[:, :n] == torch.tensor(ids[:n], dtype=torch.long)).cumprod(dim=1).sum(dim=1)
            best = int(same.argmax())
            found.append((self.entries[best], int(same[best])) if same[best] > 0 else (None, 0))
        return found


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
    if needs_lockstep(model):
        # Each process reads the contexts it has not seen, a number of forward passes of its own: processes in
        # lockstep must each run one `generate` per turn (`agentic_grpo.shrinking_batch`).
        return "the processes decode in lockstep (a policy sharded by ZeRO-3 or FSDP)"
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


def _held_batch(
    model: Any, batch: list[list[int]], matches: list[tuple[_Entry | None, int]], pad_id: int
) -> tuple[torch.Tensor, torch.Tensor, Any, int]:
    """`batch` left-padded, and a cache holding each row's first `n` tokens from its matched entry.

    Every row's unread tokens end the batch, the same number for each: rows with fewer re-read a few of their
    held tokens. A row is then padding on the left and its tokens in one run, as when read whole, so a stop
    string can still span the end of the context and the start of the new tokens. Returns the input ids, the
    attention mask, the cache and `held`, the number of leading columns the cache covers.
    """
    from transformers import DynamicCache

    fresh = max(len(ids) - n for ids, (_, n) in zip(batch, matches, strict=True))
    matches = [(entry, max(0, min(n, len(ids) - fresh))) for ids, (entry, n) in zip(batch, matches, strict=True)]
    held = max(n for _, n in matches)
    width = held + fresh
    input_ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for row, ids in enumerate(batch):
        input_ids[row, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
        mask[row, width - len(ids) :] = 1
    cache = DynamicCache(config=model.config)
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
    return input_ids.to(model.device), mask.to(model.device), cache, held


def _entry(ids: list[int], keys: list[torch.Tensor], values: list[torch.Tensor], start: int) -> _Entry:
    """The entry of `ids`, whose keys and values (per layer: kv_heads x columns x head_dim) begin at `start`."""
    end = start + len(ids)
    return _Entry(list(ids), [k[:, start:end].clone() for k in keys], [v[:, start:end].clone() for v in values])


def _entries(cache: Any, rows: list[tuple[list[int], int]]) -> list[_Entry]:
    """Row r's entry from `cache`, for each `(ids, start)` of `rows`: the ids and where their columns begin."""
    layers = cache.layers
    return [
        _entry(ids, [layer.keys[row] for layer in layers], [layer.values[row] for layer in layers], start)
        for row, (ids, start) in enumerate(rows)
    ]


def _read_contexts(model: Any, contexts: list[list[int]], pad_id: int) -> list[_Entry]:
    """Keys and values of each context. The prefix all of them share (a system prompt, tool descriptions,
    worked examples: most of a prompt) is read once; then each context's rest, in one left-padded pass."""
    shared = len(os.path.commonprefix(contexts)) if len(contexts) > 1 else 0
    shared = min(shared, min(map(len, contexts)) - 1)
    matches: list[tuple[_Entry | None, int]] = [(None, 0)] * len(contexts)
    if shared > 1:
        [prefix] = _read_contexts(model, [contexts[0][:shared]], pad_id)
        matches = [(prefix, shared)] * len(contexts)
    input_ids, mask, cache, held = _held_batch(model, contexts, matches, pad_id)
    model(
        input_ids=input_ids[:, held:], attention_mask=mask, position_ids=position_ids_from_mask(mask)[:, held:],
        use_cache=True, logits_to_keep=1, **{cache_keyword(model): cache},
    )  # fmt: skip
    width = input_ids.shape[1]
    return _entries(cache, [(ids, width - len(ids)) for ids in contexts])


def generate_reusing(
    model: Any,
    batch: list[list[int]],
    store: ContextCache,
    generation_config: Any,
    tokenizer: Any,
    shrink: bool = True,
    logprobs: list[list[float]] | None = None,
    generator: torch.Generator | None = None,
    logprob_filters: Any = None,
    **generate_kwargs: Any,
) -> list[list[int]]:
    """HF `generate` on `batch`, reading only what `store` does not hold; returns each row's new tokens
    (padded after its end, as `generate` returns them) and leaves in `store` what this call read and wrote.

    With `shrink`, rows leave the batch as they stop (`agentic_grpo.shrinking_batch`: same processors, stopping
    and random numbers), and a `logprobs` list given is filled with each row's sampling log-probs (left empty
    otherwise; `logprob_filters` and `generator` as for `sample_shrinking`). Not for processes in lockstep
    (`why_not_reusable` says so).
    `generate_kwargs` go to `generate` as they are (a `logits_processor`, for one)."""
    pad_id = tokenizer.pad_token_id
    matches = store.match(batch)
    unseen = sorted({tuple(ids[:-1]) for ids, (_, n) in zip(batch, matches, strict=True) if n == 0 and len(ids) > 1})
    if unseen:  # each distinct context once: the G copies of a prompt are read together
        store.entries.extend(_read_contexts(model, [list(c) for c in unseen], pad_id))
        matches = store.match(batch)
    input_ids, mask, cache, _ = _held_batch(model, batch, matches, pad_id)  # `generate` extends the cache in place
    width = input_ids.shape[1]
    stopped: dict[int, _Entry] = {}

    def keep_stopped(row: int, tokens: list[int], keys: list[torch.Tensor], values: list[torch.Tensor]) -> None:
        # A stopped row's last token was never fed: its keys and values end one token before it.
        stopped[row] = _entry(batch[row] + tokens[:-1], keys, values, width - len(batch[row]))

    generation_config = copy.copy(generation_config)
    generation_config.use_cache = True  # in the config: `generate` warns when a config and loose settings mix
    if shrink:
        generation_config, stopping = stop_string_criteria(generation_config, tokenizer)
        loop = functools.partial(
            sample_shrinking, kv_cache=cache, on_stop=keep_stopped, logprobs=logprobs, generator=generator,
            logprob_filters=logprob_filters,
        )  # fmt: skip
        custom = {"custom_generate": loop, "stopping_criteria": stopping}
    output = model.generate(
        input_ids=input_ids,
        attention_mask=mask,
        generation_config=generation_config,
        tokenizer=tokenizer,
        **{cache_keyword(model): cache},
        **(custom if shrink else {}),
        **generate_kwargs,
    )
    sequences = output.sequences if hasattr(output, "sequences") else output
    new_tokens = sequences[:, width:].cpu().tolist()
    if shrink:
        store.entries = [stopped[row] for row in range(len(batch))]
        return new_tokens
    fed = cache.layers[0].keys.shape[-2] - width  # the last sampled token was never fed back
    entries = _entries(cache, [(ids + new_tokens[row][:fed], width - len(ids)) for row, ids in enumerate(batch)])
    store.entries = entries  # trajectories not in this batch have finished: their entries go
    return new_tokens
