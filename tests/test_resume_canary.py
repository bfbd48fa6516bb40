"""The resume canary: a run resumed from a checkpoint checks that its first step starts where the interrupted run
went on (the trainable weights, the rows, the random state) and records it in `run.json`; each planted bug (an
adapter never loaded, another dataset, generators not restored) stops the resumed run naming what differs.

Real trainers on the tiny model, real checkpoints: a 2-step run saves after each step, and a second trainer
resumes from the first checkpoint.
"""

from __future__ import annotations

import json

import pytest
from peft import LoraConfig

from agentic_grpo.canaries import CanaryError
from agentic_grpo.trainer import AgenticGRPOTrainer
from tests.helpers import build_trainer
from tests.scripted import case_prompt
from tests.varied_rewards import distinct_characters

LORA = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])


def rows(names=("a", "b", "c", "d")) -> list[dict]:
    return [{"prompt": case_prompt(name), "question": name, "answer": "1"} for name in names]


def trainer_for(model_dir, out, data=None, **overrides) -> AgenticGRPOTrainer:
    """One question per step (G=2), a checkpoint after each step: 4 rows make an epoch of 4 steps."""
    settings = dict(max_steps=2, save_strategy="steps", save_steps=1, num_generations=2, per_device_train_batch_size=2,
                    max_turns=2, max_tokens_per_turn=8, max_completion_length=32, learning_rate=1e-2,
                    save_trajectories_steps=0)  # fmt: skip
    return build_trainer(
        model_dir, out, [distinct_characters], data or rows(), peft_config=LORA, stepped_by_hand=False,
        environment="agentic_grpo.tools.calculator:Calculator", **{**settings, **overrides},
    )  # fmt: skip


@pytest.fixture(scope="module")
def interrupted(tiny_model_dir, tmp_path_factory):
    """A finished 2-step run: checkpoint-1 holds its canary file with the next step recorded."""
    out = tmp_path_factory.mktemp("run")
    trainer_for(tiny_model_dir, out).train()
    return out


def test_a_checkpoint_records_its_weights_and_the_next_steps_start(interrupted):
    record = json.loads((interrupted / "checkpoint-1" / "canary.rank0.json").read_text())
    assert record["step"] == 1 and record["weights"] and set(record["next_step"]) == {"rows", "rng"}
    assert "next_step" not in json.loads((interrupted / "checkpoint-2" / "canary.rank0.json").read_text())


def resume(model_dir, interrupted, tmp_path, data=None) -> AgenticGRPOTrainer:
    out = tmp_path / "resumed"
    out.mkdir()
    import shutil

    shutil.copytree(interrupted / "checkpoint-1", out / "checkpoint-1")
    trainer = trainer_for(model_dir, out, data)
    trainer.train(resume_from_checkpoint=str(out / "checkpoint-1"))
    return trainer


def test_an_honest_resume_is_recorded_as_the_interrupted_run(tiny_model_dir, interrupted, tmp_path):
    trainer = resume(tiny_model_dir, interrupted, tmp_path)
    assert trainer.state.global_step == 2
    outcome = json.loads((tmp_path / "resumed" / "run.json").read_text())["resume_canary"]
    assert {outcome[k] for k in ("weights", "rows", "rng")} == {"as the interrupted run"}, outcome


def test_an_adapter_that_was_never_loaded_stops_the_run(tiny_model_dir, interrupted, tmp_path, monkeypatch):
    monkeypatch.setattr(AgenticGRPOTrainer, "_load_from_checkpoint", lambda self, *args, **kwargs: None)
    with pytest.raises(CanaryError, match="what differs: the trainable weights"):
        resume(tiny_model_dir, interrupted, tmp_path)


def test_other_data_stops_the_run(tiny_model_dir, interrupted, tmp_path):
    with pytest.raises(CanaryError, match="what differs: the rows"):
        resume(tiny_model_dir, interrupted, tmp_path, data=rows(("e", "f", "g", "h")))


def test_generators_that_were_not_restored_stop_the_run(tiny_model_dir, interrupted, tmp_path, monkeypatch):
    monkeypatch.setattr(AgenticGRPOTrainer, "_load_rng_state", lambda self, checkpoint: None)
    with pytest.raises(CanaryError, match="what differs: the random state"):
        resume(tiny_model_dir, interrupted, tmp_path)


@pytest.mark.parametrize("checkpoint", [4, 5], ids=["at-the-epoch-end", "inside-the-second-epoch"])
def test_a_resume_in_a_later_epoch_ends_where_the_uninterrupted_run_ends(tiny_model_dir, tmp_path, checkpoint):
    """The second epoch's rows are drawn in another order than the first's (TRL's sampler advances one generator
    per pass); a run resumed at or after the first epoch's end draws the second epoch's order, passes the canary
    and ends with the uninterrupted run's weights, bit for bit."""
    import shutil

    from agentic_grpo.canaries import weights_fingerprint

    whole = trainer_for(tiny_model_dir, tmp_path / "whole", max_steps=6)
    whole.train()
    out = tmp_path / "resumed"
    out.mkdir()
    shutil.copytree(tmp_path / "whole" / f"checkpoint-{checkpoint}", out / f"checkpoint-{checkpoint}")
    resumed = trainer_for(tiny_model_dir, out, max_steps=6)
    resumed.train(resume_from_checkpoint=str(out / f"checkpoint-{checkpoint}"))
    outcome = json.loads((out / "run.json").read_text())["resume_canary"]
    assert {outcome[k] for k in ("weights", "rows", "rng")} == {"as the interrupted run"}, outcome
    assert weights_fingerprint(resumed.model) == weights_fingerprint(whole.model)
