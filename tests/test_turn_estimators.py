"""The experimental per-turn estimators (agentic_grpo.experimental.turn_credit) on hand-made batches: each turn
and token gets exactly the formula's value, and the `turn` and `anchor` estimators stay unbiased when trajectories
differ in length (exact enumeration)."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from agentic_grpo.experimental.turn_credit import (
    TurnData,
    anchor_advantages,
    assign_turn_credit,
    discounted_returns,
    per_turn_advantages,
    silent_group_shares,
    token_advantages,
    turn_advantages,
)
from agentic_grpo.trajectory import Segment, Trajectory


def test_discounted_returns_put_the_final_reward_at_the_last_turn():
    assert discounted_returns([1.0, 0.0, 0.5], 0.9) == pytest.approx([1 + 0.9 * 0 + 0.81 * 0.5, 0.45, 0.5])
    assert discounted_returns([0.0, 1.0], 0.5, final=2.0) == pytest.approx([0.5 * (1 + 2), 1 + 2])


def test_turn_estimator_on_a_group_of_three_lengths():
    group = [
        TurnData([1.0, 0.0, 0.5], outcome=1.0, advantage=0.5),
        TurnData([0.0, 1.0], outcome=0.0, advantage=-0.2),
        TurnData([1.0], outcome=0.0, advantage=0.1),
    ]
    lam, gamma = 0.5, 0.9
    # Returns G: [1.405, 0.45, 0.5], [0.9, 1.0], [1.0]. Turn 0: everyone; turn 1: members 0 and 1; turn 2: member 0.
    expected = [
        [0.5 + lam * (1.405 - (0.9 + 1.0) / 2), 0.5 + lam * (0.45 - 1.0), 0.5 + lam * (0.5 - 0.0)],
        [-0.2 + lam * (0.9 - (1.405 + 1.0) / 2), -0.2 + lam * (1.0 - 0.45)],
        [0.1 + lam * (1.0 - (1.405 + 0.9) / 2)],
    ]
    got = per_turn_advantages(group, 3, "turn", lam, gamma)
    assert [len(row) for row in got] == [3, 2, 1]
    for row, want in zip(got, expected, strict=True):
        assert row == pytest.approx(want, abs=1e-12)


def test_anchor_estimator_compares_turns_taken_from_the_same_state():
    group = [
        TurnData([0.5, 0.5, 0.0], outcome=1.0, advantage=1.0, states=["", "a", "a|b"]),
        TurnData([0.5, 0.0], outcome=0.0, advantage=-0.5, states=["", "a"]),
        TurnData([0.0, 0.0], outcome=0.0, advantage=-0.5, states=["", "x"]),
        TurnData([0.5, 0.5], outcome=math.nan, advantage=0.0, states=["", "a"]),  # unscored: in no baseline
    ]
    # Returns U (outcome at the last turn): [2, 1.5, 1], [0.5, 0], [0, 0]; state "" holds members 0-2, "a" 0-1.
    expected = [
        [1.0 + (2 - (0.5 + 0) / 2), 1.0 + (1.5 - 0), 1.0 + (1 - 0)],  # "a|b": no one else there, baseline 0
        [-0.5 + (0.5 - (2 + 0) / 2), -0.5 + (0 - 1.5)],
        [-0.5 + (0 - (2 + 0.5) / 2), -0.5 + (0 - 0)],  # "x": no one else there, baseline 0
        [0.0, 0.0],
    ]
    got = per_turn_advantages(group, 4, "anchor", lam=1.0, gamma=1.0)
    for row, want in zip(got, expected, strict=True):
        assert row == pytest.approx(want, abs=1e-12)


def test_anchor_counts_a_failed_judge_call_as_its_groups_mean_as_trls_advantage_does():
    """Four identical correct two-turn trajectories; the judge call of two failed (None). TRL's advantage fills
    it with the group's mean, so all four are equal (advantage 0): the anchor term must not call them worse."""
    trajectories = []
    for judged in (None, None, 1.0, 1.0):
        t = Trajectory(prompt="q", segments=[Segment("prompt", [1], "q")], turns=2, turn_states=["", "a"])
        t.rewards = {"correctness": 1.0, "judge": judged}
        t.reward = 2.0  # what `_calculate_rewards` records: the None filled with the group's mean (1.0)
        trajectories.append(t)
    group = [TurnData.of(t, 0.0, {"correctness": 1.0, "judge": 1.0}) for t in trajectories]
    assert anchor_advantages(group) == [[0.0, 0.0]] * 4


def test_outcome_estimator_is_trls_advantage_on_every_turn():
    group = [TurnData([1.0, 0.0], 1.0, 0.7), TurnData([0.0], 0.0, -0.7)]
    assert per_turn_advantages(group, 2, "outcome") == [[0.7, 0.7], [-0.7]]


