"""A warm start for per-turn credit: a LoRA adapter fine-tuned, with supervision, on worked solutions of a recipe's
training questions. Prints JSON; `agentic-grpo bench credit --start-from ADAPTER` then starts every arm from it.

A cold small model earns few per-turn rewards, so the credit estimators have little to assign. This makes a policy
that earns them in a fair share of its sampled trajectories, from solutions a task writes, not from the model:

- **Worked solutions.** Each training row carries `solution`, the arguments of the environment's one tool in order
  (`agentic_grpo.tasks.shop_word_problems`: `["23 * 14", "322 - 150"]`). `WorkedSolutions` writes each turn of it
  (a thought, the call, then `Final Answer:` and the row's answer), and the recipe's own rollout manager runs the
  calls in the recipe's environment, renders the observations and tokenizes the whole, as in training. A worked
  solution must fit the recipe's budgets and end with the row's answer after error-free calls, each paid a per-turn
  reward; the run stops at one that does not, and names it.
- **Fine-tuning.** TRL's `SFTTrainer`, under the recipe's LoRA settings, on the written turns only: the prompt and
  the observations are masked, as GRPO masks them.
- **What it starts from.** After training, `--sample-questions` other training questions are each sampled `--k`
  times at the recipe's temperature (as a training step samples): the share of trajectories that earn a per-turn
  reward, and the share that are right. Greedy held-out accuracy is the credit benchmark's step 0.

    agentic-grpo bench warm_start --recipe credit_demo --demonstrations 256 --max-steps 32 \\
        --output-dir outputs/credit-warm-start
    agentic-grpo bench credit --start-from outputs/credit-warm-start/adapter --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path
from typing import Any

SOLUTION_COLUMN = "solution"


class WorkedSolutions:
    """A generation backend that writes each row's worked solution, a turn per call: the row is found by its question
    in the context, the turn by the observations after it (`turn_marker`)."""

    def __init__(self, tokenizer: Any, rows: list[dict[str, Any]], tool: str, argument: str, eos_ids: list[int]):
        self.tokenizer = tokenizer
        self.eos_ids = eos_ids
        self.turn_marker = "Observation:"
        self.turns = {str(row["question"]): worked_turns(row, tool, argument, tokenizer.eos_token) for row in rows}

    def generate(
        self, batch: list[list[int]], stop: list[str], max_new_tokens: int, choices: Any = None, assigned: Any = None
    ) -> list[Any]:
        from agentic_grpo.backends import cut_generation

        generations = []
        for ids in batch:
            context = self.tokenizer.decode(ids)
            found = [(context.rfind(q), q) for q in self.turns if q in context]
            at, question = max(found)  # the last question in the context: the row's, after the worked examples
            turn = context[at:].count(self.turn_marker)
            turns = self.turns[question]
            text = turns[min(turn, len(turns) - 1)]
            new_ids = self.tokenizer(text, add_special_tokens=False)["input_ids"][:max_new_tokens]
            generations.append(cut_generation(new_ids, self.eos_ids, stop, self.tokenizer))
        return generations


def worked_turns(row: dict[str, Any], tool: str, argument: str, eos: str) -> list[str]:
    """The ReAct turns of a row's worked solution: one call per step of `solution`, then the answer."""
    steps = row.get(SOLUTION_COLUMN)
    if not steps:
        raise ValueError(
            f"a training row has no `{SOLUTION_COLUMN}` column (the arguments of the tool's calls, in order): the "
            "warm start needs a task that writes its worked solutions (e.g. agentic_grpo.tasks:shop_word_problems)"
        )
    turns = [
        f"Thought: I need to compute {step}.\nAction: {tool}\nAction Input: {json.dumps({argument: step})}\n"
        "Observation:"
        for step in steps
    ]
    return [*turns, f"Thought: I know the answer.\nFinal Answer: {row['answer']}{eos}"]


def single_tool(environment: Any) -> tuple[str, str]:
    """The name and only argument of the environment's one tool: what a worked solution's steps are given to."""
    schemas = [s["function"] for s in environment.tool_schemas()]
    properties = schemas[0]["parameters"].get("properties", {}) if len(schemas) == 1 else {}
    if len(schemas) != 1 or len(properties) != 1:
        raise ValueError(
            "the warm start writes solutions for an environment with one tool of one argument; this one has "
            + ", ".join(f"{s['name']}({', '.join(s['parameters'].get('properties', {}))})" for s in schemas)
        )
    return schemas[0]["name"], next(iter(properties))


