"""Does training make the agent better on problems it never saw? Scored strictly; prints JSON.

Evaluates the untrained model on the recipe's held-out split, trains with the recipe
(a real run per seed), evaluates each trained adapter or model on the same split, and
reports the accuracies, the minutes, the peak memory and the seeds. When the recipe's rows name the tool or
specialist that should answer (`expected_tools`), it reports the selection (and routing) accuracy before and
after beside the strict accuracy, and what the sub-agents cost per query. With rows that carry an `answer`, it
reports `answer_lost_rate` (a tool handed over the answer and the final answer missed it), and with a `kind`
column, each kind's figures (`kinds`), as `agentic-grpo eval` does. Each evaluation's trajectories are kept:
`<run dir>/held_out.trajectories.jsonl` and `<prefix>-<recipe>-before-eval.trajectories.jsonl`
(`agentic-grpo show` reads them).

Every training seed trains on the same rows, drawn with the recipe's dataset `seed` (a copy of the recipe with
`train_seed` set is kept beside the runs), so figures reproduce; a plain `agentic-grpo train` draws its training
rows with a secret seed per run.

Nothing finished is done twice: the untrained model's result and each seed's are kept next to the
run directories (`<prefix>-<recipe>-before.json`, `<prefix>-<recipe>-seedN.json`) and reused when
the recipe and budget match, so an interrupted benchmark picks up at the seed it stopped in; a training run it
stopped in resumes from its last checkpoint (the same command, recipe text and training code), which continues it
exactly.

Strict scoring: a trajectory is correct only when its final answer, from a complete turn,
is the reference number itself (commas, `$`, a unit word or a trailing period allowed; an
expression such as `504 * 766` is not an answer), whatever the recipe's own rewards pay.

    agentic-grpo bench learning --seeds 0 1 2                       # the CPU demo, three seeds
    agentic-grpo bench learning --recipe cpu_reasoning_gym --seeds 0 1 2 --questions 100
    agentic-grpo bench learning --recipe ci_tiny --seeds 0 --max-steps 1 --questions 2   # a smoke run
    agentic-grpo bench learning --recipe cpu_toolbox --seeds 0       # + tool selection accuracy before/after
    agentic-grpo bench learning --recipe cpu_routing --seeds 0       # + routing accuracy, sub-agent tokens per query
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from agentic_grpo.benchmarks._stored import STAMP, cached, resumable, training_stamp


def strictly_correct(final_answer: str | None, gold: Any) -> bool:
    """The answer is the reference number itself (or, for a non-numeric reference, the same normalized text)."""
    from agentic_grpo.rewards.rules import normalize_answer, plain_number

    if final_answer is None or gold is None:
        return False
    gold_number = plain_number(str(gold))
    if gold_number is None:
        return normalize_answer(final_answer) == normalize_answer(str(gold))
    return plain_number(final_answer) == gold_number


def held_out(model: str, recipe: str, questions: int, k: int, report: Path | None = None) -> dict:
    """Strict accuracy (and the recipe-reward accuracy beside it) of `model` on the recipe's test split; with
    `report`, the evaluation's metrics and trajectories are written there as `agentic-grpo eval` writes them."""
    from agentic_grpo.evaluate import evaluate_held_out, write_report

    metrics, records = evaluate_held_out(model, recipe, questions, k)
    if report is not None:
        write_report(report, metrics, records)
    strict = [strictly_correct(r["final_answer"], r["row"].get("answer")) for r in records]
    measured = {
        "strict_accuracy": sum(strict) / max(1, len(strict)),
        "reward_accuracy": metrics["accuracy"],
        "tool_call_rate": metrics["tools/call_rate"],
        "cut_rate": sum(r["finish_reason"] == "length" for r in records) / max(1, len(records)),
    }
    # Recipes whose rows name the tool or specialist that should answer (`expected_tools`) also report the choice.
    for name, metric in CHOICE_METRICS.items():
        if metric in metrics:
            measured[name] = metrics[metric]
    if "answer_lost_rate" in metrics:  # rows with answers: a tool handed over the answer and the final one missed it
        measured["answer_lost_rate"] = metrics["answer_lost_rate"]
    kinds: dict[str, dict[str, Any]] = {}  # rows with a `kind` column: `kinds/<kind>/<metric>` as {kind: {metric}}
    for name, value in metrics.items():
        if name.startswith("kinds/"):
            kind, metric = name.removeprefix("kinds/").split("/", 1)
            kinds.setdefault(kind, {})[metric] = value
    if kinds:
        measured["kinds"] = kinds
    return measured


