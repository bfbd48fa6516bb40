"""What the test modules share: the checkout's paths, the one way a test starts another process, and the one
builder of the trainers the in-process tests drive.

Test modules import from here (or from the support modules beside it: `scripted`, `envs`, `judge_fixtures`,
`credit_support`, `subagent_support`, `varied_rewards`, `legacy_rewards`), never from another `test_*.py`.

Lanes (markers in pyproject.toml): a test that starts a separate process (through the launchers below, a
two-process `accelerate launch`, a wheel install, the llama.cpp server fixtures) or trains for several steps
in-process is marked `integration`, a lane of its own (`pytest -m 'integration and not slow and not vllm'`);
plain `pytest` leaves it out.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MODEL_CACHE = ROOT / ".model-cache"  # where `tiny-random-llama` and downloaded models are built or kept
CPU_2PROC = ROOT / "accelerate_configs" / "cpu_2proc.yaml"


# --- starting another process ----------------------------------------------------------------------------


def environment(*, drop: tuple[str, ...] = (), **extra: str) -> dict[str, str]:
    """This process's environment for a child: the checkout's model cache, W&B off, then `extra`; the names in
    `drop` left out."""
    env = {name: value for name, value in os.environ.items() if name not in drop}
    env.update(AGENTIC_GRPO_CACHE=str(MODEL_CACHE), WANDB_MODE="disabled")
    env.update(extra)
    return env


def run_process(
    *command: str | Path,
    cwd: str | Path = ROOT,
    env: dict[str, str] | None = None,
    timeout: float = 600,
    check: bool = False,
) -> subprocess.CompletedProcess:
    """THE launcher: run `command` to its end with its output captured as text (`env` defaults to
    `environment()`). Every test that runs another program to completion goes through here; `Popen` stays
    only where a test needs the live process (to kill it, or to read it while it runs)."""
    return subprocess.run(
        [str(part) for part in command], cwd=cwd, env=environment() if env is None else env, capture_output=True,
        text=True, timeout=timeout, check=check,
    )  # fmt: skip


def run_python(
    *args: str | Path, cwd: str | Path = ROOT, timeout: float = 600, **env: str
) -> subprocess.CompletedProcess:
    """This interpreter on `args` (`-m module ...`, `-c code ...`, `script.py ...`), `env` added to `environment()`."""
    return run_process(sys.executable, *args, cwd=cwd, env=environment(**env), timeout=timeout)


def train(*args: str, cwd: str | Path = ROOT, timeout: float = 600, **env: str) -> subprocess.CompletedProcess:
    """`python train.py ARGS`, as a user runs a recipe."""
    return run_python(ROOT / "train.py", *args, cwd=cwd, timeout=timeout, **env)


def run_cli(*args: str, cwd: str | Path = ROOT, timeout: float = 600, **env: str) -> subprocess.CompletedProcess:
    """`agentic-grpo ARGS` (as `python -m agentic_grpo.cli`); the checkout is on the path, so a recipe run from
    another directory can name the support modules (`tests.varied_rewards:...`)."""
    env = {"HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT), **env}
    return run_python("-m", "agentic_grpo.cli", *args, cwd=cwd, timeout=timeout, **env)


def accelerate_launch(
    script: str | Path, *args: str, processes: int = 2, timeout: float = 600
) -> subprocess.CompletedProcess:
    """`accelerate launch --config_file accelerate_configs/cpu_2proc.yaml --num_processes N SCRIPT ARGS`, through
    the `accelerate` command, as a user types it."""
    accelerate = Path(sys.executable).with_name("accelerate")
    return run_process(accelerate, "launch", "--config_file", CPU_2PROC, "--num_processes", str(processes), script,
                       *args, timeout=timeout)  # fmt: skip


def launch_two_processes(script: str, *args: str) -> subprocess.CompletedProcess:
    """Run `tests/<script>` with `args` on 2 CPU processes (gloo) under `accelerate_configs/cpu_2proc.yaml`."""
    return run_python("-m", "accelerate.commands.launch", "--config_file", CPU_2PROC, ROOT / "tests" / script, *args,
                      PYTHONPATH=str(ROOT))  # fmt: skip


def write_recipe(tmp_path: Path, **changes: Any) -> Path:
    """`recipes/ci_tiny.yaml` with `changes` (a None value removes the field), written to `tmp_path/recipe.yaml`
    with its output under `tmp_path/out`."""
    import yaml

    recipe = yaml.safe_load((ROOT / "recipes" / "ci_tiny.yaml").read_text())
    recipe.update(changes)
    recipe["output_dir"] = str(tmp_path / "out")
    for key in [k for k, v in changes.items() if v is None]:
        recipe.pop(key)
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def missing(what: str, fix: str, *, module: bool = False) -> None:
    """Skip the test (with `module`, its whole module) because `what` is not on this machine, except under CI,
    where CI's setup installs it and a skip would hide that the test never ran: fail there."""
    import pytest

    if os.environ.get("CI"):
        pytest.fail(f"{what} is missing, and CI must run this test: {fix}", pytrace=False)
    pytest.skip(f"{what} is missing ({fix})", allow_module_level=module)


