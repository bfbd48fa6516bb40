"""Spreading a GRPO group's first actions over the tools (`experimental: {spread_first_action: true}`).

A group learns which tool is right only if one of its G samples tries it, and a small model's sharp, shared
preferences can keep a whole group on one tool. Holding the first action slot of the G rows of a group to G
different tools (each tool G/n times, in a random order per group) makes every group compare every tool; the
rest of each turn is the model's own sample. The held names are not the policy's samples (off-policy), and
evaluation and greedy decoding are unchanged.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch

SPREAD_NEEDS_CONSTRAINED_SLOT = (
    "`spread_first_action` needs a format whose action slot is constrained: "
    "format: react with format_kwargs: {constrain_actions: true}"
)


def _members(groups: Sequence[Hashable]) -> list[list[int]]:
    """The rows of each group, in order of first appearance."""
    members: dict[Hashable, list[int]] = {}
    for row, group in enumerate(groups):
        members.setdefault(group, []).append(row)
    return list(members.values())


def spread_over_groups(
    groups: Sequence[Hashable], continuations: Sequence[str], generator: torch.Generator | None = None
) -> list[str | None]:
    """For each row (labelled by its group), the continuation its first action slot takes: within a group of
    several rows, the continuations in a random order, repeated as the group is larger (each taken by
    `len(group) // len(continuations)` or one more rows); a row alone in its group keeps its own choice (None)."""
    assigned: list[str | None] = [None] * len(groups)
    for rows in _members(groups):
        if len(rows) < 2:
            continue
        order = torch.randperm(len(continuations), generator=generator).tolist()
        for k, row in enumerate(rows):
            assigned[row] = continuations[order[k % len(order)]]
    return assigned
