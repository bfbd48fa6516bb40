"""The vLLM path, run for real: GRPO steps of a multi-turn tool rollout sampled by a colocated vLLM engine
(vLLM's CPU build, `WITH_VLLM=1 bash scripts/setup.sh`) through TRL's `VLLMGeneration`, one engine per process
(`tests/vllm_colocate_run.py`). What the engine sampled, the log-probs it reported and every weight sync are
recorded around it and checked against what the trainer trained on; each planted bug must stop the run.

Lane `vllm` (`pytest -m vllm`): the README's test command runs it after the default lane. Without vLLM installed
these tests skip, except under CI, where a skip would hide that the lane never ran: they fail there.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import ROOT, require_vllm, run_python, train, write_recipe

pytestmark = [pytest.mark.vllm, pytest.mark.integration]

require_vllm()

# The engine's key/value cache on the CPU backend: a fixed 1 GiB, instead of a share of the memory node that
# depends on what else runs on the machine.
ENGINE_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "PYTHONPATH": str(ROOT)}


@pytest.fixture(scope="module")
def vllm_models(tmp_path_factory) -> dict[str, str]:
    """The tiny random Llama with 32-wide heads (vLLM's CPU attention has no smaller kernel), in fp32 and bf16."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentic_grpo.models import build_tiny_model

    root = tmp_path_factory.mktemp("vllm-models")
    fp32 = build_tiny_model(root / "fp32", head_dim=32)
    bf16 = root / "bf16"
    AutoModelForCausalLM.from_pretrained(fp32, dtype=torch.bfloat16).save_pretrained(bf16)
    AutoTokenizer.from_pretrained(fp32).save_pretrained(bf16)
    return {"float32": fp32, "bfloat16": str(bf16)}


def run(models: dict[str, str], tmp_path: Path, **options: Any) -> dict[str, Any]:
    """`dtype`: the policy's; `checkpoint`: the dtype the checkpoint was saved in (default: the policy's)."""
    dtype = options.setdefault("dtype", "float32")
    checkpoint = models[options.pop("checkpoint", dtype)]
    out = tmp_path / "out"
    result = run_python(ROOT / "tests" / "vllm_colocate_run.py", checkpoint, out, json.dumps(options),
                        timeout=900, **ENGINE_ENV)  # fmt: skip
    assert (out / "result.json").is_file(), result.stdout[-3000:] + result.stderr[-6000:]
    return json.loads((out / "result.json").read_text())


def canary_means(record: dict[str, Any]) -> list[float]:
    return [m["canary/logprob_diff/mean"] for m in record["metrics"] if "canary/logprob_diff/mean" in m]


def check_rollout_is_what_the_engine_sampled(record: dict[str, Any]) -> None:
    """Every model segment is, token for token, what the engine returned for that trajectory at that turn; the
    loss mask is 1 on exactly those tokens; the sampling log-probs handed to TRL are the engine's on them and 0.0 on
    tool tokens. A turn's call holds the trajectories still live at it, in order."""
    for rollout in record["rollouts"]:
        first, last = rollout["engine_calls"]
        calls = record["engine_calls"][first:last]
        segments = rollout["segments"]
        model_turns = [[ids for role, ids in trajectory if role == "model"] for trajectory in segments]
        assert len(calls) == max(map(len, model_turns))
        sampled_logprobs: list[list[list[float]]] = [[] for _ in segments]
        for turn, call in enumerate(calls):
            live = [i for i, turns in enumerate(model_turns) if len(turns) > turn]
            assert [model_turns[i][turn] for i in live] == [output["ids"] for output in call]
            for i, output in zip(live, call, strict=True):
                sampled_logprobs[i].append(output["logprobs"])
        for i, trajectory in enumerate(segments):
            assert rollout["completion_ids"][i] == [t for _, ids in trajectory for t in ids]
            assert rollout["env_mask"][i] == [int(role == "model") for role, ids in trajectory for _ in ids]
            expected, turn = [], 0
            for role, ids in trajectory:
                if role == "model":
                    expected += sampled_logprobs[i][turn]
                    turn += 1
                else:
                    expected += [0.0] * len(ids)
            assert rollout["logprobs"][i] == pytest.approx(expected, abs=1e-6)
            assert any(role == "tool" for role, _ in trajectory)  # a multi-turn tool rollout, tool tokens masked


def test_fp32_steps_train_on_exactly_what_vllm_sampled_with_one_sync_per_rollout(vllm_models, tmp_path):
    # The demo's layout: a checkpoint saved in bf16, a policy trained in fp32 (TRL's default dtype).
    record = run(vllm_models, tmp_path, steps=3, checkpoint="bfloat16")
    assert record["error"] is None, record.get("traceback")
    assert record["dtype"] == record["engine_dtype"] == "torch.float32"  # the engine samples the policy's dtype
    # TRL syncs before each rollout whose optimizer step is new: 3 steps, 3 syncs, every tensor once each.
    assert record["syncs"] == [0, 1, 2]
    assert record["loaded_tensors"] == 3 * record["weights"]
    check_rollout_is_what_the_engine_sampled(record)
    turns = [t for rollout in record["rollouts"] for t in rollout["turns"]]
    assert len(set(turns)) > 1  # trajectories end at different turns
    assert record["base_unchanged"] is False  # full fine-tuning: the weights moved, and vLLM followed them
    means = canary_means(record)
    assert len(means) == 3 and max(means) < 0.005, means


def test_bf16_lora_syncs_the_merged_adapter_without_writing_the_base(vllm_models, tmp_path):
    record = run(vllm_models, tmp_path, dtype="bfloat16", lora=True, steps=3, learning_rate=1e-2)
    assert record["error"] is None, record.get("traceback")
    assert record["dtype"] == record["engine_dtype"] == "torch.bfloat16"
    assert record["syncs"] == [0, 1, 2]
    assert record["loaded_tensors"] == 3 * record["weights"]
    check_rollout_is_what_the_engine_sampled(record)
    assert record["base_unchanged"] is True  # the KL reference: the adapter is merged into new tensors, not the base
    means = canary_means(record)
    assert len(means) == 3 and max(means) < 0.05, means


def test_top_k_and_top_p_compare_the_processed_distributions_without_false_alarm(vllm_models, tmp_path):
    record = run(vllm_models, tmp_path, steps=2, top_k=20, top_p=0.9, importance_sampling_mode="token_truncate")
    assert record["error"] is None, record.get("traceback")
    check_rollout_is_what_the_engine_sampled(record)
    means = canary_means(record)
    assert len(means) == 2 and max(means) < 0.02, means


@pytest.mark.parametrize(
    ("plant", "options"),
    [
        ("skip_sync", dict(steps=3, learning_rate=3e-2)),  # vLLM keeps sampling with the step-0 weights
        ("raw_logprobs", dict(steps=2, top_k=20, importance_sampling_mode="token_truncate")),
        ("unmerged", dict(steps=3, lora=True, learning_rate=3e-2)),  # the adapter never reaches vLLM
    ],
)
def test_a_planted_sync_or_logprob_bug_stops_the_run(vllm_models, tmp_path, plant, options):
    record = run(vllm_models, tmp_path, plant=plant, **options)
    assert record["error"] is not None and record["error"].startswith("CanaryError"), (
        record["error"],
        canary_means(record),
    )
    assert "the sampler and the trainer score the same sampled tokens" in record["error"]


def test_sleep_mode_is_refused_at_start_up_on_a_platform_without_it(tmp_path):
    recipe = write_recipe(tmp_path, model_name_or_path="tiny-random-llama-vllm", use_vllm=True,
                          vllm_enable_sleep_mode=True, vllm_gpu_memory_utilization=0.3)  # fmt: skip
    result = train("--config", str(recipe), **ENGINE_ENV)
    assert result.returncode != 0
    assert "`vllm_enable_sleep_mode: true`, but vLLM on this machine (cpu) has no sleep mode" in result.stderr
    assert not (tmp_path / "out" / "metrics.jsonl").exists()
