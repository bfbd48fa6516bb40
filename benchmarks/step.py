"""What does a training step cost around TRL's loss, against plain TRL `GRPOTrainer` on identical rollouts? JSON.

The rollouts are generated once, before anything is timed: the recipe's first `--steps` training questions,
G trajectories each, with the project's `RolloutManager` on the untrained policy. Then two trainers, built
alike from the recipe (same model, LoRA, optimizer, seed, data and rewards), train `--steps` steps on them:

- `ours`: `AgenticGRPOTrainer`, whose rollout manager replays the recorded trajectories;
- `trl`: plain TRL `GRPOTrainer` with a `rollout_func` that returns the same token ids, loss mask and
  trajectories (the recipe's rewards read them as they do in ours).

So neither step generates: what is timed is everything around TRL's loss (scoring, advantages, the old and
reference log-probs, forward and backward, the optimizer, logging, and in ours the per-turn credit, the tool
and trajectory metrics and the trajectory files). Each step is timed from the Trainer's `on_step_begin` to
`on_step_end`; the first step (warm-up) is left out of the medians. Both runs see the same data in the
same order, so their losses must agree: `same_losses` says whether they did.

    agentic-grpo bench step                                   # SmolLM2, the demo's recipe, 6 steps
    agentic-grpo bench step --smoke --model PATH              # seconds, on a tiny model (the tests)
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import json
import statistics
import sys
import tempfile
import time
from typing import Any

import torch


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def question_of(prompt: list[dict[str, Any]]) -> str:
    """The question of a conversational prompt (its last user turn): the key the recorded rollouts are kept by."""
    return next(m["content"] for m in reversed(prompt) if m["role"] == "user")


def record(prepared: Any, model_path: str, rows: list[dict[str, Any]], group: int, seed: int) -> dict[str, list]:
    """G trajectories per question, sampled once by the untrained policy with the recipe's settings."""
    from agentic_grpo.backends import TransformersBackend
    from agentic_grpo.benchmarks.rollout import sampling
    from agentic_grpo.evaluate import load_policy

    model, tokenizer = load_policy(model_path)
    model.eval()
    parts = prepared.rollout_parts
    generation_config, eos_ids = sampling(model, tokenizer, prepared.config)
    backend = TransformersBackend(model, tokenizer, generation_config, eos_ids)
    pool = parts.sandbox_pool(rank=0)  # None unless the environment runs code (the toolbox's `python`)
    manager = parts.rollout_manager(tokenizer, pool)
    repeated = [row for row in rows for _ in range(group)]
    torch.manual_seed(seed)
    try:
        trajectories, _ = manager.rollout([row["prompt"] for row in repeated], repeated, backend)
    finally:
        manager.close()
        if pool is not None:
            pool.close()
    recorded: dict[str, list] = {}
    for row, trajectory in zip(repeated, trajectories, strict=True):
        recorded.setdefault(question_of(row["prompt"]), []).append(trajectory)
    return recorded


class Replay:
    """Hands out copies of the recorded trajectories of each question, in recorded order."""

    def __init__(self, recorded: dict[str, list]) -> None:
        self.recorded = recorded
        self.handed: dict[str, int] = {}

    def next_for(self, prompt: list[dict[str, Any]]) -> Any:
        question = question_of(prompt)
        index = self.handed.get(question, 0)
        self.handed[question] = index + 1
        group = self.recorded[question]
        return copy.deepcopy(group[index % len(group)])

    # the `RolloutManager` interface our trainer calls
    def rollout(
        self, prompts: list[Any], rows: list[dict[str, Any]], backend: Any, first_actions: Any = None
    ) -> tuple[list, Any]:
        from agentic_grpo.rollout import RolloutStats

        return [self.next_for(prompt) for prompt in prompts], RolloutStats()

    def close(self) -> None:
        pass


def step_timer() -> Any:
    """A Trainer callback that keeps each step's wall seconds in `.seconds`."""
    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):
        def __init__(self) -> None:
            self.seconds: list[float] = []
            self._start = 0.0

        def on_step_begin(self, args, state, control, **kwargs):
            self._start = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            self.seconds.append(time.perf_counter() - self._start)

    return StepTimer()


