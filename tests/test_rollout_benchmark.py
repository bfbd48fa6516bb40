"""The rollout benchmark's command runs end to end on the tiny model and reports figures that hang together."""

from __future__ import annotations

import json
import subprocess
import sys


def test_smoke_run_reports_ours_trl_and_the_bounds(tiny_model_dir):
    command = [sys.executable, "-m", "agentic_grpo.cli", "bench", "rollout", "--smoke", "--model", tiny_model_dir]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout)
    assert report["benchmark"] == "rollout" and (report["questions"], report["group"]) == (2, 2)

    latencies = ["0.0", "0.1"]
    assert sorted(report["ours"]) == latencies and sorted(report["trl"]) == latencies
    runs = [report["bound"], report["bound_before"], *report["ours"].values(), *report["trl"].values()]
    for run in runs:
        assert run["seconds"] > 0 and run["model_tokens"] > 0
        assert abs(run["tokens_per_s"] - run["model_tokens"] / run["seconds"]) <= 0.01 * run["tokens_per_s"] + 0.5
    # One seed, one sampling: reading contexts whole or in pieces, with slow tools or instant ones, the same tokens.
    assert report["bound_before"]["same_tokens_as_bound"] is True
    assert {run["model_tokens"] for run in [report["bound"], *report["ours"].values()]} == {
        report["bound"]["model_tokens"]
    }
    ratios = report["ratios"]
    assert sorted(ratios["rollout_over_bound"]) == latencies and sorted(ratios["trl_seconds_over_ours"]) == latencies
    assert ratios["bound_speedup_over_before"] > 0
