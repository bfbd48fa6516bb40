"""reasoning-gym as a first-class source: disjoint splits, the task's own verifier as a reward, eval --data."""

from __future__ import annotations

import json

import pytest

from agentic_grpo.cli import main as cli
from agentic_grpo.data import load_task_data
from agentic_grpo.reasoning_gym_tasks import held_out_rows, parse_data_argument, reasoning_gym_splits
from agentic_grpo.rewards.reasoning_gym import TaskScore
from agentic_grpo.trajectory import Segment, Trajectory

SPEC = {"reasoning_gym": "products", "config": {"min_digits": 1, "max_digits": 1}, "num_train": 40, "num_test": 20}


def test_train_and_test_never_share_a_question_even_on_a_tiny_task():
    # 1-digit products have at most 100 distinct questions: overlap would be near-certain without the rule.
    splits = reasoning_gym_splits(**SPEC)
    train, test = {r["question"] for r in splits["train"]}, {r["question"] for r in splits["test"]}
    assert len(splits["train"]) == 40 and len(train) == 40 and test
    assert not train & test


def test_a_recipe_dataset_names_the_task_and_the_split_is_reproducible():
    train, test = load_task_data({**SPEC, "seed": 3, "train_seed": 5})
    again, _ = load_task_data({**SPEC, "seed": 3, "train_seed": 5})
    assert list(train["question"]) == list(again["question"])
    assert set(train.column_names) >= {"question", "answer", "rg_task", "rg_config", "rg_entry"}


def test_an_unknown_dataset_key_or_task_is_refused_with_the_fix():
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['num_rows'\]"):
        load_task_data({"reasoning_gym": "products", "num_rows": 3})
    with pytest.raises(ValueError, match="reasoning-gym task `no_such_task`"):
        load_task_data({"reasoning_gym": "no_such_task"})


def trajectory(answer):
    return Trajectory(prompt="q", segments=[Segment("prompt", [1], "q")], final_answer=answer, turns=1)


def test_the_tasks_own_verifier_is_a_reward():
    [row] = reasoning_gym_splits("products", {"min_digits": 3, "max_digits": 3}, num_train=0, num_test=1)["test"]
    expression = json.loads(row["rg_entry"])["metadata"]["expression"]
    columns = {key: [row[key]] * 4 for key in ("rg_task", "rg_config", "rg_entry")}
    answers = [row["answer"], f"{int(row['answer']):,}", expression, None]
    scores = TaskScore()(None, None, trajectory=[trajectory(a) for a in answers], **columns)
    assert scores == [1.0, 1.0, 0.0, 0.0]


def test_the_data_argument_reads_a_config_and_matches_the_recipes_test_split():
    assert parse_data_argument("reasoning_gym:products?min_digits=3&max_digits=3&seed=2") == (
        "products", {"min_digits": 3, "max_digits": 3}, 2,
    )  # fmt: skip
    rows = held_out_rows("reasoning_gym:products?min_digits=1&max_digits=1", 20)
    assert [r["question"] for r in rows] == [r["question"] for r in reasoning_gym_splits(**SPEC)["test"]]


def test_eval_runs_on_a_reasoning_gym_task(tmp_path, capsys):
    output = tmp_path / "eval.json"
    data = "reasoning_gym:products?min_digits=3&max_digits=3"
    code = cli(["eval", "--model", "tiny-random-llama", "--recipe", "ci_tiny", "--data", data, "--limit", "2",
                "--output", str(output)])  # fmt: skip
    assert code == 0
    metrics = json.loads(output.read_text())
    assert metrics["questions"] == 2
    records = [json.loads(line) for line in output.with_suffix(".trajectories.jsonl").read_text().splitlines()]
    assert records[0]["row"]["question"].startswith("Solve the following multiplication")


def test_eval_data_beyond_the_recipes_test_split_drops_its_training_questions(tmp_path, capsys):
    # 1-digit products: --limit 60 reaches past the recipe's 20 held-out questions into ones it trains on.
    import yaml

    recipe = yaml.safe_load(open("recipes/ci_tiny.yaml"))
    recipe.update(
        dataset={**SPEC, "seed": 0, "train_seed": 0}, rewards=[{"type": "agentic_grpo.rewards.rules:Correctness"}]
    )
    path = tmp_path / "rg.yaml"
    path.write_text(yaml.safe_dump(recipe))
    output = tmp_path / "eval.json"
    code = cli(["eval", "--model", "tiny-random-llama", "--recipe", str(path), "--limit", "60", "--output",
                str(output), "--data", "reasoning_gym:products?min_digits=1&max_digits=1"])  # fmt: skip
    assert code == 0
    trained = {r["question"] for r in reasoning_gym_splits(**SPEC)["train"]}
    records = [json.loads(line) for line in output.with_suffix(".trajectories.jsonl").read_text().splitlines()]
    assert records and not {r["row"]["question"] for r in records} & trained
    assert "are training questions of the recipe" in capsys.readouterr().out
