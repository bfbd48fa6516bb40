"""The `agentic-grpo` command: show, eval and bench, run for real."""

from __future__ import annotations

import json

from agentic_grpo.cli import main
from agentic_grpo.trajectory import Segment, ToolCall, ToolResult, Trajectory


def test_show_prints_segments_and_rewards(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "300")  # rich wraps to the terminal; keep lines whole for the asserts
    trajectory = Trajectory(
        prompt="q",
        segments=[
            Segment("prompt", [1], "Q"),
            Segment("model", [2], "Action: calculator"),
            Segment("tool", [3], " 42"),
        ],
        tool_calls=[(ToolCall("calculator", {"expression": "6*7"}), ToolResult("42"))],
        final_answer="42",
        finish_reason="final_answer",
    )
    record = {**trajectory.to_dict(), "row": {"question": "What is 6*7?", "answer": "42"}, "rewards": {"c": 1.0}}
    (tmp_path / "trajectories").mkdir()
    (tmp_path / "trajectories" / "step_000003.jsonl").write_text(json.dumps(record) + "\n")
    assert main(["show", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "What is 6*7?" in out and "Action: calculator" in out and "c=1.0" in out and "step_000003" in out


def test_show_and_bench_refuse_what_does_not_exist(tmp_path, capsys):
    assert main(["show", str(tmp_path / "nothing")]) == 2
    assert main(["bench", "no-such-benchmark"]) == 2
    assert "known:" in capsys.readouterr().err


def test_eval_reports_accuracy_and_tool_use_on_a_model(tiny_model_dir, tmp_path, capsys):
    report = tmp_path / "eval.json"
    code = main(
        [
            "eval",
            "--model",
            tiny_model_dir,
            "--recipe",
            "recipes/ci_tiny.yaml",
            "--limit",
            "2",
            "--output",
            str(report),
        ]
    )
    assert code == 0
    metrics = json.loads(report.read_text())
    assert metrics["questions"] == 2 and metrics["k"] == 1
    for key in (
        "accuracy",
        "pass@1",
        "tools/call_rate",
        "tools/error_rate",
        "trajectories/turns_mean",
        "completions/mean_length",
        "trajectories/invalid_rate",
    ):
        assert 0 <= metrics[key] <= max(1, metrics[key])
    lines = report.with_suffix(".trajectories.jsonl").read_text().splitlines()
    assert len(lines) == 2 and "correct" in json.loads(lines[0])


def test_eval_with_a_missing_data_file_is_refused(tiny_model_dir, capsys):
    code = main(["eval", "--model", tiny_model_dir, "--recipe", "recipes/ci_tiny.yaml", "--data", "nope.jsonl"])
    assert code == 2 and "does not exist" in capsys.readouterr().err
