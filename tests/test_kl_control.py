"""The adaptive KL controller: when it moves beta, by how much, and within which bounds."""

from __future__ import annotations

import pytest

from agentic_grpo.kl_control import KL_PRESETS, KLSchedule, next_beta, resolve_schedule

SCHEDULE = KLSchedule(target=0.1, factor=2.0, min=0.01, max=0.5)


def test_beta_rises_by_the_factor_when_kl_exceeds_one_and_a_half_times_the_target():
    assert next_beta(0.04, 0.16, SCHEDULE) == pytest.approx(0.08)


def test_beta_falls_by_the_factor_when_kl_is_below_half_the_target():
    assert next_beta(0.04, 0.04, SCHEDULE) == pytest.approx(0.02)


@pytest.mark.parametrize("kl", [0.05, 0.1, 0.15])  # the band [0.5x, 1.5x] target, edges included
def test_beta_holds_inside_the_band(kl):
    assert next_beta(0.04, kl, SCHEDULE) == 0.04


def test_beta_is_clamped_to_its_bounds():
    assert next_beta(0.4, 10.0, SCHEDULE) == 0.5
    assert next_beta(0.015, 0.0, SCHEDULE) == 0.01


def test_repeated_high_kl_saturates_at_the_maximum():
    beta = 0.04
    for _ in range(10):
        beta = next_beta(beta, 1.0, SCHEDULE)
    assert beta == SCHEDULE.max


def test_presets_are_named_and_fields_override_them():
    assert set(KL_PRESETS) == {"tool_use", "exploration", "stable"}
    schedule = resolve_schedule("stable", target=0.3)
    assert schedule.target == 0.3 and schedule.factor == KL_PRESETS["stable"].factor


def test_no_preset_and_no_target_means_a_fixed_beta():
    assert resolve_schedule(None) is None


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"preset": "calm"}, "kl_control preset `calm` is not known"),
        ({"preset": None, "target": 0.1, "factor": 1.0}, "factor > 1"),
        ({"preset": None, "target": 0.1, "kl_min": 0.0}, "0 < min"),
        ({"preset": None, "factor": 2.0}, "need a `target` or a `preset`"),
    ],
)
def test_bad_schedules_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        resolve_schedule(**kwargs)
