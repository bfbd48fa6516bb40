"""Isolated slots that run model-written code: the sandbox every code-running tool goes through.

Layers, strongest first, chosen by a start-up probe: bubblewrap namespaces; per-slot uid +
Landlock + seccomp where user namespaces are unavailable; an explicit `unsafe-local` opt-in.
See `agentic_grpo.sandbox.probe.probe()` for what each protection rests on, `agentic-grpo sandbox check` to verify a host.
"""

import importlib
from typing import Any

# Each name's module, imported on first use: a recipe whose tools run no code never loads the slot machinery.
_EXPORTS = {
    "ExecResult": "config", "SandboxConfig": "config", "SandboxUnavailable": "config", "SandboxPool": "pool",
    "ProbeReport": "probe", "SandboxSlot": "slot",
}  # fmt: skip  # the probe function shares its module's name: `from agentic_grpo.sandbox.probe import probe`
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