def demonstrations(built: Any, tokenizer: Any, rows: list[dict[str, Any]]) -> list[Any]:
    """The worked solutions of `rows` as trajectories of the recipe's own rollout manager; raises ValueError when one
    is not a right answer after error-free, paid calls."""
    from agentic_grpo.evaluate import roll_out_rows
    from agentic_grpo.formats.react import ReActFormat

    parts = built.rollout_parts
    if not isinstance(parts.trajectory_format, ReActFormat):
        raise ValueError(
            f"the warm start writes ReAct turns; the recipe's format is {type(parts.trajectory_format).__name__}"
        )
    tool, argument = single_tool(parts.environment)
    backend = WorkedSolutions(tokenizer, rows, tool, argument, [tokenizer.eos_token_id])
    trajectories, _ = roll_out_rows(parts, tokenizer, rows, backend)
    for row, trajectory in zip(rows, trajectories, strict=True):
        problem = demonstration_problem(row, trajectory)
        if problem:
            raise ValueError(f"the worked solution of {row['question']!r} {problem}")
    return trajectories


def demonstration_problem(row: dict[str, Any], trajectory: Any) -> str | None:
    """Why `trajectory` is no demonstration of `row`, or None."""
    calls = len(row[SOLUTION_COLUMN])
    if trajectory.finish_reason == "length":
        return "does not fit the recipe's token budgets (`max_tokens_per_turn`, `max_completion_length`)"
    if trajectory.final_answer != str(row["answer"]) or trajectory.finish_reason != "final_answer":
        return f"ended with {trajectory.final_answer!r} ({trajectory.finish_reason}), not {row['answer']!r}"
    if trajectory.malformed_turns or len(trajectory.tool_calls) != calls:
        return f"made {len(trajectory.tool_calls)} calls of {calls} ({trajectory.malformed_turns} malformed)"
    errors = [result.error for _, result in trajectory.tool_calls if result.error]
    if errors:
        return f"had a call fail: {errors[0]}"
    computed = trajectory.tool_calls[-1][1].output.strip()
    if computed != str(row["answer"]):  # the tool's last result, not the answer the solution writes, decides
        return f"computed {computed!r}, not the answer {row['answer']!r}"
    paid = trajectory.turn_rewards[:calls]
    if len(paid) < calls or not all(reward > 0 for reward in paid):
        return f"was not paid on every call's turn (turn rewards {trajectory.turn_rewards})"
    return None


def sft_example(trajectory: Any) -> dict[str, list[int]]:
    """A trajectory's tokens, labelled for the loss only where the model wrote them (-100 on prompt and tools)."""
    completion = trajectory.completion_ids
    labels = [token if trained else -100 for token, trained in zip(completion, trajectory.loss_mask, strict=True)]
    return {"input_ids": trajectory.prompt_ids + completion, "labels": [-100] * len(trajectory.prompt_ids) + labels}


