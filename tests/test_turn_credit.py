"""Per-turn rewards through the real turn loop and trainer: paid once per fact, recorded per turn,
turned into per-token advantages that reach TRL's loss; one group split over two processes."""

from __future__ import annotations

import json

import pytest
import torch

from agentic_grpo.rollout import RolloutLimits
from agentic_grpo.rollout_parts import load_environment
from agentic_grpo.trajectory import Trajectory
from tests.credit_support import CASES, SCRIPTS, TURN_TERMS, build_trainer, rows
from tests.helpers import launch_two_processes
from tests.scripted import ScriptedBackend


def test_a_fact_is_paid_once_per_trajectory():
    environment = load_environment("agentic_grpo.tools.stepwise:StepwiseCalculator")()
    assert environment.pay("x", 1.0) and not environment.pay("x", 1.0)
    assert environment.take_payments() == [("x", 1.0)] and environment.take_payments() == []
    trajectory = Trajectory(prompt="q", segments=[], turns=2)
    assert trajectory.pay(1, "y", 0.5) and not trajectory.pay(0, "y", 0.5)
    assert trajectory.turn_rewards == [0.0, 0.5] and trajectory.paid_facts == {"y": 1}
    with pytest.raises(ValueError, match="turn 2 does not exist"):
        trajectory.pay(2, "z", 1.0)


def test_pay_and_state_hash_are_not_tools():
    assert set(load_environment("agentic_grpo.tools.stepwise:StepwiseCalculator").tools()) == {"calculator"}


def test_turn_loop_records_each_turns_reward_and_state(tokenizer):
    from agentic_grpo.formats import load_format
    from agentic_grpo.rollout import RolloutManager
    from agentic_grpo.tools.stepwise import StepwiseCalculator

    fmt = load_format("react", StepwiseCalculator.tool_schemas())
    manager = RolloutManager(StepwiseCalculator, fmt, tokenizer, RolloutLimits(max_turns=3, max_completion_tokens=300))
    batch = rows(cases=["both", "repeat", "direct"])
    done, _ = manager.rollout([r["prompt"] for r in batch], batch, ScriptedBackend(tokenizer, SCRIPTS))
    manager.close()
    both, repeat, direct = done
    assert both.turn_rewards == [0.5, 0.5, 0.0] and both.turn_states == ["", "1680", "1147|1680"]
    assert repeat.turn_rewards == [0.5, 0.0, 0.0] and repeat.turn_states == ["", "1680", "1680"]
    assert direct.turn_rewards == [0.0] and direct.turn_states == [""]
    assert both.paid_facts == {"('value', '1680')": 0, "('value', '1147')": 1}
    record = both.to_dict()
    assert record["turn_rewards"] == [0.5, 0.5, 0.0] and record["turn_states"] == ["", "1680", "1147|1680"]
    assert "turn_rewards" not in direct.to_dict()  # nothing paid: the record stays as before


@pytest.fixture
def turn_trainer(tiny_model_dir, tmp_path):
    return build_trainer(tiny_model_dir, str(tmp_path), "turn")


def test_every_token_gets_its_turns_formula_value_and_the_loss_trains_on_it(turn_trainer):
    trainer = turn_trainer
    batch = rows()  # every answer is wrong: outcome-only GRPO has nothing to learn from this group
    inputs = trainer.generate_and_score(batch)
    advantages = inputs["advantages"]
    assert advantages.shape == inputs["completion_ids"].shape
    for row, case in enumerate(CASES):
        mask = inputs["tool_mask"][row] * inputs["completion_mask"][row]
        expected = expected_tokens(trainer, row, case, inputs)
        assert torch.equal(advantages[row].cpu(), expected), case
        assert (advantages[row][mask == 0] == 0).all()
    metrics = trainer._metrics["train"]
    assert metrics["credit/frac_reward_zero_std/outcome"] == [1.0]
    assert metrics["credit/frac_reward_zero_std/turn"] == [0.0]
    assert metrics["credit/turn_reward/turn_1"] == [pytest.approx(1.5 / 4)]

    # TRL's loss: at the first step (policy = reference, ratio 1) a token's gradient is zero exactly when its
    # advantage is zero. Watch the final hidden states (TRL's fused LM head keeps no logits).
    captured = {}

    def keep_hidden(module, args, output):
        output.retain_grad()
        captured["hidden"] = output

    handle = trainer.model.model.norm.register_forward_hook(keep_hidden)
    try:
        trainer.compute_loss(trainer.model, inputs).backward()
    finally:
        handle.remove()
    width = inputs["completion_ids"].shape[1]
    grad = captured["hidden"].grad[:, -width - 1 : -1, :].abs().sum(-1)
    trained = (inputs["tool_mask"] * inputs["completion_mask"]).bool()
    assert (grad[trained & (advantages != 0)] > 0).all()
    assert (grad[~trained | (advantages == 0)] == 0).all()
    assert (trained & (advantages == 0)).any()  # turns whose return equals their baseline: no credit


