"""Asynchronous rollouts (`agentic_grpo.async_rollouts`): the sampler thread a step ahead, on real tiny trainers.

What each test plants or checks:
- the sampler samples step `s+1` with the weights before step `s`'s update (staleness 1), within the bound at
  `max_staleness` 2, on the rows the data loader gives each step (the same as a synchronous run's);
- the importance weight is exactly 1 where the weights did not change, under top-p and top-k (a trainer read of
  the raw distribution, TRL's mistake, is seen to break it);
- a sampler that keeps old weights, a version label that lies, a sync that hangs and a sampler that fails each
  stop the run, naming it;
- the sampler's copy of the policy computes with its own weights (TRL's fused head binds the forward to the
  original module; a copy that keeps it samples with the trainer's weights).
Exact resume after `kill -9` is in `tests/test_operations.py`.
"""

from __future__ import annotations

import contextlib
import json
import threading

import pytest
import torch
from peft import LoraConfig

import agentic_grpo.async_rollouts as async_rollouts
from agentic_grpo.async_rollouts import check_async_config, importance_weights
from agentic_grpo.async_sampler import AsyncSampler, AsyncTimeout, sampler_copy
from agentic_grpo.config import AgenticGRPOConfig
from agentic_grpo.rollout import RolloutManager
from agentic_grpo.shrinking_batch import positions_from_mask
from tests.helpers import build_trainer
from tests.scripted import case_prompt
from tests.varied_rewards import distinct_characters

LORA = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])


def rows(names: str = "abcdefgh") -> list[dict]:
    return [{"prompt": case_prompt(name), "question": name, "answer": "1"} for name in names]


def trainer_for(model_dir, out, data: list[dict] | None = None, **overrides):
    """One question x 2 a step, LoRA, a learning rate that moves the weights visibly in one step."""
    settings = dict(max_steps=3, num_generations=2, per_device_train_batch_size=2, max_turns=2, max_tokens_per_turn=8,
                    max_completion_length=32, learning_rate=1e-2, save_trajectories_steps=1, logging_steps=1,
                    async_rollouts=True)  # fmt: skip
    return build_trainer(
        model_dir, out, [distinct_characters], data or rows(), peft_config=LORA, stepped_by_hand=False,
        environment="agentic_grpo.tools.calculator:Calculator", **{**settings, **overrides},
    )  # fmt: skip


def logged(trainer, name: str) -> list[float]:
    return [row[name] for row in trainer.state.log_history if name in row]


def step_records(out, step: int) -> list[dict]:
    return [json.loads(line) for line in (out / "trajectories" / f"step_{step:06d}.jsonl").read_text().splitlines()]


def test_the_sampler_samples_the_next_step_with_the_weights_before_the_update(tiny_model_dir, tmp_path):
    trainer = trainer_for(tiny_model_dir, tmp_path)
    trainer.train()
    assert logged(trainer, "async/staleness/max") == [0, 1, 1]
    for step, version in ((1, 0), (2, 0), (3, 1)):  # step 2 was sampled while step 1 trained
        versions = {
            s["policy_version"] for r in step_records(tmp_path, step) for s in r["segments"] if s["role"] == "model"
        }
        assert versions == {version}, (step, versions)
    weights = logged(trainer, "async/importance_weight/mean")
    assert weights[0] == pytest.approx(1.0, abs=1e-5)  # sampled and trained with the same weights
    assert abs(weights[1] - 1.0) > 1e-5  # one update between them: the weight corrects for it
    assert max(logged(trainer, "canary/logprob_diff/mean")) < 1e-4  # the sampler's tokens, read by its weights


