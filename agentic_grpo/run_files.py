"""The files a run leaves in its output directory, and what they mean.

- `run.json`: the recipe and the run's status, `running` until training ends, then
  `completed` or `failed`: a directory is never mistaken for a finished run; `dataset` is the
  recipe's data spec as loaded, with the training seed drawn for the run (`data.with_training_seed`).
- `metrics.jsonl`: one JSON object per logging step (the same numbers as W&B).
- `trajectories/step_NNNNNN.jsonl`: every trajectory of sampled steps, segments, tool
  calls, rewards and advantages included (read them with `agentic-grpo show`).

Checkpoints are the Trainer's own `checkpoint-N/` directories.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from agentic_grpo.trajectory import Trajectory, plain_columns


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class RunFilesCallback(TrainerCallback):
    """Writes `metrics.jsonl` (one line per logged step; the last step is always logged) and adds `time/step` to
    the metrics; the Trainer's end-of-training summary (`train_runtime`, `train_loss`, ...) goes to `run.json` as
    `train_summary`."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer
        self._step_start: float | None = None

    def on_step_begin(self, args, state, control, **kwargs):
        self._step_start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        if self._step_start is not None:
            self.trainer.log_metrics({"time/step": time.perf_counter() - self._step_start}, mode="train")
        if state.max_steps and state.global_step >= state.max_steps:
            control.should_log = True  # a run's last step is in metrics.jsonl whatever `logging_steps` is

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        record = {"step": state.global_step, "epoch": state.epoch, **{k: _jsonable(v) for k, v in logs.items()}}
        if "train_runtime" in logs:  # the summary of the whole run, which the Trainer logs at the last step's number
            write_run_status(args.output_dir, None, train_summary=record)
            return
        path = Path(args.output_dir) / "metrics.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as f:
            f.write(json.dumps(record) + "\n")

    @staticmethod
    def write_trajectories(
        output_dir: str, step: int, records: list[dict[str, Any]], accelerator: Any, append: bool = False
    ) -> Path:
        """Write (or, with `append`, add to) the step's file; returns its path."""
        folder = Path(output_dir) / "trajectories"
        folder.mkdir(parents=True, exist_ok=True)
        suffix = f".rank{accelerator.process_index}" if accelerator.num_processes > 1 else ""
        path = folder / f"step_{step:06d}{suffix}.jsonl"
        with path.open("a" if append else "w") as f:
            for record in records:
                f.write(json.dumps(record, default=str) + "\n")
        return path


def trajectory_records(
    inputs: list[dict[str, Any]], advantages: Any | None, error: str | None = None
) -> list[dict[str, Any]] | None:
    """One record per row of a step for `trajectories/step_N.jsonl`: the trajectory, the row's plain columns,
    its reward and advantage (or the `error` that stopped scoring). None when a rollout itself failed."""
    records = []
    for i, row in enumerate(inputs):
        trajectory = row.get("trajectory")
        if not isinstance(trajectory, Trajectory):  # the rollout itself failed: nothing to write
            return None
        record = trajectory.to_dict()
        record["row"] = plain_columns(row)
        if trajectory.reward is not None:
            record["reward"] = trajectory.reward
        if advantages is not None and i < len(advantages):
            record["advantage"] = float(advantages[i])
        if error is not None:
            record["error"] = error
        records.append(record)
    return records


def write_run_status(output_dir: str | Path, status: str | None, **extra: Any) -> None:
    """Create or update `run.json` (atomically: a reader never sees half a file); `status` None keeps it."""
    path = Path(output_dir) / "run.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    data = json.loads(path.read_text()) if path.exists() else {}
    data.update(updated=time.strftime("%Y-%m-%dT%H:%M:%S"), **extra)
    if status is not None:
        data["status"] = status
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str))
    tmp.replace(path)


RUN_FILES = ("run.json", "metrics.jsonl", "held_out.json", "trajectories", "plots", "wandb", "partial-checkpoints")


