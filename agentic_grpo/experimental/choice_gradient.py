"""An auxiliary loss supervised by the rows' tool labels: the tool choice's reward, differentiated exactly at each
trajectory's first action slot (`experimental: {choice_gradient_weight: W}`).

In RL terms this is not GRPO: it is a supervised auxiliary term, the exact gradient of E_pi[r] over the slot's
choices for a reward known from each row's `expected_tools` label, added to the GRPO loss.

GRPO learns which tool a question needs from the G tools a group sampled: the sampled name's token is pushed up
or down by its trajectory's advantage, and the tools nobody sampled get nothing, so the tool one kind's groups
are paid for can rise at every action slot, whatever the question. Where the reward of each choice is known without running it (the row names its expected
tools, as `ToolChoice` pays them), the policy gradient of that reward at the slot needs no samples: over the
slot's choices a (the tools' first tokens of a canonical slot), with pi the slot's distribution renormalised over
them (at temperature 1, whose order is greedy decoding's), E_pi[r] = sum over expected a of pi(a), and its
gradient is exact. It raises the expected tools and lowers every other tool in proportion to its probability
there, so a tool that drifted up in a context where it is wrong is pushed back down in that context, sampled or
not ("all-action" or expected policy gradients: Sutton et al. 2001; Ciosek and Whiteson 2018, "Expected Policy
Gradients"). It is supervised by the rows' `expected_tools`, as `ToolChoice` is; what the held-out figures
measure is unchanged.

The loss adds `-weight * mean(E_pi[r])` over the microbatch's trajectories whose first slot chose a tool and
whose row names one; the slot's hidden states come from the loss's own forward pass (a hook on the backbone
records them), so it costs one call of the head on those few positions, not a forward pass.

Why not a library: TRL's loss sees only the sampled tokens' log-probs (its fused head never forms the logits),
and the slot's place in the tokens is the format's contract (`ActionChoices`), which only we know.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from agentic_grpo.formats import ActionChoices
from agentic_grpo.rollout_metrics import expected_tools
from agentic_grpo.trajectory import Trajectory

CHOICE_GRADIENT_NEEDS_CANONICAL_SLOT = (
    "`choice_gradient_weight` needs a slot whose choice is one token: format: react with "
    "format_kwargs: {constrain_actions: true} and experimental: {canonical_actions: true}"
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


def choice_tokens(tokenizer: Any, choices: ActionChoices | None) -> list[int]:
    """The first token of each continuation of a canonical slot, in the slot's order: the slot's choices. Refuses a
    slot that is not canonical, or whose continuations do not begin with distinct tokens."""
    if not getattr(choices, "canonical", False):
        raise ValueError(CHOICE_GRADIENT_NEEDS_CANONICAL_SLOT)
    firsts = [tokenizer.encode(c, add_special_tokens=False)[0] for c in choices.continuations]
    if len(set(firsts)) < len(firsts):
        shared = sorted({choices.names[i] for i, t in enumerate(firsts) if firsts.count(t) > 1})
        raise ValueError(
            f"`choice_gradient_weight` needs tools whose names begin with distinct tokens; {shared} share their "
            "first token in this tokenizer"
        )
    return firsts


def choice_targets(
    trajectories: Sequence[Trajectory],
    rows: Sequence[dict[str, Any]],
    tokenizer: Any,
    choices: ActionChoices,
    tokens: Sequence[int],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per trajectory, the index in its completion of the token that chose its first action (-1: no action, a
    row that names no tool of the slot, or a slot begun mid-token), and which of the slot's choices the row
    expects ((B, n) of 0/1)."""
    slots = torch.full((len(trajectories),), -1, dtype=torch.long)
    targets = torch.zeros(len(trajectories), len(choices.names))
    for row_index, (trajectory, row) in enumerate(zip(trajectories, rows, strict=True)):
        expected = [name in expected_tools(row) for name in choices.names]
        if not any(expected):
            continue
        targets[row_index] = torch.tensor(expected, dtype=torch.float32)
        first = next(action_name_positions(trajectory, tokenizer, choices), None)
        if first is not None and trajectory.completion_ids[first] in tokens:
            slots[row_index] = first
    return slots, targets


@contextlib.contextmanager
def recorded_hidden_states(model: Any) -> Iterator[list[torch.Tensor]]:
    """Record the last hidden states of the backbone's forward passes that build a graph and read no prompt
    into a cache (the loss's reads: a whole row, or a completion on a cached prompt, `read_prompt_once`)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    recorded: list[torch.Tensor] = []

    def record(module: Any, args: Any, kwargs: dict[str, Any], output: Any) -> None:
        if torch.is_grad_enabled() and not kwargs.get("use_cache"):
            recorded.append(output[0] if isinstance(output, tuple) else output.last_hidden_state)

    handle = base.base_model.register_forward_hook(record, with_kwargs=True)
    try:
        yield recorded
    finally:
        handle.remove()


def choice_loss(
    hidden: Sequence[torch.Tensor],
    completion_width: int,
    slots: torch.Tensor,
    targets: torch.Tensor,
    head: torch.nn.Module,
    tokens: Sequence[int],
) -> tuple[torch.Tensor, torch.Tensor]:
    """`-mean(E_pi[r])` over the rows with a slot, and the mean probability of the expected choices (detached).

    `hidden` are the loss's recorded reads, in row order; a read of width t predicts completion token j from
    position t - completion_width - 1 + j (a whole row, or a completion read on its prompt's cache with the
    prompt's last token)."""
    picked, live, first = [], [], 0
    for read in hidden:
        offset = read.size(1) - completion_width - 1
        if offset < 0:
            raise RuntimeError(
                f"a recorded read of width {read.size(1)} holds no {completion_width} completion tokens"
            )
        for row in range(first, min(first + read.size(0), slots.numel())):
            if slots[row] >= 0:
                picked.append(read[row - first, offset + int(slots[row])])
                live.append(row)
        first += read.size(0)
    if first != slots.numel():
        raise RuntimeError(f"the loss read {first} rows, the microbatch has {slots.numel()}")
    if not live:
        return hidden[0].sum() * 0.0, torch.tensor(float("nan"))
    picked = torch.stack(picked)
    # The head module is called (not its weight read): ZeRO-3 and FSDP gather it in their hooks around a call.
    logits = head(picked)[:, torch.tensor(list(tokens), device=picked.device)]
    expected = (logits.float().softmax(-1) * targets[live].to(logits.device)).sum(-1)
    return -expected.mean(), expected.mean().detach()
