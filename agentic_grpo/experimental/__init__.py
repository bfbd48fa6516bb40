"""Experiments: methods that helped on one benchmark so far, kept apart from the core until they help on another.

As `trl.experimental` does for TRL, this package holds what a user should not need to read to use the
framework. A recipe turns them on under one key, `experimental:`, whose fields are `ExperimentalConfig`'s; they
are not in the main `--help`. docs/tool_choice.md, docs/turn_credit.md and docs/subagents.md describe them, and
RESULTS.md what they measured.

- `spread_first_action` (`agentic_grpo.experimental.spread`): hold the first action slot of a GRPO group's G
  rows to G different tools, so every group compares every tool (off-policy exploration).
- `choice_gradient_weight` (`agentic_grpo.experimental.choice_gradient`): an auxiliary loss supervised by the
  rows' tool labels (`expected_tools`): the exact gradient of the tool choice's expected reward at each first
  action slot.
- `canonical_actions`, `action_temperature` (`agentic_grpo.experimental.action_slot`): options of ReAct's
  constrained action slot (a choice that is one token among the tools' first tokens; the tool's name sampled at a
  multiple of the sampling temperature).
- `advantage`, `turn_lambda`, `turn_gamma` (`agentic_grpo.experimental.turn_credit`): per-turn credit, the
  environment's per-turn rewards (and states) turned into per-token advantages; docs/turn_credit.md.
- `cotrain_subagents` (`agentic_grpo.experimental.cotrain`): sub-agents with `train: true` learn in the same run
  as the policy, each on a LoRA adapter of its own; docs/subagents.md.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field, fields
from typing import Any

import yaml

TURN_CREDIT_OPTIONS = ("advantage", "turn_lambda", "turn_gamma")
"""The options of per-turn credit (`agentic_grpo.experimental.turn_credit`): they reweigh advantages, no sampling."""


@dataclass(frozen=True)
class ExperimentalConfig:
    """The recipe's `experimental:` mapping. Each default leaves the core's behaviour untouched."""

    spread_first_action: bool = field(
        default=False,
        metadata={"help": "Hold the first action of a group's G trajectories to G different tools (training "
                  "rollouts only). Needs `format_kwargs: {constrain_actions: true}`."},
    )  # fmt: skip
    choice_gradient_weight: float = field(
        default=0.0,
        metadata={"help": "Weight of the auxiliary loss on the first action slot, supervised by the rows' "
                  "`expected_tools` (0: off). Needs `constrain_actions` and `canonical_actions`."},
    )  # fmt: skip
    canonical_actions: bool = field(
        default=False,
        metadata={"help": "The constrained action slot follows each tool name's own tokens, so the choice is one "
                  "token among the tools' first tokens."},
    )  # fmt: skip
    action_temperature: float = field(
        default=1.0,
        metadata={"help": "Sample the tool's name in a constrained slot at this multiple of the sampling "
                  "temperature (greedy decoding is unchanged)."},
    )  # fmt: skip

    advantage: str = field(
        default="outcome",
        metadata={"help": "Advantage estimator (formulas in agentic_grpo.experimental.turn_credit): `outcome` (TRL's "
                  "GRPO), `turn` (plus turn_lambda x each turn's return of per-turn rewards against the other group "
                  "members' at that turn), `anchor` (plus turn_lambda x each turn's return, outcome included, against "
                  "the other members' turns from the same environment state; needs `state_hash`)."},
    )  # fmt: skip
    turn_lambda: float = field(
        default=1.0, metadata={"help": "Weight of the turn-level term of the `turn` and `anchor` advantages."}
    )
    turn_gamma: float = field(
        default=1.0,
        metadata={"help": "Discount of later turns' rewards in the `turn` and `anchor` returns, in (0, 1]."},
    )

    cotrain_subagents: bool = field(
        default=False,
        metadata={"help": "Train the sub-agents with `train: true` in the same run as the policy (co-training), each "
                  "its LoRA adapter with GRPO groups of its own. Refused without such a sub-agent."},
    )  # fmt: skip

    def __post_init__(self) -> None:
        if self.advantage not in ("outcome", "turn", "anchor"):
            raise ValueError(f"experimental `advantage` must be `outcome`, `turn` or `anchor`, got `{self.advantage}`")
        if not 0.0 < self.turn_gamma <= 1.0:
            raise ValueError(f"experimental `turn_gamma` must be in (0, 1], got {self.turn_gamma}")
        if self.turn_lambda < 0:
            raise ValueError(f"experimental `turn_lambda` must be >= 0, got {self.turn_lambda}")
        if self.choice_gradient_weight < 0:
            raise ValueError(f"experimental `choice_gradient_weight` must be 0 (off) or above, got "
                             f"{self.choice_gradient_weight}")  # fmt: skip
        if self.action_temperature <= 0:
            raise ValueError(f"experimental `action_temperature` must be above 0, got {self.action_temperature}")

    @classmethod
    def from_recipe(cls, value: Any) -> ExperimentalConfig:
        """The recipe's `experimental:` value (a mapping, its YAML text, or None); unknown keys are refused."""
        if isinstance(value, ExperimentalConfig):
            return value
        if isinstance(value, str):
            value = yaml.safe_load(value)
        value = value or {}
        if not isinstance(value, dict):
            raise ValueError(f"recipe field `experimental` must be a mapping of option: value, got {value!r}")
        known = [f.name for f in fields(cls)]
        for key in value:
            if key not in known:
                close = difflib.get_close_matches(key, known, n=1)
                hint = f"; did you mean `{close[0]}`?" if close else f"; the options are {known}"
                raise ValueError(f"recipe field `experimental`: option `{key}` is not known{hint}")
        return cls(**value)
