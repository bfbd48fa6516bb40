"""A W&B table of sampled trajectories, logged where the trajectory files are written.

The scalar metrics reach W&B through the Trainer's own `WandbCallback`; what it cannot
show is the trajectories themselves. Each sampled step adds a table `trajectories`:
one row per trajectory with the question, the turns, the tool calls and their results,
the rewards and the advantage: the first thing to look at when the reward curve is flat.
Rows come from every process (gathered) and are logged by the main one.
"""

from __future__ import annotations

import json
from typing import Any

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