def test_trajectories_stay_within_the_bound_and_train_the_rows_a_synchronous_run_draws(tiny_model_dir, tmp_path):
    trainer = trainer_for(tiny_model_dir, tmp_path / "async", max_steps=4, async_rollouts={"max_staleness": 2})
    trainer.train()
    assert logged(trainer, "async/staleness/max") == [0, 1, 2, 2]  # two steps ahead at most, never more
    trainer_for(tiny_model_dir, tmp_path / "sync", max_steps=4, async_rollouts=None).train()
    for step in range(1, 5):  # every step's rows are the data loader's: none skipped, none twice
        questions = [r["row"]["question"] for r in step_records(tmp_path / "async", step)]
        assert questions == [r["row"]["question"] for r in step_records(tmp_path / "sync", step)], step


def test_staleness_zero_samples_each_step_with_its_own_weights(tiny_model_dir, tmp_path):
    """The lockstep control: each step's trajectories come from the weights that train on them, so every token
    weighs 1, while the sampler's own per-step noise is the same as at staleness 1 (step 1 samples alike)."""
    trainer = trainer_for(tiny_model_dir, tmp_path / "zero", async_rollouts={"max_staleness": 0})
    trainer.train()
    assert logged(trainer, "async/staleness/max") == [0, 0, 0]
    for step in (1, 2, 3):
        versions = {
            s["policy_version"]
            for r in step_records(tmp_path / "zero", step)
            for s in r["segments"]
            if s["role"] == "model"
        }
        assert versions == {step - 1}, (step, versions)
    assert logged(trainer, "async/importance_weight/mean") == pytest.approx([1.0, 1.0, 1.0], abs=1e-5)
    trainer_for(tiny_model_dir, tmp_path / "one").train()
    tokens = [
        [[s["token_ids"] for s in r["segments"]] for r in step_records(tmp_path / name, 1)] for name in ("zero", "one")
    ]
    assert tokens[0] == tokens[1]


def test_an_epochs_first_step_is_sampled_when_it_begins(tiny_model_dir, tmp_path):
    """The next epoch's rows exist only once the Trainer starts it: 3 rows, one a step, so steps 1 and 4 begin an
    epoch; every row of each epoch is trained once, in the epochs' own orders."""
    trainer = trainer_for(tiny_model_dir, tmp_path / "async", data=rows("abc"), max_steps=5)
    trainer.train()
    assert logged(trainer, "async/staleness/max") == [0, 1, 1, 0, 1]
    trainer_for(tiny_model_dir, tmp_path / "sync", data=rows("abc"), max_steps=5, async_rollouts=None).train()
    questions = [step_records(tmp_path / "async", step)[0]["row"]["question"] for step in range(1, 6)]
    assert sorted(questions[:3]) == ["a", "b", "c"] and len(set(questions[3:])) == 2
    assert questions == [step_records(tmp_path / "sync", step)[0]["row"]["question"] for step in range(1, 6)]


def raw_read(model, ids, mask, width, filters):
    """TRL's read: log-softmax of the raw logits over the temperature, whatever the sampler's filters."""
    with positions_from_mask(model):
        logits = model(input_ids=ids, attention_mask=mask).logits[:, -width - 1 : -1].float()
    return torch.log_softmax(logits / filters.temperature, -1).gather(-1, ids[:, -width:, None]).squeeze(-1)


@pytest.mark.parametrize("planted", [False, True], ids=["processed", "planted-raw-read"])
def test_unchanged_weights_weigh_every_token_one_under_top_p_and_top_k(tiny_model_dir, tmp_path, monkeypatch, planted):
    if planted:
        monkeypatch.setattr(async_rollouts, "processed_read", raw_read)
    trainer = trainer_for(tiny_model_dir, tmp_path, learning_rate=0.0, top_p=0.8, top_k=20, temperature=0.7)
    trainer.train()
    means, maxima = logged(trainer, "async/importance_weight/mean"), logged(trainer, "async/importance_weight/max")
    assert logged(trainer, "async/staleness/max") == [0, 1, 1]
    honest = all(abs(m - 1) < 1e-5 for m in means + maxima)
    assert honest != planted, (means, maxima)  # the raw read puts each weight near the kept probability mass


