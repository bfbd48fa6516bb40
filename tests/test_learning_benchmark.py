"""The learning benchmark scores strictly, and its command runs end to end (a one-step smoke run)."""

from __future__ import annotations

import json
import shutil

import pytest

from agentic_grpo.benchmarks.learning import strictly_correct
from tests.helpers import run_cli


@pytest.mark.parametrize(
    ("answer", "gold", "correct"),
    [("386,064", "386064", True), ("386064 pens.", "386064", True), ("504 * 766", "386064", False),
     ("77", "77750", False), (None, "1", False), ("Paris", "paris", True)],
)  # fmt: skip
def test_strict_scoring_takes_only_the_number_itself(answer, gold, correct):
    assert strictly_correct(answer, gold) is correct


@pytest.mark.integration
def test_one_step_smoke_run_reports_accuracy_minutes_and_memory(tmp_path):
    command = ["bench", "learning", "--recipe", "ci_tiny", "--seeds", "0", "--max-steps", "1", "--questions", "2",
               "--output-dir", str(tmp_path / "run")]  # fmt: skip
    result = run_cli(*command)
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout)
    assert report["scoring"].startswith("strict") and [r["seed"] for r in report["runs"]] == [0]
    assert report["train_peak_memory_mb"] > 0 and report["runs"][0]["train_minutes"] >= 0

    # Nothing finished is redone: the same command again reports the stored result without training.
    trained_at = (tmp_path / "run-ci_tiny-seed0" / "run.json").stat().st_mtime_ns
    again = run_cli(*command)
    assert again.returncode == 0, again.stderr[-2000:]
    assert json.loads(again.stdout)["runs"] == report["runs"]
    assert (tmp_path / "run-ci_tiny-seed0" / "run.json").stat().st_mtime_ns == trained_at


@pytest.mark.integration
def test_a_routing_recipe_reports_routing_and_selection_accuracy_beside_strict_accuracy(tmp_path):
    import yaml

    from agentic_grpo.resources import find_shipped

    recipe = yaml.safe_load(find_shipped("cpu_routing", "recipes", ".yaml").read_text())
    recipe.update(model_name_or_path="tiny-random-llama", num_generations=2, per_device_train_batch_size=2,
                  gradient_accumulation_steps=1, max_tokens_per_turn=16, max_completion_length=64,
                  lora_target_modules=["q_proj", "v_proj"], save_strategy="no")  # fmt: skip
    path = tmp_path / "tiny_routing.yaml"
    path.write_text(yaml.safe_dump(recipe))
    result = run_cli("bench", "learning", "--recipe", str(path), "--seeds", "0", "--max-steps", "1", "--questions",
                     "3", "--output-dir", str(tmp_path / "run"))  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout)
    for name in ("routing_accuracy", "selection_accuracy"):
        assert 0.0 <= report[f"{name}_before"] <= 1.0 and 0.0 <= report["runs"][0][f"{name}_after"] <= 1.0
        assert report[f"{name}_gain_points_mean"] == report["runs"][0][f"{name}_gain_points"]
    assert report["subagent_tokens_per_query_before"] >= 0.0
    # Toolbox rows carry `answer` and `kind`: the lost-answer rate and each kind's figures, before and after, and
    # both evaluations' trajectories kept for `agentic-grpo show`.
    run = report["runs"][0]
    for figures in (report["kinds_before"], run["kinds_after"]):  # 3 test rows, interleaved: one of each kind
        assert set(figures) == set(recipe["dataset"]["kinds"])
        assert all(f["trajectories"] == 1 and 0.0 <= f["accuracy"] <= 1.0 for f in figures.values())
    assert 0.0 <= report["answer_lost_rate_before"] <= 1.0 and 0.0 <= run["answer_lost_rate_after"] <= 1.0
    for path in (tmp_path / "run-tiny_routing-seed0" / "held_out.trajectories.jsonl",
                 tmp_path / "run-tiny_routing-before-eval.trajectories.jsonl"):  # fmt: skip
        records = [json.loads(line) for line in path.read_text().splitlines()]
        assert len(records) == 3 and all("segments" in r and r["row"]["kind"] for r in records)


def test_only_an_interrupted_run_of_the_same_training_is_resumed(tmp_path):
    from agentic_grpo.benchmarks._stored import STAMP, resumable, training_stamp

    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("max_steps: 4\n")
    run = tmp_path / "run"
    (run / "checkpoint-2").mkdir(parents=True)
    stamp = training_stamp(["train", "--config", str(recipe), "--seed", "0"], str(recipe))
    (run / STAMP).write_text(json.dumps(stamp))
    (run / "run.json").write_text(json.dumps({"status": "running"}))  # killed: never marked otherwise
    assert resumable(str(run), stamp)

    assert not resumable(str(run), training_stamp(["train", "--config", str(recipe), "--seed", "1"], str(recipe)))
    recipe.write_text("max_steps: 8\n")  # the same path, another recipe: its checkpoint is another training's
    assert not resumable(str(run), training_stamp(["train", "--config", str(recipe), "--seed", "0"], str(recipe)))
    recipe.write_text("max_steps: 4\n")
    assert not resumable(str(run), {**stamp, "code": "another"})  # the training code changed since it started
    (run / "run.json").write_text(json.dumps({"status": "completed"}))
    assert not resumable(str(run), stamp)  # finished: a new measurement trains anew
    (run / "run.json").write_text(json.dumps({"status": "failed"}))
    assert resumable(str(run), stamp)
    (run / "checkpoint-2").rmdir()
    assert not resumable(str(run), stamp)  # nothing saved to go on from
    (run / "checkpoint-2").mkdir()
    (run / STAMP).unlink()
    assert not resumable(str(run), stamp)  # a run no benchmark started, or started before stamps


@pytest.mark.integration
def test_an_interrupted_training_run_resumes_from_its_last_checkpoint(tmp_path):
    import yaml

    from agentic_grpo.benchmarks.learning import train
    from agentic_grpo.resources import find_shipped

    recipe = yaml.safe_load(find_shipped("ci_tiny", "recipes", ".yaml").read_text())
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump({**recipe, "save_steps": 1}))
    run = tmp_path / "run"
    train(str(path), 0, str(run), None)
    uninterrupted = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    # As a kill after step 1's checkpoint leaves it: step 2's checkpoint not written, run.json still running.
    shutil.rmtree(run / "checkpoint-2")
    (run / "run.json").write_text(json.dumps({**json.loads((run / "run.json").read_text()), "status": "running"}))

    train(str(path), 0, str(run), None)

    info = json.loads((run / "run.json").read_text())
    assert info["status"] == "completed" and "--resume_from_checkpoint" in info["argv"]
    resumed = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    losses = [(m["step"], m["loss"]) for m in resumed if "loss" in m]
    assert [step for step, _ in losses] == [1, 2]  # step 1 kept, step 2 trained again, from step 1's checkpoint
    assert losses == [(m["step"], m["loss"]) for m in uninterrupted if "loss" in m]
    assert (run / "checkpoint-2").exists()
