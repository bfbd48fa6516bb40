"""Does training the specialists with the orchestrator help? Co-training against the orchestrator alone; prints JSON.

Two arms per seed, same recipe, data, seed and budget:
- `cotrain`: the recipe as written: every sub-agent with `train: true` learns with the orchestrator;
- `frozen`: the same recipe with every sub-agent's `train: false` (its adapter stays as it starts).
Each run is evaluated on the recipe's held-out split with its own saved adapters (the orchestrator's and the
sub-agents'), scored strictly end to end: the orchestrator's final answer must be the reference number itself
(`benchmarks/learning.py`). Also reported: minutes and peak memory of each training run.

Finished work is kept beside the runs (`<prefix>-<recipe>-<arm>-seedN.json`) and reused for the same recipe,
budget and code, so an interrupted comparison resumes at the run it stopped in.

    agentic-grpo bench cotrain --seeds 0 1 2                    # recipes/cpu_cotrain.yaml, both arms
    agentic-grpo bench cotrain --recipe my_cotrain.yaml --seeds 0 --max-steps 1 --questions 2   # a smoke run
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import yaml

from agentic_grpo.benchmarks._stored import cached
from agentic_grpo.benchmarks.learning import held_out, train

ARMS = ("cotrain", "frozen")


def arm_recipe(recipe: dict[str, Any], arm: str) -> dict[str, Any]:
    """The recipe of one arm: `frozen` turns every sub-agent's training off (at any depth), and co-training with
    it (`experimental: cotrain_subagents`)."""
    if not any(entry.get("train") for entry in recipe.get("subagents") or []):
        raise ValueError(
            "the recipe trains no sub-agent: give one `subagents` entry `adapter: NAME` and `train: true`"
        )

    def frozen(entries: list[dict]) -> list[dict]:
        out = []
        for entry in entries:
            entry = {k: v for k, v in entry.items() if k not in ("train", "learning_rate")}
            if entry.get("subagents"):
                entry["subagents"] = frozen(entry["subagents"])
            out.append(entry)
        return out

    if arm == "cotrain":
        return recipe
    # The frozen arm trains no sub-agent, so co-training is off; the recipe's other experiments stay on.
    out = {k: v for k, v in recipe.items() if k != "experimental"}
    others = {k: v for k, v in (recipe.get("experimental") or {}).items() if k != "cotrain_subagents"}
    if others:
        out["experimental"] = others
    return {**out, "subagents": frozen(recipe["subagents"])}


def run_arm(recipe: str, seed: int, output_dir: str, args: argparse.Namespace) -> dict[str, Any]:
    minutes, peak_mb = train(recipe, seed, output_dir, args.max_steps)
    after = held_out(output_dir, recipe, args.questions, args.k)
    return {"seed": seed, "accuracy": after["strict_accuracy"], "reward_accuracy": after["reward_accuracy"],
            "tool_call_rate": after["tool_call_rate"], "train_minutes": round(minutes, 1),
            "train_peak_memory_mb": peak_mb, "output_dir": output_dir}  # fmt: skip


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    accuracies = [r["accuracy"] for r in runs]
    return {
        "accuracy_mean": round(statistics.fmean(accuracies), 3),
        "accuracy_std": round(statistics.stdev(accuracies), 3) if len(accuracies) > 1 else 0.0,
        "train_minutes_total": round(sum(r["train_minutes"] for r in runs), 1),
        "train_peak_memory_mb": max(r["train_peak_memory_mb"] for r in runs),
        "runs": runs,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        prog="agentic-grpo bench cotrain", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--recipe", default="cpu_cotrain", help="a co-training recipe (default: cpu_cotrain)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="training seeds (default: 0 1 2)")
    parser.add_argument("--max-steps", type=int, help="training steps (default: the recipe's)")
    parser.add_argument("--questions", type=int, default=48, help="held-out questions to evaluate")
    parser.add_argument("-k", type=int, default=1, help="1 = greedy pass@1; k > 1 = sampled pass@k")
    parser.add_argument("--output-dir", default=None, help="run directories' prefix (default: outputs/cotrain)")
    args = parser.parse_args()

    from agentic_grpo.data import shared_training_seed
    from agentic_grpo.resources import find_shipped

    source = find_shipped(args.recipe, "recipes", ".yaml")
    recipe = yaml.safe_load(source.read_text())
    stem = f"{args.output_dir or Path('outputs') / 'cotrain'}-{source.stem}"
    Path(stem).parent.mkdir(parents=True, exist_ok=True)
    recipe = shared_training_seed(recipe, f"{stem}-train_seed")  # both arms train on the same rows
    key = {"questions": args.questions, "k": args.k}
    before_key = {**key, "recipe": source.read_text()}
    before = cached(Path(f"{stem}-before.json"), before_key,
                    functools.partial(held_out, recipe["model_name_or_path"], str(source), args.questions, args.k))  # fmt: skip
    arms = {}
    for arm in ARMS:
        path = Path(f"{stem}-{arm}.yaml")
        text = yaml.safe_dump(arm_recipe(recipe, arm), sort_keys=False)
        path.write_text(text)
        runs = []
        for seed in args.seeds:
            measure = functools.partial(run_arm, str(path), seed, f"{stem}-{arm}-seed{seed}", args)
            stored = Path(f"{stem}-{arm}-seed{seed}.json")
            runs.append(cached(stored, {**key, "recipe": text, "max_steps": args.max_steps}, measure))
        arms[arm] = summary(runs)
    result = {
        "benchmark": "cotrain",
        "recipe": source.name,
        "scoring": "strict: the orchestrator's final answer is the reference number itself",
        "questions": args.questions,
        "k": args.k,
        "seeds": args.seeds,
        "accuracy_before": before["strict_accuracy"],
        **arms,
        "cotrain_minus_frozen_points": round(
            100 * (arms["cotrain"]["accuracy_mean"] - arms["frozen"]["accuracy_mean"]), 1
        ),
        "command": " ".join(["agentic-grpo bench cotrain", *sys.argv[1:]]),
    }
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
