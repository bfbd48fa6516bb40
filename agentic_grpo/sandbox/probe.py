"""Start-up probe: which isolation layer works on this host, and what each protection rests on.

Each candidate layer is tried for real (the trainer's interpreter is started inside a
throw-away slot), because "bwrap is installed" says nothing about whether user namespaces,
AppArmor or a container's seccomp profile let it run.
"""

from __future__ import annotations

import os
import shutil
import stat
import sys
import tempfile
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from . import bwrap as cmdlines
from . import landlock
from .config import SandboxConfig, SandboxUnavailable
from .runner import execute
from .slot import Spawner, UidLease, make_workspace, remove_tree

INSTALL_HINT = (
    "install bubblewrap (`apt-get install -y bubblewrap`, or run `.ci/install_sandbox.sh` as root) and allow "
    "user namespaces (or run the trainer as root), or use a kernel with Landlock (>= 5.13) and seccomp; "
    "to run model code with no isolation at all, set `sandbox: unsafe-local` in the recipe"
)


@dataclass
class ProbeReport:
    """What the probe found: the layer in use and what every protection rests on."""

    layer: str | None
    mode: str
    euid: int
    slot_uids: bool
    keep_read_cap: bool = False
    landlock_abi: int = 0
    layers: dict[str, str] = field(default_factory=dict)
    protections: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def format(self) -> str:
        lines = [f"sandbox layer: {self.layer or 'NONE'} (mode={self.mode}, euid={self.euid})"]
        lines += [f"  probe {name}: {status}" for name, status in self.layers.items()]
        lines.append("protections:")
        lines += [f"  {name:<14} {what}" for name, what in self.protections.items()]
        lines += [f"WARNING: {w}" for w in self.warnings]
        return "\n".join(lines)


def interpreter_reachable_by_others() -> bool:
    """Whether a uid with no special rights can search every directory above the interpreter and its libs."""
    for path in {os.path.realpath(sys.executable), os.path.realpath(sys.base_prefix), os.path.realpath(sys.prefix)}:
        current = Path(path)
        for parent in [current, *current.parents]:
            try:
                mode = parent.stat().st_mode
            except OSError:
                return False
            if stat.S_ISDIR(mode) and not mode & stat.S_IXOTH:
                return False
    return True


def _try(spawner: Spawner, root: bool) -> str:
    """Run the interpreter in a throw-away slot; 'ok' or why not."""
    base = Path(tempfile.mkdtemp(prefix="agentic-grpo-probe-"))
    base.chmod(0o711)
    lease = None
    try:
        uid = None
        if root:
            lease = UidLease(spawner.config.base_uid + 4096 * 1000, 4096)  # a range no rank uses
            uid = lease.uid
        workspace = make_workspace(base, "probe", uid)
        limits = cmdlines.rlimits(spawner.config, 20, spawner.config.memory_mb)
        result = execute(
            spawner.argv(str(workspace), uid, limits, [sys.executable, "-I", "-S", "-c", "print('sandbox-ok')"]),
            env={"PATH": cmdlines.SAFE_PATH},
            stdin=None,
            timeout=20,
            max_output_bytes=4096,
            kill=lambda proc: spawner.kill(proc, uid),
        )
        if result.exit_code == 0 and result.stdout.strip() == "sandbox-ok":
            return "ok"
        return f"failed (exit {result.exit_code}): {(result.stderr or result.stdout).strip()[:300]}"
    except OSError as exc:
        return f"failed: {exc}"
    finally:
        remove_tree(base)
        if lease is not None:
            lease.release()


