"""Weighing the tokens that choose a tool: the name written in an action slot counts `weight` times in the loss.

In a ReAct trajectory the choice of tool is one token or two (" lookup", " string" "_tool") among the ~50 a
trajectory trains (the toolbox, with `top_entropy_quantile: 0.2`), and the loss averages them with the rest.
Adam then steps where the whole batch's gradient points, which the thought, the arguments and the answer
decide: on the toolbox, 24 steps moved the greedy policy's probability of `string_tool` on held-out strings
questions from 0.06-0.17 to 0.08-0.26 while `lookup` kept 0.45-0.65 (benchmarks/RUNS.md). Hierarchical policies
give the high-level action a loss term of its own; here that is a factor on the advantage of the name's
tokens (TRL's loss takes per-token advantages), so the choice and the writing each get a share of the step.

Why not a library: TRL weighs tokens only through the entropy mask (`top_entropy_quantile`), which ranks the
name of a confidently chosen tool below the cut as often as not. The slot is the format's contract
(`ActionChoices`), and only the format knows where it is.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch

from agentic_grpo.formats import ActionChoices
from agentic_grpo.trajectory import Trajectory

ACTION_WEIGHT_NEEDS_SLOT = (
    "`action_token_weight` needs a format that marks its action slot: format: react with "
    "format_kwargs: {constrain_actions: true}"
)


def name_spans(text: str, choices: ActionChoices) -> list[tuple[int, int]]:
    """Character spans of the tool names written after each `choices.marker` in `text` (the longest name the
    text goes on with, after spaces); a marker followed by no tool's name has none."""
    spans = []
    at = text.find(choices.marker)
    while at >= 0:
        start = at + len(choices.marker)
        start += len(text[start:]) - len(text[start:].lstrip(" "))
        names = [n for n in choices.names if text.startswith(n, start)]
        if names:
            spans.append((start, start + len(max(names, key=len))))
        at = text.find(choices.marker, start)
    return spans


def name_token_positions(token_ids: Sequence[int], tokenizer: Any, choices: ActionChoices) -> list[int]:
    """Indices into `token_ids` (one model turn) of the tokens that write a tool's name in an action slot: every
    token whose text overlaps a name's span."""
    ends = [len(tokenizer.decode(token_ids[: i + 1])) for i in range(len(token_ids))]
    spans = name_spans(tokenizer.decode(token_ids), choices)
    positions = []
    for i, end in enumerate(ends):
        start = ends[i - 1] if i else 0
        if any(start < b and end > a for a, b in spans):
            positions.append(i)
    return positions


def action_name_positions(trajectory: Trajectory, tokenizer: Any, choices: ActionChoices) -> Iterator[int]:
    """Indices into `trajectory`'s completion of the tokens that write a tool's name in an action slot of a model
    turn, in order (lazily: the first costs only the turns up to it)."""
    position = 0
    for segment in trajectory.completion_segments:
        if segment.trainable:
            for i in name_token_positions(segment.token_ids, tokenizer, choices):
                yield position + i
        position += len(segment.token_ids)


def weigh_action_tokens(
    advantages: torch.Tensor,
    trajectories: Sequence[Trajectory],
    tokenizer: Any,
    choices: ActionChoices | None,
    weight: float,
    width: int,
) -> torch.Tensor:
    """`advantages` ((B,) per trajectory or (B, width) per token) as (B, width) per-token advantages, with each
    action-slot name token's multiplied by `weight`; `choices` None (a format without a marked slot) is refused."""
    if choices is None:
        raise ValueError(ACTION_WEIGHT_NEEDS_SLOT)
    tokens = advantages.unsqueeze(1).expand(-1, width) if advantages.dim() == 1 else advantages
    tokens = tokens.clone()
    for row, trajectory in enumerate(trajectories):
        for i in action_name_positions(trajectory, tokenizer, choices):
            tokens[row, i] *= weight
    return tokens
