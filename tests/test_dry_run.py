"""`agentic-grpo train --dry-run`: every shipped GPU recipe fits the card it names, a recipe that cannot fit is refused
naming its biggest part, and the meta-device models have the parameter counts of the real ones."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import yaml

from agentic_grpo.dry_run import documented_accelerate_config, dry_run
from agentic_grpo.memory_estimate import GIB, Launch, ModelFacts, estimate, launch_from_accelerate_config, model_facts
from agentic_grpo.models import SMOLLM2_ALIAS, TINY_ALIAS, TINY_VLLM_ALIAS
from agentic_grpo.resources import find_shipped, shipped_dir, shipped_names
from agentic_grpo.train import main as train

GPU_RECIPES = [
    name
    for name in shipped_names("recipes", ".yaml")
    if yaml.safe_load((shipped_dir("recipes") / f"{name}.yaml").read_text()).get("model_name_or_path")
    not in (SMOLLM2_ALIAS, TINY_ALIAS, TINY_VLLM_ALIAS)
]


def test_the_gpu_recipes_are_found():
    assert {"artist_math_qwen7b", "artist_math_qwen7b_full", "function_calling_qwen7b"} <= set(GPU_RECIPES)


@pytest.mark.parametrize("recipe", GPU_RECIPES)
def test_every_shipped_gpu_recipe_dry_runs_and_fits_its_card(recipe, tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert train(["--config", recipe, "--dry-run", "--output_dir", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert f"Dry run of recipe {recipe}" in out and "no weights allocated" in out
    for part in ("weights", "optimizer state", "activations", "logits", "gradients", "CUDA context"):
        assert f"\n  {part} " in out, part
    assert "of 80 GB: fits" in out
    assert not run_dir.exists()  # a dry run writes nothing


def test_the_full_fine_tuning_recipe_is_estimated_on_the_launch_its_comments_document():
    documented = documented_accelerate_config("artist_math_qwen7b_full")
    assert documented == "deepspeed_zero3"  # `agentic-grpo train --accelerate_config deepspeed_zero3 ...`
    launch = launch_from_accelerate_config(find_shipped(documented, "accelerate_configs", ".yaml"))
    assert (launch.processes, launch.strategy, launch.offload_optimizer) == (8, "zero3", False)
    single = documented_accelerate_config("artist_math_qwen7b")
    assert launch_from_accelerate_config(find_shipped(single, "accelerate_configs", ".yaml")).processes == 1
    assert launch_from_accelerate_config(find_shipped("fsdp", "accelerate_configs", ".yaml"), 4).processes == 4


@pytest.mark.parametrize(
    ("overrides", "biggest", "advice"),
    [
        (["--config", "artist_math_qwen7b", "--per_device_train_batch_size", "256"], "activations",
         "lower `per_device_train_batch_size`"),
        (["--config", "artist_math_qwen7b_full", "--accelerate_config", "single_gpu"], "optimizer state",
         "`use_peft: true`"),
    ],
    ids=["batch-256", "full-7b-unsharded"],
)  # fmt: skip
def test_a_recipe_that_cannot_fit_its_card_is_refused_naming_its_biggest_part(overrides, biggest, advice, capsys):
    assert train([*overrides, "--dry-run"]) == 1
    captured = capsys.readouterr()
    assert "does NOT fit" in captured.out
    error = captured.err
    assert error.startswith("error: recipe `") and "does not fit one 80 GB GPU" in error
    assert f"The biggest part is {biggest} (" in error and advice in error


def test_the_7b_shape_has_the_real_models_parameters_and_weighs_them_in_bf16():
    result = dry_run(["--config", "artist_math_qwen7b", "--dry-run"])
    assert result.facts.parameters == pytest.approx(7.62e9, rel=0.005)  # Qwen2.5-7B: 7.615e9
    assert result.estimate.part("weights").bytes == pytest.approx(7.6e9 * 2, rel=0.02)
    assert result.facts.trainable == pytest.approx(80.7e6, rel=0.01)  # r=32 on the 7 projections of 28 layers
    assert result.facts.trainable_dtype == "float32"  # PEFT upcasts the adapter outside ZeRO-3
    small = model_facts("Qwen/Qwen2.5-1.5B-Instruct", "bfloat16")
    assert small.parameters == pytest.approx(1.54e9, rel=0.005)  # tied embeddings counted once
    assert (small.hidden, small.layers, small.kv_dim, small.vocab) == (1536, 28, 2 * 128, 151936)


def test_an_unknown_model_with_no_config_is_refused_naming_the_shipped_shapes(capsys):
    assert train(["--config", "artist_math_qwen7b", "--model_name_or_path", "Qwen/No-Such-Model", "--dry-run"]) == 2
    assert "no shipped shape: shipped shapes are Qwen/Qwen2.5-1.5B-Instruct" in capsys.readouterr().err


def _facts(**changes) -> ModelFacts:
    values = dict(name="m", source="test", dtype="bfloat16", parameters=10**9, trainable=10**9,
                  trainable_dtype="bfloat16", linear_parameters=8 * 10**8, layer_parameters=3 * 10**7,
                  head_parameters=10**8, hidden=2048, layers=24, kv_dim=256, intermediate=8192, vocab=32000)  # fmt: skip
    return ModelFacts(**{**values, **changes})


def _config(**changes) -> SimpleNamespace:
    values = dict(beta=0.04, per_device_train_batch_size=8, steps_per_generation=1, max_completion_length=1024,
                  gradient_checkpointing=True, use_vllm=True, vllm_mode="colocate", vllm_gpu_memory_utilization=0.3,
                  vllm_enable_sleep_mode=True, ds3_gather_for_generation=True)  # fmt: skip
    return SimpleNamespace(**{**values, **changes})


def test_the_phases_vllm_sleep_mode_the_reference_and_sharding():
    asleep = estimate(_config(), _facts(), Launch(), 80, 512, None)
    share = 0.3 * 80 * GIB
    assert asleep.part("vLLM (colocate)").phase == "rollout"
    assert asleep.phase_bytes("rollout") - asleep.phase_bytes("training") > share / 2
    awake = estimate(_config(vllm_enable_sleep_mode=False), _facts(), Launch(), 80, 512, None)
    assert awake.phase_bytes("training") == pytest.approx(asleep.phase_bytes("training") + share)
    # Full fine-tuning keeps a reference copy; beta 0 and LoRA do not.
    assert asleep.part("reference model").bytes == 2 * 10**9
    names = {p.name for p in estimate(_config(beta=0.0), _facts(), Launch(), 80, 512, None).parts}
    assert "reference model" not in names
    lora = _facts(trainable=10**7, trainable_dtype="float32")
    assert "reference model" not in {p.name for p in estimate(_config(), lora, Launch(), 80, 512, None).parts}
    # ZeRO-3 shards weights, gradients, the fp32 master and AdamW states; HF generate then gathers the whole model.
    zero3 = estimate(_config(use_vllm=False), _facts(), Launch(4, "zero3"), 80, 512, None)
    assert zero3.part("weights").bytes == 2 * 10**9 / 4
    assert zero3.part("optimizer state").bytes == 12 * 10**9 / 4
    assert zero3.part("gathered weights (generate)").bytes == pytest.approx(2 * 10**9 * 3 / 4)
    # Without gradient checkpointing, every layer keeps its activations.
    full = estimate(_config(gradient_checkpointing=False), _facts(), Launch(), 80, 512, None)
    assert full.part("activations").bytes > 5 * asleep.part("activations").bytes


def test_vllm_whose_share_cannot_hold_the_weights_is_refused():
    result = estimate(_config(vllm_gpu_memory_utilization=0.02), _facts(), Launch(), 80, 512, None)
    assert not result.fits and "raise vllm_gpu_memory_utilization" in result.blockers[0]


def test_help_lists_the_dry_run(capsys):
    assert train(["--help"], prog="agentic-grpo train") == 0
    assert "--dry-run" in capsys.readouterr().out
