"""Does per-turn credit beat outcome-only GRPO? Four arms, same seeds, data order and budget. Prints JSON.

Arms (each a real `train` run of the recipe with one change; the estimator is the experimental option
`advantage`, agentic_grpo.experimental.turn_credit):
    outcome       `advantage: outcome`: TRL's GRPO on the recipe's rewards
    outcome_sum   `advantage: outcome` plus the summed per-turn rewards as one more scalar reward
                  (`agentic_grpo.rewards.turns:TurnRewardSum`): the same information, no credit assignment.
                  Its sum joins the other rewards before TRL's group normalisation (divided by the group's
                  std), while the `turn` term is added to the advantage unnormalised (times turn_lambda):
                  the two arms differ in scale as well as in where the credit goes.
    turn          `advantage: turn`
    anchor        `advantage: anchor`
Every `--eval-every` steps a checkpoint is saved; afterwards each is evaluated on the recipe's held-out
split (greedy pass@1) for strict accuracy: the right answer, with every turn in the format. The area
under each accuracy-vs-step curve (trapezoids, divided by the steps, so 1.0 = always right) sums a run.
Each run also reports what its sampled trajectories offered to learn from (`training`): the share of groups
whose rewards differ, and of trajectories right and paid a per-turn reward. Writes `credit.json` and
`credit.png` to the output directory.

`--start-from ADAPTER` warm-starts every arm: the saved LoRA adapter (e.g. a trained calculator agent's) is
merged into its base once, and that model is step 0, each arm's starting weights under a new adapter, and its
KL reference. A cold model earns few per-turn rewards to assign; a warm one earns them in a fair share of its
trajectories.

Nothing finished is done twice: each run's curve is kept in `ARM-seedN.json` (and the untrained
model's point in `start.json`) and reused when the budget matches, so an interrupted benchmark picks
up where it stopped, and arms run by separate invocations (`--arms turn`) into one directory are
reported together by a last invocation with every arm.

    agentic-grpo bench credit --seeds 0 1 --max-steps 30 --eval-every 10
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tqdm import tqdm

from agentic_grpo.benchmarks._stored import adapter_digest, cached

ARMS: dict[str, dict[str, Any]] = {
    "outcome": {"advantage": "outcome"},
    "outcome_sum": {"advantage": "outcome", "extra_reward": "agentic_grpo.rewards.turns:TurnRewardSum"},
    "turn": {"advantage": "turn"},
    "anchor": {"advantage": "anchor"},
}


def arm_recipe(base: dict[str, Any], arm: str, seed: int, max_steps: int, eval_every: int, out: Path) -> dict:
    """The recipe of one run: the base recipe with the arm's estimator, the seed and the shared budget."""
    recipe = dict(base)
    recipe["experimental"] = {**(base.get("experimental") or {}), "advantage": ARMS[arm]["advantage"]}
    if "extra_reward" in ARMS[arm]:
        recipe["rewards"] = [*base["rewards"], {"type": ARMS[arm]["extra_reward"], "weight": 1.0}]
    recipe.update(
        seed=seed,
        max_steps=max_steps,
        save_steps=eval_every,
        save_total_limit=None,  # every checkpoint stays: each is a point of the curve
        output_dir=str(out),
        eval_before_after=False,
        overwrite_output_dir=True,
    )
    return recipe


def merged_start(adapter: Path, out: Path) -> Path:
    """`adapter` merged into its base model, saved (with the tokenizer) under `out`; kept while the adapter's weights
    are the same."""
    weights = adapter / "adapter_model.safetensors"
    if not weights.exists():
        raise SystemExit(f"error: --start-from {adapter}: no saved LoRA adapter there (adapter_model.safetensors)")
    model_dir = out / f"start-model-{adapter_digest(adapter)}"
    if not (model_dir / "config.json").exists():
        from agentic_grpo.evaluate import load_policy

        model, tokenizer = load_policy(str(adapter), merge=True)
        partial = model_dir.with_name(model_dir.name + ".partial")  # a killed save leaves no half model behind
        model.save_pretrained(partial)
        tokenizer.save_pretrained(partial)
        partial.rename(model_dir)
    return model_dir


