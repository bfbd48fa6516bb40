"""Operating a run: exact resume after `kill -9`, atomic checkpoints, adaptive KL, W&B offline, plots.

One uninterrupted 3-step run of the CI model is the reference. Its reward
(`tests.varied_rewards`) differs between samples, so advantages, loss, grad norm and KL
are non-zero and "the resumed run matches" is a real check, not 0 == 0.
"""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from agentic_grpo.kl_control import KL_PRESETS, next_beta
from tests.helpers import ROOT, environment, run_cli, run_python

pytestmark = pytest.mark.integration  # every test reads or makes runs of train.py, each a process of its own

COMPARED = ["loss", "grad_norm", "kl", "kl_coef", "reward", "reward_std", "completions/mean_length"]


def command(*args: str, script: str | None = None) -> list[str]:
    """`train.py ARGS`, or the program `script` standing in for it (`python -c SCRIPT ARGS`)."""
    return [*(["-c", script] if script else [str(ROOT / "train.py")]), *args]


def run(*args: str, script: str | None = None) -> subprocess.CompletedProcess:
    return run_python(*command(*args, script=script))


def metrics(out: Path) -> dict[int, dict]:
    """Step -> the per-step row of metrics.jsonl (the end-of-training summary row has no `loss` key)."""
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r for r in rows if "loss" in r}


def sampled_tokens(out: Path, step: int) -> list[list[int]]:
    records = (out / "trajectories" / f"step_{step:06d}.jsonl").read_text().splitlines()
    return [[t for s in json.loads(r)["segments"] for t in s["token_ids"]] for r in records]


@pytest.fixture(scope="module")
def recipe(tmp_path_factory) -> Path:
    recipe = yaml.safe_load((ROOT / "recipes" / "ci_tiny.yaml").read_text())
    recipe.update(
        max_steps=3, save_steps=1, max_turns=2, max_tokens_per_turn=12, max_completion_length=48,
        learning_rate=5e-3, kl_control={"preset": "tool_use"}, report_to="wandb", wandb_mode="offline",
        rewards=[{"type": "tests.varied_rewards:distinct_characters"}, {"type": "agentic_grpo.rewards.rules:Correctness"}],
        env={"WANDB_PROJECT": "agentic-grpo-tests"},
    )  # fmt: skip
    path = tmp_path_factory.mktemp("recipe") / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


