"""Sub-agents as a layer over the policy's trainer: `SubAgentsLayer`, composed with `AgenticGRPOTrainer` by
`agentic_grpo.trainer_layers.trainer_class` where a recipe has `subagents:`.

Sub-agents run inside the policy's tool turns (the rollout manager calls them as tools); this layer adds what
the trainer needs of them: their adapters on the policy's model, their usage metrics, and the policy's own
adapter back in place after a resume. Co-training those with `train: true` is an experiment, a layer of its
own (`agentic_grpo.experimental.cotrain_layer`).
"""

from __future__ import annotations

from typing import Any

from agentic_grpo.models import is_peft_model
from agentic_grpo.subagents.adapters import BASE, restore_policy_adapter
from agentic_grpo.subagents.usage import subagent_metrics


def attach_subagent_adapters(model: Any, agents: list[Any]) -> None:
    """Attach the adapters of the sub-agents (`agents`: a whole tree) that run on the policy's base model to
    `model`, before training wraps it; raises ValueError where the policy is no LoRA adapter to run them beside."""
    from agentic_grpo.subagents.sources import attach_adapters

    attach_adapters(model, agents)
    based = [a.name for a in agents if a.adapter == BASE]
    if based and not is_peft_model(model):  # trained in full, the policy is no longer its own base
        raise ValueError(f"sub-agent(s) {based} run on the policy's base model (`adapter: __base__`), which "
                         "needs a LoRA policy: set `use_peft: true`, or give them a `model` of their own")  # fmt: skip


class SubAgentsLayer:
    """The recipe's sub-agents over `AgenticGRPOTrainer` (a mixin placed before it)."""

    layer = "subagents"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        attach_subagent_adapters(self.model, self.rollout_parts.all_agents())

    def _rollout_metrics(self, trajectories: list[Any], stats: Any, rows: list[dict[str, Any]]) -> dict:
        metrics = super()._rollout_metrics(trajectories, stats, rows)
        metrics.update(subagent_metrics(trajectories, self._sum_over_processes))
        return metrics

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: Any = None) -> None:
        """The Trainer's load, then the policy's own adapter (which it skips when the checkpoint also holds the
        sub-agents' adapters)."""
        super()._load_from_checkpoint(resume_from_checkpoint, model)
        restore_policy_adapter(self.accelerator.unwrap_model(model if model is not None else self.model),
                               resume_from_checkpoint)  # fmt: skip