def strict_accuracy(model: str, recipe_path: Path, questions: int) -> dict[str, float]:
    """Greedy pass@1 on the held-out split: right answer, final answer given, no malformed turn."""
    from agentic_grpo.evaluate import evaluate_held_out

    metrics, records = evaluate_held_out(model, recipe_path, questions)
    strict = [r["correct"] and r["final_answer"] is not None and r["malformed_turns"] == 0 for r in records]
    return {"strict_accuracy": sum(strict) / len(strict), "accuracy": metrics["accuracy"],
            "turns_mean": metrics["trajectories/turns_mean"]}  # fmt: skip


def train_and_evaluate(
    recipe_path: Path, run_dir: Path, steps: list[int], start_point: dict[str, float], questions: int
) -> dict[str, Any]:
    """One real training run, then its strict accuracy at every saved step."""
    began = time.time()
    command = [sys.executable, "-m", "agentic_grpo.cli", "train", "--config", str(recipe_path)]
    subprocess.run(command, check=True, stdout=sys.stderr)  # stdout carries only the JSON
    minutes = (time.time() - began) / 60
    curve = [start_point]
    for step in tqdm(steps[1:], desc=f"evaluating {run_dir.name}", file=sys.stderr):
        checkpoint = run_dir / f"checkpoint-{step}"
        curve.append(strict_accuracy(str(checkpoint if checkpoint.exists() else run_dir), recipe_path, questions))
    accuracy = [point["strict_accuracy"] for point in curve]
    return {
        "steps": steps,
        "strict_accuracy": accuracy,
        "auc": area_under_curve(steps, accuracy),
        "final": accuracy[-1],
        "turns_mean": [point["turns_mean"] for point in curve],
        "train_minutes": round(minutes, 2),
    }


def training_signal(run_dir: Path, group_size: int, correctness: str) -> dict[str, float] | None:
    """What a run's sampled trajectories offered to learn from (its `trajectories/step_N.jsonl`, a step's groups
    consecutive): the share of groups whose rewards differ (outcome-only GRPO learns from no other), and of
    trajectories right and paid a per-turn reward. None when the run kept no trajectories."""
    from agentic_grpo.advantages import flat_groups

    records = []
    for path in sorted((run_dir / "trajectories").glob("step_*.jsonl")):
        records += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if not records or len(records) % group_size:
        return None
    rewards = [math.nan if r.get("reward") is None else r["reward"] for r in records]
    flat = flat_groups(rewards, group_size)  # per trajectory, so the share of trajectories is the share of groups
    right = [(r.get("rewards") or {}).get(correctness) or 0.0 for r in records]
    return {
        "groups_with_signal": 1 - sum(flat) / len(flat),
        "right": sum(value >= 1.0 for value in right) / len(records),
        "earn_turn_reward": sum(any(x > 0 for x in r.get("turn_rewards") or []) for r in records) / len(records),
    }


def area_under_curve(steps: list[int], values: list[float]) -> float:
    """Trapezoid area under values(step), divided by the step span: the curve's mean height."""
    if len(steps) < 2:
        return values[0] if values else math.nan
    area = sum((steps[i + 1] - steps[i]) * (values[i] + values[i + 1]) / 2 for i in range(len(steps) - 1))
    return area / (steps[-1] - steps[0])


