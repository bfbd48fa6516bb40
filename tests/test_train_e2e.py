"""End to end through `train.py`: two real GRPO steps of the CI recipe on a tiny random model."""

from __future__ import annotations

import json

import pytest

from tests.helpers import ROOT, train, write_recipe

pytestmark = pytest.mark.integration  # every test runs train.py in a process of its own

METRICS = [
    "reward", "reward_std", "rewards/correctness/mean", "rewards/format/mean", "kl", "tokens/trainable_ratio",
    "tools/calls_per_trajectory", "tools/error_rate", "tools/timeout_rate", "tools/truncated_rate",
    "trajectories/invalid_rate", "trajectories/turns_mean", "time/generation", "time/tools", "time/reward",
    "time/step",
]  # fmt: skip


@pytest.fixture(scope="module")
def ci_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("run") / "ci"
    result = train("--config", "recipes/ci_tiny.yaml", "--output_dir", str(out), cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    return out, result


def test_two_steps_write_metrics_with_the_listed_names(ci_run):
    out, _ = ci_run
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "loss" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert [r["step"] for r in rows] == [1, 2]  # one line per step: the run's summary is in run.json
    assert "train_runtime" in json.loads((out / "run.json").read_text())["train_summary"]
    for name in METRICS:
        assert name in steps[0], name
    assert 0 < steps[0]["tokens/trainable_ratio"] <= 1


def test_trajectory_files_hold_segments_rewards_and_advantages(ci_run):
    out, _ = ci_run
    files = sorted((out / "trajectories").glob("step_*.jsonl"))
    assert [f.name for f in files] == ["step_000001.jsonl", "step_000002.jsonl"]
    records = [json.loads(line) for line in files[0].read_text().splitlines()]
    assert len(records) == 4  # one question x G=4
    first = records[0]
    assert first["segments"][0]["role"] == "prompt" and first["segments"][1]["role"] == "model"
    assert set(first["rewards"]) == {"correctness", "format"} and "advantage" in first
    assert first["row"]["answer"].isdigit()


def test_a_step_that_generates_twice_keeps_both_generations_trajectories(tmp_path):
    # gradient accumulation over two microbatches, each generated on its own (steps_per_generation 1): one
    # optimizer step sees two questions, and its trajectory file must hold both groups, not the last one only
    out = tmp_path / "accumulated"
    result = train("--config", "recipes/ci_tiny.yaml", "--output_dir", str(out), "--max_steps", "1",
                   "--gradient_accumulation_steps", "2", "--steps_per_generation", "1", "--save_steps", "10")  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    files = sorted((out / "trajectories").glob("step_*.jsonl"))
    assert [f.name for f in files] == ["step_000001.jsonl"]
    records = [json.loads(line) for line in files[0].read_text().splitlines()]
    assert len(records) == 8  # two questions x G=4
    assert len({r["row"]["question"] for r in records}) == 2


def test_run_is_marked_completed_with_a_checkpoint_and_summary(ci_run):
    out, result = ci_run
    assert json.loads((out / "run.json").read_text())["status"] == "completed"
    assert (out / "checkpoint-2" / "model.safetensors").exists()
    assert (out / "model.safetensors").exists()
    assert "Run finished. Outputs in" in result.stdout and str(out) in result.stdout


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (["--max_turn", "3"], "max_turn"),
        (["--model_name_or_path", "./no/such/model"], "does not exist"),
        (
            ["--environment", "no_such_module:Tools"],
            "cannot import module `no_such_module`: No module named 'no_such_module' (plug-ins are imported from the current directory",
        ),
        (["--environment", "agentic_grpo.tools.calculator:Nope"], "has no `Nope`"),
    ],
)
def test_bad_command_line_stops_before_any_output(tmp_path, override, message):
    out = tmp_path / "out"
    result = train("--config", "recipes/ci_tiny.yaml", "--output_dir", str(out), *override, cwd=ROOT, timeout=120)
    assert result.returncode != 0
    assert message in result.stderr
    assert not out.exists()


def test_mistyped_recipe_field_is_named_with_a_suggestion(tmp_path):
    result = train("--config", str(write_recipe(tmp_path, max_turn=3)), timeout=120)
    assert result.returncode == 2
    assert "field `max_turn` is not known; did you mean `max_turns`?" in result.stderr
    assert not (tmp_path / "out").exists()


def test_dataset_without_needed_columns_is_refused(tmp_path):
    data = tmp_path / "data.jsonl"
    data.write_text('{"question": "What is 2*3?", "solution": "6"}\n' * 8)
    recipe = write_recipe(tmp_path, dataset={"path": "json", "data_files": str(data)})
    result = train("--config", str(recipe), timeout=120)
    assert result.returncode == 2
    assert "reward `correctness` needs column(s) ['answer']" in result.stderr and "solution" in result.stderr
    assert not (tmp_path / "out").exists()


def test_unknown_reward_type_is_refused(tmp_path):
    recipe = write_recipe(tmp_path, rewards=[{"type": "agentic_grpo.rewards.rules:Corectness"}])
    result = train("--config", str(recipe), timeout=120)
    assert result.returncode == 2 and "has no `Corectness`" in result.stderr


def test_held_out_accuracy_before_and_after_is_printed_and_written(tmp_path):
    out = tmp_path / "out"
    result = train("--config", "recipes/ci_tiny.yaml", "--output_dir", str(out), "--eval_before_after", "true",
                   "--eval_questions", "2")  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    held_out = json.loads((out / "held_out.json").read_text())
    assert held_out["before"]["questions"] == 2 and held_out["after"]["questions"] == 2
    assert "held-out accuracy (greedy pass@1, 2 questions never trained on)" in result.stdout
    assert "before ->" in result.stdout and "plots:" in result.stdout
