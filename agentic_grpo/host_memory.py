"""Freed host memory handed back to the system, so that a CPU run's resident size follows what it holds.

PyTorch's CPU tensors come from the C heap (glibc `malloc`). Tensors under glibc's mmap threshold (which rises to
32 MB as large blocks are freed) live in heap arenas, and a freed block there stays resident until a later
allocation reuses it: a step that frees a rollout's key/value caches, then the pieces of a loss read, leaves
holes that different-sized tensors do not fill. The resident size then grows to about twice what the tensors
need. `release_freed_memory` returns the heap's free pages to the system (glibc's `malloc_trim`) at the points
where a phase has just freed a lot; it does nothing where the C library has no such call.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Callable

import torch


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    return getattr(libc, "malloc_trim", None)


def release_freed_memory(device: torch.device | str = "cpu") -> None:
    """Hand the C heap's free pages back to the system when `device` is the CPU (tensors on an accelerator are
    not in the C heap)."""
    trim = _malloc_trim()
    if trim is not None and torch.device(device).type == "cpu":
        trim(0)
