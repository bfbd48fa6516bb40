"""Position ids numbered from the attention mask, in every read of a trajectory.

Generation numbers a left-padded row's positions from its mask (its first real token is position 0):
transformers' `generate` does, and so does `agentic_grpo.kv_reuse`. TRL's training read passes no position
ids, so the model numbers the padded row from its first column instead. For rotary models that is the same
function (attention sees only differences of positions); for models with absolute position embeddings
(GPT-2 and its kind) it is not: the trainer would score a padded row at shifted positions, and disagree with
the sampler by a tenth of a nat per token. `positions_from_mask` gives every forward inside it the mask's
numbering, so sampler and trainer read the same positions for every model.

`cache_keyword` names the other input every read passes by a name that depends on the model: its key/value cache.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from typing import Any

import torch


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