def mean_std(values: list[float]) -> tuple[float, float]:
    mean = sum(values) / len(values)
    return mean, (sum((v - mean) ** 2 for v in values) / max(1, len(values) - 1)) ** 0.5


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.5))
    for color, (arm, runs) in zip(
        plt.rcParams["axes.prop_cycle"].by_key()["color"], result["arms"].items(), strict=False
    ):
        curves = list(runs["seeds"].values())
        steps = curves[0]["steps"]
        for curve in curves:
            axes.plot(curve["steps"], curve["strict_accuracy"], color=color, alpha=0.25, linewidth=1)
        mean = [sum(c["strict_accuracy"][i] for c in curves) / len(curves) for i in range(len(steps))]
        axes.plot(steps, mean, color=color, linewidth=2.5, marker="o", label=f"{arm} (AUC {runs['auc_mean']:.3f})")
    axes.set_xlabel("training step")
    axes.set_ylabel("held-out strict accuracy (greedy)")
    axes.set_title(f"Per-turn credit: {result['recipe']}, {len(result['seeds'])} seed(s) per arm")
    axes.legend()
    axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="agentic-grpo bench credit", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--recipe", default="credit_demo", help="recipe file or shipped name (default: credit_demo)")
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    parser.add_argument("--max-steps", type=int, default=30, help="training steps of every run")
    parser.add_argument("--eval-every", type=int, default=10, help="steps between held-out evaluations")
    parser.add_argument("--questions", type=int, default=48, help="held-out questions per evaluation")
    parser.add_argument("--output-dir", default="outputs/credit", help="runs, credit.json and credit.png go here")
    parser.add_argument(
        "--start-from", type=Path, help="a saved LoRA adapter merged into its base: every arm's starting model"
    )
    args = parser.parse_args(argv)

    import yaml

    from agentic_grpo.data import shared_training_seed
    from agentic_grpo.resources import find_shipped

    base_path = find_shipped(args.recipe, "recipes", ".yaml")
    base = yaml.safe_load(base_path.read_text())
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    base = shared_training_seed(base, out / "train_seed")  # every arm and seed trains on the same rows
    if args.start_from is not None:
        base["model_name_or_path"] = str(merged_start(args.start_from, out))
    steps = sorted({0, *range(args.eval_every, args.max_steps + 1, args.eval_every), args.max_steps})

    base_recipe = out / "base.yaml"
    base_recipe.write_text(yaml.safe_dump({**base, "output_dir": str(out / "eval")}))
    # Step 0 is the untrained model, the same for every arm and seed (greedy decoding): measured once.
    measure_start = functools.partial(strict_accuracy, base["model_name_or_path"], base_recipe, args.questions)
    start_point = cached(out / "start.json", {"questions": args.questions, "recipe": base}, measure_start)
    result: dict[str, Any] = {"benchmark": "credit", "recipe": base_path.name, "seeds": args.seeds,
                              "max_steps": args.max_steps, "eval_steps": steps, "questions": args.questions,
                              "start_from": str(args.start_from) if args.start_from else None,
                              "arms": {}}  # fmt: skip
    for arm in args.arms:
        runs: dict[str, Any] = {}
        for seed in args.seeds:
            run_dir = out / f"{arm}-seed{seed}"
            recipe_path = out / f"{arm}-seed{seed}.yaml"
            recipe_path.write_text(
                yaml.safe_dump(arm_recipe(base, arm, seed, args.max_steps, args.eval_every, run_dir))
            )
            budget = {"recipe": yaml.safe_load(recipe_path.read_text()), "steps": steps, "questions": args.questions}
            run = functools.partial(train_and_evaluate, recipe_path, run_dir, steps, start_point, args.questions)
            runs[str(seed)] = cached(out / f"{arm}-seed{seed}.json", budget, run)
            signal = training_signal(run_dir, base["num_generations"], base.get("correctness_reward", "correctness"))
            if signal is not None:
                runs[str(seed)]["training"] = signal
        auc_mean, auc_std = mean_std([r["auc"] for r in runs.values()])
        result["arms"][arm] = {"auc_mean": auc_mean, "auc_std": auc_std, "seeds": runs}
    result["command"] = " ".join(["agentic-grpo bench credit", *(argv if argv is not None else sys.argv[1:])])
    (out / "credit.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(result, out / "credit.png")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
