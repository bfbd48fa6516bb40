"""`scripts/gpu_check.sh --tiny`: the GPU check's whole code path on CPU, tiny shapes, with the packages the GPU
machine lacks hidden (trl, datasets, wandb, openai, reasoning-gym, gguf, math-verify), as they are there.

The hiding is a `sitecustomize` on the child's path that wraps every import finder so that those names are not
found: `import trl` fails and `importlib.util.find_spec("trl")` is None, as on a machine without trl (a None in
`sys.modules` would instead make `find_spec` raise, which transformers' availability checks do not expect).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT, environment, run_process

pytestmark = pytest.mark.integration  # the check's shell script, in a process of its own

HIDDEN = ("trl", "datasets", "wandb", "openai", "reasoning_gym", "gguf", "math_verify")
SITECUSTOMIZE = f"""
import sys

HIDDEN = {HIDDEN!r}


class Hiding:
    def __init__(self, finder):
        self.finder = finder

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in HIDDEN:
            return None
        find = getattr(self.finder, "find_spec", None)
        return find(name, path, target) if find is not None else None

    def __getattr__(self, name):
        return getattr(self.finder, name)


sys.meta_path[:] = [Hiding(finder) for finder in sys.meta_path]
"""


def without_hidden_packages(folder: Path, **extra: str) -> dict[str, str]:
    (folder / "sitecustomize.py").write_text(SITECUSTOMIZE)
    return environment(PYTHONPATH=str(folder), PYTHON=sys.executable, **extra)


@pytest.fixture(scope="module")
def check(tmp_path_factory) -> tuple[dict, str, Path]:
    folder = tmp_path_factory.mktemp("gpu-check")
    out = folder / "gpu.json"
    result = run_process("bash", ROOT / "scripts" / "gpu_check.sh", "--tiny", "--out", out,
                         env=without_hidden_packages(folder), timeout=600)  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(out.read_text()), result.stdout, folder


def test_the_hidden_packages_cannot_be_imported(check):
    _, _, folder = check
    probe = (
        "import importlib.util, sys; print([importlib.util.find_spec(n) is None for n in sys.argv[1:]]); import trl"
    )
    result = run_process(sys.executable, "-c", probe, *HIDDEN, env=without_hidden_packages(folder))
    assert result.stdout.strip() == str([True] * len(HIDDEN))
    assert "ModuleNotFoundError: No module named 'trl'" in result.stderr


def test_the_check_runs_every_phase_and_prints_what_it_writes(check):
    report, stdout, _ = check
    assert json.loads(stdout) == report
    assert report["benchmark"] == "gpu" and report["mode"] == "tiny" and report["complete"] is True
    assert report["skipped"] == [] and report["imported_absent_packages"] == []
    for key in ("device", "torch", "transformers", "peft", "accelerate", "memory_measure", "seconds"):
        assert report[key], key
    assert sorted(report["phases"]) == ["decode", "fp32_identity", "full", "lora"]


@pytest.mark.parametrize("phase", ["lora", "full"])
def test_each_grpo_phase_reports_memory_time_and_both_rollouts(check, phase):
    result = check[0]["phases"][phase]
    assert "error" not in result
    assert result["gradient_checkpointing"] is (phase == "full")
    assert len(result["steps"]) == 2 and len(result["step_seconds"]) == 2
    assert result["peak_memory_gb"] > 0 and result["step_seconds_after_first"] > 0
    rates = result["rollout_tokens_per_s"]
    assert rates["ours"] > 0 and rates["plain_generate"] > 0 and rates["ours_over_plain"] > 0
    for step in result["steps"]:
        rollout = step["rollout"]
        assert rollout["model_tokens"] > 0 and rollout["turns_max"] >= 2, "multi-turn trajectories"
        assert step["train_seconds"] > 0 and step["loss"] == step["loss"], "a finite loss"  # NaN != NaN
    assert result["trainable_parameters_m"] > 0


def test_fp32_tokens_are_the_same_with_a_shrinking_batch_a_full_batch_and_whole_reads(check):
    identity = check[0]["phases"]["fp32_identity"]
    assert (
        identity["rollout"]["turns_max"] >= 2 and identity["rollout"]["turns_min"] < identity["rollout"]["turns_max"]
    )
    for comparison in ("shrinking_vs_full_batch", "kept_keys_vs_whole_read"):
        same = {"same_tokens": True, "trajectories_differing": 0, "first_differing_token_of": [],
                "same_generator_state": True}  # fmt: skip
        assert identity[comparison] == same, comparison


@pytest.mark.parametrize("phase", ["lora", "full"])
def test_bf16_sampler_and_trainer_logprobs_agree_to_rounding(check, phase):
    """The tolerances of tests/test_kv_reuse_bf16.py: the training forward reads what the sampler sampled."""
    gap = check[0]["phases"][phase]["logprob_gap"]
    assert gap["tokens"] > 0
    assert gap["mean"] < 0.02 and gap["max"] < 0.1 and gap["share_over_0.5"] == 0.0, gap


def test_the_decode_phase_times_the_plain_model_and_the_peft_wrapper_with_and_without_adapters(check):
    decode = check[0]["phases"]["decode"]
    assert "error" not in decode
    for variant in ("plain", "peft_lora", "peft_lora_disabled"):
        # A timed difference (steps minus prefill): its sign on a loaded CPU is noise, so only its presence is checked.
        assert math.isfinite(decode[variant]["wall_ms_per_step"]), variant
    assert decode["lora_over_plain"] == round(
        decode["peft_lora"]["wall_ms_per_step"] / decode["plain"]["wall_ms_per_step"], 2
    )
    assert decode["batch"] == 8 and decode["steps"] == 4, "the tiny plan's G x questions rows"


TRAINER_CHECK = ROOT / "scripts" / "gpu_trainer_check.sh"


def test_the_trainer_check_refuses_a_machine_without_cuda_before_running_anything(tmp_path):
    result = run_process("bash", TRAINER_CHECK, tmp_path / "out", env=environment(PYTHON=sys.executable), timeout=300)
    assert result.returncode == 1 and "no CUDA GPU" in result.stdout, result.stdout + result.stderr
    assert not (tmp_path / "out" / "work").exists()


def test_the_trainer_check_explains_itself_and_names_an_unknown_argument(tmp_path):
    shown = run_process("bash", TRAINER_CHECK, "--help", timeout=60)
    assert shown.returncode == 0 and "OUT_DIR [--wheels DIR]" in shown.stdout
    refused = run_process("bash", TRAINER_CHECK, tmp_path / "out", "--stpes", "2", timeout=60)
    assert refused.returncode == 2 and "unknown argument --stpes" in refused.stderr
