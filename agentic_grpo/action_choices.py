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
"""

from __future__ import annotations

import functools
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
        self._allowed: dict[str, torch.Tensor] = {}

    def allowed(self, written: str) -> torch.Tensor | None:
        """Token ids that may come next after `written` in the slot, or None when the slot is closed."""
        if written not in self._allowed:
            remainders = self.choices.remainders(written)
            if not remainders:
                return None
            ids = sorted({t for t, piece in self._pieces if any(r.startswith(piece) for r in remainders)})
            self._allowed[written] = torch.tensor(ids, dtype=torch.long)
        return self._allowed[written]

    def slot_text(self, text: str) -> str | None:
        """The text after the turn's last marker, or None when the turn has no marker yet."""
        at = text.rfind(self.choices.marker)
        return None if at < 0 else text[at + len(self.choices.marker) :]


@functools.lru_cache(maxsize=8)
def choice_mask(tokenizer: Any, choices: ActionChoices) -> ActionChoiceMask:
    """The mask of `choices` for `tokenizer`, built once per process: the trainer makes a new backend for every
    rollout, and the mask (a decode of the vocabulary, then a scan per slot state) depends on neither."""
    return ActionChoiceMask(tokenizer, choices)


class ActionChoiceProcessor:
    """A logits processor for `generate`: masks every token but the allowed ones in rows whose turn is inside an
    action slot.

    One per `generate` call: the first call sees the contexts alone, so its width is where this turn's
    new tokens begin in every row (rows are left-padded to one width, and stay so as the batch shrinks).
    """

    def __init__(self, mask: ActionChoiceMask) -> None:
        self.mask = mask
        self.start: int | None = None

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self.start is None:
            self.start = input_ids.shape[1]
        for row in range(input_ids.shape[0]):
            text = self.mask.tokenizer.decode(input_ids[row, self.start :])
            written = self.mask.slot_text(text)
            allowed = None if written is None else self.mask.allowed(written)
            if allowed is not None:
                allowed = allowed.to(scores.device)
                keep = scores[row, allowed] / self.mask.choices.temperature
                scores[row] = float("-inf")
                scores[row, allowed] = keep
        return scores
