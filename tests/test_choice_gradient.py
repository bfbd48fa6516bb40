"""The exact tool-choice gradient (`choice_gradient_weight`): the slot found in real trajectories of the real
`MathToolbox` (scripted turns, real tokenizer and tools), its term equal to the expected tools' probability read
from a plain forward pass of the tiny model with either read of the loss and under LoRA, a step on it raising
that probability, and the set-ups it refuses."""

from __future__ import annotations

import json

import pytest
import torch

from agentic_grpo.experimental.action_slot import TunedActionChoices
from agentic_grpo.experimental.choice_gradient import choice_tokens
from agentic_grpo.formats import ActionChoices
from tests.choice_support import choice_rows, choice_trainer, slot_probabilities
from tests.helpers import launch_two_processes


@pytest.mark.parametrize(("read_prompt_once", "lora"), [(True, False), (False, False), (True, True)])
def test_the_term_is_the_expected_tools_probability_at_the_first_slot(
    tiny_model_dir, tmp_path, read_prompt_once, lora
):
    from peft import LoraConfig

    peft_config = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False) if lora else None
    trainer = choice_trainer(tiny_model_dir, str(tmp_path), read_prompt_once=read_prompt_once, peft_config=peft_config)
    inputs = trainer.generate_and_score(choice_rows())
    tokenizer = trainer.processing_class
    slots = inputs["choice_slots"].tolist()
    assert slots[3] == -1  # no action, no slot
    named = [tokenizer.decode(inputs["completion_ids"][row, slots[row]]).strip() for row in range(3)]
    assert named == ["calculator", "python", "calculator"]
    names = trainer.trajectory_format.action_choices.names
    assert inputs["choice_targets"][:, names.index("python")].tolist() == [1.0, 1.0, 0.0, 1.0]

    plain = {k: v for k, v in inputs.items() if k not in ("choice_slots", "choice_targets")}
    policy_loss = trainer.compute_loss(trainer.model, plain)  # TRL's loss alone
    loss = trainer.compute_loss(trainer.model, inputs)
    expected = slot_probabilities(trainer, inputs)
    assert torch.allclose(loss - policy_loss, -expected.mean(), atol=1e-5)
    assert trainer._metrics["train"]["tools/choice_probability"][-1] == pytest.approx(expected.mean().item(), abs=1e-5)


def test_a_step_on_the_term_raises_the_expected_tools_where_another_was_chosen(tiny_model_dir, tmp_path):
    trainer = choice_trainer(tiny_model_dir, str(tmp_path))
    inputs = trainer.generate_and_score(choice_rows())
    assert torch.count_nonzero(inputs["advantages"]) == 0  # every answer is scored the same: TRL's loss is flat
    before = slot_probabilities(trainer, inputs).detach()
    trainer.compute_loss(trainer.model, inputs).backward()
    with torch.no_grad():
        for parameter in trainer.model.parameters():
            if parameter.grad is not None:
                parameter -= 0.5 * parameter.grad
    after = slot_probabilities(trainer, inputs).detach()
    # The mean is what the step climbs, and the row that chose calculator for a python question rose with it. The
    # tiny random model barely tells the rows apart, so the one calculator row fell as the two python rows rose.
    assert after.mean() > before.mean() and after[0] > before[0], (before, after)


@pytest.mark.integration
def test_two_processes_each_train_their_own_slots_and_log_the_mean_of_both(tiny_model_dir, tmp_path):
    result = launch_two_processes("choice_two_processes.py", tiny_model_dir, str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert {r["wrapped"] for r in ranks} == {"DistributedDataParallel"}
    both = (ranks[0]["own"] + ranks[1]["own"]) / 2  # the mean of each process's mean (over 2 slots and over 1)
    assert ranks[0]["logged"] == pytest.approx(both, abs=1e-5) and ranks[1]["logged"] == pytest.approx(both, abs=1e-5)


def test_the_term_needs_a_canonical_slot_whose_choices_begin_with_distinct_tokens(tokenizer, tmp_path):
    from agentic_grpo.config import AgenticGRPOConfig
    from agentic_grpo.train import prepare

    free = ActionChoices("Action:", (" calculator\n", " python\n"), ("calculator", "python"))
    with pytest.raises(ValueError, match="canonical_actions"):
        choice_tokens(tokenizer, free)
    with pytest.raises(ValueError, match="canonical_actions"):
        choice_tokens(tokenizer, None)
    shared = TunedActionChoices("Action:", (" string_tool\n", " string_count\n"), ("string_tool", "string_count"),
                                canonical=True)  # fmt: skip
    with pytest.raises(ValueError, match="distinct tokens"):
        choice_tokens(tokenizer, shared)
    with pytest.raises(ValueError, match="choice_gradient_weight` must be 0"):
        AgenticGRPOConfig(output_dir=str(tmp_path), experimental={"choice_gradient_weight": -1.0})
    argv = ["--config", "recipes/ci_tiny.yaml", "--output_dir", str(tmp_path / "out"),
            "--experimental", "{choice_gradient_weight: 1}"]  # fmt: skip
    with pytest.raises(ValueError, match="canonical_actions"):
        prepare(argv)