# benchmark name -> `agentic-grpo eval` metric, reported before and after when the recipe's rows name tools
CHOICE_METRICS = {
    "selection_accuracy": "tools/selection_accuracy",
    "routing_accuracy": "routing/accuracy",
    "subagent_tokens_per_query": "subagents/tokens_per_trajectory",
}
# what `held_out` reports beside them, for rows with an `answer` and a `kind` column
BREAKDOWN = ("answer_lost_rate", "kinds")


VLLM_SAMPLING = ["--use_vllm", "true", "--vllm_gpu_memory_utilization", "0.3"]
"""`--engine vllm`: the training rollouts sampled by a colocated vLLM engine (the held-out evaluation stays HF's)."""


def train(
    recipe: str, seed: int, output_dir: str, max_steps: int | None, engine: str = "hf", staleness: int | None = None
) -> tuple[float, int]:
    """Train one run in a child process; returns its minutes and its peak resident memory in MB. A run of the same
    command, recipe and training code interrupted in `output_dir` resumes from its last checkpoint (the minutes are
    then this process's share)."""
    command = [sys.executable, "-m", "agentic_grpo.cli", "train", "--config", recipe, "--seed", str(seed),
               "--output_dir", output_dir, "--eval_before_after", "false"]  # fmt: skip
    if engine == "vllm":
        command += VLLM_SAMPLING
    if staleness is not None:
        command += ["--async_rollouts", f"{{max_staleness: {staleness}}}"]
    if max_steps:
        command += ["--max_steps", str(max_steps)]
    stamp = training_stamp(command[1:], recipe)
    if resumable(output_dir, stamp):
        print(f"{output_dir}: resuming an interrupted run of this training from its last checkpoint", file=sys.stderr)
        command += ["--resume_from_checkpoint", "last"]
    else:
        command += ["--overwrite_output_dir", "true"]
        Path(output_dir).mkdir(parents=True, exist_ok=True)
        (Path(output_dir) / STAMP).write_text(json.dumps(stamp) + "\n")
    start = time.time()
    child = subprocess.Popen(command, stdout=sys.stderr)  # stdout carries only the JSON
    _, status, usage = os.wait4(child.pid, 0)  # this child's own peak, not the largest of all children
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        raise subprocess.CalledProcessError(child.returncode, command)
    return (time.time() - start) / 60, round(usage.ru_maxrss / 1024)


def staleness(args: argparse.Namespace) -> int | None:
    """The run's `max_staleness`, None for a synchronous run."""
    return args.max_staleness if args.max_staleness is not None else (1 if args.async_rollouts else None)


def train_and_measure(recipe: str, seed: int, output_dir: str, args: argparse.Namespace, before: dict) -> dict:
    """One seed: a real training run, then its strict held-out accuracy."""
    minutes, peak_mb = train(recipe, seed, output_dir, args.max_steps, args.engine, staleness(args))
    after = held_out(output_dir, recipe, args.questions, args.k, Path(output_dir) / "held_out.json")
    run = {
        "seed": seed,
        "accuracy_after": after["strict_accuracy"],
        "gain_points": round(100 * (after["strict_accuracy"] - before["strict_accuracy"]), 1),
        "reward_accuracy_after": after["reward_accuracy"],
        "tool_call_rate_after": after["tool_call_rate"],
        "cut_rate_after": after["cut_rate"],
        "train_minutes": round(minutes, 1),
        "train_peak_memory_mb": peak_mb,
        "output_dir": output_dir,
    }
    for name in (*CHOICE_METRICS, *BREAKDOWN):
        if name in after:
            run[f"{name}_after"] = after[name]
            if name.endswith("accuracy") and name in before:
                run[f"{name}_gain_points"] = round(100 * (after[name] - before[name]), 1)
    return run


def pinned_training_rows(recipe: Path, copy: Path) -> str:
    """The recipe to train, as a path: for generated data with no `train_seed`, a copy at `copy` whose training
    rows are drawn with its `seed` (`agentic-grpo train` draws a secret seed per run otherwise), so that every
    training seed of the benchmark, and every rerun of it, trains on the same rows."""
    import yaml

    spec = yaml.safe_load(recipe.read_text())
    dataset = spec.get("dataset")
    if not isinstance(dataset, dict) or "train_seed" in dataset or not {"generator", "reasoning_gym"} & set(dataset):
        return str(recipe)
    spec["dataset"] = {**dataset, "train_seed": dataset.get("seed", 0)}
    copy.write_text(yaml.safe_dump(spec, sort_keys=False))
    return str(copy)


