"""`agentic-grpo eval`: held-out accuracy with the same rollouts, tools and sandbox as training.

No gradient, no trainer: the recipe's environment, format and rewards run through the
`RolloutManager` on a model (a checkpoint, a LoRA adapter directory, or the untrained
base). pass@1 decodes greedily; pass@k samples k trajectories per question. A
trajectory is correct when the recipe's correctness reward (recipe field
`correctness_reward`, default the reward named `correctness`) gives it at least 1.0.
Its rollout metrics carry the names training logs them under (`tools/call_rate`, ...).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from agentic_grpo.data import row_prompt
from agentic_grpo.eval_breakdown import kind_breakdown
from agentic_grpo.reward_setup import score_trajectories
from agentic_grpo.rollout import RolloutStats
from agentic_grpo.rollout_metrics import rollout_metrics, selection_counts, selection_metrics, tool_names_of
from agentic_grpo.rollout_parts import RolloutParts
from agentic_grpo.trajectory import Trajectory, plain_columns


class EvaluationError(RuntimeError):
    """A reward raised while scoring an evaluation; `records` holds every trajectory, unscored."""

    def __init__(self, message: str, records: list[dict[str, Any]]) -> None:
        super().__init__(message)
        self.records = records


def load_policy(path: str, merge: bool = True) -> tuple[Any, Any]:
    """Model and tokenizer from a model directory, hub id, alias, or LoRA adapter directory (merged into its base
    unless `merge=False`: sub-agents that run under LoRA adapters need the policy's PeftModel)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentic_grpo.models import resolve_model

    adapter = Path(path) / "adapter_config.json"
    if adapter.exists():
        from peft import AutoPeftModelForCausalLM

        model = AutoPeftModelForCausalLM.from_pretrained(path)
        tokenizer = AutoTokenizer.from_pretrained(path)
        return (model.merge_and_unload() if merge else model), tokenizer
    resolved = resolve_model(path)
    return AutoModelForCausalLM.from_pretrained(resolved), AutoTokenizer.from_pretrained(resolved)


def load_policy_for(path: str, parts: RolloutParts) -> tuple[Any, Any]:
    """`load_policy` for a recipe's parts. A LoRA policy stays unmerged when sub-agents run under adapters, or on
    its base with the adapter off (`__base__`: merged, the trained weights would answer for the base). When
    sub-agents run under LoRA adapters, the policy stays a PeftModel (a base model gets an adapter that changes
    nothing), and each sub-agent adapter saved beside the policy's (`path/NAME/`, as a run saves co-trained and
    frozen sub-agents) is loaded under its name, unless the recipe gives that sub-agent an `adapter_path`."""
    adapters = [getattr(a, "adapter", None) for a in parts.all_agents()]
    agents = [a for a in parts.all_agents() if getattr(a, "adapter", None) not in (None, "__base__")]
    model, tokenizer = load_policy(path, merge=not any(name is not None for name in adapters))
    if not agents:
        return model, tokenizer
    from peft import LoraConfig, PeftModel, get_peft_model

    if not isinstance(model, PeftModel):  # B = 0: the base model itself, with room for the sub-agents' adapters
        model = get_peft_model(model, LoraConfig(r=1, target_modules="all-linear", init_lora_weights=True))
    for agent in agents:
        saved = Path(path) / agent.adapter
        if agent.source.adapter_path is None and (saved / "adapter_config.json").exists():
            model.load_adapter(str(saved), adapter_name=agent.adapter, is_trainable=False)
    return model, tokenizer


def evaluate(
    model: Any,
    tokenizer: Any,
    parts: RolloutParts,
    rewards: list,
    rows: list[dict[str, Any]],
    k: int = 1,
    temperature: float = 0.7,
    top_p: float = 1.0,
    batch_size: int = 16,
    progress: bool = True,
    sandbox_pool: Any = None,
    correctness: str | None = None,
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """Metrics over `rows` and one record per trajectory; greedy when k == 1, sampling otherwise. `correctness`
    names the reward that decides correctness (`correctness_reward`; default: the reward named `correctness`).

    Code tools run in `sandbox_pool` when given (a trainer's own, so one process never holds two pools that
    compete for the per-slot cgroups), otherwise in a pool opened and closed here. Raises `EvaluationError`,
    carrying the unscored trajectories, when a reward raises.
    """
    from transformers import GenerationConfig

    from agentic_grpo.backends import TransformersBackend

    judge_of_correctness = correctness_reward_name(rewards, correctness)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    eos = model.generation_config.eos_token_id
    eos_ids = sorted({tokenizer.eos_token_id, *([eos] if isinstance(eos, int) else (eos or []))})
    sampling = k > 1
    generation_config = GenerationConfig(
        do_sample=sampling,
        temperature=temperature if sampling else None,
        top_p=top_p if sampling else None,
        top_k=None,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=eos_ids,
    )
    if parts.agents:  # sub-agents under LoRA adapters run on this model: their adapters join it
        from agentic_grpo.subagents.sources import attach_adapters

        attach_adapters(model, parts.all_agents())
    backend = TransformersBackend(model.eval(), tokenizer, generation_config, eos_ids)
    repeated = [row for row in rows for _ in range(k)]
    trajectories, stats = roll_out_rows(parts, tokenizer, repeated, backend, sandbox_pool, batch_size, progress)

    try:
        scores = score_trajectories(rewards, trajectories, repeated)
    except Exception as exc:
        records = [{**t.to_dict(), "row": plain_columns(row)} for t, row in zip(trajectories, repeated, strict=True)]
        raise EvaluationError(f"a reward raised {type(exc).__name__}: {exc}", records) from exc
    correct = [s is not None and s >= 1.0 for s in scores[judge_of_correctness]]
    per_question = [any(correct[i * k : (i + 1) * k]) for i in range(len(rows))]
    n = max(1, len(trajectories))
    metrics = {
        "questions": len(rows),
        "k": k,
        "accuracy": sum(correct) / n,
        f"pass@{k}": sum(per_question) / max(1, len(rows)),
        "correctness_reward": judge_of_correctness,
        "completions/mean_length": sum(len(t.completion_ids) for t in trajectories) / n,
    }
    if trajectories:  # the names and formulas training logs (one process: the sums are the local ones)
        metrics.update(rollout_metrics(trajectories, stats, lambda counts: counts))
    names = tool_names_of(parts)  # tools/selection_accuracy, routing/accuracy, tools/calls/<name>
    agent_names = [agent.name for agent in parts.agents]
    counts = selection_counts(trajectories, repeated, names, agent_names)
    metrics.update(selection_metrics(counts, names))
    metrics.update(kind_breakdown(trajectories, repeated, correct, names, agent_names))
    if parts.agents and trajectories:
        from agentic_grpo.subagents.usage import subagent_metrics

        metrics.update(subagent_metrics(trajectories, lambda counts: counts))
    for name, values in scores.items():
        given = [v for v in values if v is not None]
        metrics[f"rewards/{name}/mean"] = sum(given) / len(given) if given else None
    records = []
    for i, (trajectory, row) in enumerate(zip(trajectories, repeated, strict=True)):
        per_reward = {name: values[i] for name, values in scores.items()}
        records.append(
            {**trajectory.to_dict(), "row": plain_columns(row), "rewards": per_reward, "correct": correct[i]}
        )
    return metrics, records


def roll_out_rows(
    parts: RolloutParts,
    tokenizer: Any,
    rows: list[dict[str, Any]],
    backend: Any,
    sandbox_pool: Any = None,
    batch_size: int = 16,
    progress: bool = False,
) -> tuple[list[Trajectory], RolloutStats]:
    """One trajectory per row, sampled from `backend` by the recipe's own rollout manager, `batch_size` rows at a
    time. Code tools run in `sandbox_pool` when given, otherwise in a pool opened and closed here."""
    own_pool = sandbox_pool is None
    pool = parts.sandbox_pool(rank=0) if own_pool else sandbox_pool
    manager = parts.rollout_manager(tokenizer, pool)
    trajectories: list[Trajectory] = []
    stats = RolloutStats()
    try:
        for start in tqdm(range(0, len(rows), batch_size), desc="eval", disable=not progress):
            chunk = rows[start : start + batch_size]
            prompts = [row_prompt(parts.trajectory_format, r, parts.environment) for r in chunk]
            done, chunk_stats = manager.rollout(prompts, chunk, backend)
            trajectories.extend(done)
            stats.generation_seconds += chunk_stats.generation_seconds
            stats.tool_seconds += chunk_stats.tool_seconds
    finally:
        manager.close()
        if own_pool and pool is not None:
            pool.close()
    return trajectories, stats


def correctness_reward_name(rewards: list, name: str | None = None) -> str:
    """The reward that decides correctness: `name` (recipe field `correctness_reward`), or the reward named
    `correctness`; raises ValueError naming the rewards there are when neither is found."""
    names = [getattr(func, "__name__", repr(func)) for func in rewards]
    wanted = name or "correctness"
    if wanted not in names:
        how = "is not among" if name else "is not set and no reward is named `correctness` among"
        raise ValueError(f"`correctness_reward` {f'`{name}` ' if name else ''}{how} the recipe's rewards {names}: set "
                         "`correctness_reward: NAME` in the recipe to the reward that pays 1 for a correct answer")  # fmt: skip
    return wanted


def write_report(path: str | Path, metrics: dict[str, Any], records: list[dict[str, Any]]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(metrics, indent=2) + "\n")
    with path.with_suffix(".trajectories.jsonl").open("w") as f:
        for record in records:
            f.write(json.dumps(record, default=str) + "\n")


def evaluate_held_out(model: str, recipe: str | Path, questions: int, k: int = 1) -> tuple[dict, list[dict]]:
    """`model` (a path, alias or adapter) on the first `questions` rows of a recipe's test split, with the recipe's
    own parts and rewards: what the benchmarks measure before and after training."""
    import tempfile

    from agentic_grpo.run_parts import build_recipe

    built = build_recipe(
        ["--config", str(recipe), "--output_dir", str(Path(tempfile.gettempdir()) / "agentic-grpo-eval")]
    )
    if built.test is None:
        raise ValueError(f"recipe `{recipe}` has no held-out split: set `num_test` (or `test_split`)")
    policy, tokenizer = load_policy_for(model, built.rollout_parts)
    rows = list(built.test)[:questions]
    return evaluate(policy, tokenizer, built.rollout_parts, built.rewards, rows, k=k, progress=False,
                    correctness=built.config.correctness_reward)  # fmt: skip


def held_out_accuracy(trainer: Any, rewards: list, rows: list[dict[str, Any]]) -> dict[str, float]:
    """Greedy pass@1 of the trainer's current policy on `rows` (run on the main process of a one-process run)."""
    model = trainer.accelerator.unwrap_model(trainer.model)
    was_training = model.training
    try:
        metrics, _ = evaluate(model, trainer.processing_class, trainer.rollout_parts, rewards, rows, k=1,
                              sandbox_pool=trainer.sandbox_pool, correctness=trainer.args.correctness_reward)  # fmt: skip
    finally:
        model.train(was_training)
    return metrics
