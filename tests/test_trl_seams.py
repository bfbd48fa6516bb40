"""The trainer's contract with TRL: every private TRL/transformers method it overrides or calls is listed in
`agentic_grpo.trl_seams.PRIVATE_SEAMS` with the parameters it relies on, and matches the installed TRL."""

from __future__ import annotations

import ast
import inspect
import re
import textwrap
from types import SimpleNamespace

import pytest
import torch
from transformers import Trainer
from trl import GRPOTrainer

from agentic_grpo.canaries import ResumeCanary
from agentic_grpo.checkpoints import AtomicCheckpoints
from agentic_grpo.chunked_logps import ChunkedLogps
from agentic_grpo.epoch_order import ResumableOrder
from agentic_grpo.trainer import AgenticGRPOTrainer
from agentic_grpo.trl_seams import PRIVATE_SEAMS, SEAM_RETURNS
from tests.helpers import require_vllm


def owners() -> dict[str, type]:
    from peft import PeftModel
    from trl.generation.vllm_generation import VLLMGeneration  # defined with or without vLLM installed

    return {"GRPOTrainer": GRPOTrainer, "Trainer": Trainer, "VLLMGeneration": VLLMGeneration, "PeftModel": PeftModel}


def seam_mismatches(
    seams: dict[str, tuple[str, ...]], owners: dict[str, type], returns: dict[str, int] | None = None
) -> list[str]:
    """One line per seam whose method is gone or whose parameters changed (any of them: a new one too), whose
    attribute its class no longer sets, or whose returns are no longer tuples of the length relied on."""
    problems = []
    for seam, expected in seams.items():
        owner_name, name = seam.split(".")
        owner = owners[owner_name]
        if not expected:  # an attribute the class sets
            if not re.search(rf"self\.{name}\s*=", inspect.getsource(owner)):
                problems.append(f"{seam}: {owner_name} no longer sets `self.{name}`")
            continue
        method = getattr(owner, name, None)
        if method is None:
            problems.append(f"{seam}: no such method in {owner.__module__}.{owner_name}")
            continue
        found = tuple(inspect.signature(method).parameters)
        if found != expected:
            problems.append(f"{seam}: parameters {found}, the trainer relies on {expected}")
        arity = (returns or {}).get(seam)
        if arity is not None:
            tree = ast.parse(textwrap.dedent(inspect.getsource(method)))
            lengths = {len(r.value.elts) if isinstance(r.value, ast.Tuple) else 1
                       for r in ast.walk(tree) if isinstance(r, ast.Return) and r.value is not None}  # fmt: skip
            if lengths != {arity}:
                problems.append(f"{seam}: returns tuples of length {sorted(lengths)}, the trainer relies on {arity}")
    return problems


def test_every_private_seam_matches_the_installed_packages():
    assert seam_mismatches(PRIVATE_SEAMS, owners(), SEAM_RETURNS) == []


def test_each_kind_of_change_is_reported_naming_the_seam():
    """Planted upgrades: a parameter gone, a parameter added, a method gone, an attribute renamed, a return of
    another length."""

    class Upgraded:
        def __init__(self) -> None:
            self._renamed = {}

        def _calculate_rewards(self, inputs, prompts, completions):  # one parameter gone
            return None

        def _read(self, model, input_ids, new_flag=False):  # one parameter added
            return model, input_ids

        def _logps(self, model):
            if model:
                return model, None
            return model, None, None

    seams = {"Upgraded._calculate_rewards": ("self", "inputs", "prompts", "completions", "completion_ids_list"),
             "Upgraded._read": ("self", "model", "input_ids"), "Upgraded._generate": ("self", "prompts"),
             "Upgraded._metrics": (), "Upgraded._logps": ("self", "model")}  # fmt: skip
    problems = seam_mismatches(seams, {"Upgraded": Upgraded}, {"Upgraded._logps": 3})
    assert len(problems) == 5, problems
    assert problems[0].startswith("Upgraded._calculate_rewards: parameters")
    assert problems[1].startswith("Upgraded._read: parameters") and "new_flag" in problems[1]
    assert "Upgraded._generate: no such method" in problems[2]
    assert "no longer sets `self._metrics`" in problems[3]
    assert problems[4] == "Upgraded._logps: returns tuples of length [2, 3], the trainer relies on 3"


