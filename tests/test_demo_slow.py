"""The CPU demo on the real SmolLM2-135M-Instruct for a few steps (slow: run with `pytest -m slow`)."""

from __future__ import annotations

import json

import pytest

from tests.helpers import train

pytestmark = pytest.mark.slow


def test_demo_parses_and_executes_real_calculator_calls(tmp_path):
    out = tmp_path / "demo"
    result = train(
        "--config", "recipes/cpu_demo.yaml", "--output_dir", str(out), "--max_steps", "3", "--save_steps", "3",
        timeout=3600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    records = [
        json.loads(line) for path in sorted((out / "trajectories").glob("step_*.jsonl"))
        for line in path.read_text().splitlines()
    ]  # fmt: skip
    calls = [c for r in records for c in r["tool_calls"] if c["call"]["name"] == "calculator"]
    assert calls, "the demo's trajectories contain calculator calls"
    executed = [c for c in calls if c["result"]["error"] is None]
    assert executed, "at least one calculator call ran without error"
    from agentic_grpo.tools.calculator import evaluate

    for call in executed:
        assert call["result"]["output"] == str(evaluate(call["call"]["arguments"]["expression"]))