def expected_tokens(trainer, row: int, case: str, inputs) -> torch.Tensor:
    """The turn terms written out by hand (outcome advantage 0), laid on the trajectory's segments."""
    width = inputs["completion_ids"].shape[1]
    out = torch.zeros(width)
    mask = inputs["tool_mask"][row].tolist()
    n = int(inputs["completion_mask"][row].sum())
    turn, position = -1, 0
    while position < n:  # each run of model tokens is one turn
        if mask[position] and (position == 0 or not mask[position - 1]):
            turn += 1
        if mask[position]:
            out[position] = TURN_TERMS[case][turn]
        position += 1
    assert turn + 1 == len(TURN_TERMS[case])
    return out


def test_trajectory_files_hold_turn_rewards_and_turn_advantages(turn_trainer, tmp_path):
    turn_trainer.generate_and_score(rows())
    records = [json.loads(line) for line in (tmp_path / "trajectories" / "step_000001.jsonl").read_text().splitlines()]
    both = records[0]
    assert both["turn_rewards"] == [0.5, 0.5, 0.0] and both["advantage"] == 0.0
    # The row's intermediate values are kept beside what each turn was paid; its chat prompt is not repeated.
    assert both["row"]["values"] == ["1680", "1147"] and "prompt" not in both["row"]
    assert both["turn_advantages"] == pytest.approx(TURN_TERMS["both"])


def test_outcome_default_keeps_trls_per_sequence_advantages(tiny_model_dir, tmp_path):
    trainer = build_trainer(tiny_model_dir, str(tmp_path), "outcome")
    inputs = trainer.generate_and_score(rows(answer="1000"))  # three right, `direct` wrong
    rewards = torch.tensor([1.0, 1.0, 1.0, 0.0])
    assert inputs["advantages"].dim() == 1
    assert torch.equal(inputs["advantages"].cpu(), (rewards - rewards.mean()) / (rewards.std() + 1e-4))
    assert trainer._metrics["train"]["credit/frac_reward_zero_std/turn"] == [0.0]


def test_anchor_needs_an_environment_with_a_state(tiny_model_dir, tmp_path):
    with pytest.raises(ValueError, match="defines no `state_hash\\(\\)`"):
        build_trainer(tiny_model_dir, str(tmp_path), "anchor", environment="agentic_grpo.tools.calculator:Calculator")


@pytest.mark.integration
def test_a_group_split_over_two_processes_is_estimated_whole(tiny_model_dir, tmp_path):
    result = launch_two_processes("credit_two_processes.py", tiny_model_dir, str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["cases"] for r in ranks] == [CASES[:2], CASES[2:]]  # each process holds half of the one group
    # Outcome rewards [1, 1, 1, 0] (only `direct` is wrong): TRL's group advantage (r - 0.75) / (std 0.5 + 1e-4).
    outcome = {case: (reward - 0.75) / (0.5 + 1e-4) for case, reward in zip(CASES, [1, 1, 1, 0], strict=True)}
    for rank in ranks:
        for case, values in zip(rank["cases"], rank["turn_advantages"], strict=True):
            assert values == pytest.approx([outcome[case] + t for t in TURN_TERMS[case]], abs=1e-5), case
        for case, tokens, mask in zip(rank["cases"], rank["tokens"], rank["masks"], strict=True):
            turns = [v for v, m, prev in zip(tokens, mask, [0, *mask], strict=False) if m and not prev]
            assert turns == pytest.approx([outcome[case] + t for t in TURN_TERMS[case]], abs=1e-5), case
            assert all(v == 0 for v, m in zip(tokens, mask, strict=True) if not m)


def test_show_prints_each_turns_reward_and_advantage(turn_trainer, tmp_path, capsys, monkeypatch):
    from agentic_grpo.cli import main

    monkeypatch.setenv("COLUMNS", "200")
    turn_trainer.generate_and_score(rows())
    assert main(["show", str(tmp_path), "--index", "0"]) == 0
    assert "turns  1: r=0.5 A=0.6667  2: r=0.5 A=0.5  3: r=0.0 A=0.0" in capsys.readouterr().out