@pytest.fixture(scope="module")
def reference(recipe, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("reference") / "out"
    result = run("--config", str(recipe), "--output_dir", str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    return out


# --- exact resume -------------------------------------------------------------------------


def kill_and_resume(recipe: Path, reference: Path, out: Path, kill_after: int, steps: int) -> None:
    """Start the run, kill -9 it once checkpoint `kill_after` exists (mid-step next), resume with `last`, and check
    that every step after the checkpoint sampled the reference's tokens and logged its numbers."""
    process = subprocess.Popen(  # killed mid-run, so not `run`
        [sys.executable, *command("--config", str(recipe), "--output_dir", str(out))], cwd=ROOT, env=environment(),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        while not (out / f"checkpoint-{kill_after}").exists():  # appears complete: renamed into place
            assert process.poll() is None, f"training ended before checkpoint {kill_after}"
            time.sleep(0.05)
    finally:
        os.killpg(process.pid, signal.SIGKILL)  # mid-step: its rollouts are running
        process.wait()
    last = max(int(p.name.split("-")[1]) for p in out.glob("checkpoint-*"))
    assert last < steps, "the run finished before it was killed"

    result = run("--config", str(recipe), "--output_dir", str(out), "--resume_from_checkpoint", "last")
    assert result.returncode == 0, result.stderr[-3000:]

    state = json.loads((out / f"checkpoint-{steps}" / "trainer_state.json").read_text())
    assert state["global_step"] == steps
    canary = json.loads((out / "run.json").read_text())["resume_canary"]  # checked at the resumed first step
    assert canary["weights"] == "as the interrupted run", canary
    expected, resumed = metrics(reference), metrics(out)
    for step in range(last + 1, steps + 1):
        assert sampled_tokens(out, step) == sampled_tokens(reference, step), f"step {step} sampled other tokens"
        for name in (n for n in COMPARED if n in expected[step]):  # `kl_coef` only with adaptive KL
            assert resumed[step][name] == pytest.approx(expected[step][name], rel=1e-5, abs=1e-8), (step, name)
    assert expected[last + 1]["grad_norm"] > 0 and expected[last + 1]["reward_std"] > 0  # not a vacuous 0 == 0


def test_resume_after_kill_9_continues_exactly_like_an_uninterrupted_run(recipe, reference, tmp_path):
    kill_and_resume(recipe, reference, tmp_path / "out", kill_after=1, steps=3)


@pytest.fixture(scope="module")
def asynchronous(recipe, tmp_path_factory) -> tuple[Path, Path]:
    """The reference recipe with asynchronous rollouts (the sampler a step ahead), and an uninterrupted run of it."""
    root = tmp_path_factory.mktemp("async")
    (root / "recipe.yaml").write_text(yaml.safe_dump({**yaml.safe_load(recipe.read_text()), "async_rollouts": True}))
    result = run("--config", str(root / "recipe.yaml"), "--output_dir", str(root / "reference"))
    assert result.returncode == 0, result.stderr[-3000:]
    return root / "recipe.yaml", root / "reference"


def test_an_asynchronous_run_resumes_after_kill_9_exactly(asynchronous, tmp_path):
    recipe, reference = asynchronous
    assert [metrics(reference)[step]["async/staleness/max"] for step in (1, 2, 3)] == [0, 1, 1]
    kill_and_resume(recipe, reference, tmp_path / "out", kill_after=1, steps=3)
    # step 2's trajectories were sampled before checkpoint 1 was written, with the weights before step 1's update:
    # the checkpoint stored them, and the resumed run trained on them instead of sampling step 2 again
    assert (tmp_path / "out" / "checkpoint-1" / "async_rollouts.pt").is_file()
    assert metrics(tmp_path / "out")[2]["async/staleness/max"] == 1


@pytest.fixture(scope="module")
def short_epochs(tmp_path_factory) -> tuple[Path, Path]:
    """The CI recipe on 3 training rows, one a step: each epoch is 3 steps, drawn in its own order. Its recipe and
    an uninterrupted 5-step run of it."""
    recipe = yaml.safe_load((ROOT / "recipes" / "ci_tiny.yaml").read_text())
    recipe["dataset"]["num_train"] = 3
    recipe.update(max_steps=5, save_steps=1, max_turns=2, max_tokens_per_turn=12, max_completion_length=48,
                  learning_rate=5e-3, rewards=[{"type": "tests.varied_rewards:distinct_characters"}])  # fmt: skip
    root = tmp_path_factory.mktemp("short-epochs")
    (root / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    result = run("--config", str(root / "recipe.yaml"), "--output_dir", str(root / "reference"))
    assert result.returncode == 0, result.stderr[-3000:]
    return root / "recipe.yaml", root / "reference"


def test_resume_after_kill_9_at_an_epoch_end_continues_exactly(short_epochs, tmp_path):
    recipe, reference = short_epochs
    kill_and_resume(recipe, reference, tmp_path / "out", kill_after=3, steps=5)


FAIL_SECOND_SAVE = """
import sys
from agentic_grpo.trainer import AgenticGRPOTrainer
from agentic_grpo.train import main

save_rng_state = AgenticGRPOTrainer._save_rng_state

def failing(self, output_dir):  # the model and optimizer are written; then the disk "fills up"
    if self.state.global_step == 2:
        raise OSError("No space left on device (simulated)")
    return save_rng_state(self, output_dir)

AgenticGRPOTrainer._save_rng_state = failing
sys.exit(main(sys.argv[1:]))
"""


def test_a_save_that_fails_midway_leaves_the_previous_checkpoint_usable(tmp_path):
    out = tmp_path / "out"
    overrides = ["--max_steps", "2", "--save_steps", "1", "--max_turns", "2", "--max_tokens_per_turn", "12"]
    args = ["--config", "recipes/ci_tiny.yaml", "--output_dir", str(out), "--max_completion_length", "48", *overrides]
    failed = run(*args, script=FAIL_SECOND_SAVE)
    assert failed.returncode != 0 and "No space left on device (simulated)" in failed.stderr
    assert not (out / "checkpoint-2").exists()  # no half-written checkpoint under the real name
    assert {p.name for p in (out / "checkpoint-1").iterdir()} >= {
        "model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json",
    }  # fmt: skip
    assert json.loads((out / "run.json").read_text())["status"] == "failed"

    resumed = run(*args, "--resume_from_checkpoint", "last")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert json.loads((out / "checkpoint-2" / "trainer_state.json").read_text())["global_step"] == 2
    assert list(metrics(out)) == [1, 2]  # step 1 from the failed run, step 2 from the resumed one


# --- adaptive KL ---------------------------------------------------------------------------


def test_adaptive_kl_coefficient_is_logged_and_follows_the_measured_kl(reference):
    rows = metrics(reference)
    preset = KL_PRESETS["tool_use"]
    assert rows[1]["kl_coef"] == pytest.approx(0.04)  # the recipe's beta, for the first step
    for step in (1, 2):
        assert rows[step + 1]["kl_coef"] == pytest.approx(next_beta(rows[step]["kl_coef"], rows[step]["kl"], preset))
    assert rows[3]["kl_coef"] != rows[1]["kl_coef"]  # the measured KL is far below target: beta went down


# --- W&B offline ---------------------------------------------------------------------------


def wandb_history(run_dir: Path) -> list[dict]:
    """History rows of an offline run's `.wandb` file (a LevelDB-style log of protobuf records)."""
    from wandb.proto import wandb_internal_pb2

    data = next(run_dir.glob("*.wandb")).read_bytes()
    assert data[:4] == b":W&B"
    position, block, pending, rows = 7, 32768, b"", []
    while position + 7 <= len(data):
        if block - position % block < 7:  # block trailer too short for a header: padding
            position += block - position % block
            continue
        _, length, kind = struct.unpack("<IHB", data[position : position + 7])
        chunk, position = data[position + 7 : position + 7 + length], position + 7 + length
        pending = chunk if kind in (1, 2) else pending + chunk  # FULL/FIRST start a record, MIDDLE/LAST extend it
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            if record.WhichOneof("record_type") == "history":
                rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item})
    return rows


def test_wandb_offline_run_holds_metrics_and_a_trajectory_table(reference):
    runs = list((reference / "wandb").glob("offline-run-*"))
    assert len(runs) == 1  # under output_dir, in offline mode as the recipe asked (the env said disabled)
    history = wandb_history(runs[0])
    kl_coef = [r["train/kl_coef"] for r in history if "train/kl_coef" in r]
    assert kl_coef == pytest.approx([metrics(reference)[s]["kl_coef"] for s in (1, 2, 3)])

    tables = [json.loads(p.read_text()) for p in runs[0].glob("files/media/table/trajectories_*.table.json")]
    assert sorted(t["data"][0][0] for t in tables) == [1, 2, 3]  # one per sampled step, column 0 is the step
    table = next(t for t in tables if t["data"][0][0] == 1)
    assert table["columns"][:2] == ["step", "question"] and "advantage" in table["columns"]
    assert len(table["data"]) == 4  # one question x G=4
    column = dict(zip(table["columns"], table["data"][0], strict=True))
    lines = (reference / "trajectories" / "step_000001.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert column["question"] == records[0]["row"]["question"]
    assert column["advantage"] == pytest.approx(records[0]["advantage"])


# --- plots ---------------------------------------------------------------------------------


def test_run_ends_with_png_curves_and_plot_redraws_them(reference):
    names = {p.name for p in (reference / "plots").glob("*.png")}
    assert {"reward.png", "accuracy.png", "kl.png", "tool_call_rate.png", "trainable_ratio.png"} <= names
    (reference / "plots" / "kl.png").unlink()
    result = run_cli("plot", str(reference))
    assert result.returncode == 0, result.stderr
    assert (reference / "plots" / "kl.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert str(reference / "plots" / "kl.png") in result.stdout


def test_plot_of_a_directory_without_metrics_is_refused(tmp_path):
    result = run_cli("plot", str(tmp_path))
    assert result.returncode == 2 and "metrics.jsonl does not exist" in result.stderr


def test_resume_restoring_callback_states_keeps_the_adaptive_kl_coefficient(recipe, reference, tmp_path):
    out = tmp_path / "out"
    result = run("--config", str(recipe), "--output_dir", str(out), "--max_steps", "2",
                 "--resume_from_checkpoint", str(reference / "checkpoint-1"),
                 "--restore_callback_states_from_checkpoint", "true")  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert metrics(out)[2]["kl_coef"] == pytest.approx(metrics(reference)[2]["kl_coef"], rel=1e-6)


def test_a_resume_into_another_output_dir_trains_on_the_interrupted_runs_rows(tmp_path):
    """Without `train_seed` in the recipe each run draws a secret one; a resume from a checkpoint into another
    output_dir (here from a copy of the checkpoint alone) reads the interrupted run's from the checkpoint."""
    recipe = yaml.safe_load((ROOT / "recipes" / "ci_tiny.yaml").read_text())
    del recipe["dataset"]["train_seed"]
    recipe.update(max_steps=2, save_steps=1, max_turns=2, max_tokens_per_turn=12, max_completion_length=48)
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    first = tmp_path / "first"
    assert run("--config", str(tmp_path / "recipe.yaml"), "--output_dir", str(first)).returncode == 0
    seed = json.loads((first / "run.json").read_text())["dataset"]["train_seed"]
    moved = tmp_path / "elsewhere" / "checkpoint-1"
    import shutil

    shutil.copytree(first / "checkpoint-1", moved)
    second = tmp_path / "second"
    result = run("--config", str(tmp_path / "recipe.yaml"), "--output_dir", str(second),
                 "--resume_from_checkpoint", str(moved))  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    record = json.loads((second / "run.json").read_text())
    assert record["dataset"]["train_seed"] == seed
    assert record["resume_canary"]["rows"] == "as the interrupted run", record["resume_canary"]
    (moved / "run.json").unlink()  # a checkpoint that records no seed, in a directory without a run: refused
    refused = run("--config", str(tmp_path / "recipe.yaml"), "--output_dir", str(tmp_path / "third"),
                  "--resume_from_checkpoint", str(moved))  # fmt: skip
    assert refused.returncode != 0 and "would train on other rows" in refused.stderr, refused.stderr[-2000:]