def _protections(layer: str, root: bool, abi: int, keep_read_cap: bool) -> dict[str, str]:
    uid_note = "a per-slot uid (no real user's), " if root else ""
    if layer == "bwrap":
        return {
            "filesystem": "bwrap mount namespace: read-only binds of /usr and the interpreter, only the workspace "
            "writable, /tmp and /dev/shm read-only, no /etc secrets",
            "network": "bwrap network namespace: no interface but a downed loopback",
            "isolation": f"{uid_note}pid namespace (own /proc), mount namespace (other workspaces not mounted)",
            "privileges": "setpriv drops to the slot uid with an empty bounding set and no_new_privs"
            if root
            else "user namespace with --cap-drop ALL and --disable-userns",
            "processes": "RLIMIT_NPROC " + ("on the slot uid" if root else "counted in the slot's user namespace"),
            "memory/cpu": "RLIMIT_AS and RLIMIT_CPU (prlimit), RLIMIT_FSIZE, RLIMIT_NOFILE, no core dumps",
            "timeout": "SIGKILL to bwrap kills its init (--die-with-parent): the pid namespace dies with every "
            "process in it, setsid or not",
            "zombies": "bwrap's init is pid 1 of the namespace and reaps orphans",
            "environment": "--clearenv: only PATH, HOME, TMPDIR, locale and thread-count variables",
        }
    if layer == "landlock":
        net = "Landlock denies TCP bind/connect, " if abi >= 4 else ""
        scope = "Landlock scoping blocks signals to and ptrace of processes outside the slot" if abi >= 6 else ""
        return {
            "filesystem": f"Landlock ABI {abi}: read/execute on system dirs and the interpreter, write only in the "
            "workspace" + ("; the slot uid owns nothing else" if root else ""),
            "network": f"{net}seccomp denies every non-unix socket and io_uring",
            "isolation": f"{uid_note}Landlock (no /proc, other workspaces not granted); {scope}".rstrip("; "),
            "privileges": "setpriv drops to the slot uid, no_new_privs"
            + (
                " (keeps CAP_DAC_READ_SEARCH only to reach the interpreter; Landlock confines it)"
                if keep_read_cap
                else ""
            )
            if root
            else "no_new_privs",
            "processes": "RLIMIT_NPROC" + (" on the slot uid" if root else " on the trainer's uid (shared!)"),
            "memory/cpu": "RLIMIT_AS and RLIMIT_CPU, RLIMIT_FSIZE, RLIMIT_NOFILE, no core dumps",
            "timeout": "the launcher is a child subreaper: on timeout it SIGKILLs every descendant (setsid ones "
            "are re-parented to it)" + ("; the slot uid is killed wholesale at release" if root else ""),
            "zombies": "the launcher reaps every re-parented orphan",
            "environment": "replaced: only PATH, HOME, TMPDIR, locale and thread-count variables",
        }
    return {
        "filesystem": "NONE: the code can read and write whatever the trainer can",
        "network": "NONE",
        "isolation": "NONE: the code can read the trainer's memory, environment and files",
        "processes": "RLIMIT_NPROC on the trainer's uid",
        "memory/cpu": "RLIMIT_AS and RLIMIT_CPU, RLIMIT_FSIZE, RLIMIT_NOFILE",
        "timeout": "the launcher (subreaper) kills every descendant",
        "environment": "replaced (no secrets passed), but readable from /proc",
    }


_CACHE: dict[tuple, ProbeReport] = {}
_LOCK = threading.Lock()


def probe(config: SandboxConfig | None = None, *, refresh: bool = False) -> ProbeReport:
    """Find the strongest layer the config allows that works here (cached per mode and uid)."""
    config = config or SandboxConfig()
    key = (config.mode, os.geteuid(), tuple(config.extra_ro_paths))
    with _LOCK:
        if key in _CACHE and not refresh:
            return _CACHE[key]
        root = os.geteuid() == 0
        abi = landlock.abi_version()
        keep_read_cap = root and not interpreter_reachable_by_others()
        report = ProbeReport(layer=None, mode=config.mode, euid=os.geteuid(), slot_uids=root, landlock_abi=abi)
        wanted = ["bwrap", "landlock"] if config.mode == "auto" else [config.mode]
        for layer in wanted:
            if layer == "bwrap":
                missing = [b for b in ("bwrap", "prlimit", *(("setpriv",) if root else ())) if not shutil.which(b)]
                status = f"missing {', '.join(missing)}" if missing else _try(Spawner("bwrap", config), root)
            elif layer == "landlock":
                if abi < 1:
                    status = "kernel has no Landlock"
                elif not landlock.seccomp_filter_supported():
                    status = f"no seccomp socket filter for {landlock.machine()}"
                elif root and not shutil.which("setpriv"):
                    status = "missing setpriv (util-linux)"
                else:
                    status = _try(Spawner("landlock", config, keep_read_cap=keep_read_cap), root)
            else:  # unsafe-local
                status = _try(Spawner("unsafe-local", config), False)
            report.layers[layer] = status
            if status == "ok":
                report.layer = layer
                break
        if report.layer is not None:
            report.keep_read_cap = keep_read_cap and report.layer == "landlock"
            report.protections = _protections(report.layer, root, abi, report.keep_read_cap)
            if report.layer == "unsafe-local":
                report.slot_uids = False
                report.warnings.append(
                    "sandbox: unsafe-local runs model-written code WITHOUT isolation (it can read secrets, use the "
                    "network and touch every file the trainer can); never use it with a model you do not trust"
                )
            elif report.layer == "landlock" and not root:
                report.warnings.append(
                    "landlock layer without root: all slots share the trainer's uid, so the process limit is "
                    "shared; run as root or enable user namespaces for bubblewrap"
                )
        _CACHE[key] = report
        return report


def require(config: SandboxConfig) -> ProbeReport:
    """probe(), raising SandboxUnavailable with what to install when nothing works."""
    report = probe(config)
    if report.layer is None:
        tried = "; ".join(f"{name}: {status}" for name, status in report.layers.items())
        raise SandboxUnavailable(f"no sandbox layer works here ({tried}). To fix: {INSTALL_HINT}")
    return report
