"""Results a benchmark keeps on disk so that an interrupted or split run never redoes finished work.

A stored result is reused only for the same key (recipe, budget) and the same code: the key carries a
digest of the installed agentic_grpo package's Python files, so a result measured before a code change
is measured again rather than reported as today's. A training run that was interrupted resumes from its last
checkpoint, which continues it exactly (docs/outputs_and_resume.md), when it is the same command on the same
recipe text and training code.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any


@functools.cache
def code_digest(benchmarks: bool = True) -> str:
    """A short digest of every `.py` file of the agentic_grpo package (tools and rewards included, and the
    benchmarks unless `benchmarks` is false: then it is the digest of the code a training run runs)."""
    import agentic_grpo

    digest = hashlib.sha256()
    roots = [Path(p) for p in agentic_grpo.__path__]
    for sub in ("tools", "rewards", *(["benchmarks"] if benchmarks else [])):
        module = __import__(f"agentic_grpo.{sub}", fromlist=["__path__"])
        roots += [Path(p) for p in module.__path__]
    for root in roots:
        for file in sorted(root.rglob("*.py")):
            digest.update(str(file.relative_to(root)).encode() + b"\0" + file.read_bytes())
    return digest.hexdigest()[:16]


def adapter_digest(directory: Path) -> str:
    """A digest of a saved LoRA adapter's weights: what was measured over an adapter is redone if it is retrained."""
    return hashlib.sha256((directory / "adapter_model.safetensors").read_bytes()).hexdigest()[:16]


def cached(path: Path, key: dict[str, Any], compute: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """`compute()`, or what an earlier invocation stored in `path` for the same `key` and code."""
    key = {**key, "code": code_digest()}
    if path.exists():
        stored = json.loads(path.read_text())
        if stored.get("key") == key:
            return stored["value"]
    value = compute()
    path.write_text(json.dumps({"key": key, "value": value}, indent=2) + "\n")
    return value


STAMP = "bench_run.json"
"""What a benchmark's training run was started as, in its output_dir: `training_stamp`'s command and digests."""


def training_stamp(command: list[str], recipe: str) -> dict[str, Any]:
    """The identity of a training run: its command, its recipe file's text and the training code (digests); a run
    resumed under other code would not continue what it started."""
    recipe_digest = hashlib.sha256(Path(recipe).read_bytes()).hexdigest()
    return {"command": command, "recipe": recipe_digest, "code": code_digest(benchmarks=False)}


def resumable(output_dir: str, stamp: dict[str, Any]) -> bool:
    """Whether `output_dir` holds an interrupted run of this very training (the same stamp) with a checkpoint to
    resume: run.json says it never completed. A finished run, another recipe or command, or no checkpoint: train
    anew."""
    folder = Path(output_dir)
    if not (folder / STAMP).exists() or not any(folder.glob("checkpoint-*")):
        return False
    if json.loads((folder / STAMP).read_text()) != stamp:
        return False
    run = folder / "run.json"
    return run.exists() and json.loads(run.read_text()).get("status") != "completed"