def require_vllm() -> None:
    """At a vLLM test module's top: skip it where vLLM is not installed (under CI: fail, see `missing`)."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        missing("vLLM", "WITH_VLLM=1 bash scripts/setup.sh", module=True)


# --- a trainer in this process ---------------------------------------------------------------------------

TRAINER_DEFAULTS: dict[str, Any] = dict(
    num_generations=4, per_device_train_batch_size=4, gradient_checkpointing=False, report_to=[],
    save_strategy="no", seed=0,
)  # fmt: skip


def build_trainer(
    model_dir: str | Path,
    output_dir: str | Path,
    reward_funcs: list,
    rows: list[dict[str, Any]],
    *,
    scripts: dict[str, list[str]] | None = None,
    peft_config: Any = None,
    environment_factory: Any = None,
    stepped_by_hand: bool = True,
    **config: Any,
):
    """An `AgenticGRPOTrainer` (with the layers the config needs) on `rows`, its config `TRAINER_DEFAULTS` updated with `config`.

    `scripts`: a `ScriptedBackend` plays them instead of the model generating (`tests.scripted`).
    `stepped_by_hand`: the test calls `generate_and_score` / `compute_loss` itself, around the
    Trainer's loop, so the model is put in train mode and the accumulation count the loop would set is 1.
    """
    from datasets import Dataset

    from agentic_grpo.config import AgenticGRPOConfig
    from agentic_grpo.trainer_layers import trainer_class
    from tests.scripted import ScriptedBackend

    args = AgenticGRPOConfig(**{**TRAINER_DEFAULTS, "output_dir": str(output_dir), **config})
    trainer = trainer_class(args)(model=str(model_dir), reward_funcs=list(reward_funcs), args=args,
                                 train_dataset=Dataset.from_list(rows), peft_config=peft_config,
                                    environment_factory=environment_factory)  # fmt: skip
    if scripts is not None:
        trainer.generation_backend = ScriptedBackend(trainer.processing_class, scripts)
    if stepped_by_hand:
        trainer.model.train()
        trainer.current_gradient_accumulation_steps = 1
    return trainer


def scored_two_groups(model_dir: str | Path, output_dir: str | Path, **config: Any) -> tuple[Any, dict[str, Any]]:
    """A trainer on two questions x 4 (calculator, up to 2 turns, beta 0.04) and its scored inputs, whose rewards
    vary with the sampled tokens, so advantages are not all zero."""
    from tests.scripted import case_prompt

    def by_tokens(prompts, completions, trajectory, **_):
        return [float(sum(t.completion_ids) % 3) for t in trajectory]

    rows = [{"prompt": case_prompt(name), "question": name, "answer": "1"} for name in ("a", "b") for _ in range(4)]
    trainer = build_trainer(
        model_dir, output_dir, [by_tokens], rows, environment="agentic_grpo.tools.calculator:Calculator",
        per_device_train_batch_size=8, max_completion_length=48, max_tokens_per_turn=16, max_turns=2, beta=0.04,
        save_trajectories_steps=0, **config,
    )  # fmt: skip
    inputs = trainer.generate_and_score(rows)
    assert inputs["advantages"].abs().sum() > 0
    return trainer, inputs


def trainer_loss_and_grads(trainer: Any, inputs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """The trainer's loss on `inputs` and the gradients it leaves on each parameter."""
    trainer.model.zero_grad()
    loss = trainer.compute_loss(trainer.model, inputs)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}
