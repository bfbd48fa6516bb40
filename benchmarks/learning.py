"""Does training make the agent better on problems it never saw? Prints JSON.

Evaluates the untrained model on the recipe's held-out split, trains with the recipe
(`train.py`, a real run), evaluates the trained adapter or model on the same split, and
reports both accuracies, the minutes, the peak memory and the seed.

    agentic-grpo bench learning --seed 0
    agentic-grpo bench learning --seed 1 --max-steps 40 --questions 48
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path


def held_out_accuracy(model: str, recipe: str, questions: int, k: int) -> dict:
    from agentic_grpo.config import read_recipe
    from agentic_grpo.data import load_task_data
    from agentic_grpo.evaluate import evaluate, load_policy
    from agentic_grpo.reward_setup import build_rewards
    from agentic_grpo.run_parts import build_rollout_parts

    recipe_args, config, _ = read_recipe(["--config", recipe, "--output_dir", "/tmp/agentic-grpo-eval"])
    parts = build_rollout_parts(config)
    rewards, _ = build_rewards(recipe_args.rewards)
    _, test = load_task_data(recipe_args.dataset)
    policy, tokenizer = load_policy(model)
    metrics, _ = evaluate(policy, tokenizer, parts, rewards, list(test)[:questions], k=k, progress=False)
    return metrics


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipe", default="cpu_demo", help="recipe file or shipped recipe name (default: cpu_demo)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-steps", type=int, help="training steps (default: the recipe's)")
    parser.add_argument("--questions", type=int, default=48, help="held-out questions to evaluate")
    parser.add_argument("-k", type=int, default=1, help="1 = greedy pass@1; k > 1 = sampled pass@k")
    parser.add_argument("--output-dir", default=None, help="run directory (default: outputs/learning-seedN)")
    args = parser.parse_args()

    import yaml

    from agentic_grpo.resources import find_shipped

    args.recipe = str(find_shipped(args.recipe, "recipes", ".yaml"))
    base_model = yaml.safe_load(Path(args.recipe).read_text())["model_name_or_path"]
    output_dir = args.output_dir or str(Path("outputs") / f"learning-seed{args.seed}")
    before = held_out_accuracy(base_model, args.recipe, args.questions, args.k)

    command = [sys.executable, "-m", "agentic_grpo.cli", "train", "--config", args.recipe, "--seed", str(args.seed),
               "--output_dir", output_dir, "--eval_before_after", "false"]  # fmt: skip
    if args.max_steps:
        command += ["--max_steps", str(args.max_steps)]
    start = time.time()
    subprocess.run(command, check=True, stdout=sys.stderr)  # stdout carries only the JSON
    minutes = (time.time() - start) / 60
    peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024

    after = held_out_accuracy(output_dir, args.recipe, args.questions, args.k)
    metric = "accuracy"
    result = {
        "benchmark": "learning",
        "recipe": Path(args.recipe).name,
        "seed": args.seed,
        "questions": args.questions,
        "k": args.k,
        "accuracy_before": before[metric],
        "accuracy_after": after[metric],
        "gain_points": round(100 * (after[metric] - before[metric]), 1),
        "tool_call_rate_before": before["tool_call_rate"],
        "tool_call_rate_after": after["tool_call_rate"],
        "train_minutes": round(minutes, 1),
        "train_peak_memory_mb": round(peak_mb),
        "command": " ".join(sys.argv),
    }
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
