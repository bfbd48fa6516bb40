"""The adaptive curriculum: kinds drawn in proportion to 1 - score + floor, several kinds a batch, TRL's repeat
layout, and a real training run (tiny model, toolbox recipe) that draws its batches by the logged scores."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from agentic_grpo.curriculum import FLOOR, AdaptiveCurriculum, CurriculumSampler
from tests.test_toolbox_recipes import TINY
from tests.test_train_e2e import train

KINDS = ["a", "b", "c", "a", "b", "c", "a"]


def test_unscored_kinds_come_in_turn_each_batch_of_different_kinds():
    curriculum = AdaptiveCurriculum(KINDS)
    assert [curriculum.next_kinds(2) for _ in range(3)] == [["a", "b"], ["c", "a"], ["b", "c"]]


def test_kinds_come_in_proportion_to_what_is_left_to_learn():
    curriculum = AdaptiveCurriculum(KINDS, reward_name="tool_choice")
    curriculum.observe(["a"] * 4 + ["b"] * 4 + ["c"] * 4, [1.0] * 4 + [0.5] * 4 + [0.0, 0.0, 0.0, float("nan")])
    assert curriculum.scores == {"a": 1.0, "b": 0.5, "c": 0.0}  # the NaN (not scored) is left out of c's mean
    drawn = Counter(kind for _ in range(600) for kind in curriculum.next_kinds(1))
    weights = {"a": FLOOR, "b": 0.5 + FLOOR, "c": 1.0 + FLOOR}
    for kind, weight in weights.items():
        assert drawn[kind] == pytest.approx(600 * weight / sum(weights.values()), abs=1)


def test_a_kind_that_slips_is_drawn_more():
    curriculum = AdaptiveCurriculum(KINDS)
    curriculum.observe(["a", "b", "c"], [1.0, 1.0, 1.0])
    assert curriculum.weight("a") == pytest.approx(FLOOR)
    curriculum.observe(["a", "a"], [0.0, 0.0])  # half its old score, half the new batch's mean
    assert curriculum.scores["a"] == pytest.approx(0.5)
    assert curriculum.weight("a") > curriculum.weight("b")
    assert Counter(curriculum.next_kinds(1)[0] for _ in range(10)).most_common(1)[0][0] == "a"


def test_scores_outside_zero_one_are_clipped_in_the_weight():
    curriculum = AdaptiveCurriculum(["x", "y"])
    curriculum.observe(["x", "y"], [3.0, -2.0])
    assert curriculum.weight("x") == pytest.approx(FLOOR) and curriculum.weight("y") == pytest.approx(1 + FLOOR)


def test_the_sampler_lays_prompts_out_as_trls_and_cycles_each_kinds_rows():
    curriculum = AdaptiveCurriculum(KINDS)
    sampler = iter(CurriculumSampler(curriculum, mini_repeat_count=2, batch_size=2, repeat_count=2))
    first = [next(sampler) for _ in range(8)]
    assert first == [0, 0, 1, 1, 0, 0, 1, 1]  # a's first row, b's first row; the batch twice
    second = [next(sampler) for _ in range(8)]
    assert second == [2, 2, 3, 3, 2, 2, 3, 3]  # c's first row, a's second
    curriculum.next_kinds(5)
    assert [curriculum.next_row("c") for _ in range(3)] == [5, 2, 5]  # c's rows in order, cycling


def test_a_curriculum_needs_rows():
    with pytest.raises(ValueError, match="needs rows"):
        AdaptiveCurriculum([])


def test_a_curriculum_needs_max_steps_and_its_reward_needs_a_column():
    from agentic_grpo.config import AgenticGRPOConfig

    with pytest.raises(ValueError, match="set max_steps"):
        AgenticGRPOConfig(output_dir="/tmp/unused", curriculum_column="kind")
    with pytest.raises(ValueError, match="set curriculum_column"):
        AgenticGRPOConfig(output_dir="/tmp/unused", max_steps=2, curriculum_reward="tool_choice")


def test_a_column_or_reward_that_is_not_there_is_refused_before_training(tmp_path):
    for flags, message in (
        (["--curriculum_column", "topic"], "names no column of the training data"),
        (["--curriculum_column", "kind", "--curriculum_reward", "tool_chioce"], "is not one of the rewards"),
    ):
        result = train("--config", "cpu_toolbox", "--output_dir", str(tmp_path / flags[1]), *TINY, *flags)
        assert result.returncode != 0
        assert message in result.stderr, result.stderr[-2000:]


def test_training_draws_each_batch_by_the_kinds_scores(tmp_path):
    """Three real GRPO steps on the toolbox: each step's two groups are of two kinds, drawn unscored kinds first,
    and the scores and draws are logged per kind (the draw by score is checked above, without a model)."""
    out = tmp_path / "out"
    result = train("--config", "cpu_toolbox", "--output_dir", str(out), *TINY, "--max_steps", "3",
                   "--per_device_train_batch_size", "4", "--curriculum_column", "kind",
                   "--curriculum_reward", "tool_choice")  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    logged = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    last = [line for line in logged if any(key.startswith("curriculum/") for key in line)][-1]
    kinds_per_step = []
    for step in (1, 2, 3):
        records = [json.loads(line) for line in (out / "trajectories" / f"step_{step:06d}.jsonl").open()]
        kinds_per_step.append(sorted({r["row"]["kind"] for r in records}))
    assert all(len(kinds) == 2 for kinds in kinds_per_step)
    # The first two batches are drawn before any score (Accelerate asks for a batch ahead): the kinds in the
    # order the rows first name them (the generator's: arithmetic, units, dates, lookup, strings, Python).
    assert kinds_per_step[:2] == [["arithmetic", "units"], ["dates", "lookup"]]
    assert last["step"] == 3
    scored = [key for key in last if key.startswith("curriculum/") and key.endswith("/score")]
    assert {key.split("/")[1] for key in scored} >= {"dates", "strings", "arithmetic", "python"}
    assert all(0.0 <= last[key] <= 1.0 for key in scored)
    assert sum(last[key] for key in last if key.endswith("/drawn")) == 8  # three batches of two, one drawn ahead
