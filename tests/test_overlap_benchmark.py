"""The overlap benchmark's command runs end to end on the tiny model: a synchronous and an asynchronous run per
tool latency, each step timed, the asynchronous one's first step weighing its tokens 1 (same weights)."""

from __future__ import annotations

import json

import pytest

from tests.helpers import run_cli

pytestmark = pytest.mark.integration  # the benchmark's command, in a process of its own


def test_smoke_run_trains_synchronous_and_asynchronous_at_each_latency(tiny_model_dir):
    result = run_cli("bench", "overlap", "--smoke", "--model", tiny_model_dir, "--latencies", "0", "0.2")
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout)
    assert report["benchmark"] == "overlap" and report["steps"] == 2
    assert [run["tool_seconds"] for run in report["runs"]] == [0.0, 0.2]
    for run in report["runs"]:
        for mode in ("sync", "async"):
            assert len(run[mode]["step_seconds"]) == 2 and run[mode]["median_step_seconds"] > 0
        assert "async/queue_wait" not in run["sync"]
        assert run["async"]["async/importance_weight/mean"][0] == pytest.approx(1.0, abs=1e-5)  # same weights
        assert run["speedup"] > 0
