"""Where does a training step's memory go? Peak resident memory per phase of a few real steps. Prints JSON.

Builds the run from the recipe exactly as `train` does, wraps the trainer's phases (rollout, scoring,
loss forward, backward, optimizer step) and samples the process's resident set size every 50 ms,
keeping the peak seen inside each phase. Anything after `--` is passed to the recipe as overrides,
so two layouts can be compared on the same seed:

    agentic-grpo bench memory --steps 3
    agentic-grpo bench memory --steps 3 -- --per_device_train_batch_size 8 --gradient_accumulation_steps 1

Resident memory is what the machine must have; CPU tensors freed by PyTorch may stay with the
allocator, so a phase's peak can include what an earlier phase left behind.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

import psutil


class PhasePeaks:
    """The peak resident memory (MB) seen while each named phase ran, from a 50 ms sampler thread."""

    def __init__(self) -> None:
        self.process = psutil.Process()
        self.phase = "start-up"
        self.peaks: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.is_set():
            rss = self.process.memory_info().rss / 2**20
            self.peaks[self.phase] = max(self.peaks.get(self.phase, 0.0), rss)
            time.sleep(0.05)

    def wrap(self, name: str, function: Callable) -> Callable:
        @functools.wraps(function)
        def in_phase(*args: Any, **kwargs: Any) -> Any:
            outer, self.phase = self.phase, name
            try:
                return function(*args, **kwargs)
            finally:
                self.phase = outer

        return in_phase

    def stop(self) -> dict[str, int]:
        self._stop.set()
        self._thread.join()
        return {name: round(peak) for name, peak in self.peaks.items()}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    own, overrides = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    parser = argparse.ArgumentParser(
        prog="agentic-grpo bench memory", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--recipe", default="cpu_demo", help="recipe file or shipped name (default: cpu_demo)")
    parser.add_argument("--steps", type=int, default=3, help="training steps to measure (default: 3)")
    args = parser.parse_args(own)

    from agentic_grpo.resources import find_shipped
    from agentic_grpo.train import prepare
    from agentic_grpo.trainer import AgenticGRPOTrainer

    peaks = PhasePeaks()
    with tempfile.TemporaryDirectory(prefix="agentic-grpo-memory-") as output_dir:
        recipe = str(find_shipped(args.recipe, "recipes", ".yaml"))
        run = prepare(["--config", recipe, *overrides, "--max_steps", str(args.steps), "--output_dir", output_dir,
                       "--save_strategy", "no", "--eval_before_after", "false", "--report_to", "none"])  # fmt: skip
        peaks.phase = "model and trainer set-up"
        trainer = AgenticGRPOTrainer(model=run.model_path, reward_funcs=run.rewards, args=run.config,
                                     train_dataset=run.train, rollout_parts=run.rollout_parts,
                                     peft_config=run.peft_config)  # fmt: skip
        trainer.rollout_func = peaks.wrap("rollout (generation and tools)", trainer.rollout_func)
        trainer._generate_and_score_completions = peaks.wrap(
            "scoring (rewards, old and reference log-probs)", trainer._generate_and_score_completions
        )
        trainer.compute_loss = peaks.wrap("loss forward", trainer.compute_loss)
        trainer.accelerator.backward = peaks.wrap("backward", trainer.accelerator.backward)
        peaks.phase = "optimizer step and logging"
        began = time.time()
        trainer.train()
        seconds = time.time() - began
        steps = [row for row in trainer.state.log_history if "step_time" in row]
    phases = peaks.stop()
    result = {
        "benchmark": "memory",
        "recipe": recipe,
        "overrides": overrides,
        "steps": args.steps,
        "peak_mb": max(phases.values()),
        "peak_mb_by_phase": phases,
        "step_seconds": [round(row["step_time"], 1) for row in steps],
        "train_seconds": round(seconds, 1),
        "command": " ".join(["agentic-grpo bench memory", *argv]),
    }
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
