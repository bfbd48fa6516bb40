"""Files shipped with agentic-grpo: recipes, judge rubrics and benchmarks.

They live in the top-level `recipes/`, `rubrics/` and `benchmarks/` folders of a checkout
and install as the packages `agentic_grpo.recipes`, `agentic_grpo.rubrics` and
`agentic_grpo.benchmarks` (see pyproject.toml), so `importlib.resources` finds them the same
way after `pip install -e .` and after a plain `pip install .`, from any working directory.
An explicit path that exists always wins over a shipped name.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path


def shipped_dir(kind: str) -> Path:
    """The installed folder of `recipes`, `rubrics`, `benchmarks` or `accelerate_configs`."""
    return Path(str(resources.files(f"agentic_grpo.{kind}")))


def shipped_names(kind: str, suffix: str) -> list[str]:
    """Names (without suffix) of the shipped files of one kind, e.g. the recipes."""
    return sorted(p.stem for p in shipped_dir(kind).glob(f"*{suffix}") if not p.name.startswith("_"))


def find_shipped(name_or_path: str | Path, kind: str, suffix: str) -> Path:
    """An existing file: `name_or_path` itself, else the shipped file of that name.

    `cpu_demo`, `cpu_demo.yaml` and `recipes/cpu_demo.yaml` all name the shipped demo recipe,
    so the README's commands work from any directory. Raises ValueError listing what ships.
    """
    path = Path(name_or_path)
    if path.is_file():
        return path
    if path.parent in (Path("."), Path(kind)):
        candidate = shipped_dir(kind) / (path.name if path.suffix == suffix else path.name + suffix)
        if candidate.is_file():
            return candidate
    known = ", ".join(shipped_names(kind, suffix))
    singular = kind.rstrip("s")
    raise ValueError(
        f"{singular} `{name_or_path}` is neither a file (looked in {Path.cwd()}) nor a shipped {singular} "
        f"(shipped: {known})"
    )
