"""Asynchronous against synchronous rollouts: seconds per optimizer step and model tokens per second. JSON.

For each tool latency of `--latencies` (the calculator sleeps that long before each call, as a slow tool or API
would), the recipe trains `--steps` steps twice from the same start, same seed, same rows: synchronous (a step
samples, then trains) and with `async_rollouts: true` (the sampler thread rolls out step s+1 while step s trains;
docs/async.md). Each step is timed from the Trainer's `on_step_begin` to `on_step_end`; the first step is left out
of the medians (it warms caches, and an asynchronous run has nothing to overlap with yet). Tokens per second are
the model tokens of the timed steps' trajectories over their seconds. Each run also reports how long the trainer
waited for the sampler (`async/queue_wait`) and the sampler for work (`async/sampler_idle`).

Two processes share the machine's cores here: generation and training both want them, so what overlaps is what
waits (tool calls, the judge), not arithmetic.

    agentic-grpo bench overlap                                   # SmolLM2, the demo's recipe, tools 0/1/5 s
    agentic-grpo bench overlap --smoke --model PATH              # seconds, on a tiny model (the tests)
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import statistics
import sys
import tempfile
from typing import Any

import torch

from agentic_grpo.benchmarks.rollout import sleeping
from agentic_grpo.benchmarks.step import log, parse_training_bench, step_timer, training_bench_parser


def train_once(common: list[str], latency: float, asynchronous: bool) -> dict[str, Any]:
    """One run of the recipe with the sleeping calculator; its step seconds, tokens and waits."""
    from agentic_grpo.train import prepare
    from agentic_grpo.trainer_layers import trainer_class

    prepared = prepare([*common, "--async_rollouts", str(asynchronous).lower()])
    parts = dataclasses.replace(
        prepared.rollout_parts, environment=sleeping(prepared.rollout_parts.environment, latency)
    )
    timer = step_timer()
    trainer = trainer_class(prepared.config, parts)(model=prepared.model_path, reward_funcs=prepared.rewards,
                                                    args=prepared.config, train_dataset=prepared.train,
                                                    rollout_parts=parts, peft_config=prepared.peft_config,
                                                    callbacks=[timer])  # fmt: skip
    with contextlib.redirect_stdout(sys.stderr):  # the Trainer prints its logs; stdout carries only the JSON
        trainer.train()
    steps = [row for row in trainer.state.log_history if "loss" in row]
    tokens = [row["num_tokens"] for row in steps]  # TRL's running count of tokens seen (prompt and completion)
    completion = [row["completions/mean_length"] * prepared.config.num_generations for row in steps]
    timed = timer.seconds[1:] or timer.seconds
    figures = {
        "step_seconds": [round(s, 2) for s in timer.seconds],
        "median_step_seconds": round(statistics.median(timed), 2),
        "completion_tokens_per_s": round(sum(completion[1:] or completion) / sum(timed), 2),
        "tokens_seen": tokens[-1] if tokens else 0,
        "tool_calls_per_trajectory": round(statistics.mean(row["tools/calls_per_trajectory"] for row in steps), 2),
    }
    if asynchronous:
        for name in ("async/queue_wait", "async/sampler_idle", "async/importance_weight/mean"):
            figures[name] = [round(row.get(name, float("nan")), 3) for row in steps]
    return figures


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = training_bench_parser("overlap", __doc__, 4, "training steps per run")
    parser.add_argument("--latencies", type=float, nargs="+", default=[0.0, 1.0, 5.0],
                        help="seconds each tool call sleeps first (default: 0 1 5)")  # fmt: skip
    args, overrides = parse_training_bench(parser, argv)

    from agentic_grpo.resources import find_shipped

    recipe = str(find_shipped(args.recipe, "recipes", ".yaml"))
    runs = []
    with tempfile.TemporaryDirectory(prefix="agentic-grpo-bench-overlap-") as output_dir:
        for latency in args.latencies:
            run: dict[str, Any] = {"tool_seconds": latency}
            for mode, asynchronous in (("sync", False), ("async", True)):
                log(f"tools {latency:g} s, {mode} ...")
                common = ["--config", recipe, "--output_dir", f"{output_dir}/{mode}-{latency:g}",
                          "--max_steps", str(args.steps), "--seed", str(args.seed), "--eval_before_after", "false",
                          "--save_strategy", "no", "--report_to", "none", "--save_trajectories_steps", "0",
                          *([f"--model_name_or_path={args.model}"] if args.model else []), *overrides]  # fmt: skip
                run[mode] = train_once(common, latency, asynchronous)
            run["speedup"] = round(run["sync"]["median_step_seconds"] / run["async"]["median_step_seconds"], 2)
            runs.append(run)
    result = {
        "benchmark": "overlap", "recipe": recipe, "model": args.model or "the recipe's", "steps": args.steps,
        "seed": args.seed, "torch_threads": torch.get_num_threads(), "runs": runs,
        "command": " ".join(["agentic-grpo bench overlap", *argv]),
    }  # fmt: skip
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
