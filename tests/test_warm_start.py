"""The credit benchmark's warm start: worked solutions run as real trajectories, fine-tuned on their written turns."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.helpers import ROOT, run_python


def tiny_credit_recipe(tmp_path, **changes):
    """`credit_demo` (its task, environment, format and rewards) on the tiny CI model, LoRA kept."""
    recipe = yaml.safe_load((ROOT / "recipes" / "credit_demo.yaml").read_text())
    recipe.update(model_name_or_path="tiny-random-llama", output_dir=str(tmp_path / "run"),
                  dataset={**recipe["dataset"], "num_train": 24, "num_test": 4}, max_tokens_per_turn=96,
                  max_completion_length=512, **changes)  # fmt: skip  # the tiny tokenizer's tokens are short
    path = tmp_path / "credit.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


@pytest.fixture
def built(tmp_path):
    from agentic_grpo.run_parts import build_recipe

    return build_recipe(["--config", str(tiny_credit_recipe(tmp_path)), "--output_dir", str(tmp_path / "unused")])


def test_worked_solutions_are_right_paid_trajectories_trained_on_their_written_turns_only(built, tokenizer):
    from agentic_grpo.benchmarks.warm_start import demonstrations, sft_example

    train = list(built.train)
    rows = [row for n in (2, 3) for row in train if len(row["solution"]) == n][::4]  # both shapes of the task
    assert {len(row["solution"]) for row in rows} == {2, 3}
    trajectories = demonstrations(built, tokenizer, rows)
    for row, trajectory in zip(rows, trajectories, strict=True):
        # The recipe's own environment ran the calls: each value came back and was paid on its turn.
        assert [result.output for _, result in trajectory.tool_calls] == row["values"]
        assert trajectory.turn_rewards == [0.5] * len(row["values"]) + [0.0]
        assert trajectory.final_answer == row["answer"]
        example = sft_example(trajectory)
        pairs = zip(example["input_ids"], example["labels"], strict=True)
        trained = tokenizer.decode([token for token, label in pairs if label != -100])
        assert trained.count("Action: calculator") == len(row["solution"])
        assert trained.endswith(row["answer"] + "<|im_end|>")
        for value in row["values"][:-1]:  # an observation the model did not write is never a label
            assert f"Observation: {value}" not in trained and f"Observation: {value}" in trajectory.completion_text
        assert row["question"] not in trained and row["question"] in tokenizer.decode(example["input_ids"])


def test_a_wrong_worked_solution_stops_the_warm_start_and_names_its_question(built, tokenizer):
    from agentic_grpo.benchmarks.warm_start import demonstrations

    rows = list(built.train)[:2]
    wrong = {**rows[1], "solution": ["1 + 1", *rows[1]["solution"][1:]]}  # a first step that pays nothing
    with pytest.raises(ValueError, match="not paid on every call") as raised:
        demonstrations(built, tokenizer, [rows[0], wrong])
    assert rows[1]["question"] in str(raised.value)
    with pytest.raises(ValueError, match="computed .*, not the answer '7'"):
        demonstrations(built, tokenizer, [{**rows[0], "answer": "7"}])
    with pytest.raises(ValueError, match="token budgets"):
        built.rollout_parts.limits.max_tokens_per_turn = 8
        demonstrations(built, tokenizer, rows[:1])
    with pytest.raises(ValueError, match="no `solution` column"):
        demonstrations(built, tokenizer, [{k: v for k, v in rows[0].items() if k != "solution"}])


def test_a_seed_decides_the_questions_solved_and_sampled(tmp_path):
    from agentic_grpo.benchmarks.warm_start import seeded_recipe
    from agentic_grpo.run_parts import build_recipe

    def questions(seed: int, where: str) -> list[str]:
        (tmp_path / where).mkdir()
        recipe = seeded_recipe(tiny_credit_recipe(tmp_path), seed, tmp_path / where)
        built = build_recipe(["--config", str(recipe), "--output_dir", str(tmp_path / "unused")])
        return [row["question"] for row in built.train]

    # Without a fixed train_seed each build draws its own rows (a fresh secret), and two runs would differ.
    assert questions(0, "a") == questions(0, "b") != questions(1, "c")


def test_the_warm_start_trains_a_lora_adapter_the_credit_bench_starts_from(tmp_path):
    from safetensors.torch import load_file

    from agentic_grpo.benchmarks.credit import merged_start

    out = tmp_path / "warm"
    result = run_python(
        "-m", "agentic_grpo.benchmarks.warm_start", "--recipe", str(tiny_credit_recipe(tmp_path)), "--demonstrations",
        "4", "--max-steps", "2", "--batch-size", "2", "--sample-questions", "2", "-k", "2", "--output-dir", str(out),
        timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert report == json.loads((out / "warm_start.json").read_text())
    assert report["demonstrations"] == 4 and report["max_steps"] == 2
    assert report["sampled"]["trajectories"] == 4 and 0 <= report["sampled"]["earn_turn_reward_rate"] <= 1
    weights = load_file(str(out / "adapter" / "adapter_model.safetensors"))
    # LoRA starts with B = 0; trained B is not: the fine-tuning reached the adapter that was saved.
    assert any(name.endswith("lora_B.weight") and tensor.abs().sum() > 0 for name, tensor in weights.items())
    assert (merged_start(out / "adapter", tmp_path / "credit") / "config.json").exists()


def test_the_warm_start_refuses_a_recipe_without_lora_and_bad_counts(tmp_path):
    recipe = tiny_credit_recipe(tmp_path, use_peft=False)
    refused = run_python("-m", "agentic_grpo.benchmarks.warm_start", "--recipe", str(recipe), "--demonstrations", "2",
                         "--max-steps", "1", "--output-dir", str(tmp_path / "w"), timeout=300)  # fmt: skip
    assert refused.returncode != 0 and "use_peft: true" in refused.stderr
    bad = run_python("-m", "agentic_grpo.benchmarks.warm_start", "--max-steps", "0", timeout=120)
    assert bad.returncode == 2 and "--max-steps must be at least 1" in bad.stderr
