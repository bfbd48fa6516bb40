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


def test_bench_hands_its_arguments_over_verbatim(monkeypatch):
    """A `--` right after the name reaches the benchmark (`bench trace -- --seed 1`: recipe fields after it). The
    benchmark is not started (a trace takes minutes): the command it would be started with is recorded."""
    import subprocess

    calls = []
    monkeypatch.setattr(subprocess, "call", lambda command: calls.append(command) or 0)
    assert main(["bench", "trace", "--", "--model_name_or_path", "tiny-random-llama"]) == 0
    assert calls[0][-3:] == ["--", "--model_name_or_path", "tiny-random-llama"]


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


def _record(question: str, tool_output: str = " 42") -> dict:
    trajectory = Trajectory(
        prompt="q",
        segments=[
            Segment("prompt", [1], "Q"),
            Segment("model", [2], "Action: calculator"),
            Segment("tool", [3], tool_output),
        ],
        final_answer="42",
        finish_reason="final_answer",
    )
    return {**trajectory.to_dict(), "row": {"question": question, "answer": "42"}}


def test_show_reads_every_process_file_of_a_step_or_the_one_asked_for(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "300")
    folder = tmp_path / "trajectories"
    folder.mkdir()
    for step in (2, 4):
        for rank in (0, 1):
            lines = [json.dumps(_record(f"step {step} rank {rank} question {k}")) for k in range(4)]
            (folder / f"step_{step:06d}.rank{rank}.jsonl").write_text("\n".join(lines) + "\n")

    assert main(["show", str(tmp_path), "--limit", "8"]) == 0
    out = capsys.readouterr().out
    assert "8 trajectories from 2 processes" in out
    assert all(f"step 4 rank {rank} question {k}" in out for rank in (0, 1) for k in range(4))
    assert "step 2" not in out and "rank=1" in out

    assert main(["show", str(tmp_path), "--step", "2", "--rank", "1"]) == 0
    out = capsys.readouterr().out
    assert "step 2 rank 1 question 0" in out and "rank 0" not in out and "4 trajectories" in out

    assert main(["show", str(tmp_path), "--rank", "2"]) == 2
    assert "processes 0, 1" in capsys.readouterr().err
    assert main(["show", str(tmp_path), "--step", "3"]) == 2
    assert "saved steps: 2, 4" in capsys.readouterr().err


def test_show_never_sends_tool_output_escape_sequences_to_the_terminal(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "300")
    hostile = "\x1b]0;pwned\x07\x1b]52;c;aGk=\x07\rreward=1.0 \x9b31m"
    path = tmp_path / "step_000001.jsonl"
    path.write_text(json.dumps(_record("\x1b[2Jq", tool_output=hostile)) + "\n")
    assert main(["show", str(path)]) == 0
    out = capsys.readouterr().out
    assert not any(ch in out for ch in "\x1b\x07\r\x9b")
    assert "\\x1b]0;pwned\\x07" in out and "\\x1b[2Jq" in out
