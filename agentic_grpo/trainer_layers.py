"""The trainer class for a recipe: `AgenticGRPOTrainer`, the policy's trainer, with the layers the recipe uses.

A layer is a mixin that extends the trainer's steps (`_sample`, `_rollout_metrics`, `_advantages`,
`compute_loss`, ...), names itself in `layer` and may check its settings before a model loads
(`check_layer_setup`); the trainer refuses a recipe whose layers its class lacks.
Sub-agents (`agentic_grpo.subagents.layer`), experiments (`agentic_grpo.experimental.layer`), asynchronous
rollouts (`agentic_grpo.async_rollouts`) and co-trained sub-agents (`agentic_grpo.experimental.cotrain_layer`)
are the four; each is imported only for a recipe that uses it.
"""

from __future__ import annotations

import functools
from typing import Any


def trainer_class(args: Any, rollout_parts: Any = None) -> type:
    """`AgenticGRPOTrainer` with the layers `args` (an `AgenticGRPOConfig`) and its rollout parts need: sub-agents
    where the recipe has any, experiments where it sets `experimental:` (and co-training where that sets
    `cotrain_subagents`), asynchronous rollouts where it sets `async_rollouts`."""
    agents = rollout_parts.agents if rollout_parts is not None else getattr(args, "subagents", None)
    experimental = getattr(args, "experimental", None)
    return _composed(
        bool(agents), bool(experimental), bool(getattr(args, "async_rollouts", False)), cotraining_on(experimental)
    )


def cotraining_on(experimental: Any) -> bool:
    """Whether a recipe's `experimental:` value turns co-training on (`cotrain_subagents`)."""
    if not experimental:
        return False
    from agentic_grpo.experimental import ExperimentalConfig

    return ExperimentalConfig.from_recipe(experimental).cotrain_subagents


@functools.cache
def _composed(subagents: bool, experimental: bool, asynchronous: bool = False, cotraining: bool = False) -> type:
    from agentic_grpo.trainer import AgenticGRPOTrainer

    layers: list[type] = []
    if cotraining:  # before the sub-agents' layer: a resume restores the policy's adapter before it
        from agentic_grpo.experimental.cotrain_layer import CoTrainingLayer

        layers.append(CoTrainingLayer)
    if subagents:
        from agentic_grpo.subagents.layer import SubAgentsLayer

        layers.append(SubAgentsLayer)
    if experimental:
        from agentic_grpo.experimental.layer import ExperimentsLayer

        layers.append(ExperimentsLayer)
    if asynchronous:
        from agentic_grpo.async_rollouts import AsyncRolloutsLayer

        layers.append(AsyncRolloutsLayer)
    if not layers:
        return AgenticGRPOTrainer
    name = "AgenticGRPOTrainer" + "".join("With" + layer.__name__.removesuffix("Layer") for layer in layers)
    return type(name, (*layers, AgenticGRPOTrainer), {"__module__": __name__})
