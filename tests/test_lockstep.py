"""Processes whose policy is sharded (FSDP, ZeRO-3) take part in every turn until all are done, and a rollout
unwraps (gathers) the policy once, however many turns it has."""

from __future__ import annotations

import json

import pytest
import torch

from tests.helpers import ROOT, build_trainer, run_python
from tests.lockstep_support import manager, uneven_rows
from tests.lockstep_two_processes import completion_loss

TWO_PROCESSES = ("-m", "torch.distributed.run", "--nproc_per_node", "2", ROOT / "tests" / "lockstep_two_processes.py")


def one_process_rollout(model_dir, rank):
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    from agentic_grpo.backends import TransformersBackend

    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    config = GenerationConfig(
        do_sample=False, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id
    )
    backend = TransformersBackend(model, tokenizer, config, [tokenizer.eos_token_id])
    rollout = manager(tokenizer)
    try:
        trajectories, _ = rollout.rollout(*uneven_rows(rank), backend)
    finally:
        rollout.close()
    with torch.no_grad():
        return trajectories, completion_loss(model, trajectories).item()


@pytest.mark.integration
def test_fsdp_processes_whose_trajectories_end_at_different_turns_finish_with_one_process_results(
    tiny_model_dir, tmp_path
):
    result = run_python(*TWO_PROCESSES, tiny_model_dir, tmp_path, timeout=300, PYTHONPATH=str(ROOT))
    assert result.returncode == 0, result.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert all(r["lockstep"] for r in ranks)  # the tiny model is FSDP-managed over 2 processes
    assert ranks[0]["turns"] == [1, 1, 1, 1] and max(ranks[1]["turns"]) == 4  # process 0 idles for 3 turns
    for rank, record in enumerate(ranks):
        trajectories, loss = one_process_rollout(tiny_model_dir, rank)
        assert [t.completion_ids for t in trajectories] == record["completions"]
        assert record["loss"] == pytest.approx(loss, abs=1e-5)


@pytest.mark.integration
def test_a_process_that_leaves_the_turn_loop_on_its_own_does_not_finish(tiny_model_dir, tmp_path):
    """The planted bug: process 0 leaves after its own last turn; process 1's next forward pass waits for it."""
    result = run_python(*TWO_PROCESSES, tiny_model_dir, tmp_path, "planted", timeout=300, PYTHONPATH=str(ROOT))
    assert result.returncode != 0
    assert "Timed out" in result.stderr or "Connection" in result.stderr, result.stderr[-2000:]


def test_a_rollout_unwraps_the_policy_once_however_many_turns(tiny_model_dir, tmp_path, monkeypatch):
    import trl.models

    from agentic_grpo.rewards.rules import Correctness

    rows = [{"prompt": [{"role": "user", "content": "What is 2 + 2?"}], "answer": "4"}] * 4
    trainer = build_trainer(tiny_model_dir, tmp_path, [Correctness()], rows)
    unwraps = []
    unwrap = trl.models.unwrap_model_for_generation

    def counting(*args, **kwargs):
        unwraps.append(1)
        return unwrap(*args, **kwargs)

    monkeypatch.setattr(trl.models, "unwrap_model_for_generation", counting)
    backend = trainer.generation_backend
    rollout = manager(trainer.processing_class)
    try:
        trajectories, stats = rollout.rollout(*uneven_rows(1), backend)
    finally:
        rollout.close()
    assert stats.turns == 4 and len(unwraps) == 1
    for _ in range(3):  # outside a rollout, each call unwraps on its own
        backend.generate([[1, 2, 3]], [], 2)
    assert len(unwraps) == 4