def previous_run(output_dir: str | Path) -> str | None:
    """A description of the run already in `output_dir`, or None when it holds none."""
    folder = Path(output_dir)
    if not folder.is_dir():
        return None
    found = [name for name in RUN_FILES if (folder / name).exists()]
    found += sorted(p.name for p in folder.glob("checkpoint-*"))
    if not found:
        return None
    status = "unknown status"
    if (folder / "run.json").is_file():
        try:
            status = f"status {json.loads((folder / 'run.json').read_text()).get('status', 'unknown')}"
        except (OSError, ValueError):
            pass
    return f"{status}; holds {', '.join(found[:6])}{', ...' if len(found) > 6 else ''}"


# What `trainer.save_model` writes into `output_dir` itself (a full model or a LoRA adapter, its config,
# tokenizer and model card): removed with an earlier run's files only when `run.json` marks the folder as one.
MODEL_FILES = (
    "model.safetensors", "model.safetensors.index.json", "adapter_model.safetensors", "adapter_config.json",
    "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
    "chat_template.jinja", "training_args.bin", "README.md",
)  # fmt: skip


def clear_previous_run(output_dir: str | Path) -> None:
    """Delete the files of an earlier run (what `previous_run` finds, and the model it saved), nothing else."""
    import shutil

    folder = Path(output_dir)
    paths = [folder / name for name in RUN_FILES] + list(folder.glob("checkpoint-*"))
    if (folder / "run.json").is_file():
        paths += [folder / name for name in MODEL_FILES] + list(folder.glob("model-*-of-*.safetensors"))
    for path in paths:
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()


def trim_metrics_after(output_dir: str | Path, step: int) -> int:
    """Drop `metrics.jsonl` lines logged after `step` (a resumed run logs those steps again); returns how many."""
    path = Path(output_dir) / "metrics.jsonl"
    if not path.is_file():
        return 0
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    kept = [line for line in lines if json.loads(line).get("step", 0) <= step]
    if len(kept) != len(lines):
        tmp = path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(line + "\n" for line in kept))
        tmp.replace(path)
    return len(lines) - len(kept)


# --- wandb table ----------------------------------------------------------------------------------
# A W&B table of sampled trajectories, logged where the trajectory files are written.
#
# The scalar metrics reach W&B through the Trainer's own `WandbCallback`; what it cannot
# show is the trajectories themselves. Each sampled step adds a table `trajectories`:
# one row per trajectory with the question, the turns, the tool calls and their results,
# the rewards and the advantage: the first thing to look at when the reward curve is flat.
# Rows come from every process (gathered) and are logged by the main one.

COLUMNS = [
    "step", "question", "answer", "completion", "turns", "tool_calls", "final_answer", "finish_reason", "rewards",
    "reward", "advantage",
]  # fmt: skip
MAX_TEXT = 4000  # characters of completion text per cell: W&B tables are for reading, the jsonl keeps everything


def wandb_reporting(args: Any) -> bool:
    """True when the run reports to W&B (same answer on every process, so gathers stay collective)."""
    return "wandb" in (args.report_to or []) and args.wandb_mode != "disabled"


def table_row(step: int, record: dict[str, Any]) -> list[Any]:
    """One row of the table from a trajectory record (`Trajectory.to_dict()` plus rewards and advantage)."""
    row = record.get("row") or {}
    completion = "".join(s["text"] for s in record["segments"] if s["role"] != "prompt")
    calls = [
        f"{c['call']['name']}({json.dumps(c['call']['arguments'], default=str)}) -> "
        + str(c["result"].get("output", ""))[:200]
        for c in record.get("tool_calls", [])
    ]
    return [
        step,
        str(row.get("question", "")),
        str(row.get("answer", "")),
        completion[:MAX_TEXT],
        record.get("turns"),
        "\n".join(calls),
        record.get("final_answer"),
        record.get("finish_reason"),
        json.dumps(record.get("rewards") or {}),
        record.get("reward"),
        record.get("advantage"),
    ]


def log_trajectory_table(step: int, records: list[dict[str, Any]], accelerator: Any) -> None:
    """Gather this step's rows from all processes; the main process logs them as `trajectories`."""
    from accelerate.utils import gather_object

    rows = [table_row(step, r) for r in records]
    if accelerator.num_processes > 1:
        rows = gather_object(rows)
    if not accelerator.is_main_process:
        return
    import wandb

    if wandb.run is None:  # W&B not initialised (e.g. evaluation outside `train`)
        return
    wandb.run.log({"trajectories": wandb.Table(columns=COLUMNS, data=rows), "train/global_step": step})
