"""`train.py` / `agentic-grpo train`: read a recipe, check everything, train, say where the results are.

Every check that can fail (recipe keys, model path, data columns, plug-in imports,
reward weights) runs before the output directory is touched, so a bad recipe stops
with one message and leaves nothing behind that looks like a run.
"""

from __future__ import annotations

import json
import logging
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

DEFAULT_RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "cpu_demo.yaml"
logger = logging.getLogger("agentic_grpo")


def build_rewards(specs: Any) -> tuple[list[Callable], list[float]]:
    """Reward callables and their weights from a recipe's `rewards:` list."""
    from agentic_grpo.plugins import PluginError, import_object

    if not specs:
        raise ValueError(
            "recipe field `rewards` is empty: name at least one, e.g. `{type: rewards.rules:Correctness}`"
        )
    if not isinstance(specs, list):
        raise ValueError("recipe field `rewards` must be a list of `{type: module:Class, weight: w, ...}`")
    funcs, weights, names = [], [], set()
    for position, spec in enumerate(specs):
        if not isinstance(spec, dict) or "type" not in spec:
            raise ValueError(f"reward #{position + 1} must be a mapping with a `type` key, got {spec!r}")
        spec = dict(spec)
        path, weight, name = spec.pop("type"), spec.pop("weight", 1.0), spec.pop("name", None)
        if not isinstance(weight, (int, float)) or isinstance(weight, bool):
            raise ValueError(f"reward `{path}`: weight must be a number, got {weight!r}")
        target = import_object(path, what="reward")
        try:
            func = target(**spec) if isinstance(target, type) else target
        except (TypeError, ValueError, OSError) as exc:
            raise PluginError(f"reward `{path}`: {exc}") from exc
        if not isinstance(target, type) and spec:
            raise PluginError(f"reward `{path}` is a function and takes no options; got {sorted(spec)}")
        if not callable(func):
            raise PluginError(f"reward `{path}` is not callable")
        name = name or getattr(func, "__name__", None) or type(func).__name__
        if name in names:
            raise ValueError(f"two rewards are named `{name}`: give each a distinct `name`")
        names.add(name)
        if isinstance(target, type):
            func.__name__ = name
        funcs.append(func)
        weights.append(float(weight))
    return funcs, weights


def main(argv: list[str] | None = None) -> int:
    # transformers 5 renamed `gradient_checkpointing`; TRL's config still sets the old name,
    # and the warning would greet every user at every start.
    warnings.filterwarnings("ignore", message=".*gradient_checkpointing.*deprecated", category=FutureWarning)
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        argv = ["--config", str(DEFAULT_RECIPE)]
        print(f"No recipe given: running the offline CPU demo ({DEFAULT_RECIPE.name}).", flush=True)
    if argv[0] in ("-h", "--help"):
        from trl import TrlParser

        from agentic_grpo.config import RECIPE_TYPES

        TrlParser(RECIPE_TYPES).parse_args_and_config(argv)
        return 0
    try:
        setup = prepare(argv)
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return run(*setup)


def prepare(argv: list[str]) -> tuple[Any, ...]:
    """Everything that can be checked before training; raises ValueError with one clear message."""
    from transformers import set_seed
    from trl import get_peft_config

    from agentic_grpo.config import read_recipe
    from agentic_grpo.data import add_prompts, check_columns, load_task_data
    from agentic_grpo.formats import load_format
    from agentic_grpo.models import resolve_model
    from agentic_grpo.trainer import load_environment

    recipe, config, model_config = read_recipe(argv)
    set_seed(config.seed)
    model_path = resolve_model(model_config.model_name_or_path or "")
    environment = load_environment(config.environment)
    trajectory_format = load_format(config.format, environment.tool_schemas(), **config.format_kwargs)
    rewards, weights = build_rewards(recipe.rewards)
    if config.reward_weights is not None and len(config.reward_weights) != len(rewards):
        raise ValueError(f"`reward_weights` has {len(config.reward_weights)} values for {len(rewards)} rewards")
    config.reward_weights = weights

    train, test = load_task_data(recipe.dataset)
    required = ["question"] + sorted({c for r in rewards for c in getattr(r, "required_columns", ())})
    check_columns(train, required, "training data")
    if test is not None:
        check_columns(test, required, "test data")
    train = add_prompts(train, trajectory_format)
    test = add_prompts(test, trajectory_format) if test is not None else None

    model_kwargs: dict[str, Any] = dict(config.model_init_kwargs or {})
    if model_config.dtype not in (None, "auto"):
        model_kwargs.setdefault("dtype", model_config.dtype)
    if model_config.attn_implementation:
        model_kwargs.setdefault("attn_implementation", model_config.attn_implementation)
    config.model_init_kwargs = model_kwargs
    peft_config = get_peft_config(model_config)
    return config, model_path, rewards, train, test, peft_config, argv


def run(config: Any, model_path: str, rewards: list, train: Any, test: Any, peft_config: Any, argv: list[str]) -> int:
    from agentic_grpo.run_files import write_run_status
    from agentic_grpo.trainer import AgenticGRPOTrainer

    start = time.time()
    trainer = AgenticGRPOTrainer(
        model=model_path, reward_funcs=rewards, args=config, train_dataset=train, peft_config=peft_config
    )
    main_process = trainer.accelerator.is_main_process
    if main_process:
        write_run_status(config.output_dir, "running", argv=argv, model=model_path, started=time.ctime(start))
    try:
        trainer.train(resume_from_checkpoint=config.resume_from_checkpoint)
        trainer.save_model(config.output_dir)
    except BaseException as exc:
        if main_process:
            write_run_status(config.output_dir, "failed", error=f"{type(exc).__name__}: {exc}")
        raise
    if main_process:
        write_run_status(config.output_dir, "completed", minutes=round((time.time() - start) / 60, 2))
        print(summary(Path(config.output_dir)), flush=True)
    return 0


def summary(output_dir: Path) -> str:
    """Where the run's files are, and how tool use changed from the first to the last logged step."""
    lines = [f"\nRun finished. Outputs in {output_dir.resolve()}:"]
    metrics_path = output_dir / "metrics.jsonl"
    lines.append(f"  metrics:      {metrics_path}")
    lines.append(f"  trajectories: {output_dir / 'trajectories'} (read with `agentic-grpo show`)")
    checkpoints = sorted(output_dir.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[-1]))
    lines.append(
        f"  model:        {output_dir}" + (f" (last checkpoint: {checkpoints[-1].name})" if checkpoints else "")
    )
    if metrics_path.exists():
        rows = [json.loads(line) for line in metrics_path.read_text().splitlines() if line.strip()]
        rows = [r for r in rows if "tools/call_rate" in r]
        if rows:
            first, last = rows[0], rows[-1]
            lines.append(
                f"  tool-call rate: {first['tools/call_rate']:.0%} (step {first['step']}) -> "
                f"{last['tools/call_rate']:.0%} (step {last['step']}); reward {first.get('reward', 0):.3f} -> "
                f"{last.get('reward', 0):.3f}"
            )
    return "\n".join(lines)
