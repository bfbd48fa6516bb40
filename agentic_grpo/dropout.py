"""Dropout off while sampling and scoring, and a count of what would still draw masks.

TRL leaves the policy in train mode while it generates; LoRA or attention dropout would then draw random masks
for the sampled tokens and for the old and reference log-probs computed from them. The trainer samples and
scores inside `dropout_off`; the sampler-trainer canary counts `dropout_active` modules at sampling time to
name dropout as the cause when the two disagree.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def dropout_off(model: torch.nn.Module) -> Iterator[None]:
    """Every module below `model` in eval mode (no dropout, functional attention dropout included) for the block.

    `model.training` itself is left as it is: TRL and the trainer read it to tell a training step from an
    evaluation (which metrics a value goes to, whether trajectories are saved).
    """
    modes = [(module, module.training) for module in model.modules()]
    for module in model.children():
        module.eval()
    try:
        yield
    finally:
        for module, training in modes:
            module.training = training


def dropout_active(model: torch.nn.Module) -> int:
    """How many modules below `model` would draw dropout masks now: `Dropout` layers with p > 0 and attention
    modules with a non-zero `attention_dropout` (HF applies it functionally), in train mode."""
    count = 0
    for module in model.modules():
        if not module.training:
            continue
        if isinstance(module, torch.nn.modules.dropout._DropoutNd) and module.p > 0:
            count += 1
        elif isinstance(getattr(module, "attention_dropout", None), float) and module.attention_dropout > 0:
            count += 1
    return count
