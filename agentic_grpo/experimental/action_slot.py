"""Two options of ReAct's constrained action slot (`experimental: {canonical_actions, action_temperature}`).

- `canonical_actions`: by default any tokens that spell a continuation may be written, so the choice can be
  carried by a fragment: " " then "lookup", or " l" then "ookup". Greedy decoding then picks the likeliest
  fragment, and GRPO trains whichever tokens were sampled, so training can move the choice onto a shared fragment
  (a lone " ") and the tool is then chosen by the token after it. A canonical slot follows each continuation's own
  tokenization, as a grammar over token ids would: the choice is one token among the tools' first tokens.
- `action_temperature`: the tool's name is sampled at the sampling temperature times this (above 1: tools the
  model rates low are tried more often; greedy decoding is unchanged).

`tune_action_slot` puts a `TunedActionChoices` in place of the format's slot; its `mask_for` gives the core's
logits processor (`agentic_grpo.action_choices`) the `TunedActionChoiceMask` that does both.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from agentic_grpo.action_choices import ActionChoiceMask
from agentic_grpo.formats import ActionChoices


@dataclasses.dataclass(frozen=True)
class TunedActionChoices(ActionChoices):
    """A constrained slot with the experimental options: the choice drawn at `temperature` times the sampling
    temperature, and, when `canonical`, held to each continuation's own tokens."""

    temperature: float = 1.0
    canonical: bool = False

    def mask_for(self, tokenizer: Any) -> TunedActionChoiceMask:
        """The mask `agentic_grpo.action_choices.choice_mask` uses for this slot."""
        return TunedActionChoiceMask(tokenizer, self)


class TunedActionChoiceMask(ActionChoiceMask):
    """`ActionChoiceMask` for a `TunedActionChoices`: canonical next tokens first, and the slot's logits scaled."""

    def __init__(self, tokenizer: Any, choices: TunedActionChoices) -> None:
        super().__init__(tokenizer, choices)
        # Each continuation's own tokens, and the text each prefix of them spells.
        self._canonical = {}
        for continuation in choices.continuations if choices.canonical else ():
            ids = tokenizer.encode(continuation, add_special_tokens=False)
            self._canonical[continuation] = [(tokenizer.decode(ids[:k]), ids[k]) for k in range(len(ids))]

    def next_tokens(self, written: str, among: tuple[str, ...] | None, remainders: list[str]) -> set[int]:
        """The next token of each continuation whose own tokens spell `written` so far; any spelling when the slot
        is not canonical or `written` ends inside one of those tokens (the slot began mid-token)."""
        candidates = self.choices.continuations if among is None else among
        own = {token for c in candidates for prefix, token in self._canonical.get(c, ()) if prefix == written}
        return own or super().next_tokens(written, among, remainders)

    def slot_logits(self, logits: torch.Tensor) -> torch.Tensor:
        return logits / self.choices.temperature


def tune_action_slot(trajectory_format: Any, experiments: Any) -> None:
    """Give `trajectory_format`'s constrained slot the recipe's experimental options (`experiments`, an
    `ExperimentalConfig`), where any is set; refuses them on a format without a constrained slot."""
    if not experiments.canonical_actions and experiments.action_temperature == 1.0:
        return
    slot = getattr(trajectory_format, "action_choices", None)
    if slot is None:
        raise ValueError(
            "experimental `canonical_actions` and `action_temperature` need a constrained action slot: set "
            "format_kwargs `constrain_actions: true`"
        )
    fields = {f.name: getattr(slot, f.name) for f in dataclasses.fields(ActionChoices)}
    trajectory_format.action_choices = TunedActionChoices(
        **fields, temperature=experiments.action_temperature, canonical=experiments.canonical_actions
    )
