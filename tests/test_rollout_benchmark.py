"""The rollout benchmark's command runs end to end on the tiny model and reports figures that hang together."""

from __future__ import annotations

import json

import pytest

from tests.helpers import run_cli

pytestmark = pytest.mark.integration  # the benchmark's command, in a process of its own


def test_smoke_run_reports_ours_trl_and_the_bounds(tiny_model_dir):
    result = run_cli("bench", "rollout", "--smoke", "--model", tiny_model_dir)
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout)
    assert report["benchmark"] == "rollout" and (report["questions"], report["group"]) == (2, 2)

    latencies = ["0.0", "0.1"]
    assert sorted(report["ours"]) == latencies and sorted(report["trl"]) == latencies
    runs = [
        report["bound"],
        report["bound_before"],
        report["bound_full_batch"],
        *report["ours"].values(),
        *report["trl"].values(),
    ]
    for run in runs:
        assert run["seconds"] > 0 and run["model_tokens"] > 0
        # `seconds` is printed rounded to 0.01 s: on a tiny model's sub-second runs that rounding alone moves
        # tokens / seconds by a lot, so the rate must lie between the bounds the unrounded time allows.
        low, high = (
            run["model_tokens"] / (run["seconds"] + 0.005),
            run["model_tokens"] / max(run["seconds"] - 0.005, 1e-9),
        )
        assert low - 0.5 <= run["tokens_per_s"] <= high + 0.5
    # One seed, one sampling: reading contexts whole or in pieces, with slow tools or instant ones, the same tokens.
    assert report["bound_before"]["same_tokens_as_bound"] is True
    assert report["bound_full_batch"]["same_tokens_as_bound"] is True
    assert {run["model_tokens"] for run in [report["bound"], *report["ours"].values()]} == {
        report["bound"]["model_tokens"]
    }
    ratios = report["ratios"]
    assert sorted(ratios["rollout_over_bound"]) == latencies and sorted(ratios["trl_seconds_over_ours"]) == latencies
    assert ratios["bound_speedup_over_before"] > 0 and ratios["bound_speedup_over_full_batch"] > 0
