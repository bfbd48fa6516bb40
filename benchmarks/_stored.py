"""Results a benchmark keeps on disk so that an interrupted or split run never redoes finished work."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any


def cached(path: Path, key: dict[str, Any], compute: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """`compute()`, or what an earlier invocation stored in `path` for the same `key` (recipe, budget)."""
    if path.exists():
        stored = json.loads(path.read_text())
        if stored.get("key") == key:
            return stored["value"]
    value = compute()
    path.write_text(json.dumps({"key": key, "value": value}, indent=2) + "\n")
    return value
