"""Co-training as a layer over the policy's trainer: `CoTrainingLayer`, composed with `AgenticGRPOTrainer` by
`agentic_grpo.trainer_layers.trainer_class` where a recipe sets `experimental: {cotrain_subagents: true}`.

It trains the sub-agents with `train: true` (`agentic_grpo.experimental.cotrain`): their children's group
advantages after the policy's (`_advantages`), their losses before the policy's (`compute_loss`), their adapters
in parameter groups of their own (`create_optimizer`), and trainable again after a resume
(`_load_from_checkpoint`). It sits before `SubAgentsLayer`, which attaches their adapters to the model.
"""

from __future__ import annotations

from typing import Any

from agentic_grpo.backends import dropout_off
from agentic_grpo.experimental.cotrain import CoTraining, trained_roles

NO_TRAINED_SUBAGENT = (
    "experimental `cotrain_subagents` co-trains the sub-agents with `train: true`, and the recipe has none: add "
    "`train: true` to a sub-agent on `adapter: NAME`, or drop the option"
)


def check_cotraining(args: Any, rollout_parts: Any) -> None:
    """Refuse a co-training set-up that cannot train (before a model loads)."""
    if not trained_roles(rollout_parts.all_agents(), args.loss_type):
        raise ValueError(NO_TRAINED_SUBAGENT)


class CoTrainingLayer:
    """The co-trained sub-agents over `AgenticGRPOTrainer` with `SubAgentsLayer` (a mixin placed before both)."""

    layer = "cotraining"
    check_layer_setup = staticmethod(check_cotraining)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)  # the sub-agents' adapters join the model there
        self.cotraining = CoTraining.for_trainer(self, self.rollout_parts.all_agents())

    def _advantages(self, inputs: list[dict[str, Any]], rows: list[dict[str, Any]], output: dict[str, Any]) -> None:
        """The trainer's advantages, then each co-trained sub-agent's children with their own group advantages
        (`output["role_samples"]`)."""
        super()._advantages(inputs, rows, output)
        with dropout_off(self.model):
            output["role_samples"] = self.cotraining.samples_for(inputs, "train" if self.model.training else "eval")

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """The trainer's loss for the policy's rows, plus each co-trained sub-agent's loss over those rows'
        children (computed first: back-propagated one child at a time when `CoTraining.backward` allows)."""
        role_losses = self.cotraining.losses(model, inputs.get("role_samples", []), self.cotraining.backward())
        loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        self.cotraining.log_policy_loss(loss)
        return loss + sum(role_losses.values())

    def create_optimizer(self, model: Any = None) -> Any:
        """The Trainer's optimizer, with each co-trained sub-agent's adapter in parameter groups of its own (its
        `learning_rate`). Built before any step, so there is no optimizer state to move."""
        optimizer = super().create_optimizer(model)
        self.cotraining.split_param_groups(optimizer, model or self.model)
        return optimizer

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: Any = None) -> None:
        """The load of the layers below (the policy's own adapter restored last, which leaves only the active
        adapter trainable), then every co-trained adapter trainable again."""
        super()._load_from_checkpoint(resume_from_checkpoint, model)
        self.cotraining.make_trainable()