def main() -> int:
    parser = argparse.ArgumentParser(
        prog="agentic-grpo bench learning", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--recipe", default="cpu_demo", help="recipe file or shipped recipe name (default: cpu_demo)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="training seeds (default: 0 1 2)")
    parser.add_argument("--seed", type=int, help="one seed (same as --seeds N)")
    parser.add_argument("--max-steps", type=int, help="training steps (default: the recipe's)")
    parser.add_argument("--questions", type=int, default=48, help="held-out questions to evaluate")
    parser.add_argument("-k", type=int, default=1, help="1 = greedy pass@1; k > 1 = sampled pass@k")
    parser.add_argument("--output-dir", default=None, help="run directories' prefix (default: outputs/learning)")
    parser.add_argument("--engine", choices=["hf", "vllm"], default="hf",
                        help="what samples the training rollouts: HF generate, or a colocated vLLM engine "
                             "(`use_vllm: true`); the held-out evaluation is HF's either way (default: hf)")  # fmt: skip
    parser.add_argument(
        "--async-rollouts",
        action="store_true",
        help="train with `async_rollouts: true` (the sampler a step ahead; docs/async.md)",
    )
    parser.add_argument("--max-staleness", type=int, default=None,
                        help="train with `async_rollouts: {max_staleness: N}` (0: the sampler in lockstep, each step "
                             "sampled by its own weights with the asynchronous sampler's noise)")  # fmt: skip
    args = parser.parse_args()
    seeds = [args.seed] if args.seed is not None else args.seeds

    import yaml

    from agentic_grpo.resources import find_shipped

    shipped = find_shipped(args.recipe, "recipes", ".yaml")
    prefix = args.output_dir or str(Path("outputs") / "learning")
    stem = f"{prefix}-{shipped.stem}"
    Path(stem).parent.mkdir(parents=True, exist_ok=True)  # a prefix in a new directory
    recipe = pinned_training_rows(shipped, Path(f"{stem}-recipe.yaml"))
    base_model = yaml.safe_load(Path(recipe).read_text())["model_name_or_path"]
    key = {"recipe": Path(recipe).read_text(), "questions": args.questions, "k": args.k}
    measure_before = functools.partial(
        held_out, base_model, recipe, args.questions, args.k, Path(f"{stem}-before-eval.json")
    )
    before = cached(Path(f"{stem}-before.json"), key, measure_before)  # greedy: the same for every seed
    runs = []
    for seed in seeds:
        run = functools.partial(train_and_measure, recipe, seed, f"{stem}-seed{seed}", args, before)
        engine = {"engine": args.engine} if args.engine != "hf" else {}  # the key of runs cached before the option
        engine |= {"async_rollouts": True} if staleness(args) == 1 else {}
        engine |= {"max_staleness": staleness(args)} if staleness(args) not in (None, 1) else {}
        runs.append(cached(Path(f"{stem}-seed{seed}.json"), {**key, "max_steps": args.max_steps, **engine}, run))
    gains = [r["gain_points"] for r in runs]
    result = {
        "benchmark": "learning",
        "recipe": shipped.name,
        "engine": args.engine,
        "async_rollouts": staleness(args) is not None,
        **({"max_staleness": staleness(args)} if staleness(args) is not None else {}),
        "scoring": "strict: the final answer is the reference number itself",
        "questions": args.questions,
        "k": args.k,
        "accuracy_before": before["strict_accuracy"],
        "reward_accuracy_before": before["reward_accuracy"],
        "tool_call_rate_before": before["tool_call_rate"],
        "cut_rate_before": before["cut_rate"],
        "runs": runs,
        "accuracy_after_mean": round(sum(r["accuracy_after"] for r in runs) / len(runs), 3),
        "gain_points_mean": round(sum(gains) / len(gains), 1),
        "gain_points_min": min(gains),
        "train_minutes_max": max(r["train_minutes"] for r in runs),
        "train_peak_memory_mb": max(r["train_peak_memory_mb"] for r in runs),
        "command": " ".join(["agentic-grpo bench learning", *sys.argv[1:]]),
    }
    for name in BREAKDOWN:  # kept as measured: `kinds` is a table, not a number to average over seeds
        if name in before:
            result[f"{name}_before"] = before[name]
    for name in CHOICE_METRICS:  # the choice of tool or specialist, before and after, beside strict accuracy
        if name in before:
            result[f"{name}_before"] = before[name]
            afters = [r[f"{name}_after"] for r in runs if f"{name}_after" in r]
            result[f"{name}_after_mean"] = round(sum(afters) / len(afters), 3) if afters else None
            gains = [r[f"{name}_gain_points"] for r in runs if f"{name}_gain_points" in r]
            if gains:
                result[f"{name}_gain_points_mean"] = round(sum(gains) / len(gains), 1)
                result[f"{name}_gain_points_min"] = min(gains)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
