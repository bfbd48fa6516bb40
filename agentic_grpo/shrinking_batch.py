"""Sampling whose batch shrinks: a row leaves the batch, keys and values included, as soon as it stops.

HF `generate` keeps every row until the last one stops and feeds the finished ones padding, so one long
turn makes the whole batch pay for its length. In a rollout turn most rows stop early (a call is about
30 tokens, an answer fewer, the budget is 48-64), so much of a turn's decoding was padding.

`sample_shrinking` is a decoding loop handed to `generate` through its public `custom_generate` seam:
`generate` still builds the logits processors, the stopping criteria (EOS, stop strings, length) and the
special tokens exactly as for its own sampling; only the loop differs. It reads the batch's unread tokens
once, then decodes the live rows only, and hands each stopped row's keys and values to `on_stop` before
dropping them from the cache; a logits processor with a `live_rows` attribute is told before each step which
of the caller's rows it is given (`agentic_grpo.action_choices`). `generate` drops the tokenizer before it
calls a custom loop, so stop strings come as a ready criterion (`stop_string_criteria`), not as `stop_strings`.

The random numbers are `generate`'s own. `torch.multinomial(p, 1)`, which `generate` samples with, is
`argmax(p / E)` for exponential noise `E` drawn over the whole (batch, vocabulary); the loop draws `E` for
the full batch every step, as `generate` does, and gives each live row its own row of it. A fixed seed
then samples the same tokens as `generate` and leaves the generator in the same state after the call.

The loop also records each sampled token's log-probability under the model's raw logits at the sampling
temperature (before top-k, top-p or a constrained slot): the quantity the trainer computes for the same
token, which the sampler-trainer canary compares it with (`agentic_grpo.canaries`).
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

RowStop = Callable[[int, list[int], list[torch.Tensor], list[torch.Tensor]], None]
"""`on_stop(row, new_tokens, keys, values)`: a row stopped; `keys`/`values` per layer are kv_heads x fed x
head_dim, for every token fed so far (its context, then all its new tokens but the last)."""


def sample_shrinking(
    model: Any,
    input_ids: torch.LongTensor,
    logits_processor: Any,
    stopping_criteria: Any,
    generation_config: Any,
    *,
    kv_cache: Any,
    on_stop: RowStop,
    logprobs: list[list[float]] | None = None,
    generator: torch.Generator | None = None,
    logprob_filters: SamplingFilters | None = None,
    **model_kwargs: Any,
) -> torch.LongTensor:
    """`generate`'s sampling over `input_ids` (left-padded; `kv_cache` holds the keys and values of the first
    `kv_cache.get_seq_length()` columns), dropping each row from the batch once it stops.

    Returns the sequences as `generate` does: the input, then each row's new tokens padded after its end. A
    `logprobs` list given is filled with one list per row: each new token's log-probability under the raw
    logits at the sampling temperature, or, with `logprob_filters` that filter, under the distribution those
    filters leave (`processed_log_softmax`). `generator` draws the sampling noise (default: torch's global one).
    """
    attention_mask = model_kwargs.get("attention_mask")
    if attention_mask is None:  # `generate` drops a mask without padding
        attention_mask = torch.ones_like(input_ids)
    given = input_ids
    batch, width = input_ids.shape
    held = kv_cache.get_seq_length()
    live = torch.arange(batch, device=input_ids.device)  # each live row's index in the caller's batch
    new_tokens: list[list[int]] = [[] for _ in range(batch)]
    new_logprobs: list[list[float]] = [[] for _ in range(batch)]
    temperature = (generation_config.temperature or 1.0) if generation_config.do_sample else 1.0
    positions = position_ids_from_mask(attention_mask)
    cache = {cache_keyword(model): kv_cache}
    outputs = model(
        input_ids=input_ids[:, held:], attention_mask=attention_mask, position_ids=positions[:, held:],
        use_cache=True, logits_to_keep=1, **cache,
    )  # fmt: skip
    while True:
        for processor in logits_processor:  # a processor that keeps per-row state learns which rows are live
            if hasattr(processor, "live_rows"):
                processor.live_rows = live.tolist()
        raw = outputs.logits[:, -1].to(dtype=torch.float32)
        scores = logits_processor(input_ids, raw.clone())
        if generation_config.do_sample:
            probs = torch.nn.functional.softmax(scores, dim=-1)
            noise = torch.empty((batch, probs.shape[-1]), dtype=probs.dtype, device=probs.device)
            noise.exponential_(1, generator=generator)
            next_tokens = (probs / noise[live]).argmax(-1)
        else:
            next_tokens = scores.argmax(-1)
        input_ids = torch.cat([input_ids, next_tokens[:, None]], dim=-1)
        if logprob_filters is not None and logprob_filters.active:
            read = processed_log_softmax(raw, logprob_filters)
        else:
            read = torch.log_softmax(raw / temperature, dim=-1)
        chosen = read.gather(-1, next_tokens[:, None]).squeeze(-1)
        for row, token, logprob in zip(live.tolist(), next_tokens.tolist(), chosen.tolist(), strict=True):
            new_tokens[row].append(token)
            new_logprobs[row].append(logprob)
        stopped = stopping_criteria(input_ids, scores)
        for index in stopped.nonzero().flatten().tolist():
            row = int(live[index])
            on_stop(
                row,
                new_tokens[row],
                [layer.keys[index] for layer in kv_cache.layers],
                [layer.values[index] for layer in kv_cache.layers],
            )
        if bool(stopped.all()):
            break
        if bool(stopped.any()):
            keep = (~stopped).nonzero().flatten()
            live, input_ids, attention_mask, next_tokens = (
                live[keep],
                input_ids[keep],
                attention_mask[keep],
                next_tokens[keep],
            )
            kv_cache.batch_select_indices(keep)
        attention_mask = torch.cat([attention_mask, attention_mask.new_ones((len(live), 1))], dim=-1)
        outputs = model(
            input_ids=next_tokens[:, None], attention_mask=attention_mask,
            position_ids=attention_mask.long().sum(-1, keepdim=True) - 1,
            use_cache=True, logits_to_keep=1, **cache,
        )  # fmt: skip

    if logprobs is not None:
        logprobs.extend(new_logprobs)
    pad = getattr(generation_config, "_pad_token_tensor", None)
    pad_id = int(pad) if pad is not None else (generation_config.pad_token_id or 0)
    sequences = given.new_full((batch, width + max(map(len, new_tokens))), pad_id)
    sequences[:, :width] = given
    for row, tokens in enumerate(new_tokens):
        sequences[row, width : width + len(tokens)] = given.new_tensor(tokens)
    return sequences


def stop_string_criteria(generation_config: Any, tokenizer: Any) -> tuple[Any, Any]:
    """`generation_config` without its stop strings, and a criterion list that stops on them, for `generate`
    with a custom loop (it builds its own stop-string criterion only when it has the tokenizer)."""
    import copy

    from transformers import StoppingCriteriaList, StopStringCriteria

    stops = generation_config.stop_strings
    if not stops:
        return generation_config, StoppingCriteriaList()
    config = copy.copy(generation_config)
    config.stop_strings = None
    return config, StoppingCriteriaList([StopStringCriteria(tokenizer=tokenizer, stop_strings=stops)])


# --- lockstep -------------------------------------------------------------------------------------
# Processes that must decode in lockstep: a policy sharded by ZeRO-3 or FSDP over several processes.
#
# Under those engines every forward pass is a collective (each layer's parameters are gathered from all
# processes), so every process must run the same number of forward passes. `generate` keeps that true inside one
# call (`synced_gpus`: a process whose rows have stopped keeps stepping until all have). Across the turns of a
# multi-turn rollout nothing does, since each process's trajectories end at their own turns: the rollout asks
# `live_on_any_process` every turn and a process with nothing left to generate runs an idle turn, so no process waits
# in a collective that the others have left.


def needs_lockstep(model: Any) -> bool:
    """Whether every process must run the same decoding steps (`generate`'s `synced_gpus`: ZeRO-3 or FSDP shards
    over several processes)."""
    from transformers.integrations import is_deepspeed_zero3_enabled
    from transformers.integrations.fsdp import is_fsdp_managed_module

    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    world = torch.distributed.get_world_size() if distributed else 1
    return world > 1 and (is_deepspeed_zero3_enabled() or is_fsdp_managed_module(model))


def live_on_any_process(live_here: int) -> bool:
    """Whether any process still has a live trajectory (a collective: every process calls it once per turn)."""
    device = torch.device("cpu")
    if torch.distributed.get_backend() == "nccl":  # NCCL reduces CUDA tensors only
        device = torch.device("cuda", torch.cuda.current_device())
    flag = torch.tensor([1 if live_here else 0], device=device)
    torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
    return bool(flag.item())


# --- sampling distribution ------------------------------------------------------------------------
# The distribution a sampler draws from: the model's logits at the sampling temperature, then min-p, top-k and
# top-p, renormalized over what is left.
#
# vLLM reports each sampled token's log-prob under that processed distribution (TRL starts it with
# `logprobs_mode="processed_logprobs"`, so that its importance-sampling correction divides by the probability the
# token was really drawn with). The trainer scores log_softmax(logits / T), with no filter. With top-k, top-p or
# min-p set, the two differ by the log of the mass the filters removed before any bug, so the sampler-trainer
# canary compares the sampler's log-probs with the trainer's under the same processing. HF `generate` (`agentic_grpo.shrinking_batch`)
# records log_softmax(logits / T), which needs none.


@dataclass(frozen=True)
class SamplingFilters:
    """The filters applied after the temperature (the neutral value of each: top_k 0, top_p 1, min_p 0)."""

    temperature: float
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0

    def named(self) -> list[str]:
        """The filters that are on, as `name: value`."""
        values = (("top_k", self.top_k, 0), ("top_p", self.top_p, 1.0), ("min_p", self.min_p, 0.0))
        return [f"{name}: {value}" for name, value, neutral in values if value != neutral]

    @property
    def active(self) -> bool:
        return bool(self.named())


def filters_of(sampler: Any) -> SamplingFilters:
    """The sampling filters of a `GRPOTrainer` or its config (temperature, top_k, top_p, min_p; a field it lacks is
    neutral)."""
    top_p = getattr(sampler, "top_p", None)
    return SamplingFilters(
        temperature=float(getattr(sampler, "temperature", 1.0)),
        top_k=int(getattr(sampler, "top_k", 0) or 0),
        top_p=1.0 if top_p is None else float(top_p),
        min_p=float(getattr(sampler, "min_p", 0.0) or 0.0),
    )


def processed_log_softmax(logits: torch.Tensor, filters: SamplingFilters) -> torch.Tensor:
    """Log-probs over the vocabulary (last dimension) after temperature, min-p, top-k and top-p, in vLLM's order
    and with its tie rules (a token tied with the k-th logit is kept; top-p keeps the most likely token always).
    Filtered-out tokens get -inf."""
    logits = logits.float() / filters.temperature
    if filters.min_p > 0:
        probs = logits.softmax(-1)
        floor = probs.amax(-1, keepdim=True) * filters.min_p
        logits = logits.masked_fill(probs < floor, float("-inf"))
    if filters.top_k > 0 or filters.top_p < 1.0:
        ordered, order = logits.sort(dim=-1, descending=False)
        if filters.top_k > 0:
            k = min(filters.top_k, ordered.size(-1))
            kth = ordered[..., ordered.size(-1) - k].unsqueeze(-1)
            ordered = ordered.masked_fill(ordered < kth, float("-inf"))
        if filters.top_p < 1.0:
            cumulative = ordered.softmax(-1).cumsum(-1)
            dropped = cumulative <= 1 - filters.top_p
            dropped[..., -1] = False
            ordered = ordered.masked_fill(dropped, float("-inf"))
        logits = torch.empty_like(ordered).scatter_(-1, order, ordered)
    return logits.log_softmax(-1)


def processed_token_logprobs(
    logits: torch.Tensor, tokens: torch.Tensor, filters: SamplingFilters, rows_at_once: int = 1
) -> torch.Tensor:
    """Each token's log-prob under the processed distribution of the logits that predicted it
    (`logits`: [rows, positions, vocab], `tokens`: [rows, positions]); a few rows at a time, so that the sort
    holds one row's logits twice at most."""
    out = []
    for start in range(0, logits.size(0), rows_at_once):
        block = processed_log_softmax(logits[start : start + rows_at_once], filters)
        out.append(block.gather(-1, tokens[start : start + rows_at_once, :, None]).squeeze(-1))
    return torch.cat(out)


def processed_read(
    model: Any, ids: torch.Tensor, mask: torch.Tensor, width: int, filters: SamplingFilters
) -> torch.Tensor:
    """The log-probs of the last `width` tokens of each row of `ids` under the processed distribution: one forward
    of these rows, positions numbered from `mask`."""
    with positions_from_mask(model):
        logits = model(input_ids=ids, attention_mask=mask).logits[:, -width - 1 : -1]
    return processed_token_logprobs(logits, ids[:, -width:], filters)


# --- positions ------------------------------------------------------------------------------------
# Position ids numbered from the attention mask, in every read of a trajectory.
#
# Generation numbers a left-padded row's positions from its mask (its first real token is position 0):
# transformers' `generate` does, and so does `agentic_grpo.kv_reuse`. TRL's training read passes no position
# ids, so the model numbers the padded row from its first column instead. For rotary models that is the same
# function (attention sees only differences of positions); for models with absolute position embeddings
# (GPT-2 and its kind) it is not: the trainer would score a padded row at shifted positions, and disagree with
# the sampler by a tenth of a nat per token. `positions_from_mask` gives every forward inside it the mask's
# numbering, so sampler and trainer read the same positions for every model.
#
# `cache_keyword` names the other input every read passes by a name that depends on the model: its key/value cache.


def position_ids_from_mask(mask: torch.Tensor) -> torch.Tensor:
    """Each column's count of real tokens before it (0 for the first); padding columns get 0."""
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


def _takes_position_ids(model: torch.nn.Module) -> bool:
    base = getattr(model, "module", model)  # inside a DDP or DeepSpeed wrapper
    if hasattr(base, "get_base_model"):  # a PEFT model
        base = base.get_base_model()
    return "position_ids" in inspect.signature(type(base).forward).parameters


@contextlib.contextmanager
def positions_from_mask(model: torch.nn.Module) -> Iterator[None]:
    """For the block, each forward of `model` given `input_ids` and an `attention_mask` but no `position_ids`
    gets the mask's numbering; with a cache, the mask covers cached and new tokens and the new ones take the
    last columns' positions."""

    def add_positions(module: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        ids, mask = kwargs.get("input_ids"), kwargs.get("attention_mask")
        if ids is None or mask is None or kwargs.get("position_ids") is not None or mask.dim() != 2:
            return None
        kwargs["position_ids"] = position_ids_from_mask(mask)[:, -ids.shape[1] :]
        return args, kwargs

    if not _takes_position_ids(model):
        yield
        return
    handle = model.register_forward_pre_hook(add_positions, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()


def cache_keyword(model: Any) -> str:
    """The name under which `model`'s forward takes a key/value cache: `cache` since transformers renamed
    `past_key_values` (the old name is still accepted there, with a warning, until 5.40)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(type(base).forward).parameters else "past_key_values"
