"""The policy's loss read in pieces of rows and columns, each piece's activations recomputed in backward: memory
that follows the model, not the prompt.

TRL reads a whole microbatch in one forward pass with gradients, and autograd keeps every layer's activations of
every row until the backward: per token and layer the MLP's inner activations and the attention's inputs and
outputs, and per row the keys and values repeated to every query head over all its columns. TRL's fused log-prob
head already keeps the full-vocabulary logits from being materialized; what grows with the prompt (and with the
microbatch) is these activations, tens of kilobytes per token and layer in fp32: for two groups of eight rows of
a thousand tokens, several times what a small model, its optimizer and its rollout hold together.

Here, in the policy's loss (`ChunkedLogps.loss_read`), a microbatch that keeps more than `loss_chunk_tokens`
tokens' activations (`row_tokens`) is read in pieces of at most that many, each under `torch.utils.checkpoint`: a
piece keeps only its inputs and its per-token log-probs and entropies, and its activations are recomputed when the
backward reaches it, one piece at a time. The peak is then one piece's activations, whatever the microbatch size
and the prompt length, for one more forward pass of the pieces. The last piece keeps its activations: the
backward reaches it first, before any other piece is recomputed.

Prompts go through a key/value cache (`agentic_grpo.shared_prompt`) when rows share them (`read_prompt_once`: each
distinct prompt read once) or when a single row is more than a piece: the prompts are read in recomputed pieces
of rows, and a prompt longer than a piece in pieces of columns, each on the keys and values of the columns before
it; then each piece of rows reads its completions on them. Completions are not cut into columns: a row's
completion is read in one piece, however long (`max_completion_length` bounds it). Per-token values are the same function of the
same weights as one whole read, so log-probs, entropies and gradients equal the unchunked read's to rounding
(`tests/test_chunked_logps.py`); TRL's loss (the entropy quantile over the whole microbatch included) runs
unchanged on the concatenated pieces.

A recomputed forward must see the model as the first one did: positions are numbered from the mask in both runs
(`agentic_grpo.shrinking_batch`), dropout draws the same masks (the random state is restored), and a replay under
another adapter or mode than its forward raises instead of training on wrong gradients.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
from collections.abc import Callable, Iterator
from typing import Any

import torch
from accelerate.utils import DistributedType
from torch.utils.checkpoint import checkpoint

from agentic_grpo.shared_prompt import (
    joined_columns,
    read_on_prompts,
    read_prompts,
    shared_prompt_logps,
    shared_prompt_rows,
)
from agentic_grpo.shrinking_batch import cache_keyword, positions_from_mask

LOSS_CHUNK_TOKENS = 1024
"""The most tokens' activations (`row_tokens`) one piece of the policy's loss read keeps (for a 135M model of 30
layers in fp32, about a gigabyte and a half by the tensors' shapes), whatever the prompt length and the microbatch
size; a piece holds at least one row."""

SPAN_SHARE = 8
"""A row keeps, per column it attends to, its keys and values repeated to every query head in each layer: about an
eighth of what a token it reads keeps (HF attention, grouped-query models included)."""


def row_tokens(read: int, span: int) -> int:
    """The activations a row keeps, in tokens' worth, when it reads `read` tokens attending to `span` columns."""
    return read + span // SPAN_SHARE


def row_pieces(rows: int, per_row: int, max_tokens: int | None) -> list[slice]:
    """Consecutive slices that cover `range(rows)` once, in order, each of at most `max_tokens // per_row` rows
    and at least one; one slice when `max_tokens` is None or 0."""
    size = rows if not max_tokens else max(1, min(rows, max_tokens // max(per_row, 1)))
    return [slice(start, min(start + size, rows)) for start in range(0, rows, max(size, 1))]


def plain_cache(config: Any) -> bool:
    """Whether `config`'s model caches plain per-token keys and values in every layer, which a read can be split
    around (not sliding-window, recurrent or indexed layers)."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    try:
        return all(type(layer) is DynamicLayer for layer in DynamicCache(config=config).layers)
    except Exception:  # noqa: BLE001 - a model whose cache cannot be built here is read whole
        return False


def _model_state(model: Any) -> tuple:
    """What a forward of `model` depends on besides its inputs and weights: the active and disabled adapters
    (PEFT) and the train/eval mode of every module."""
    from peft import PeftModel

    base = getattr(model, "module", model)  # inside a DDP or DeepSpeed wrapper
    adapters = (tuple(base.active_adapters), bool(base._adapters_disabled)) if isinstance(base, PeftModel) else ()
    return adapters, tuple(module.training for module in base.modules())


@contextlib.contextmanager
def _replay(model: Any, state: tuple, device: torch.device) -> Iterator[None]:
    release_freed_memory(device)  # what the backward of the piece before freed
    if _model_state(model) != state:
        raise RuntimeError(
            "a piece of the loss read is being recomputed under another adapter or train/eval mode than its forward "
            "ran in: run the backward in the state the loss was computed in"
        )
    with positions_from_mask(model):
        yield


def recomputed(model: Any, function: Callable[..., Any], *tensors: Any) -> Any:
    """`function(*tensors)`, a forward of `model`, keeping none of its activations: they are recomputed when the
    backward reaches them (non-reentrant `torch.utils.checkpoint`), with positions numbered from the mask in both
    runs. The replay raises if `model`'s adapters or modes have changed since the forward. On the CPU, the memory
    each run frees goes back to the system (`agentic_grpo.chunked_logps`)."""
    state, device = _model_state(model), tensors[0].device

    def contexts() -> tuple[Any, Any]:
        return positions_from_mask(model), _replay(model, state, device)

    outputs = checkpoint(function, *tensors, use_reentrant=False, context_fn=contexts)
    release_freed_memory(device)  # the piece's activations, freed as its forward went
    return outputs


class ChunkedLogps:
    """Trainer mixin: TRL's `_get_per_token_logps_and_entropies`, reading each distinct prompt of a microbatch
    once under `args.read_prompt_once` (`agentic_grpo.shared_prompt`), and inside `loss_read` in pieces of at most
    `loss_chunk_tokens` tokens' activations, recomputed in backward.

    Rows are read whole, by TRL, with MoE aux losses and image inputs. With gradient checkpointing, prompts are
    read per row (HF's checkpointed layers drop a cache they would write: the backward replay would write it
    twice) and the loss is read whole (the layers already recompute their activations). The loss is read whole too
    where an engine wraps the model (DDP, DeepSpeed, FSDP: several processes): a piece's replay would run the
    engine's forward inside its backward, whose gradient reduction is set up by the forward; gradient
    checkpointing bounds the memory there.
    """

    loss_chunk_tokens: int | None = LOSS_CHUNK_TOKENS
    _in_loss_read: bool = False

    @contextlib.contextmanager
    def loss_read(self) -> Iterator[None]:
        """For the block, reads with gradients are the policy's loss: pieces recomputed in backward, which must then
        run with the model in the state the block left it in (adapters, train/eval mode)."""
        outer, self._in_loss_read = self._in_loss_read, True
        try:
            yield
        finally:
            self._in_loss_read = outer

    def _get_per_token_logps_and_entropies(
        self, model, input_ids, attention_mask, logits_to_keep, batch_size=None, compute_entropy=False,
        compute_aux_loss=False, **image_inputs,
    ):  # fmt: skip
        """TRL's, with each distinct prompt read once under `read_prompt_once`, and the loss read in recomputed
        pieces (see the class)."""
        trl = functools.partial(super()._get_per_token_logps_and_entropies, model, logits_to_keep=logits_to_keep)
        if compute_aux_loss or any(value is not None for value in image_inputs.values()):
            return trl(input_ids, attention_mask, batch_size=batch_size, compute_entropy=compute_entropy,
                       compute_aux_loss=compute_aux_loss, **image_inputs)  # fmt: skip
        checkpointed = self.args.gradient_checkpointing
        shared = self.args.read_prompt_once and not checkpointed
        alone = self.accelerator.distributed_type == DistributedType.NO  # no engine wraps the model
        if self._in_loss_read and torch.is_grad_enabled() and alone and not checkpointed and self.loss_chunk_tokens:
            read = self._read_in_pieces(model, trl, input_ids, attention_mask, logits_to_keep, compute_entropy, shared)
            if read is not None:
                return *read, None
        if not shared:
            return trl(input_ids, attention_mask, batch_size=batch_size, compute_entropy=compute_entropy)
        unwrapped = self.accelerator.unwrap_model(model)
        config, cache_name = unwrapped.config, cache_keyword(unwrapped)
        chunk = batch_size or input_ids.size(0)  # TRL's memory bound on the rows read at once
        logps, entropies = [], []
        for start in range(0, input_ids.size(0), chunk):
            ids, mask = input_ids[start : start + chunk], attention_mask[start : start + chunk]
            read = shared_prompt_logps(model, config, ids, mask, logits_to_keep, compute_entropy, cache_name)
            read = read or trl(ids, mask, compute_entropy=compute_entropy)[:2]  # no two rows share a prompt
            logps.append(read[0])
            entropies.append(read[1])
        return torch.cat(logps), torch.cat(entropies) if compute_entropy else None, None

    def _read_in_pieces(
        self,
        model: Any,
        trl: Callable[..., Any],
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        logits_to_keep: int,
        compute_entropy: bool,
        shared: bool,
    ) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        """The rows' log-probs (and entropies) read piece by piece, every piece but the last recomputed in backward.
        Prompts go through a cache when rows share them (`shared`) or when one row is more than a piece; then each
        distinct prompt is read once, in recomputed pieces of rows and of columns. None when the whole read fits in
        one piece."""
        budget, (rows, width) = self.loss_chunk_tokens, input_ids.shape
        head = width - logits_to_keep - 1  # the prompts but their last token (`shared_prompt_logps`)
        unwrapped = self.accelerator.unwrap_model(model)
        cacheable = head >= 1 and plain_cache(unwrapped.config)
        found = shared_prompt_rows(input_ids, attention_mask, head) if cacheable and shared else None
        if found is None and cacheable and row_tokens(width, width) > budget:
            found = torch.arange(rows, device=input_ids.device), torch.arange(rows, device=input_ids.device)
        if found is None:
            pieces = row_pieces(rows, row_tokens(width, width), budget)
            if len(pieces) <= 1:
                return None

            def read(ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
                return tuple(trl(ids, mask, compute_entropy=compute_entropy)[:2])

            arguments = [(input_ids[piece], attention_mask[piece]) for piece in pieces]
        else:
            first, inverse = found
            if row_tokens(head, head) * first.numel() + row_tokens(width - head, width) * rows <= budget:
                return None
            config, cache_name = unwrapped.config, cache_keyword(unwrapped)
            prompts = [
                self._read_prompts(model, input_ids[first[piece], :head], attention_mask[first[piece], :head])
                for piece in row_pieces(first.numel(), row_tokens(head, head), budget)
            ]
            keys_values = tuple(torch.cat(layer) for layer in zip(*prompts, strict=True))
            read = functools.partial(read_on_prompts, model, config, logits_to_keep, compute_entropy, cache_name)
            pieces = row_pieces(rows, row_tokens(width - head, width), budget)
            arguments = [
                (input_ids[piece, head:], attention_mask[piece], inverse[piece], *keys_values) for piece in pieces
            ]
        # The last piece keeps its activations: the backward reaches it first, before any other piece is recomputed.
        reads = [recomputed(model, read, *tensors) for tensors in arguments[:-1]] + [read(*arguments[-1])]
        logps = torch.cat([piece[0] for piece in reads])
        entropies = torch.cat([piece[1] for piece in reads]) if compute_entropy else None
        return logps, entropies

    def _read_prompts(
        self, model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        """The keys and values of the prompts `input_ids` (`read_prompts`), read in recomputed pieces of columns when
        they are more than a piece, each on the keys and values of the columns before it."""
        unwrapped = self.accelerator.unwrap_model(model)
        read = functools.partial(read_prompts, model, unwrapped.config, cache_name=cache_keyword(unwrapped))
        rows, width = input_ids.shape
        per_row = self.loss_chunk_tokens // rows
        # A piece also attends to every column before it (a prompt's worth at most), but reads at least half a piece.
        columns = max(per_row - width // SPAN_SHARE, per_row // 2, 1)
        parts: list[tuple[torch.Tensor, ...]] = []
        for start in range(0, width, columns):
            end = min(start + columns, width)
            parts.append(recomputed(model, read, input_ids[:, start:end], attention_mask[:, :end], tuple(parts)))
        return joined_columns(parts)


# --- host memory ----------------------------------------------------------------------------------
# Freed host memory handed back to the system, so that a CPU run's resident size follows what it holds.
#
# PyTorch's CPU tensors come from the C heap (glibc `malloc`). Tensors under glibc's mmap threshold (which rises to
# 32 MB as large blocks are freed) live in heap arenas, and a freed block there stays resident until a later
# allocation reuses it: a step that frees a rollout's key/value caches, then the pieces of a loss read, leaves
# holes that different-sized tensors do not fill. The resident size then grows to about twice what the tensors
# need. `release_freed_memory` returns the heap's free pages to the system (glibc's `malloc_trim`) at the points
# where a phase has just freed a lot; it does nothing where the C library has no such call.


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    return getattr(libc, "malloc_trim", None)


def release_freed_memory(device: torch.device | str = "cpu") -> None:
    """Hand the C heap's free pages back to the system when `device` is the CPU (tensors on an accelerator are
    not in the C heap)."""
    trim = _malloc_trim()
    if trim is not None and torch.device(device).type == "cpu":
        trim(0)
