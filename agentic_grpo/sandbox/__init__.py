"""Isolated slots that run model-written code: the sandbox every code-running tool goes through.

Layers, strongest first, chosen by a start-up probe: bubblewrap namespaces; per-slot uid +
Landlock + seccomp where user namespaces are unavailable; an explicit `unsafe-local` opt-in.
See `probe()` for what each protection rests on, `agentic-grpo sandbox check` to verify a host.
"""

from .config import ExecResult, SandboxConfig, SandboxUnavailable
from .pool import SandboxPool
from .probe import ProbeReport, probe
from .slot import SandboxSlot

__all__ = ["ExecResult", "ProbeReport", "SandboxConfig", "SandboxPool", "SandboxSlot", "SandboxUnavailable", "probe"]
