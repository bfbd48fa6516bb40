"""`pip install .` (not editable) works from any directory, next to a user's own `tools` and `rewards` packages.

A wheel is built from this checkout and installed into a fresh venv. The venv borrows the
running environment's dependencies (torch, transformers, TRL, ...) through a `.pth` line
rather than downloading them again: what is under test is our packaging, not PyPI. The
running environment's editable install of agentic-grpo is not visible there, because the
`.pth` files of a borrowed folder are not executed.

Every command then runs from a user's project directory that holds its own `tools/` and
`rewards/` packages (common folder names), which must neither shadow the built-ins nor be
shadowed by them.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sysconfig
import textwrap
from pathlib import Path

import pytest

from tests.helpers import ROOT, environment, run_process, run_python

pytestmark = pytest.mark.integration  # a wheel built and installed into a venv; every command a process

USER_TOOLS = '''
from agentic_grpo import ToolEnvironment


class Shout(ToolEnvironment):
    """The user's own environment, in the user's own `tools` package."""

    def shout(self, text: str) -> str:
        """Upper-case a text.

        Args:
            text: The text.
        """
        return text.upper()
'''

USER_REWARD = """
def brevity(prompts, completions, trajectory, **kwargs):
    return [1.0 / (1 + len(t.completion_ids)) for t in trajectory]
"""

USER_RECIPE = """
model_name_or_path: tiny-random-llama
dataset: {generator: agentic_grpo.tasks:multiplication_word_problems, num_train: 8, num_test: 2, seed: 0}
environment: tools.shout:Shout
rewards:
  - {type: rewards.mine:brevity}
  - {type: agentic_grpo.rewards.rules:Correctness}
