"""The trainer's contract with TRL: every private TRL/transformers method it overrides or calls is listed in
`agentic_grpo.trainer.PRIVATE_SEAMS` with the parameters it relies on, and matches the installed TRL."""

from __future__ import annotations

import inspect

from transformers import Trainer
from trl import GRPOTrainer

from agentic_grpo.checkpoints import AtomicCheckpoints
from agentic_grpo.chunked_logps import ChunkedLogps
from agentic_grpo.trainer import PRIVATE_SEAMS, AgenticGRPOTrainer

OWNERS = {"GRPOTrainer": GRPOTrainer, "Trainer": Trainer}


def seam_mismatches(seams: dict[str, tuple[str, ...]], owners: dict[str, type]) -> list[str]:
    """One line per seam whose method is gone, whose leading parameters changed, or whose attribute TRL no longer
    sets in its constructor."""
    problems = []
    for seam, expected in seams.items():
        owner_name, name = seam.split(".")
        owner = owners[owner_name]
        if not expected:  # an attribute the constructor sets
            if f"self.{name} =" not in inspect.getsource(owner.__init__):
                problems.append(f"{seam}: {owner_name}.__init__ no longer sets `self.{name}`")
            continue
        method = getattr(owner, name, None)
        if method is None:
            problems.append(f"{seam}: no such method in {owner.__module__}.{owner_name}")
            continue
        found = tuple(inspect.signature(method).parameters)[: len(expected)]
        if found != expected:
            problems.append(f"{seam}: parameters {found}, the trainer relies on {expected}")
    return problems


def test_every_private_seam_matches_the_installed_trl():
    assert seam_mismatches(PRIVATE_SEAMS, OWNERS) == []


def test_a_changed_signature_is_reported_naming_the_method():
    class Upgraded:
        def __init__(self) -> None:
            self._renamed = {}

        def _calculate_rewards(self, inputs, prompts, completions):  # one parameter gone
            return None

    seams = {"Upgraded._calculate_rewards": ("self", "inputs", "prompts", "completions", "completion_ids_list"),
             "Upgraded._generate": ("self", "prompts"), "Upgraded._metrics": ()}  # fmt: skip
    problems = seam_mismatches(seams, {"Upgraded": Upgraded})
    assert len(problems) == 3
    assert problems[0].startswith("Upgraded._calculate_rewards: parameters")
    assert "Upgraded._generate: no such method" in problems[1]
    assert "no longer sets `self._metrics`" in problems[2]


def test_every_private_method_the_trainer_overrides_is_in_the_table():
    ours = (AgenticGRPOTrainer, AtomicCheckpoints, ChunkedLogps)
    overridden = {
        f"{'GRPOTrainer' if name in vars(GRPOTrainer) else 'Trainer'}.{name}"
        for cls in ours
        for name in vars(cls)
        if name.startswith("_") and not name.startswith("__") and hasattr(GRPOTrainer, name)
    }
    assert overridden and overridden <= set(PRIVATE_SEAMS), overridden - set(PRIVATE_SEAMS)
