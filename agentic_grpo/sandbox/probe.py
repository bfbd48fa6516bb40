"""Start-up probe: which isolation layer works on this host, and what each protection rests on.

Each candidate layer is tried for real (the trainer's interpreter is started inside a
throw-away slot), because "bwrap is installed" says nothing about whether user namespaces,
AppArmor or a container's seccomp profile let it run. The answer is cached in memory and
on disk per host state (`probe_cache`), so a short-lived `sandbox exec` does not re-probe.
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
import sys
import tempfile
import threading
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from . import bwrap as cmdlines
from . import landlock, probe_cache, seccomp
from .config import SandboxConfig, SandboxUnavailable
from .protections import protections
from .runner import execute
from .slot import Spawner, UidLease, private_dir
from .slot_python import base_executable
from .workspace import make_workspace, remove_tree

logger = logging.getLogger(__name__)

INSTALL_HINT = (
    "install bubblewrap (`apt-get install -y bubblewrap`, or run `.ci/install_sandbox.sh` as root) and allow "
    "user namespaces (or run the trainer as root), or use a kernel with Landlock (>= 5.13) and seccomp; "
    "to run model code with no isolation at all, set `sandbox: unsafe-local` in the recipe"
)
# What `auto` will not choose for the user: Landlock slots without root run as the trainer's uid.
LANDLOCK_SHARED_UID_REFUSAL = (
    "refused by auto: without root, Landlock slots run as the trainer's uid, so tool code can stat every path the "
    "trainer can (sizes and times of its files, which pids exist) and shares its process limit. Enable user "
    "namespaces so bubblewrap works (`sysctl kernel.unprivileged_userns_clone=1`, or "
    "`kernel.apparmor_restrict_unprivileged_userns=0`), or run the trainer as root (slots get uids of their own); "
    "to accept these limits, name the layer: `sandbox: landlock` in the recipe (docs/sandbox.md lists them)"
)
# Without a slot uid the code shares the trainer's uid: only Landlock scoping (ABI 6) keeps it
# from signalling the trainer and reaching its abstract unix sockets.
MIN_ABI_SHARED_UID = 6


@dataclass
class ProbeReport:
    """What the probe found: the layer in use and what every protection rests on.

    The pool fills `cgroup` and `bounds` (what limits memory, processes, CPU and disk in its slots).
    """

    layer: str | None
    mode: str
    euid: int
    slot_uids: bool
    landlock_abi: int = 0
    landlock_features: dict[str, bool] = field(default_factory=dict)
    layers: dict[str, str] = field(default_factory=dict)
    protections: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    downgraded: str | None = None
    seccomp_denies: list[str] = field(default_factory=list)
    cgroup: str = ""
    bounds: dict[str, str] = field(default_factory=dict)
    cached: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> ProbeReport:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    def format(self) -> str:
        lines = [f"sandbox layer: {self.layer or 'NONE'} (mode={self.mode}, euid={self.euid})"]
        lines += [f"  probe {name}: {status}" for name, status in self.layers.items()]
        if self.landlock_features:
            enforced = [name for name, on in self.landlock_features.items() if on]
            missing = [name for name, on in self.landlock_features.items() if not on]
            lines.append(f"  landlock ABI {self.landlock_abi}: enforces {', '.join(enforced)}"
                         + (f"; NOT {', '.join(missing)}" if missing else ""))  # fmt: skip
        if self.cgroup:
            lines.append(f"  cgroup: {self.cgroup}")
        lines.append("protections:")
        lines += [f"  {name:<14} {what}" for name, what in self.protections.items()]
        if self.bounds:
            lines.append("resource bounds per slot:")
            lines += [f"  {name:<14} {what}" for name, what in self.bounds.items()]
        lines += [f"WARNING: {w}" for w in self.warnings]
        return "\n".join(lines)


def unreachable_directory() -> str | None:
    """The first directory above the interpreter or its libs that a uid with no rights cannot search."""
    for path in {os.path.realpath(sys.executable), os.path.realpath(sys.base_prefix), os.path.realpath(sys.prefix)}:
        current = Path(path)
        for parent in [*reversed(current.parents), current]:
            try:
                mode = parent.stat().st_mode
            except OSError:
                return str(parent)
            if stat.S_ISDIR(mode) and not mode & stat.S_IXOTH:
                return str(parent)
    return None


def interpreter_reachable_by_others() -> bool:
    """Whether a uid with no special rights can search every directory above the interpreter and its libs."""
    return unreachable_directory() is None


def _try(spawner: Spawner, root: bool) -> str:
    """Run the interpreter in a throw-away slot; 'ok' or why not."""
    base = Path(tempfile.mkdtemp(prefix="agentic-grpo-probe-"))
    base.chmod(0o711)
    lease = None
    fd = spawner.seccomp_fd()
    try:
        uid = None
        if root:
            lease = UidLease(spawner.config.base_uid + 4096 * 1000, 4096)  # a range no rank uses
            uid = lease.uid
        workspace, _ = make_workspace(base, "probe", uid)
        limits = cmdlines.rlimits(spawner.config, 20, spawner.config.memory_mb)
        command = [base_executable(), "-I", "-S", "-c", "print('sandbox-ok')"]
        result = execute(
            spawner.argv(str(workspace), uid, limits, command, seccomp_fd=fd),
            env={"PATH": cmdlines.SAFE_PATH},
            stdin=None,
            timeout=20,
            max_output_bytes=4096,
            kill=lambda proc: spawner.kill(proc, uid),
            pass_fds=(fd,) if fd is not None else (),
        )
        if result.exit_code == 0 and result.stdout.strip() == "sandbox-ok":
            return "ok"
        return f"failed (exit {result.exit_code}): {(result.stderr or result.stdout).strip()[:300]}"
    except OSError as exc:
        return f"failed: {exc}"
    finally:
        if fd is not None:
            os.close(fd)
        remove_tree(base)
        if lease is not None:
            lease.release()


def _landlock_status(config: SandboxConfig, root: bool, abi: int, required: tuple[str, ...]) -> str:
    if abi < 1:
        return "kernel has no Landlock"
    if not seccomp.supported():
        return f"no seccomp filter for {seccomp.machine()}"
    if not root and config.mode == "auto":
        return LANDLOCK_SHARED_UID_REFUSAL
    if root and not shutil.which("setpriv"):
        return "missing setpriv (util-linux)"
    if not root and abi < MIN_ABI_SHARED_UID:
        return (f"refused: Landlock ABI {abi} < {MIN_ABI_SHARED_UID} cannot stop code running as the trainer's uid "
                "from signalling the trainer; run as root (per-slot uids) or use a kernel >= 6.12")  # fmt: skip
    blocked = unreachable_directory() if root else None
    if blocked:
        return (f"refused: the trainer's interpreter is under {blocked}, which slot uids cannot search, and the "
                "slot keeps no capability to bypass that; use an interpreter/venv outside private directories "
                f"or allow search only (`chmod o+x {blocked}`)")  # fmt: skip
    return _try(Spawner("landlock", config, landlock_require=required), root)


_CACHE: dict[tuple, ProbeReport] = {}
_LOCK = threading.Lock()


def probe(config: SandboxConfig | None = None, *, refresh: bool = False) -> ProbeReport:
    """Find the strongest layer the config allows that works here (cached per host state, mode and uid)."""
    config = config or SandboxConfig()
    root = os.geteuid() == 0
    abi = landlock.abi_version()
    reachable = interpreter_reachable_by_others()
    key = (config.mode, os.geteuid(), tuple(config.extra_ro_paths), abi)
    with _LOCK:
        if key in _CACHE and not refresh:
            return _CACHE[key]
        digest = probe_cache.key(config.mode, config.extra_ro_paths, abi, reachable)
        try:
            directory = private_dir()
        except (OSError, RuntimeError):
            directory = None
        stored = probe_cache.load(directory, digest) if directory is not None and not refresh else None
        if stored is not None:
            report = ProbeReport.from_dict(stored)
            report.cached = True
        else:
            report = _probe(config, root, abi)
            if directory is not None and report.layer is not None:
                try:
                    probe_cache.store(directory, digest, report.to_dict())
                except OSError as exc:
                    logger.debug("sandbox probe cache not written: %s", exc)
        _CACHE[key] = report
        return report


def _probe(config: SandboxConfig, root: bool, abi: int) -> ProbeReport:
    features = landlock.features(abi) if abi >= 1 else {}
    required = tuple(name for name, on in features.items() if on)
    report = ProbeReport(layer=None, mode=config.mode, euid=os.geteuid(), slot_uids=root, landlock_abi=abi,
                         landlock_features=features)  # fmt: skip
    wanted = ["bwrap", "landlock"] if config.mode == "auto" else [config.mode]
    for layer in wanted:
        if layer == "bwrap":
            missing = [b for b in ("bwrap", "prlimit", *(("setpriv",) if root else ())) if not shutil.which(b)]
            if missing:
                status = f"missing {', '.join(missing)}"
            elif not seccomp.supported():
                status = f"no seccomp filter for {seccomp.machine()}"
            else:
                status = _try(Spawner("bwrap", config), root)
        elif layer == "landlock":
            status = _landlock_status(config, root, abi, required)
        else:  # unsafe-local
            status = _try(Spawner("unsafe-local", config), False)
        report.layers[layer] = status
        if status == "ok":
            report.layer = layer
            break
    if report.layer is None:
        return report
    if report.layer != "landlock":
        report.landlock_features = {}
    if report.layer != "unsafe-local":
        report.seccomp_denies = seccomp.denied_syscalls()
    report.protections = protections(report.layer, root, abi)
    if config.mode == "auto" and report.layer != "bwrap":
        report.downgraded = f"auto fell back to the weaker {report.layer} layer: bwrap {report.layers['bwrap']}"
        report.warnings.append(f"sandbox: {report.downgraded}")
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
    return report


def require(config: SandboxConfig) -> ProbeReport:
    """probe(), raising SandboxUnavailable with what to install when nothing works."""
    report = probe(config)
    if report.layer is None:
        tried = "; ".join(f"{name}: {status}" for name, status in report.layers.items())
        raise SandboxUnavailable(f"no sandbox layer works here ({tried}). To fix: {INSTALL_HINT}")
    return report