@pytest.mark.parametrize("planted", [False, True], ids=["honest", "sampler-outside-autocast"])
def test_a_mixed_precision_sampler_samples_in_the_precision_the_trainer_reads(tiny_model_dir, tmp_path, monkeypatch,
                                                                               planted):  # fmt: skip
    if planted:  # the sampler's thread without the trainer's autocast (per thread: not inherited)
        init = AsyncSampler.__init__

        def without_autocast(self, *args, **kwargs):
            init(self, *args, **kwargs)
            self.autocast = contextlib.nullcontext

        monkeypatch.setattr(AsyncSampler, "__init__", without_autocast)
    trainer = trainer_for(tiny_model_dir, tmp_path, learning_rate=0.0, bf16=True, use_cpu=True)
    with torch.no_grad():  # sharper logits: bf16 arithmetic against fp32 shows in every token
        trainer.model.get_output_embeddings().weight.mul_(8)
    trainer.train()
    maxima = logged(trainer, "async/importance_weight/max")
    # Measured: honest at most 1.0001 (bf16 rounding where shapes differ), planted at least 1.0068.
    assert all(abs(m - 1) < 1e-3 for m in maxima) != planted, maxima


def test_a_sampler_that_keeps_old_weights_stops_the_run(tiny_model_dir, tmp_path, monkeypatch):
    load = AsyncSampler.load

    def load_once(self, weights):
        if not getattr(self, "loaded", False):
            load(self, weights)
            self.loaded = True

    monkeypatch.setattr(AsyncSampler, "load", load_once)
    with pytest.raises(RuntimeError, match="version 1, but the sampler held other weights"):
        trainer_for(tiny_model_dir, tmp_path).train()


def test_a_version_label_that_lies_stops_the_run(tiny_model_dir, tmp_path, monkeypatch):
    make = AsyncSampler._make

    def older_label(self, job):
        batch = make(self, job)
        batch.version = max(batch.version - 1, 0)  # claims the weights before the ones it held
        return batch

    monkeypatch.setattr(AsyncSampler, "_make", older_label)
    # step 3's, sampled with version 1, claims 0: two steps old, past the bound (a claim within it fails the digest)
    with pytest.raises(
        RuntimeError, match="step 3's trajectories were sampled with the weights of version 0, 2 steps"
    ):
        trainer_for(tiny_model_dir, tmp_path).train()


def test_a_sync_that_hangs_stops_the_run_naming_it(tiny_model_dir, tmp_path, monkeypatch):
    released, rolled_out = threading.Event(), []
    monkeypatch.setattr(AsyncSampler, "load", lambda self, weights: released.wait())
    monkeypatch.setattr(RolloutManager, "rollout", lambda *args, **kwargs: rolled_out.append(1))
    trainer = trainer_for(tiny_model_dir, tmp_path, async_rollouts={"timeout": 2})
    try:
        with pytest.raises(AsyncTimeout, match="the sampler is loading the weights of version 0 for step 1"):
            trainer.train()
    finally:
        samplers = [thread for thread in threading.enumerate() if thread.name == "agentic-grpo-sampler"]
        released.set()
    # The hung load returns after the run stopped: the sampler stops there, rolling nothing out in a dead run
    # (a rollout there raced the next trainer's accelerator state).
    for thread in samplers:
        thread.join(timeout=30)
    assert samplers and not any(thread.is_alive() for thread in samplers) and not rolled_out


def test_a_sampler_that_fails_hands_its_error_to_the_trainer(tiny_model_dir, tmp_path, monkeypatch):
    def broken(self, weights):
        raise ValueError("the sampler broke")

    monkeypatch.setattr(AsyncSampler, "load", broken)
    with pytest.raises(RuntimeError, match="the sampler failed") as caught:
        trainer_for(tiny_model_dir, tmp_path).train()
    assert isinstance(caught.value.__cause__, ValueError)


