"""The probe's result on disk, per host state: `sandbox exec` does not start throw-away slots on every call.

The key is everything the probe's answer rests on: kernel release and build, effective
uid, mode, interpreter, extra read-only paths, the Landlock ABI, and the identity (path,
size, mtime) of bwrap, setpriv, prlimit and of this package's own sources, and the sysctls that
allow or forbid unprivileged user namespaces. Any change is
a new key, so the next call probes again. The file lives in the uid's private directory
(0700, refused if anyone else owns it) and is replaced atomically.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

_FILE = "probe-cache.json"
_TOOLS = ("bwrap", "setpriv", "prlimit", "nice")
# Settings that decide whether unprivileged user namespaces (bubblewrap's) work; a change re-probes.
_SYSCTLS = (
    "/proc/sys/kernel/unprivileged_userns_clone",
    "/proc/sys/user/max_user_namespaces",
    "/proc/sys/kernel/apparmor_restrict_unprivileged_userns",
    "/proc/sys/kernel/yama/ptrace_scope",
)


def _read_setting(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def _identity(path: str | None) -> list:
    if not path:
        return [None]
    try:
        info = os.stat(path)
    except OSError:
        return [path, None]
    return [path, info.st_size, info.st_mtime_ns, info.st_ino]


def key(mode: str, extra_ro_paths: list[str], abi: int, reachable: bool) -> str:
    """A digest of every input of the probe's answer."""
    uname = os.uname()
    package = Path(__file__).resolve().parent
    parts: dict[str, Any] = {
        "kernel": [uname.release, uname.version, uname.machine],
        "euid": os.geteuid(),
        "mode": mode,
        "python": [sys.executable, sys.version],
        "extra_ro_paths": list(extra_ro_paths),
        "landlock_abi": abi,
        "interpreter_reachable": reachable,
        "tools": {tool: _identity(shutil.which(tool)) for tool in _TOOLS},
        "package": sorted((p.name, _identity(str(p))[1:]) for p in package.glob("*.py")),
        "sysctls": {path: _read_setting(path) for path in _SYSCTLS},
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def load(directory: Path, digest: str) -> dict | None:
    """The stored report for this key, or None."""
    try:
        fd = os.open(directory / _FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if info.st_uid != os.geteuid() or info.st_mode & 0o022:
            return None
        with os.fdopen(fd, "r") as f:
            fd = -1
            entries = json.load(f)
    except (OSError, ValueError):
        return None
    finally:
        if fd >= 0:
            os.close(fd)
    entry = entries.get(digest) if isinstance(entries, dict) else None
    return entry if isinstance(entry, dict) else None


def store(directory: Path, digest: str, report: dict) -> None:
    """Add this key's report (keeping a few others: several modes, several interpreters)."""
    entries: dict = {}
    try:
        with open(directory / _FILE) as f:
            loaded = json.load(f)
        if isinstance(loaded, dict):
            entries = dict(list(loaded.items())[-15:])
    except (OSError, ValueError):
        pass
    entries[digest] = report
    tmp = directory / f".{_FILE}.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(entries, f)
    os.replace(tmp, directory / _FILE)
