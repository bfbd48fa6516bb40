"""Co-training on the tiny model: the policy and a sub-agent (`train: true`), each on its own LoRA adapter of one
base model, learn in the same real GRPO steps; each role's loss moves its own adapter only; a resume continues
every role exactly.

The policy's format (`tests.subagent_support:CallingFormat`) makes every turn a call to the sub-agent, so a
random model delegates; the reward (`distinct_characters`) differs between the policy's samples, and every
child shares its root's, so both roles get non-zero advantages.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from trl import GRPOTrainer

from agentic_grpo.experimental.cotrain import ChildSample, adapter_of, assign_advantages
from agentic_grpo.plugins import PluginError
from tests.subagent_support import helper, make_trainer


def owners(model) -> dict[str, str]:
    """Parameter name -> `default`, `helper` (its LoRA adapter) or `base`."""
    return {n: adapter_of(n) or "base" for n, _ in model.named_parameters()}


@pytest.mark.integration  # trains for several steps
def test_two_steps_train_every_roles_adapter_and_leave_the_base_alone(tiny_model_dir, tmp_path):
    trainer = make_trainer(tiny_model_dir, tmp_path, helper(learning_rate=5e-3))
    model = trainer.model
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer.train()

    after = dict(model.named_parameters())
    changed = {owner for n, owner in owners(model).items() if not torch.equal(before[n], after[n])}
    assert changed == {"default", "helper"}  # both adapters moved; no base weight did
    assert model.active_adapter == "default"
    assert all(p.requires_grad for n, p in after.items() if adapter_of(n) in ("default", "helper"))

    groups = {g["role"]: g["initial_lr"] for g in trainer.optimizer.param_groups}  # one group per role, its own rate
    assert groups == {"policy": 1e-2, "helper": 5e-3}

    steps = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert len(steps) == 2
    for entry in steps:
        for role in ("policy", "helper"):
            assert {f"roles/{role}/{k}" for k in ("reward", "samples", "loss", "kl")} <= set(entry), entry
        assert entry["roles/helper/samples"] > 0 and entry["roles/policy/samples"] == 4
    records = [json.loads(line) for line in (tmp_path / "trajectories" / "step_000001.jsonl").read_text().splitlines()]
    assert any(c["delegation"]["adapter"] == "helper" for r in records for c in r.get("children", []))


def test_each_roles_loss_only_reaches_its_own_adapter(tiny_model_dir, tmp_path):
    trainer = make_trainer(tiny_model_dir, tmp_path, helper())
    model = trainer.model
    with torch.no_grad():  # the new adapters start as the base (B = 0): make both act, so gradients reach A too
        for name, p in model.named_parameters():
            if ".lora_B." in name:
                p.normal_(0, 0.1)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    rows = [dict(row) for row in trainer.train_dataset][:4]
    inputs = trainer.generate_and_score(rows)
    samples = [s for row in inputs["role_samples"] for s in row]
    assert samples and any(s.advantage != 0 for s in samples)

    def reached(loss: torch.Tensor) -> set[str]:
        model.zero_grad(set_to_none=True)
        loss.backward()
        return {owners(model)[n] for n, p in model.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}

    policy_kl = trainer.logged_values("kl")
    assert reached(trainer.cotraining.losses(model, inputs["role_samples"])["helper"]) == {"helper"}
    # The role's loss is TRL's own: what it logs goes under the role's name, never into the policy's figures.
    assert trainer.logged_values("kl") == policy_kl
    assert trainer.logged_values("roles/helper/kl") and trainer.logged_values("roles/helper/entropy")
    assert trainer.logged_values("roles/helper/clip_ratio/region_mean") == [0.0]  # the first pass: old = current
    assert reached(GRPOTrainer.compute_loss(trainer, model, inputs)) == {"default"}
    assert len(trainer.logged_values("kl")) == len(policy_kl) + 1


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dapo"])
def test_back_propagating_one_child_at_a_time_gives_the_summed_losss_gradients(tiny_model_dir, tmp_path, loss_type):
    trainer = make_trainer(tiny_model_dir, tmp_path, helper(), loss_type=loss_type)
    model = trainer.model
    with torch.no_grad():  # B = 0 at the start would give A no gradient: make the helper's adapter act
        for name, p in model.named_parameters():
            if ".lora_B.helper" in name:
                p.normal_(0, 0.1)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 2  # the scaling for accumulation must be kept as well
    inputs = trainer.generate_and_score([dict(row) for row in trainer.train_dataset][:4])
    assert sum(len(row) for row in inputs["role_samples"]) > 1  # several children: the split is exercised

    def helper_grads() -> dict[str, torch.Tensor]:
        grads = {
            n: p.grad.clone() for n, p in model.named_parameters() if adapter_of(n) == "helper" and p.grad is not None
        }
        model.zero_grad(set_to_none=True)
        return grads

    summed = trainer.cotraining.losses(model, inputs["role_samples"])["helper"]
    summed.backward()
    expected = helper_grads()
    calls = []
    split = trainer.cotraining.losses(
        model, inputs["role_samples"], backward=lambda loss: calls.append(loss) or loss.backward()
    )
    got = helper_grads()
    assert len(calls) == sum(len(row) for row in inputs["role_samples"])  # one backward per child
    assert not split["helper"].requires_grad and split["helper"].item() == pytest.approx(summed.item(), rel=1e-5)
    assert expected and expected.keys() == got.keys()
    assert any(g.abs().sum() > 0 for g in expected.values())
    for name, grad in expected.items():
        assert torch.allclose(got[name], grad, rtol=1e-4, atol=1e-7), name


def test_advantages_are_grouped_by_query_per_role():
    rows = [[ChildSample("a", [1], [2], [1], reward=r)] for r in (1.0, 0.0, 5.0, 5.0)]  # G=2: queries {0,1}, {2,3}
    rows[1].append(ChildSample("a", [1], [2], [1], reward=0.0))  # a parent that called twice: two samples
    rows[3].append(ChildSample("b", [1], [2], [1], reward=5.0))  # another role: a group of one
    summary = assign_advantages(rows, group_size=2, first_row=0, scale_rewards="group")
    first = [s.advantage for row in rows[:2] for s in row]
    assert first[0] > 0 > first[1] == first[2] and sum(first) == pytest.approx(0, abs=1e-6)
    assert rows[2][0].advantage == rows[3][0].advantage == 0.0 and rows[3][1].advantage == 0.0
    assert summary["a"]["samples"] == 5 and summary["b"] == {"reward": 5.0, "samples": 1.0}


def test_a_roles_group_of_equal_rewards_gets_exactly_zero_advantages():
    """Three children paid 0.1 each: in floats their mean misses 0.1 by a rounding residue, which the std
    division would turn into advantages of one sign; they get exactly 0."""
    rows = [[ChildSample("a", [1], [2], [1], reward=0.1, role_scores=())] for _ in range(3)]
    assert sum([0.1] * 3) / 3 != 0.1  # the residue
    assign_advantages(rows, group_size=3, first_row=0, scale_rewards="group")
    assert [row[0].advantage for row in rows] == [0.0] * 3


def test_a_roles_reward_that_gives_none_counts_as_its_groups_mean_not_zero():
    """Two role rewards (already weighted); G=2. The first reward gave None for three of the four children."""
    nan = math.nan
    scores = [(0.5, 2.0), (nan, 4.0), (nan, 1.0), (nan, 3.0)]
    rows = [
        [ChildSample("a", [1], [2], [1], reward=root, role_scores=own)]
        for root, own in zip((1, 1, 0, 0), scores, strict=True)
    ]
    assign_advantages(rows, group_size=2, first_row=0, scale_rewards="none")
    # Group {0, 1}: the None is filled with the group's 0.5. Group {2, 3}: None throughout, 0 for both.
    assert [row[0].reward for row in rows] == [3.5, 5.5, 1.0, 3.0]
    assert [row[0].advantage for row in rows] == [-1.0, 1.0, -1.0, 1.0]  # counted as 0, the first gap would be 1.5


def test_a_roles_own_rewards_add_to_the_shared_one(tiny_model_dir, tmp_path):
    own = [{"type": "tests.varied_rewards:distinct_characters", "weight": 2.0}]
    trainer = make_trainer(tiny_model_dir, tmp_path, helper(rewards=own))
    trainer.model.train()
    scored = []  # the rows as the trainer scored them, each with its trajectory
    samples_for = trainer.cotraining.samples_for
    trainer.cotraining.samples_for = lambda inputs, mode: scored.extend(inputs) or samples_for(inputs, mode)
    output = trainer.generate_and_score([dict(row) for row in trainer.train_dataset][:4])
    checked = 0
    for row, samples in zip(scored, output["role_samples"], strict=True):
        root = row["trajectory"]
        assert len(samples) == len(root.children)  # one level of sub-agents, none cut by a budget here
        for sample, child in zip(samples, root.children, strict=True):
            assert sample.reward == pytest.approx(root.reward + 2 * len(set(child.completion_text)) / 50)
            checked += 1
    assert checked > 0


@pytest.mark.parametrize(
    ("entry", "message"),
    [({"adapter": None}, "`train: true` trains a LoRA adapter"), ({"adapter": "__base__"}, "not `__base__`"),
     ({"train": False, "learning_rate": 1e-3}, "`learning_rate` is for a trained sub-agent"),
     ({"train": False, "rewards": [{"type": "tests.varied_rewards:distinct_characters"}]}, "`rewards` is for a"),
     ({"rewards": [{"type": "agentic_grpo.rewards.rules:Correctness"}]}, "needs.*answer"),
     ({"temperature": 0.3}, "sampled and trained at the run's `temperature`"),
     ({"temperature": 0.0}, "sampled and trained at the run's `temperature`")],
)  # fmt: skip
def test_a_trained_subagent_needs_an_adapter_of_its_own(tiny_model_dir, tmp_path, entry, message):
    with pytest.raises(PluginError, match=message):
        make_trainer(tiny_model_dir, tmp_path, helper(**entry))


def test_co_training_is_an_experiment_turned_on_by_name_and_only_where_a_subagent_trains(tiny_model_dir, tmp_path):
    with pytest.raises(ValueError, match=r"\['helper'\] set `train: true`: co-training is an experiment.*"
                                         r"experimental: \{cotrain_subagents: true\}"):  # fmt: skip
        make_trainer(tiny_model_dir, tmp_path / "off", helper(), experimental={})
    with pytest.raises(ValueError, match="`cotrain_subagents` co-trains the sub-agents with `train: true`, and the"):
        make_trainer(tiny_model_dir, tmp_path / "none", helper(train=False), experimental={"cotrain_subagents": True})
    trainer = make_trainer(tiny_model_dir, tmp_path / "on", helper())
    assert [role.name for role in trainer.cotraining.roles] == ["helper"]


@pytest.mark.integration  # trains for several steps
def test_resume_continues_every_role_exactly(tiny_model_dir, tmp_path):
    reference = make_trainer(tiny_model_dir, tmp_path / "ref", helper(), max_steps=3, save_strategy="steps",
                             save_steps=1)  # fmt: skip
    reference.train()
    checkpoint = tmp_path / "ref" / "checkpoint-1"
    assert (checkpoint / "adapter_model.safetensors").exists()
    assert (checkpoint / "helper" / "adapter_model.safetensors").exists()  # PEFT: each further adapter in a folder

    resumed = make_trainer(tiny_model_dir, tmp_path / "resumed", helper(), max_steps=3, save_strategy="no")
    resumed.train(resume_from_checkpoint=str(checkpoint))

    def tokens(out: Path, step: int) -> list:
        records = [json.loads(x) for x in (out / "trajectories" / f"step_{step:06d}.jsonl").read_text().splitlines()]
        return [[r["segments"], [c["segments"] for c in r.get("children", [])]] for r in records]

    def logged(trainer) -> dict[int, dict]:
        return {e["step"]: e for e in trainer.state.log_history if "loss" in e}

    expected, got = logged(reference), logged(resumed)
    for step in (2, 3):
        assert tokens(tmp_path / "resumed", step) == tokens(tmp_path / "ref", step), f"step {step} sampled otherwise"
        for name in ("loss", "grad_norm", "roles/policy/loss", "roles/helper/loss", "roles/helper/kl",
                     "roles/helper/reward"):  # fmt: skip
            assert got[step][name] == pytest.approx(expected[step][name], rel=1e-5, abs=1e-8), (step, name)
    assert expected[2]["roles/helper/kl"] > 0 and expected[2]["grad_norm"] > 0  # not 0 == 0
    final = {n: p for n, p in resumed.model.named_parameters() if adapter_of(n)}
    for name, p in reference.model.named_parameters():
        if adapter_of(name):
            assert torch.allclose(p, final[name], atol=1e-6), name


@pytest.mark.integration  # trains for several steps
def test_with_accumulation_and_two_iterations_the_old_log_probs_are_stored_at_generation(tiny_model_dir, tmp_path):
    trainer = make_trainer(tiny_model_dir, tmp_path, helper(), per_device_train_batch_size=2,
                           gradient_accumulation_steps=2, num_iterations=2, max_steps=2)  # fmt: skip
    stored = []
    samples_for = trainer.cotraining.samples_for
    trainer.cotraining.samples_for = lambda inputs, mode: stored.append(samples_for(inputs, mode)) or stored[-1]
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if adapter_of(n)}
    trainer.train()
    samples = [s for rows in stored for row in rows for s in row]
    assert samples and all(len(s.old_logps) == len(s.ref_logps) == len(s.completion_ids) for s in samples)
    changed = {
        adapter_of(n) for n, p in trainer.model.named_parameters() if n in before and not torch.equal(before[n], p)
    }
    assert changed == {"default", "helper"}