def test_every_private_method_the_trainer_overrides_is_in_the_table():
    """Every class between GRPOTrainer and the trainer with all its layers (sub-agents, experiments, async)."""
    from types import SimpleNamespace

    from agentic_grpo.async_rollouts import AsyncRolloutsLayer
    from agentic_grpo.experimental.layer import ExperimentsLayer
    from agentic_grpo.subagents.layer import SubAgentsLayer
    from agentic_grpo.trainer_layers import trainer_class

    layered = trainer_class(
        SimpleNamespace(experimental={"spread_first_action": True}, subagents=[{"name": "a"}], async_rollouts=True)
    )
    ours = layered.__mro__[: layered.__mro__.index(GRPOTrainer)]
    assert {SubAgentsLayer, ExperimentsLayer, AsyncRolloutsLayer, AgenticGRPOTrainer} <= set(ours)
    assert {ResumeCanary, ResumableOrder, AtomicCheckpoints, ChunkedLogps} <= set(ours)
    overridden = {
        f"{'GRPOTrainer' if name in vars(GRPOTrainer) else 'Trainer'}.{name}"
        for cls in ours
        for name in vars(cls)
        if name.startswith("_") and not name.startswith("__") and hasattr(GRPOTrainer, name)
    }
    assert overridden and overridden <= set(PRIVATE_SEAMS), overridden - set(PRIVATE_SEAMS)


def test_trl_builds_the_colocated_engine_with_no_dtype_of_its_own():
    """`vllm_backend.engine_as_the_policy` hands TRL's `LLM(...)` the policy's dtype by a keyword TRL does not
    pass (were TRL to pass one, the call would fail on the keyword twice), and adds the run's seed to TRL's."""
    require_vllm()  # TRL's vLLM module defines `LLM` only with vLLM installed
    from trl.generation import vllm_generation

    source = inspect.getsource(vllm_generation.VLLMGeneration._init_vllm)
    assert "LLM(" in source and "dtype=" not in source and "seed=accelerator.process_index" in source
    assert vllm_generation.LLM.__name__ == "LLM"


@pytest.mark.parametrize(
    ("model_init_kwargs", "engine_dtype"),
    [
        ({"dtype": "float32"}, "float32"),
        ({"dtype": torch.bfloat16}, "bfloat16"),
        ({}, None),
        ({"dtype": "auto"}, None),
    ],
)
def test_the_colocated_engine_is_built_in_the_policys_dtype_from_the_runs_seed(
    monkeypatch, model_init_kwargs, engine_dtype
):
    require_vllm()  # TRL's vLLM module defines `LLM` only with vLLM installed
    from trl.generation import vllm_generation

    from agentic_grpo.vllm_backend import engine_as_the_policy

    built: list[dict] = []
    monkeypatch.setattr(vllm_generation, "LLM", lambda **kwargs: built.append(kwargs))
    engine = vllm_generation.LLM
    args = SimpleNamespace(use_vllm=True, vllm_mode="colocate", model_init_kwargs=model_init_kwargs, seed=3,
                           world_size=2)  # fmt: skip
    with engine_as_the_policy(args, "some/model"):
        vllm_generation.LLM(model="some/model", seed=1)  # as TRL builds it on process 1
    assert vllm_generation.LLM is engine  # restored
    assert built == [{"model": "some/model", "seed": 3 * 2 + 1, **({"dtype": engine_dtype} if engine_dtype else {})}]
    with engine_as_the_policy(args, torch.nn.Linear(2, 2, dtype=torch.float64)):
        vllm_generation.LLM(model="some/model", seed=0)
    assert built[-1]["dtype"] == "float64"  # a model object: its own weights decide
    with engine_as_the_policy(SimpleNamespace(**{**vars(args), "vllm_mode": "server"}), "some/model"):
        assert vllm_generation.LLM is engine  # a server's dtype and seed are its own command line's