def test_a_trajectorys_own_turns_and_stopping_do_not_enter_its_baseline():
    others = [TurnData([0.0, 1.0], 0.0, 0.0), TurnData([1.0, 0.0, 0.0], 0.0, 0.0)]
    baselines = []
    for own in ([1.0], [0.0, 0.0], [0.0, 1.0, 1.0], [5.0, -3.0]):  # stops at turn 1, 2 or 3, any rewards
        mine = TurnData(own, 0.0, 0.0)
        first_turn = turn_advantages([mine, *others])[0][0]
        baselines.append(discounted_returns(own, 1.0)[0] - first_turn)
    assert baselines == pytest.approx([(1.0 + 1.0) / 2] * 4)


# --- unbiasedness, by exact enumeration ------------------------------------------------------
# A policy with one parameter: at turns 0 and 1 it goes on with probability p = sigmoid(theta) or
# stops; turn 2 always stops. Going on at turn k pays GO[k], stopping pays STOP[k]. So a group's
# trajectories have 1, 2 or 3 turns, and the expected policy gradient of every estimator can be
# computed exactly by enumerating all G-tuples of trajectories.
GO, STOP, THETA, G = [0.3, -0.2], [1.0, 0.2, 0.8], 0.4, 3


def episodes(p: float) -> list[tuple[float, list[float], list[float]]]:
    """(probability, turn rewards, score d/dtheta log pi of each turn's action)."""
    go, stop = 1 - p, -p  # d/dtheta log sigmoid(theta), d/dtheta log(1 - sigmoid(theta))
    return [
        (1 - p, [STOP[0]], [stop]),
        (p * (1 - p), [GO[0], STOP[1]], [go, stop]),
        (p * p, [GO[0], GO[1], STOP[2]], [go, go, 0.0]),
    ]


def true_gradient() -> float:
    theta = torch.tensor(THETA, dtype=torch.float64, requires_grad=True)
    p = torch.sigmoid(theta)
    value = (1 - p) * STOP[0] + p * (1 - p) * (GO[0] + STOP[1]) + p * p * (GO[0] + GO[1] + STOP[2])
    value.backward()
    return theta.grad.item()


def expected_gradient(estimator) -> float:
    p = 1 / (1 + math.exp(-THETA))
    total = 0.0
    for tuple_ in itertools.product(episodes(p), repeat=G):
        probability = math.prod(e[0] for e in tuple_)
        terms = estimator([TurnData(rewards, 0.0, 0.0) for _, rewards, _ in tuple_])
        gradient = sum(
            s * a for (_, _, scores), row in zip(tuple_, terms, strict=True) for s, a in zip(scores, row, strict=True)
        )
        total += probability * gradient / G
    return total


def per_index_normalised(group: list[TurnData]) -> list[list[float]]:
    """The biased design: each turn index normalised on its own (mean and std include the trajectory itself)."""
    returns = [discounted_returns(d.turn_rewards, 1.0) for d in group]
    out = []
    for member in returns:
        row = []
        for k, value in enumerate(member):
            peers = torch.tensor([r[k] for r in returns if len(r) > k], dtype=torch.float64)
            std = peers.std().item() if len(peers) > 1 else 0.0
            row.append((value - peers.mean().item()) / (std + 1e-4))
        out.append(row)
    return out


def per_index_mean_with_self(group: list[TurnData]) -> list[list[float]]:
    """Leave-one-out dropped: the baseline of turn k is the mean over every member that reached it, itself included."""
    returns = [discounted_returns(d.turn_rewards, 1.0) for d in group]
    return [
        [v - sum(r[k] for r in returns if len(r) > k) / sum(len(r) > k for r in returns) for k, v in enumerate(m)]
        for m in returns
    ]


def test_turn_estimator_is_unbiased_when_lengths_vary_and_per_index_baselines_are_not():
    truth = true_gradient()
    assert expected_gradient(turn_advantages) == pytest.approx(truth, rel=1e-9, abs=1e-12)
    # The check can fail: both per-turn-index designs miss the true gradient by far more than rounding
    # (exact values here: truth -0.0051, mean with itself -0.0142, normalised per index -0.141).
    assert abs(expected_gradient(per_index_mean_with_self) - truth) > 0.005
    assert abs(expected_gradient(per_index_normalised) - truth) > 0.05


def with_states(estimator):
    """The stop/go problem's state before turn k is k (the actions before it were all `go`)."""
    return lambda group: estimator([TurnData(d.turn_rewards, d.outcome, d.advantage, [str(k) for k in range(d.turns)])
                                    for d in group])  # fmt: skip


