"""A judge that fails 30% of its calls costs no training step (end to end, tiny model, real HTTP)."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.helpers import ROOT, train
from tests.judge_fixtures import FaultProxy

pytestmark = pytest.mark.integration  # trains through train.py in a process of its own

PATTERN = [("status", 500), ("reply", '{"score": 8}'), ("reply", '{"score": 2}')] * 2 + [
    ("status", 503),
    ("reply", '{"score": 6}'),
    ("reply", '{"score": 4}'),
    ("status", 500),
]  # 3 failures in 10 calls, repeated for every question


def test_thirty_percent_judge_failures_cost_no_training_step(tmp_path):
    questions = [f"[jq{i}] A box holds {100 + i} pens. How many pens are in {200 + i} boxes?" for i in range(8)]
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"question": q, "answer": str((100 + i) * (200 + i))}) + "\n"
                            for i, q in enumerate(questions)))  # fmt: skip
    proxy = FaultProxy()
    for i in range(len(questions)):
        proxy.script(f"[jq{i}]", PATTERN * 4)
    recipe = yaml.safe_load((ROOT / "recipes" / "ci_tiny.yaml").read_text())
    recipe.update(
        dataset={"path": "json", "data_files": str(data)},
        rewards=[
            {"type": "agentic_grpo.rewards.rules:Correctness", "weight": 1.0},
            {
                "name": "judge",
                "type": "agentic_grpo.rewards.judge:LLMJudge",
                "weight": 0.5,
                "endpoint": proxy.url,
                "model": "judge",
                "max_retries": 0,
                "timeout_s": 10,
                "max_concurrency": 2,
            },
        ],  # fmt: skip
        max_steps=3,
        save_steps=3,
        output_dir=str(tmp_path / "out"),
    )
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    try:
        result = train("--config", str(path))
    finally:
        proxy.close()
    assert result.returncode == 0, result.stderr[-3000:]

    out = tmp_path / "out"
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [s for s in steps if "loss" in s]
    assert [s["step"] for s in steps] == [1, 2, 3]  # every step trained
    failures = sum(s["judge/failures"] for s in steps)
    calls = sum(s["judge/calls"] for s in steps)
    judged = [json.loads(line)["rewards"]["judge"] for f in (out / "trajectories").glob("*.jsonl")
              for line in f.read_text().splitlines()]  # fmt: skip
    failed_requests = sum(1 for entry in proxy.log if entry["action"][0] == "status")
    assert failed_requests > 0 and judged.count(None) == failed_requests
    assert all(score is None or 0.0 <= score <= 1.0 for score in judged)
    assert failures > 0 and calls > 0
