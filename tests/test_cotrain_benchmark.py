"""The co-training benchmark runs both arms end to end on the tiny model (a one-step smoke run) and evaluates each
run with the sub-agent adapters it saved."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from agentic_grpo.benchmarks.cotrain import arm_recipe
from tests.helpers import ROOT, run_cli


def tiny_recipe(path: Path) -> Path:
    recipe = yaml.safe_load((ROOT / "recipes" / "cpu_cotrain.yaml").read_text())
    recipe.update(
        model_name_or_path="tiny-random-llama", dataset={**recipe["dataset"], "num_train": 16, "num_test": 4},
        num_generations=2, per_device_train_batch_size=2, gradient_accumulation_steps=1, max_turns=1,
        max_tokens_per_turn=8, max_completion_length=32, save_strategy="no", save_trajectories_steps=0,
        eval_before_after=False, lora_target_modules=["q_proj", "v_proj"], lora_r=2, lora_alpha=4,
    )  # fmt: skip
    recipe["subagents"][0].update(max_turns=1, max_tokens_per_turn=8, max_completion_length=16)
    path.write_text(yaml.safe_dump(recipe))
    return path


def test_the_frozen_arm_is_the_same_recipe_with_no_sub_agent_trained():
    recipe = yaml.safe_load((ROOT / "recipes" / "cpu_cotrain.yaml").read_text())
    frozen = arm_recipe(recipe, "frozen")
    assert arm_recipe(recipe, "cotrain") == recipe
    assert all("train" not in e and "learning_rate" not in e for e in frozen["subagents"])
    assert recipe["experimental"] == {"cotrain_subagents": True} and "experimental" not in frozen
    del frozen["subagents"], recipe["subagents"], recipe["experimental"]
    assert frozen == recipe
    # Other experiments of the recipe stay on in both arms.
    spread = {**recipe, "subagents": [{"name": "x", "train": True}],
              "experimental": {"cotrain_subagents": True, "spread_first_action": True}}  # fmt: skip
    assert arm_recipe(spread, "frozen")["experimental"] == {"spread_first_action": True}


@pytest.mark.integration
def test_one_step_smoke_run_of_both_arms_prints_strict_accuracies(tmp_path):
    recipe = tiny_recipe(tmp_path / "tiny_cotrain.yaml")
    result = run_cli("bench", "cotrain", "--recipe", str(recipe), "--seeds", "0", "--max-steps", "1", "--questions",
                     "2", "--output-dir", str(tmp_path / "run"), timeout=900)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert report["scoring"].startswith("strict") and report["seeds"] == [0]
    for arm in ("cotrain", "frozen"):
        run = report[arm]["runs"][0]
        assert 0.0 <= run["accuracy"] <= 1.0 and run["train_peak_memory_mb"] > 0
        assert (Path(run["output_dir"]) / "calculator" / "adapter_model.safetensors").exists()

    # The evaluation of a run uses the sub-agent adapter that run saved, not a new one.
    from agentic_grpo.evaluate import load_policy_for
    from agentic_grpo.run_parts import build_recipe

    out = Path(report["cotrain"]["runs"][0]["output_dir"])
    built = build_recipe(["--config", str(tmp_path / "run-tiny_cotrain-cotrain.yaml"), "--output_dir", str(out)])
    model, _ = load_policy_for(str(out), built.rollout_parts)
    saved = load_file(out / "calculator" / "adapter_model.safetensors")
    loaded = {n: p for n, p in model.named_parameters() if ".calculator." in n}
    assert saved and len(loaded) == len(saved)
    for name, tensor in saved.items():
        key = name.replace(".weight", ".calculator.weight")
        assert torch.equal(loaded[key], tensor), name
