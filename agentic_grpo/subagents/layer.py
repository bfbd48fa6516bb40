"""Sub-agents as a layer over the policy's trainer: `SubAgentsLayer`, composed with `AgenticGRPOTrainer` by
`agentic_grpo.trainer_layers.trainer_class` where a recipe has `subagents:`.

Sub-agents run inside the policy's tool turns (the rollout manager calls them as tools); this layer adds what
the trainer needs of them: their adapters on the policy's model, their usage metrics, and the co-training of
those with `train: true` (`agentic_grpo.subagents.cotrain`): their children's group advantages after the
policy's (`_advantages`), their losses before the policy's (`compute_loss`), their adapters in parameter groups
of their own (`create_optimizer`), and trainable again after a resume (`_load_from_checkpoint`).
"""

from __future__ import annotations

from typing import Any

from agentic_grpo.backends import dropout_off
from agentic_grpo.subagents.adapters import restore_policy_adapter
from agentic_grpo.subagents.cotrain import CoTraining
from agentic_grpo.subagents.usage import subagent_metrics


class SubAgentsLayer:
    """The recipe's sub-agents over `AgenticGRPOTrainer` (a mixin placed before it)."""

    layer = "subagents"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Their adapters join the policy's model here, before training wraps it; None when none is trained.
        self.cotraining = CoTraining.for_trainer(self, self.rollout_parts.all_agents())

    def _rollout_metrics(self, trajectories: list[Any], stats: Any, rows: list[dict[str, Any]]) -> dict:
        metrics = super()._rollout_metrics(trajectories, stats, rows)
        metrics.update(subagent_metrics(trajectories, self._sum_over_processes))
        return metrics

    def _advantages(self, inputs: list[dict[str, Any]], rows: list[dict[str, Any]], output: dict[str, Any]) -> None:
        """The trainer's advantages, then each co-trained sub-agent's children with their own group advantages
        (`output["role_samples"]`)."""
        super()._advantages(inputs, rows, output)
        if self.cotraining is not None:
            with dropout_off(self.model):
                output["role_samples"] = self.cotraining.samples_for(
                    inputs, "train" if self.model.training else "eval"
                )

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """The trainer's loss for the policy's rows, plus each co-trained sub-agent's loss over those rows'
        children (computed first: back-propagated one child at a time when `CoTraining.backward` allows)."""
        if self.cotraining is None:
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        role_losses = self.cotraining.losses(model, inputs.get("role_samples", []), self.cotraining.backward())
        loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        self.cotraining.log_policy_loss(loss)
        return loss + sum(role_losses.values())

    def create_optimizer(self, model: Any = None) -> Any:
        """The Trainer's optimizer, with each co-trained sub-agent's adapter in parameter groups of its own (its
        `learning_rate`). Built before any step, so there is no optimizer state to move."""
        optimizer = super().create_optimizer(model)
        if self.cotraining is not None:
            self.cotraining.split_param_groups(optimizer, model or self.model)
        return optimizer

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: Any = None) -> None:
        """The Trainer's load, then the policy's own adapter (which it skips when the checkpoint also holds the
        sub-agents' adapters); co-trained sub-agents' adapters train on after a resume too (it leaves only the
        active one trainable)."""
        super()._load_from_checkpoint(resume_from_checkpoint, model)
        restore_policy_adapter(self.accelerator.unwrap_model(model if model is not None else self.model),
                               resume_from_checkpoint)  # fmt: skip
        if self.cotraining is not None:
            self.cotraining.make_trainable()