def test_the_samplers_copy_computes_with_its_own_weights(tiny_model_dir, tmp_path):
    trainer = trainer_for(tiny_model_dir, tmp_path)  # TRL's fused head is installed on the policy
    policy = trainer.accelerator.unwrap_model(trainer.model)
    sampler = sampler_copy(policy)
    ids = torch.tensor([[1, 5, 9, 13, 17]], device=policy.device)
    with torch.no_grad():
        before = sampler(input_ids=ids).logits
        for parameter in policy.parameters():
            if parameter.requires_grad:
                parameter.add_(0.5)
        after = sampler(input_ids=ids).logits
        moved = policy(input_ids=ids).logits
    assert torch.equal(before, after)
    assert not torch.equal(before, moved)  # the change reaches the policy itself
    shared = {p.data_ptr() for p in policy.parameters() if not p.requires_grad}
    assert shared and shared <= {p.data_ptr() for p in sampler.parameters()}  # the frozen base is not copied


def test_importance_weights_truncate_and_report_the_raw_ratio():
    proximal = torch.log(torch.tensor([[0.5, 0.9, 0.2, 0.3]]))
    behaviour = torch.log(torch.tensor([[0.5, 0.3, 0.4, 0.3]]))
    mask = torch.tensor([[1, 1, 1, 0]])
    weights, metrics = importance_weights(proximal, behaviour, mask, cap=2.0)
    assert weights.tolist()[0] == pytest.approx([1.0, 2.0, 0.5, 1.0])  # 3.0 truncated; the masked token weighs 1
    assert metrics["async/importance_weight/max"] == pytest.approx(3.0)
    assert metrics["async/importance_weight/mean"] == pytest.approx((1 + 3 + 0.5) / 3)
    assert metrics["async/importance_weight/clipped_share"] == pytest.approx(1 / 3)


@pytest.mark.parametrize(
    "change, named",
    [
        ({"use_vllm": True}, "use_vllm: false"),
        ({"loss_type": "sapo"}, "loss_type"),
        ({"num_iterations": 2}, "num_iterations: 1"),
        ({"gradient_accumulation_steps": 4, "steps_per_generation": 2}, "steps_per_generation"),
        ({"experimental": {"spread_first_action": True}}, "action-slot options"),
    ],
)
def test_what_async_rollouts_cannot_run_with_is_refused_before_a_model_loads(tmp_path, change, named):
    args = AgenticGRPOConfig(output_dir=str(tmp_path), async_rollouts=True, report_to=[], **change)
    with pytest.raises(ValueError, match=f"async_rollouts: .*{named}"):
        check_async_config(args)


def test_per_turn_credit_runs_with_async_rollouts(tmp_path):
    """Per-turn credit only reweighs advantages, which the importance weight multiplies as it does TRL's."""
    credit = {"advantage": "turn", "turn_lambda": 0.5, "turn_gamma": 0.9}
    check_async_config(AgenticGRPOConfig(output_dir=str(tmp_path), async_rollouts=True, report_to=[],
                                         experimental=credit))  # fmt: skip


@pytest.mark.parametrize(
    "value, named",
    [
        ({"max_staleness": -1}, "max_staleness must be a whole number >= 0"),
        ({"importance_weight_cap": 0.5}, "importance_weight_cap must be >= 1"),
        ({"max_stalenes": 2}, "did you mean `max_staleness`"),
        ("[1, 2]", "`true`, `false` or a mapping"),
    ],
)
def test_bad_async_settings_are_refused_in_one_line(tmp_path, value, named):
    with pytest.raises(ValueError, match=named):
        AgenticGRPOConfig(output_dir=str(tmp_path), async_rollouts=value, report_to=[])


def test_async_settings_from_the_command_line(tmp_path):
    on = AgenticGRPOConfig(output_dir=str(tmp_path), async_rollouts="true", report_to=[]).async_rollouts
    assert (on.max_staleness, on.importance_weight_cap) == (1, 3.0)
    assert AgenticGRPOConfig(output_dir=str(tmp_path), async_rollouts="false", report_to=[]).async_rollouts is None
    two = AgenticGRPOConfig(output_dir=str(tmp_path), async_rollouts="{max_staleness: 2}", report_to=[])
    assert two.async_rollouts.max_staleness == 2
