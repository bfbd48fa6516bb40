"""The sampler-trainer canary: every training step compares the sampler's log-prob of each sampled token with
the trainer's, and stops the run past `canary_logprob_limit`, naming what it found.

Real tiny models generate for real (HF generate through the kept-cache, shrinking-batch loop that records the
sampling log-probs); each planted bug re-introduces one that once trained silently wrong: dropout on while
sampling (#44 item 1), a sampling temperature other than the trainer's (item 5), positions numbered differently
by sampler and trainer on an absolute-position model (item 8).
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from peft import LoraConfig

from agentic_grpo import trainer as trainer_module
from agentic_grpo.canaries import CanaryError
from tests.helpers import build_trainer

# A random adapter (not PEFT's zero B), scaled up: its dropout changes the output from the first step.
LORA = LoraConfig(r=4, lora_alpha=64, target_modules=["q_proj", "v_proj"], lora_dropout=0.3, init_lora_weights=False)
QUESTIONS = ["What is 12 * 34?", "Multiply 120 by 7 and then add 3, please."]  # two prompt lengths: left padding


def rows_for(trainer_format) -> list[dict]:
    return [
        {"prompt": trainer_format.prompt_messages(q), "question": q, "answer": "1"}
        for q in QUESTIONS
        for _ in range(2)
    ]


def react_rows() -> list[dict]:
    """`rows_for` the ReAct format of the calculator, for a trainer that is yet to be built."""
    from agentic_grpo.formats import load_format
    from agentic_grpo.tools.calculator import Calculator

    return rows_for(load_format("react", Calculator.tool_schemas()))


def zero(trajectory, **_):
    return [0.0] * len(trajectory)


def canary_trainer(model_dir, tmp_path, rows=None, **config):
    built = build_trainer(
        model_dir, tmp_path, [zero], rows or [{"prompt": "x", "question": "x", "answer": "1"}],
        environment="agentic_grpo.tools.calculator:Calculator", num_generations=2, per_device_train_batch_size=4,
        max_turns=2, max_tokens_per_turn=12, max_completion_length=64, save_trajectories_steps=1, **config,
    )  # fmt: skip
    with torch.no_grad():  # sharper: a random model's near-uniform next-token logits hide what a trained one shows
        built.model.get_output_embeddings().weight.mul_(8)
    torch.manual_seed(0)
    return built


def sample_with_dropout_on(trainer) -> None:
    """Plant: the policy samples in train mode, as after a sub-agent call left it so (`model.train(True)`)."""
    generating = trainer.generation_backend._generating_model

    @contextlib.contextmanager
    def dropout_back_on():
        with generating() as model:
            model.train(True)
            yield model

    trainer.generation_backend._generating_model = dropout_back_on


def test_a_healthy_step_logs_agreement_to_rounding(tiny_model_dir, tmp_path):
    trainer = canary_trainer(tiny_model_dir, tmp_path, peft_config=LORA)
    trainer.generate_and_score(rows_for(trainer.trajectory_format))
    logged = trainer._metrics["train"]
    assert logged["canary/logprob_diff/mean"][-1] < 1e-4 and logged["canary/logprob_diff/max"][-1] < 1e-3
    assert logged["canary/logprob_diff/share_over_0.5"][-1] == 0.0


@pytest.mark.parametrize("planted", [False, True], ids=["honest", "sampled-outside-autocast"])
def test_a_mixed_precision_run_samples_in_the_precision_it_trains_in(tiny_model_dir, tmp_path, monkeypatch, planted):
    # bf16 mixed precision (on CPU here; the default on a GPU): the training forward runs under autocast, and a
    # PEFT model's `generate` reaches the base model's own forward, outside Accelerate's autocast wrapper.
    trainer = canary_trainer(tiny_model_dir, tmp_path, react_rows(), peft_config=LORA, bf16=True, use_cpu=True,
                             stepped_by_hand=False, max_steps=1)  # fmt: skip
    if planted:
        monkeypatch.setattr(trainer.accelerator, "autocast", contextlib.nullcontext)
    trainer.train()  # the training forward is Accelerate's, under autocast, once the model is prepared
    gap = [row["canary/logprob_diff/mean"] for row in trainer.state.log_history if "canary/logprob_diff/mean" in row][
        0
    ]
    # Measured: honest 9e-5 (bf16 rounding where shapes differ), planted 0.003 (bf16 against fp32 arithmetic).
    assert (gap > 5e-4) == planted, gap


def test_dropout_on_while_sampling_stops_the_run_and_is_named(tiny_model_dir, tmp_path):
    trainer = canary_trainer(tiny_model_dir, tmp_path, peft_config=LORA)
    sample_with_dropout_on(trainer)
    with pytest.raises(CanaryError, match=r"(?s)dropout was on while sampling \(\d+ dropout modules") as caught:
        trainer.generate_and_score(rows_for(trainer.trajectory_format))
    assert "trajectories are in" in str(caught.value) and (tmp_path / "trajectories").is_dir()


def test_a_sampling_temperature_other_than_the_trainers_is_named(tiny_model_dir, tmp_path):
    trainer = canary_trainer(tiny_model_dir, tmp_path, temperature=1.0)
    trainer.generation_backend.generation_config.temperature = 0.3  # sampled at 0.3, trained at 1.0
    with pytest.raises(CanaryError, match="sampler sampled at temperature 0.3 and the trainer scores at 1.0"):
        trainer.generate_and_score(rows_for(trainer.trajectory_format))


def test_positions_numbered_differently_on_an_absolute_position_model_are_named(gpt2_dir, tmp_path, monkeypatch):  # noqa: F811
    trainer = canary_trainer(gpt2_dir, tmp_path)
    with torch.no_grad():  # learned positions that matter, as a trained GPT-2's do
        trainer.model.transformer.wpe.weight.mul_(4)
    trainer.generate_and_score(rows_for(trainer.trajectory_format))  # with the trainer's own positions: agrees
    assert trainer._metrics["train"]["canary/logprob_diff/mean"][-1] < 1e-4
    monkeypatch.setattr(trainer_module, "positions_from_mask", lambda model: contextlib.nullcontext())
    with pytest.raises(CanaryError, match="left-padded rows disagree"):
        trainer.generate_and_score(rows_for(trainer.trajectory_format))


def test_the_check_stops_a_real_training_run_and_can_be_turned_off(tiny_model_dir, tmp_path):
    trainer = canary_trainer(
        tiny_model_dir, tmp_path, react_rows(), stepped_by_hand=False, max_steps=1, temperature=1.0
    )
    trainer.generation_backend.generation_config.temperature = 0.5
    with pytest.raises(CanaryError, match="at step 1 "):
        trainer.train()
    assert trainer.state.global_step == 0
    trainer.args.canary_logprob_limit = 0
    trainer.train()
    assert trainer.state.global_step == 1


def test_a_cotrained_subagent_sampled_at_its_own_temperature_is_named(tiny_model_dir, tmp_path):
    """#44 item 5 planted: a trained sub-agent sampled at 0.3 while its role loss scores at the run's 1.0 (the
    start-up refusal of its own `temperature` bypassed)."""
    from tests.subagent_support import helper, make_trainer

    trainer = make_trainer(tiny_model_dir, tmp_path, helper())
    with torch.no_grad():
        trainer.model.get_output_embeddings().weight.mul_(8)
    rows = [{"prompt": [{"role": "user", "content": f"What is {a} * 7?"}], "question": f"What is {a} * 7?"}
            for a in (100, 101)]  # fmt: skip
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    torch.manual_seed(0)
    trainer.generate_and_score(rows * 2)  # honest: the role's children agree with its sampler
    assert trainer._metrics["train"]["canary/helper/logprob_diff/mean"][-1] < 1e-4
    [agent] = trainer.rollout_parts.agents
    agent.source.temperature = 0.3
    with pytest.raises(CanaryError, match=r"(?s)of sub-agent `helper`.*sampler sampled at temperature 0.3"):
        trainer.generate_and_score(rows * 2)


def test_the_default_limit_is_calibrated_by_the_precision_sampler_and_trainer_compute_in():
    from types import SimpleNamespace

    from agentic_grpo.canaries import (
        ACCELERATOR_FULL_PRECISION_LIMIT,
        FULL_PRECISION_LIMIT,
        HALF_PRECISION_LIMIT,
        canary_limit,
    )

    def trainer(dtype, use_vllm=False, engine_dtype=None, limit=None, device="cpu", bf16=False):
        engine = None if engine_dtype is None else SimpleNamespace(model_config=SimpleNamespace(dtype=engine_dtype))
        return SimpleNamespace(args=SimpleNamespace(canary_logprob_limit=limit, bf16=bf16), use_vllm=use_vllm,
                               model=torch.nn.Linear(2, 2, dtype=dtype, device=device),
                               vllm_generation=SimpleNamespace(llm=SimpleNamespace(llm_engine=engine)))  # fmt: skip

    assert canary_limit(trainer(torch.float32)) == FULL_PRECISION_LIMIT
    assert canary_limit(trainer(torch.bfloat16)) == HALF_PRECISION_LIMIT
    assert canary_limit(trainer(torch.float32, bf16=True)) == HALF_PRECISION_LIMIT  # fp32 weights, bf16 arithmetic
    # Weights off the CPU: "meta" stands in for a GPU, which this machine has not (only the device type is read).
    assert canary_limit(trainer(torch.float32, device="meta")) == ACCELERATOR_FULL_PRECISION_LIMIT
    assert canary_limit(trainer(torch.bfloat16, device="meta")) == HALF_PRECISION_LIMIT
    assert canary_limit(trainer(torch.float32, True, torch.float32)) == FULL_PRECISION_LIMIT
    assert canary_limit(trainer(torch.float32, True, torch.bfloat16)) == HALF_PRECISION_LIMIT
    assert canary_limit(trainer(torch.float32, True)) == HALF_PRECISION_LIMIT  # a server: its dtype is unknown
    assert (
        canary_limit(trainer(torch.bfloat16, limit=0.5)) == 0.5 and canary_limit(trainer(torch.float32, limit=0)) == 0
    )


def test_dropout_left_on_at_a_realistic_rate_is_caught_by_the_default_limit(tiny_model_dir, tmp_path):
    """LoRA dropout 0.05 left on while sampling: in fp32 the default limit stops it, which the old fixed 0.1 let
    through."""
    trainer = canary_trainer(tiny_model_dir, tmp_path, peft_config=LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.05, init_lora_weights=False))  # fmt: skip
    sample_with_dropout_on(trainer)
    with pytest.raises(CanaryError, match=r"\(limit 0.0001\)") as caught:
        trainer.generate_and_score(rows_for(trainer.trajectory_format))
    gap = float(str(caught.value).split("differently: ")[1].split(" nats")[0])
    assert 0.0001 < gap < 0.1, gap  # the old fixed limit would have let it through
