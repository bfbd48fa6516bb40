"""Attacks on what outlives a call or reaches past it: code that undoes what kills it at the deadline, that starts
with the trainer's ignored signals, that signals itself to death, or that opens its workspace to other local users.

Harm is judged on the host (a heartbeat file that still grows after the call returned), or by what the code
reports of its own signal dispositions.
"""

from __future__ import annotations

import os
import secrets
import signal
import threading
from pathlib import Path

from ..slot import SandboxSlot
from .support import AttackResult, Context, last_json, run_code, still_growing

_CLEAR_PDEATHSIG = """
import ctypes, json, time
# {marker}
libc = ctypes.CDLL(None, use_errno=True)
cleared = libc.prctl(1, 0, 0, 0, 0)  # PR_SET_PDEATHSIG, 0: no signal when the parent dies
sig = ctypes.c_int(-1)
libc.prctl(2, ctypes.byref(sig), 0, 0, 0)  # PR_GET_PDEATHSIG
print(json.dumps({{"cleared": cleared, "pdeathsig_now": sig.value}}), flush=True)
while True:
    with open("heartbeat", "a") as f:
        f.write(".")
    time.sleep(0.05)
"""


def pdeathsig_cleared(ctx: Context, slot: SandboxSlot) -> AttackResult:
    """Clear the parent-death signal, then run past the deadline: without root, under bwrap, the code is the
    namespace's pid 1, and that signal is what kills it when the trainer kills bwrap."""
    marker = f"agentic-grpo-attack-{secrets.token_hex(8)}"
    result = run_code(slot, _CLEAR_PDEATHSIG.format(marker=marker), timeout=1.5)
    beating = still_growing(slot.workspace / "heartbeat")
    survivors = _kill_marked(marker)  # a survivor must not outlive the check either
    blocked = result.timed_out and not beating and not survivors
    detail = f"timed_out={result.timed_out} beating={beating} survivors={survivors} code said {last_json(result)}"
    return AttackResult("pdeathsig_cleared", blocked, detail)


_SELF_KILL = """
import os, signal
print("alive", flush=True)
os.kill(os.getpid(), signal.SIGKILL)
print("survived", flush=True)
"""


def self_kill_status(ctx: Context, slot: SandboxSlot) -> AttackResult:
    """Code that kills itself with SIGKILL must end the call as killed (exit 137), as it would anywhere else:
    a process that is its namespace's pid 1 cannot signal itself to death, and the call would report the code's
    own exit status instead (a tool's error read as success)."""
    result = run_code(slot, _SELF_KILL)
    survived = "survived" in result.stdout
    blocked = result.exit_code == 128 + signal.SIGKILL and not survived and "alive" in result.stdout
    return AttackResult("self_kill_status", blocked, f"exit_code={result.exit_code} survived={survived}")


_SIGNALS_SEEN = """
import json, signal
ignored = [int(s) for s in signal.valid_signals() if signal.getsignal(s) is signal.SIG_IGN]
print(json.dumps({"ignored": ignored, "blocked": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, []))}))
"""
_TRAINER_IGNORES = (signal.SIGHUP, signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)


def ignored_signals(ctx: Context, slot: SandboxSlot) -> AttackResult:
    """A trainer started under `nohup` or in the background ignores SIGHUP or SIGINT; its slot's code must start
    with every signal at its default, or the signals that end it (the launcher's SIGTERM among them) do not."""
    if threading.current_thread() is not threading.main_thread():
        return AttackResult(
            "ignored_signals", True, "not run", skipped="signal dispositions are set in the main thread"
        )
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in _TRAINER_IGNORES}
    try:
        result = run_code(slot, _SIGNALS_SEEN)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    seen = last_json(result)
    if "ignored" not in seen:
        return AttackResult("ignored_signals", False, f"no answer: {result.stderr[-300:]}")
    inherited = [sig.name for sig in _TRAINER_IGNORES if sig in seen["ignored"] or sig in seen["blocked"]]
    return AttackResult("ignored_signals", not inherited, f"ignored or blocked in the slot: {inherited or 'none'}")


_HEAVY_CHILDREN = """
import os, time
# {marker}
for _ in range({children}):
    if os.fork() == 0:
        os.setsid()  # out of the code's process group: only the launcher's list of its children finds it
        if os.fork() == 0:  # a light grandchild, re-parented to the launcher only once its parent has died
            os.setsid()
            while True:
                with open("heartbeat", "a") as f:
                    f.write(".")
                time.sleep(0.05)
        hold = b"x" * ({megabytes} << 20)  # an address space the kernel takes a while to free
        while True:
            time.sleep(1)
print("started", flush=True)
while True:
    time.sleep(1)
"""


def heavy_children(ctx: Context, slot: SandboxSlot) -> AttackResult:
    """Children that each hold most of the address space allowed, each with a light grandchild in a session of
    its own, then run past the deadline: a killed child frees its memory before its own children are re-parented
    to the launcher, so a clean-up that gives up after a number of rounds, not once nothing is left, returns
    while grandchildren run on."""
    marker = f"agentic-grpo-attack-{secrets.token_hex(8)}"
    megabytes = max(64, min(slot.pool.config.memory_mb - 160, 800))
    code = _HEAVY_CHILDREN.format(marker=marker, children=4, megabytes=megabytes)
    result = run_code(slot, code, timeout=3.0)
    beating = still_growing(slot.workspace / "heartbeat")
    survivors = _kill_marked(marker)
    blocked = result.timed_out and not beating and not survivors
    detail = f"timed_out={result.timed_out} beating={beating} survivors={len(survivors)} ({megabytes} MB children)"
    return AttackResult("heavy_children", blocked, detail)


def _kill_marked(marker: str) -> list[int]:
    """SIGKILL every host process whose command line carries `marker`; their pids."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                if marker.encode() not in f.read():
                    continue
            os.kill(int(name), signal.SIGKILL)
            found.append(int(name))
        except OSError:
            pass
    return found


_OPEN_TO_OTHERS = """
import json, os, shutil, stat, sys
out = {}
for name, step in (("chmod workspace 0777", lambda: os.chmod(".", 0o777)),
                   ("fifo", lambda: (os.mkfifo("pipe"), os.chmod("pipe", 0o666))),
                   ("setuid copy", lambda: (shutil.copy(sys.executable, "py"), os.chmod("py", 0o4755)))):
    try:
        step()
        out[name] = "OK"
    except OSError as exc:
        out[name] = exc.errno
print(json.dumps(out))
"""


def workspace_open_to_others(ctx: Context, slot: SandboxSlot) -> AttackResult:
    """Open the workspace to every local user and leave a FIFO (a two-way channel with another user) and a setuid
    copy of the interpreter (without root, the trainer's uid for whoever runs it). Harm: another local user,
    by the permission bits on the host path, reaches either."""
    result = run_code(slot, _OPEN_TO_OTHERS)
    reachable = [name for name in ("pipe", "py") if _others_reach(slot.workspace / name)]
    detail = f"reachable by other local users: {reachable or 'none'}; code said {last_json(result)}"
    return AttackResult("workspace_open_to_others", bool(last_json(result)) and not reachable, detail)


def _others_reach(path: Path) -> bool:
    """Whether a user who is neither the owner nor in the group of anything on the way can open `path`: every
    directory above it searchable by others, and the file itself open to them."""
    try:
        info = os.lstat(path)
    except OSError:
        return False
    if not info.st_mode & 0o006:
        return False
    return all(os.stat(parent).st_mode & 0o001 for parent in path.parents)
