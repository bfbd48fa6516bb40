"""Run by tests/test_choice_gradient.py under `accelerate launch` (2 CPU processes): each process holds two of the
four rows, computes the loss with the choice term through the DDP-wrapped model, and writes its own term and the
`tools/choice_probability` it logged (gathered over both processes) to OUT/rank{N}.json.

    accelerate launch --config_file accelerate_configs/cpu_2proc.yaml tests/choice_two_processes.py MODEL OUT
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from agentic_grpo.launch import use_cpu_when_distributed_without_gpu


def main(model_dir: str, out: str) -> None:
    use_cpu_when_distributed_without_gpu()
    from tests.choice_support import choice_rows, choice_trainer, slot_probabilities

    trainer = choice_trainer(model_dir, out, per_device=2, save_trajectories_steps=0)
    rank = trainer.accelerator.process_index
    inputs = trainer.generate_and_score(choice_rows()[2 * rank : 2 * rank + 2])
    wrapped = trainer.accelerator.prepare_model(trainer.model)  # as the training loop wraps it: DDP
    loss = trainer.compute_loss(wrapped, inputs)
    loss.backward()  # DDP reduces the gradients of both processes: a process that skipped the term would hang here
    record = {
        "own": slot_probabilities(trainer, inputs).mean().item(),
        "logged": trainer._metrics["train"]["tools/choice_probability"][-1],
        "wrapped": type(wrapped).__name__,
    }
    Path(out, f"rank{rank}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main(*sys.argv[1:3])