def anchor_dropping_unvisited_states(group: list[TurnData]) -> list[list[float]]:
    """GiGPO's rule: a state no other member visited gives its turn no step term (the planted bias)."""
    out = anchor_advantages(group)
    for i, d in enumerate(group):
        for k, state in enumerate(d.states):
            if not any(state in (o.states or []) for j, o in enumerate(group) if j != i):
                out[i][k] = d.advantage
    return out


def test_anchor_estimator_is_unbiased_when_lengths_vary():
    truth = true_gradient()
    assert expected_gradient(with_states(anchor_advantages)) == pytest.approx(truth, rel=1e-9, abs=1e-12)
    # The check can fail: dropping the term at unvisited states is about three times the true gradient.
    assert abs(expected_gradient(with_states(anchor_dropping_unvisited_states)) - truth) > 0.005


# --- tokens ----------------------------------------------------------------------------------


def trajectory(*lengths: tuple[str, int]) -> Trajectory:
    segments = [Segment("prompt", [1, 2], "")] + [Segment(role, [7] * n, "") for role, n in lengths]
    return Trajectory(prompt="q", segments=segments, turns=sum(role == "model" for role, _ in lengths))


def test_each_model_token_gets_its_turns_advantage_and_tool_tokens_and_padding_get_zero():
    batch = [
        trajectory(("model", 3), ("tool", 2), ("model", 2), ("tool", 1), ("model", 4)),
        trajectory(("model", 5)),
        trajectory(("model", 1), ("tool", 3), ("model", 2)),
    ]
    per_turn = [[0.5, -1.0, 2.0], [0.25], [-0.5, 1.5]]
    tokens = token_advantages(batch, per_turn, width=14)
    assert tokens.shape == (3, 14)
    assert tokens[0].tolist() == [0.5] * 3 + [0.0] * 2 + [-1.0] * 2 + [0.0] + [2.0] * 4 + [0.0] * 2
    assert tokens[1].tolist() == [0.25] * 5 + [0.0] * 9
    assert tokens[2].tolist() == [-0.5] + [0.0] * 3 + [1.5] * 2 + [0.0] * 8
    for t, row in zip(batch, tokens, strict=True):  # tool tokens carry nothing, whatever the mask does
        mask = torch.tensor(t.loss_mask + [0] * (14 - len(t.loss_mask)))
        assert (row[mask == 0] == 0).all()


def test_a_batch_narrower_than_a_trajectory_is_refused():
    with pytest.raises(ValueError, match="batch is 4 wide"):
        token_advantages([trajectory(("model", 5))], [[1.0]], width=4)


def test_no_signal_share_per_estimator():
    same_outcome = [TurnData([0.5, 0.0], 1.0, 0.0), TurnData([0.0, 0.5], 1.0, 0.0)]  # credit differs
    nothing = [TurnData([0.0], 0.0, 0.0), TurnData([0.0], 0.0, 0.0)]
    metrics = silent_group_shares(same_outcome + nothing, group_size=2)
    assert metrics["credit/frac_reward_zero_std/outcome"] == 1.0
    assert metrics["credit/frac_reward_zero_std/turn"] == 0.5
    assert "credit/frac_reward_zero_std/anchor" not in metrics  # no state hashes: anchor is not defined


def test_turn_credit_replaces_the_outcome_advantage_of_this_processs_rows_only():
    """Two processes' halves of one group: each gets the per-turn values of its own rows, estimated on the whole
    group, and each trajectory keeps its turn advantages for its saved record."""
    batch = [trajectory(("model", 1), ("tool", 1), ("model", 1)) for _ in range(4)]
    paid = [[0.5, 0.0], [0.0, 0.0], [0.5, 0.5], [0.0, 0.5]]
    for t, rewards in zip(batch, paid, strict=True):
        t.turn_rewards, t.rewards = list(rewards), {"correctness": 0.0}
    data = [TurnData.of(t, 0.0, {"correctness": 1.0}) for t in batch]
    whole = per_turn_advantages(data, 4, "turn")
    for rank in (0, 1):
        mine = batch[2 * rank : 2 * rank + 2]
        tokens, metrics = assign_turn_credit(
            mine, torch.zeros(2), {"correctness": 1.0}, estimator="turn", lam=1.0, gamma=1.0, group_size=4,
            width=3, gather=lambda local: data, process_index=rank,
        )  # fmt: skip
        assert [t.turn_advantages for t in mine] == whole[2 * rank : 2 * rank + 2]
        assert tokens[:, 0].tolist() == pytest.approx([row[0] for row in whole[2 * rank : 2 * rank + 2]])
        assert tokens[:, 1].tolist() == [0.0, 0.0]  # the tool token
        assert metrics["credit/frac_reward_zero_std/outcome"] == 1.0