num_generations: 2
per_device_train_batch_size: 2
max_steps: 1
max_turns: 2
max_tokens_per_turn: 16
max_completion_length: 48
save_steps: 1
report_to: none
output_dir: out/mine
"""


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict[str, Path]:
    """A fresh venv with agentic-grpo installed from a wheel, and a user's project directory."""
    base = tmp_path_factory.mktemp("install")
    wheel_dir = base / "wheels"
    # Built from a copy of the tracked files: building in the checkout leaves `build/lib` behind, from which a
    # later wheel could pick up modules that no longer exist.
    source = base / "source"
    tracked = run_process("git", "ls-files", "-z", check=True).stdout
    for name in filter(None, tracked.split("\0")):
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    build = run_python("-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", wheel_dir, source,
                       cwd=base)  # fmt: skip
    assert build.returncode == 0, build.stderr[-3000:]
    venv = base / "venv"
    run_python("-m", "venv", venv, timeout=300).check_returncode()
    python = venv / "bin" / "python"
    paths = run_process(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=base,
                        check=True)  # fmt: skip
    site = Path(paths.stdout.strip())
    (site / "_borrowed_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    wheel = next(wheel_dir.glob("agentic_grpo-*.whl"))
    install = run_process(python, "-m", "pip", "install", "--no-deps", "--no-index", "-q", wheel, cwd=base)
    assert install.returncode == 0, install.stderr[-3000:]

    project = base / "user_project"
    (project / "tools").mkdir(parents=True)
    (project / "tools" / "__init__.py").write_text("")
    (project / "tools" / "shout.py").write_text(USER_TOOLS)
    (project / "rewards").mkdir()
    (project / "rewards" / "__init__.py").write_text("")
    (project / "rewards" / "mine.py").write_text(USER_REWARD)
    (project / "mine.yaml").write_text(USER_RECIPE)
    return {"venv": venv, "site": site, "project": project}


def run(installed: dict[str, Path], *command: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = environment(drop=("PYTHONPATH", "VIRTUAL_ENV"), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    env["PATH"] = f"{installed['venv'] / 'bin'}:{env.get('PATH', '')}"
    return run_process(*command, cwd=installed["project"], env=env, timeout=timeout)


def test_built_ins_and_their_files_install_under_agentic_grpo_only(installed):
    site = installed["site"]
    for path in ["tools/calculator.py", "rewards/rules.py", "recipes/cpu_demo.yaml", "recipes/ci_tiny.yaml",
                 "rubrics/tool_use.md", "benchmarks/learning.py", "sandbox/launcher.py",
                 "accelerate_configs/cpu_2proc.yaml"]:  # fmt: skip
        assert (site / "agentic_grpo" / path).is_file(), path
    for name in ["tools", "rewards", "recipes", "rubrics", "benchmarks", "accelerate_configs", "tests"]:
        assert not (site / name).exists(), f"{name} installed as a top-level package"


def test_installed_code_is_the_wheel_not_the_checkout(installed):
    result = run(installed, "python", "-c", "import agentic_grpo.tools.calculator as m; print(m.__file__)")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().startswith(str(installed["site"]))


def test_users_own_tools_and_rewards_train_beside_the_built_ins(installed):
    result = run(installed, "agentic-grpo", "train", "--config", "mine.yaml")
    assert result.returncode == 0, result.stderr[-3000:]
    out = installed["project"] / "out" / "mine"
    assert (out / "checkpoint-1").is_dir() and (out / "metrics.jsonl").is_file()
    record = (out / "trajectories" / "step_000001.jsonl").read_text()
    assert '"brevity"' in record and '"correctness"' in record


def test_shipped_recipe_by_name_evaluates_with_the_built_in_calculator(installed):
    # The user's `tools` package is first on the path here; the recipe's calculator must still be ours.
    result = run(installed, "agentic-grpo", "eval", "--model", "tiny-random-llama", "--recipe", "ci_tiny",
                 "--limit", "2", "--output", "eval/report.json")  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert (installed["project"] / "eval" / "report.trajectories.jsonl").is_file()


def test_shipped_recipe_by_name_trains(installed):
    result = run(installed, "agentic-grpo", "train", "--config", "ci_tiny", "--max_steps", "1", "--output_dir",
                 "out/shipped", "--save_strategy", "no")  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert (installed["project"] / "out" / "shipped" / "metrics.jsonl").is_file()


def test_two_processes_launch_with_a_shipped_accelerate_config_named(installed):
    """A pip user has no `accelerate_configs/` folder: `--accelerate_config cpu_2proc` finds the shipped one."""
    result = run(installed, "agentic-grpo", "train", "--accelerate_config", "cpu_2proc", "--config", "ci_tiny",
                 "--max_steps", "1", "--output_dir", "out/two", "--save_strategy", "no")  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert str(installed["site"] / "agentic_grpo" / "accelerate_configs" / "cpu_2proc.yaml") in result.stdout
    files = sorted((installed["project"] / "out" / "two" / "trajectories").glob("step_000001.rank*.jsonl"))
    assert [f.name for f in files] == ["step_000001.rank0.jsonl", "step_000001.rank1.jsonl"]  # one per process
    assert all(len(f.read_text().splitlines()) == 4 for f in files)  # each process: one question x G=4


def test_bench_knows_and_runs_the_shipped_benchmarks(installed):
    shipped = sorted(p.stem for p in (ROOT / "benchmarks").glob("*.py") if not p.name.startswith("_"))
    unknown = run(installed, "agentic-grpo", "bench", "nope")
    assert unknown.returncode == 2 and f"known: {', '.join(shipped)}" in unknown.stderr
    shown = run(installed, "agentic-grpo", "bench", "sandbox", "--help")
    assert shown.returncode == 0 and shown.stdout.startswith("usage: agentic-grpo bench sandbox")
    ran = run(installed, "agentic-grpo", "bench", "learning", "--recipe", "ci_tiny", "--seeds", "0", "--max-steps",
              "1", "--questions", "2", "--output-dir", "out/bench")  # fmt: skip
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert json.loads(ran.stdout)["runs"][0]["seed"] == 0


def test_judge_finds_its_default_rubrics_as_package_data(installed):
    code = textwrap.dedent("""
        from agentic_grpo.rewards.judge import LLMJudge
        for mode in ("trajectory", "group"):
            judge = LLMJudge(endpoint="http://127.0.0.1:9/v1", model="judge", mode=mode, check_endpoint=False)
            print(judge.rubric_path)
    """)
    result = run(installed, "python", "-c", code)
    assert result.returncode == 0, result.stderr[-3000:]
    paths = result.stdout.split()
    assert [Path(p).name for p in paths] == ["tool_use.md", "tool_use_group.md"]
    assert all(p.startswith(str(installed["site"])) for p in paths)


def test_sandbox_check_runs_from_the_installed_package(installed):
    result = run(installed, "agentic-grpo", "sandbox", "check")
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert "layer" in result.stdout
