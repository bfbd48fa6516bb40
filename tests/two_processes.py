"""`accelerate launch` of a test script on 2 CPU processes (gloo), as the scaling docs launch a run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def launch_two_processes(script: str, *args: str) -> subprocess.CompletedProcess:
    """Run `tests/<script>` with `args` under `accelerate_configs/cpu_2proc.yaml`; the result's output is text."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "WANDB_MODE": "disabled"}
    return subprocess.run(
        [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(ROOT / "accelerate_configs" / "cpu_2proc.yaml"),
         str(ROOT / "tests" / script), *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
