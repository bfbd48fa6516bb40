"""The step benchmark's command runs end to end on the tiny model: both trainers train on the same replayed
rollouts, and their losses agree (the comparison is of like with like)."""

from __future__ import annotations

import json

import pytest

from tests.helpers import run_cli

pytestmark = pytest.mark.integration  # the benchmark's command, in a process of its own


def test_smoke_run_times_ours_and_plain_trl_on_the_same_rollouts(tiny_model_dir):
    result = run_cli("bench", "step", "--smoke", "--model", tiny_model_dir)
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout)
    assert report["benchmark"] == "step" and report["steps"] == 2 and report["group"] == 2
    for side in ("ours", "trl"):
        assert len(report[side]["step_seconds"]) == 2 and report[side]["median_seconds"] > 0
    assert len(report["ours_losses"]) == len(report["trl_losses"]) == 2
    assert report["same_losses"] is True
    assert report["ratio_ours_over_trl"] > 0
