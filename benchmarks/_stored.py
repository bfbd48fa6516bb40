"""Results a benchmark keeps on disk so that an interrupted or split run never redoes finished work.

A stored result is reused only for the same key (recipe, budget) and the same code: the key carries a
digest of the installed agentic_grpo package's Python files, so a result measured before a code change
is measured again rather than reported as today's.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any


@functools.cache
def code_digest() -> str:
    """A short digest of every `.py` file of the agentic_grpo package (tools, rewards and benchmarks included)."""
    import agentic_grpo

    digest = hashlib.sha256()
    roots = [Path(p) for p in agentic_grpo.__path__]
    for sub in ("tools", "rewards", "benchmarks"):
        module = __import__(f"agentic_grpo.{sub}", fromlist=["__path__"])
        roots += [Path(p) for p in module.__path__]
    for root in roots:
        for file in sorted(root.rglob("*.py")):
            digest.update(str(file.relative_to(root)).encode() + b"\0" + file.read_bytes())
    return digest.hexdigest()[:16]


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