def fine_tune(
    built: Any, model_path: str, tokenizer: Any, examples: list[dict[str, list[int]]], args: argparse.Namespace
) -> dict:
    """TRL's SFT under the recipe's LoRA settings (the trainer pads with EOS when the tokenizer has no pad token);
    saves the adapter (and tokenizer) to `<output-dir>/adapter`."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM
    from trl import SFTConfig, SFTTrainer, get_peft_config

    peft_config = get_peft_config(built.model_config)
    config = SFTConfig(
        output_dir=str(Path(args.output_dir) / "sft"),
        max_steps=args.max_steps,
        per_device_train_batch_size=args.batch_size,
        learning_rate=args.learning_rate,
        lr_scheduler_type="constant",
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        seed=args.seed,
        max_length=None,
        use_cpu=not torch.cuda.is_available(),  # SFTConfig defaults to bf16, which it refuses on a CPU it is not told of
    )
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype="float32")
    trainer = SFTTrainer(
        model=model, args=config, train_dataset=Dataset.from_list(examples), processing_class=tokenizer,
        peft_config=peft_config,
    )  # fmt: skip
    began = time.time()
    with contextlib.redirect_stdout(sys.stderr):  # stdout carries only the JSON; the trainer prints its logs
        trainer.train()
    minutes = (time.time() - began) / 60
    adapter = Path(args.output_dir) / "adapter"
    trainer.save_model(str(adapter))
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    return {
        "sft_minutes": round(minutes, 1),
        "loss_first": losses[0],
        "loss_last": losses[-1],
        "adapter": str(adapter),
    }


def sampled_start(adapter: Path, built: Any, rows: list[dict[str, Any]], k: int) -> dict[str, Any]:
    """The adapter's trajectories on `rows`, `k` samples each at the recipe's temperature: how many earn a per-turn
    reward, and how many are right."""
    from agentic_grpo.evaluate import evaluate, load_policy_for

    model, tokenizer = load_policy_for(str(adapter), built.rollout_parts)
    metrics, records = evaluate(
        model, tokenizer, built.rollout_parts, built.rewards, rows, k=k, temperature=built.config.temperature,
        progress=False, correctness=built.config.correctness_reward,
    )  # fmt: skip
    earning = [any(r > 0 for r in record.get("turn_rewards", [])) for record in records]  # kept when any was paid
    return {
        "questions": len(rows), "k": k, "temperature": built.config.temperature, "trajectories": len(records),
        "earn_turn_reward_rate": sum(earning) / len(records), "right_rate": metrics["accuracy"],
        f"pass@{k}": metrics[f"pass@{k}"],
    }  # fmt: skip


def seeded_recipe(recipe: Path, seed: int, out: Path) -> Path:
    """`recipe` written to `out/recipe.yaml` with its generated training rows decided by `seed` (`train_seed`, unless
    it sets one): the same seed solves and samples the same questions on every run."""
    import yaml

    spec = yaml.safe_load(recipe.read_text())
    dataset = spec.get("dataset")
    if isinstance(dataset, dict) and dataset.get("train_seed") is None:
        spec["dataset"] = {**dataset, "train_seed": seed}
    path = out / "recipe.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="agentic-grpo bench warm_start", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--recipe", default="credit_demo", help="recipe file or shipped name (default: credit_demo)")
    parser.add_argument("--demonstrations", type=int, default=256, help="training rows solved and trained on")
    parser.add_argument("--max-steps", type=int, default=32, help="fine-tuning steps")
    parser.add_argument("--batch-size", type=int, default=8, help="demonstrations a step")
    parser.add_argument("--learning-rate", type=float, default=1e-4, help="the adapter's learning rate")
    parser.add_argument(
        "--seed", type=int, default=0, help="the fine-tuning's seed, and the training rows' (train_seed)"
    )
    parser.add_argument("--sample-questions", type=int, default=12, help="training questions sampled afterwards")
    parser.add_argument("-k", "--k", type=int, default=8, help="samples per question afterwards")
    parser.add_argument("--output-dir", default="outputs/credit-warm-start", help="the adapter and JSON go here")
    args = parser.parse_args(argv)
    for name in ("demonstrations", "max_steps", "batch_size", "sample_questions", "k"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")

    from transformers import AutoTokenizer

    from agentic_grpo.models import resolve_model
    from agentic_grpo.resources import find_shipped
    from agentic_grpo.run_parts import build_recipe

    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    recipe = find_shipped(args.recipe, "recipes", ".yaml")
    built = build_recipe(["--config", str(seeded_recipe(recipe, args.seed, out)), "--output_dir", str(out / "unused")])
    if not built.model_config.use_peft:
        raise SystemExit(f"error: {recipe}: the warm start trains a LoRA adapter; the recipe needs `use_peft: true`")
    train = list(built.train)
    if len(train) < args.demonstrations + args.sample_questions:
        parser.error(f"the recipe has {len(train)} training rows, fewer than the demonstrations and sampled questions")
    model_path = resolve_model(built.model_config.model_name_or_path)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    solved = train[-args.demonstrations :]  # the far end of the split; the sampled questions come from its start
    trajectories = demonstrations(built, tokenizer, solved)
    print(f"{len(trajectories)} worked solutions, all right and paid", file=sys.stderr)
    tuned = fine_tune(built, model_path, tokenizer, [sft_example(t) for t in trajectories], args)
    result = {
        "benchmark": "warm_start", "recipe": recipe.name, "demonstrations": len(trajectories),
        "max_steps": args.max_steps, "batch_size": args.batch_size, "learning_rate": args.learning_rate,
        "seed": args.seed, **tuned,
        "sampled": sampled_start(Path(tuned["adapter"]), built, train[: args.sample_questions], args.k),
        "command": " ".join(["agentic-grpo bench warm_start", *(argv if argv is not None else sys.argv[1:])]),
    }  # fmt: skip
    (out / "warm_start.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
