"""The experiments as a layer over the policy's trainer: `ExperimentsLayer`, composed with `AgenticGRPOTrainer`
by `agentic_grpo.trainer_layers.trainer_class` where a recipe sets `experimental:`.

- `spread_first_action`: the rollout of a training step holds the first action slot of each group's G rows to
  G different tools (`_sample`).
- `advantage: turn | anchor`: the advantage step replaces each trajectory's outcome advantage with per-token
  advantages of its turns (`_advantages`, `agentic_grpo.experimental.turn_credit`).
- `choice_gradient_weight`: the advantage step adds each row's first-slot targets (`_advantages`), and the loss
  adds the choice-gradient term from the hidden states of TRL's own forward pass (`compute_loss`).
"""

from __future__ import annotations

from typing import Any

from accelerate.utils import gather_object

from agentic_grpo.experimental.choice_gradient import (
    CHOICE_GRADIENT_NEEDS_CANONICAL_SLOT,
    choice_loss,
    choice_targets,
    choice_tokens,
    recorded_hidden_states,
)
from agentic_grpo.experimental.spread import SPREAD_NEEDS_CONSTRAINED_SLOT, spread_over_groups
from agentic_grpo.experimental.turn_credit import ANCHOR_NEEDS_STATE, assign_turn_credit


def check_experiments(config: Any, parts: Any) -> None:
    """Refuse experiments the recipe's trajectory format cannot carry (before a model loads, in `prepare`)."""
    experiments = config.experiments
    slot = getattr(parts.trajectory_format, "action_choices", None)
    if experiments.spread_first_action and not slot:
        raise ValueError(SPREAD_NEEDS_CONSTRAINED_SLOT)
    if experiments.choice_gradient_weight and not getattr(slot, "canonical", False):
        raise ValueError(CHOICE_GRADIENT_NEEDS_CANONICAL_SLOT)
    if experiments.advantage == "anchor":
        from agentic_grpo.environment import ToolEnvironment

        if parts.environment.state_hash is ToolEnvironment.state_hash:
            raise ValueError(ANCHOR_NEEDS_STATE.format(name=parts.environment.__name__))


class ExperimentsLayer:
    """The recipe's `experimental:` options over `AgenticGRPOTrainer` (a mixin placed before it)."""

    layer = "experimental"
    check_layer_setup = staticmethod(check_experiments)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.experiments = self.args.experiments
        slot = getattr(self.trajectory_format, "action_choices", None)
        # The first action slot's choices, for `choice_gradient_weight`.
        self.choice_tokens = (
            choice_tokens(self.processing_class, slot) if self.experiments.choice_gradient_weight else None
        )

    def _sample(self, prompts: list[Any], rows: list[dict[str, Any]]) -> Any:
        if not (self.experiments.spread_first_action and self.model.training):
            return super()._sample(prompts, rows)
        continuations = self.trajectory_format.action_choices.continuations
        first_actions = spread_over_groups([repr(prompt) for prompt in prompts], continuations)
        return self.rollout_manager.rollout(prompts, rows, self.generation_backend, first_actions)

    def _advantages(self, inputs: list[dict[str, Any]], rows: list[dict[str, Any]], output: dict[str, Any]) -> None:
        """The trainer's advantages, then per-turn credit (`advantage: turn | anchor`) and the choice gradient's slot
        targets (`output["choice_slots"]`, `["choice_targets"]`)."""
        super()._advantages(inputs, rows, output)
        if "advantage" in self.args.experimental:  # set, even to `outcome`: the estimators' metrics are logged
            self._turn_credit(inputs, output)
        if self.choice_tokens is not None and self.model.training:
            trajectories = [row["trajectory"] for row in inputs]
            slots, targets = choice_targets(
                trajectories, rows, self.processing_class, self.trajectory_format.action_choices, self.choice_tokens
            )
            device = output["completion_ids"].device
            output["choice_slots"], output["choice_targets"] = slots.to(device), targets.to(device)

    def _turn_credit(self, inputs: list[dict[str, Any]], output: dict[str, Any]) -> None:
        """Per-token advantages of each trajectory's turns in place of its outcome advantage, and the estimators'
        `credit/frac_reward_zero_std/...`."""
        experiments = self.experiments
        tokens, metrics = assign_turn_credit(
            [row["trajectory"] for row in inputs],
            output["advantages"],
            dict(zip(self.reward_func_names, self.reward_weights.tolist(), strict=True)),
            estimator=experiments.advantage,
            lam=experiments.turn_lambda,
            gamma=experiments.turn_gamma,
            group_size=self.num_generations if self.model.training else self.num_generations_eval,
            width=output["completion_ids"].shape[1],
            gather=gather_object,
            process_index=self.accelerator.process_index,
        )
        if tokens is not None:
            output["advantages"] = tokens
        self.log_metrics(metrics)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """The trainer's loss, plus under `choice_gradient_weight` the exact gradient of the tool-choice reward at
        the first action slots, from the hidden states of TRL's own forward pass."""
        if "choice_slots" not in inputs or not model.training:
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        unwrapped = self.accelerator.unwrap_model(model)
        with recorded_hidden_states(unwrapped) as hidden:
            loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        term, probability = choice_loss(
            hidden, inputs["completion_ids"].size(1), inputs["choice_slots"], inputs["choice_targets"],
            unwrapped.get_output_embeddings(), self.choice_tokens,
        )  # fmt: skip
        gathered = self.accelerator.gather(probability.to(loss.device).reshape(1))
        self.log_metrics({"tools/choice_probability": gathered.nanmean().item()}, mode="train")
        weight = self.experiments.choice_gradient_weight
        return loss + weight * term / self.current_gradient_accumulation_steps
