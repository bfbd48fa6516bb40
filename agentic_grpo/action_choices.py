"""Constrained action slots: after a marker the model writes freely (ReAct's `Action:`), decoding may only
continue with one of a few strings (a tool's name and the `Action Input:` line).

A small model asked to pick among many tools often writes no tool at all: a verb ("Action: reverse"), the
last example's tool, or the tool's name with the `Action Input:` line left out. Each is a malformed turn,
so GRPO's group sees no choice among real tools to compare. Function-calling servers solve this with a
grammar over the tool names; `ReActFormat(constrain_actions=True)` does the same here, and the model still
chooses which tool, writes its thought before and its arguments after.

Why not a library: transformers' `prefix_allowed_tokens_fn` and grammar engines (outlines, xgrammar)
constrain the whole output from its first token, while here the constraint starts wherever the model
itself writes the marker, and is a matter of text (any tokenization of "Action: calculator" is allowed,
the one the model prefers included). The mask is one logits processor, used by the transformers backends;
the slot itself (`ActionChoices`) is part of a format's contract (`agentic_grpo.formats`).

A slot may bring its own mask (`mask_for(tokenizer)`, e.g. `agentic_grpo.experimental.action_slot`), which
chooses the next tokens (`next_tokens`) and scales the slot's logits (`slot_logits`).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import torch

from agentic_grpo.formats import ActionChoices


class ActionChoiceMask:
    """Allowed token ids per slot state for one tokenizer and one `ActionChoices` (cached: the states are the
    prefixes of the continuations)."""

    def __init__(self, tokenizer: Any, choices: ActionChoices) -> None:
        self.tokenizer = tokenizer
        self.choices = choices
        alphabet = set("".join(choices.continuations))
        # Only tokens made of the continuations' characters can be a prefix of one (for SmolLM2 and eight tool
        # names, 30k of 49k tokens): each slot state scans these, not the whole vocabulary.
        self._pieces = [
            (token_id, piece)
            for token_id in range(len(tokenizer))
            if (piece := tokenizer.decode([token_id])) and set(piece) <= alphabet
        ]
        self._allowed: dict[tuple[str, tuple[str, ...] | None], torch.Tensor] = {}

    def allowed(self, written: str, among: tuple[str, ...] | None = None) -> torch.Tensor | None:
        """Token ids that may come next after `written` in the slot (held to the continuations `among`, when
        given), or None when the slot is closed."""
        key = (written, among)
        if key not in self._allowed:
            remainders = self.choices.remainders(written, among)
            if not remainders:
                return None
            ids = sorted(self.next_tokens(written, among, remainders))
            self._allowed[key] = torch.tensor(ids, dtype=torch.long)
        return self._allowed[key]

    def next_tokens(self, written: str, among: tuple[str, ...] | None, remainders: list[str]) -> set[int]:
        """The tokens that may come next after `written`, given what is left of each continuation it may still
        become (`remainders`): any token that begins one of them, so any tokenization spells a continuation."""
        return {t for t, piece in self._pieces if any(r.startswith(piece) for r in remainders)}

    def slot_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """The logits of the allowed tokens inside a slot, before sampling (unchanged here)."""
        return logits

    def slot_text(self, text: str) -> str | None:
        """The text after the turn's last marker, or None when the turn has no marker yet."""
        at = text.rfind(self.choices.marker)
        return None if at < 0 else text[at + len(self.choices.marker) :]


@functools.lru_cache(maxsize=8)
def choice_mask(tokenizer: Any, choices: ActionChoices) -> ActionChoiceMask:
    """The mask of `choices` for `tokenizer`, built once per process: the trainer makes a new backend for every
    rollout, and the mask (a decode of the vocabulary, then a scan per slot state) depends on neither."""
    mask_for = getattr(choices, "mask_for", None)
    return mask_for(tokenizer) if mask_for is not None else ActionChoiceMask(tokenizer, choices)


class ActionChoiceProcessor:
    """A logits processor for `generate`: masks every token but the allowed ones in rows whose turn is inside an
    action slot.

    One per `generate` call: the first call sees the contexts alone, so its width is where this turn's
    new tokens begin in every row (rows are left-padded to one width, and stay so as the batch shrinks).
    `assigned[row]`, when given and not None, is the one continuation the row's first slot of this turn may
    take. A decoding loop whose batch shrinks sets `live_rows` (the caller's index of each row it still
    decodes) before each call; otherwise row `i` is the caller's row `i`.
    """

    def __init__(self, mask: ActionChoiceMask, assigned: Sequence[str | None] | None = None) -> None:
        self.mask = mask
        self.assigned = list(assigned) if assigned is not None else None
        self.start: int | None = None
        self.live_rows: list[int] | None = None

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self.start is None:
            self.start = input_ids.shape[1]
        for row in range(input_ids.shape[0]):
            text = self.mask.tokenizer.decode(input_ids[row, self.start :])
            written = self.mask.slot_text(text)
            allowed = None if written is None else self.mask.allowed(written, self._held_to(row, text))
            if allowed is not None:
                allowed = allowed.to(scores.device)
                keep = self.mask.slot_logits(scores[row, allowed])
                scores[row] = float("-inf")
                scores[row, allowed] = keep
        return scores

    def _held_to(self, row: int, text: str) -> tuple[str, ...] | None:
        if self.assigned is None or text.count(self.mask.choices.marker) != 1:
            return None
        continuation = self.assigned[self.live_rows[row] if self.live_rows is not None else row]
        return None if continuation is None else (continuation,)