def train_ours(prepared: Any, model_path: str, dataset: Any, recorded: dict[str, list]) -> tuple[list, list]:
    from agentic_grpo.trainer_layers import trainer_class

    timer = step_timer()
    trainer = trainer_class(prepared.config, prepared.rollout_parts)(model=model_path, reward_funcs=prepared.rewards, args=prepared.config,
                                 train_dataset=dataset, rollout_parts=prepared.rollout_parts,
                                 peft_config=prepared.peft_config, callbacks=[timer])  # fmt: skip
    trainer.rollout_manager = Replay(recorded)
    trainer.train()
    return timer.seconds, [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


def train_trl(prepared: Any, model_path: str, dataset: Any, recorded: dict[str, list]) -> tuple[list, list]:
    """Plain TRL on the same rollouts: our config's TRL fields, the recipe's rewards, a replaying `rollout_func`."""
    from trl import GRPOConfig, GRPOTrainer

    from agentic_grpo.trajectory import masked_loss_mask

    ours = prepared.config
    fields = {f.name: getattr(ours, f.name) for f in dataclasses.fields(GRPOConfig) if f.init}
    # Ours masks cut trajectories by finish reason inside `env_mask` (below) and turns TRL's own test off.
    # `generation_batch_size` is derived from `steps_per_generation` (TRL refuses both given).
    args = GRPOConfig(**{**fields, "generation_batch_size": None, "mask_truncated_completions": False,
                         "output_dir": ours.output_dir + "-trl"})  # fmt: skip
    replay = Replay(recorded)

    def rollout_func(prompts: list[Any], trainer: Any) -> dict[str, Any]:
        trajectories = [replay.next_for(prompt) for prompt in prompts]
        return {
            "prompt_ids": [t.prompt_ids for t in trajectories],
            "completion_ids": [t.completion_ids for t in trajectories],
            "logprobs": None,
            "env_mask": [masked_loss_mask(t, ours.mask_truncated_completions) for t in trajectories],
            "trajectory": trajectories,
        }

    timer = step_timer()
    trainer = GRPOTrainer(model=model_path, reward_funcs=prepared.rewards, args=args, train_dataset=dataset,
                          peft_config=prepared.peft_config, rollout_func=rollout_func, callbacks=[timer])  # fmt: skip
    trainer.train()
    return timer.seconds, [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


def summary(seconds: list[float]) -> dict[str, Any]:
    timed = seconds[1:] or seconds  # the first step warms caches and allocators
    return {"step_seconds": [round(s, 2) for s in seconds], "median_seconds": round(statistics.median(timed), 3)}


def training_bench_parser(name: str, description: str, steps: int, steps_help: str) -> argparse.ArgumentParser:
    """The options of a benchmark that trains a recipe: `--recipe`, `--model`, `--steps`, `--seed`, `--smoke`."""
    parser = argparse.ArgumentParser(
        prog=f"agentic-grpo bench {name}",
        description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--recipe", default="cpu_demo", help="recipe file or shipped name (default: cpu_demo)")
    parser.add_argument("--model", default=None, help="model instead of the recipe's (e.g. a tiny test model)")
    parser.add_argument("--steps", type=int, default=steps, help=f"{steps_help} (default: {steps})")
    parser.add_argument("--seed", type=int, default=0, help="sampling and training seed (default: 0)")
    parser.add_argument("--smoke", action="store_true",
                        help="2 steps, G=2, 16 tokens a turn: seconds on a tiny --model")  # fmt: skip
    return parser


def parse_training_bench(parser: argparse.ArgumentParser, argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """The options before `--` and the recipe fields after it; `--smoke` makes the run 2 small steps."""
    own, overrides = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    args = parser.parse_args(own)
    if args.smoke:
        args.steps = 2
        overrides = ["--num_generations", "2", "--gradient_accumulation_steps", "2", "--max_tokens_per_turn", "16",
                     "--max_completion_length", "48", *overrides]  # fmt: skip
    return args, overrides


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = training_bench_parser("step", __doc__, 6, "training steps per trainer")
    args, overrides = parse_training_bench(parser, argv)

    from agentic_grpo.resources import find_shipped
    from agentic_grpo.train import prepare

    recipe = str(find_shipped(args.recipe, "recipes", ".yaml"))
    with tempfile.TemporaryDirectory(prefix="agentic-grpo-bench-step-") as output_dir:
        common = ["--config", recipe, "--output_dir", f"{output_dir}/run", "--max_steps", str(args.steps),
                  "--seed", str(args.seed), "--eval_before_after", "false", "--save_strategy", "no",
                  "--report_to", "none", *([f"--model_name_or_path={args.model}"] if args.model else []),
                  *overrides]  # fmt: skip
        prepared = prepare(common)
        config = prepared.config
        group = config.num_generations
        questions_per_step = config.per_device_train_batch_size * config.gradient_accumulation_steps // group
        rows = [dict(row) for row in prepared.train.select(range(args.steps * questions_per_step))]
        dataset = prepared.train.select(range(len(rows)))
        log(f"recording {len(rows)} questions x G={group} ...")
        start = time.perf_counter()
        recorded = record(prepared, prepared.model_path, rows, group, args.seed)
        recording_seconds = time.perf_counter() - start
        with contextlib.redirect_stdout(sys.stderr):  # the Trainer prints its logs; stdout carries only the JSON
            log("ours (AgenticGRPOTrainer) ...")
            ours_seconds, ours_losses = train_ours(prepared, prepared.model_path, dataset, recorded)
            log("plain TRL GRPOTrainer ...")
            trl_seconds, trl_losses = train_trl(prepared, prepared.model_path, dataset, recorded)

    result: dict[str, Any] = {
        "benchmark": "step", "recipe": recipe, "model": prepared.model_path, "steps": args.steps, "group": group,
        "questions_per_step": questions_per_step, "seed": args.seed, "torch_threads": torch.get_num_threads(),
        "recording_seconds": round(recording_seconds, 1),
        "ours": summary(ours_seconds), "trl": summary(trl_seconds),
        "ours_losses": ours_losses, "trl_losses": trl_losses,
        "same_losses": len(ours_losses) == len(trl_losses) and all(
            abs(a - b) <= 1e-4 * max(1.0, abs(b)) for a, b in zip(ours_losses, trl_losses, strict=True)),
    }  # fmt: skip
    result["ratio_ours_over_trl"] = round(result["ours"]["median_seconds"] / result["trl"]["median_seconds"], 3)
    result["command"] = " ".join(["agentic-grpo bench step", *argv])
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
