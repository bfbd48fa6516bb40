"""Run by tests/test_turn_credit.py under `accelerate launch` (2 CPU processes): one group of 4 trajectories,
2 on each process; each process writes the turn and token advantages it trains on to OUT/rank{N}.json.

    accelerate launch --config_file accelerate_configs/cpu_2proc.yaml tests/credit_two_processes.py MODEL OUT
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from agentic_grpo.launch import use_cpu_when_distributed_without_gpu


def main(model_dir: str, out: str) -> None:
    use_cpu_when_distributed_without_gpu()
    from tests.credit_support import CASES, build_trainer, rows

    trainer = build_trainer(model_dir, out, "turn", per_device=2, save_trajectories_steps=0)
    rank = trainer.accelerator.process_index
    # The answer the scripts give (1000) is right for three cases: outcome advantages are not 0, so a mix-up of
    # the processes' outcome advantages would show too.
    mine = rows(answer="1000", cases=CASES[2 * rank : 2 * rank + 2])
    inputs = trainer.generate_and_score(mine)
    # The trajectories themselves stay inside the trainer's copies of the rows; their turn advantages are
    # read back from the per-token tensor and the env mask.
    masks = (inputs["tool_mask"] * inputs["completion_mask"]).tolist()
    record = {
        "cases": [row["question"] for row in mine],
        "tokens": inputs["advantages"].tolist(),
        "masks": masks,
        "turn_advantages": [
            [v for v, m, prev in zip(tokens, mask, [0, *mask], strict=False) if m and not prev]
            for tokens, mask in zip(inputs["advantages"].tolist(), masks, strict=True)
        ],
    }
    Path(out, f"rank{rank}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main(*sys.argv[1:3])
