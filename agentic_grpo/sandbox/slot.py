"""Slots: a private workspace (and, as root, a private uid) that one live trajectory owns.

A `Spawner` turns "run argv in this slot" into the layer's command line and knows how to
kill the layer's process tree; `SandboxSlot` is what tools hold. Slot uids are reserved
with `flock` on a per-uid lock file, so two pools (two ranks, or `sandbox check` next to a
training run) never hand the same uid to two live slots.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from . import bwrap as cmdlines
from .config import ExecResult, SandboxConfig
from .runner import execute

if TYPE_CHECKING:
    from .pool import SandboxPool

_ARG_MAX_CODE = 100_000  # longer code goes through a file: one argv string may not exceed 128 KiB
_KILL_GRACE_S = 2.0


class Spawner:
    """How one layer starts a command in a slot and kills what it started."""

    def __init__(self, layer: str, config: SandboxConfig, *, keep_read_cap: bool = False) -> None:
        self.layer = layer
        self.config = config
        self.keep_read_cap = keep_read_cap

    def argv(self, workspace: str, uid: int | None, limits: dict[str, int], command: list[str]) -> list[str]:
        if self.layer == "bwrap":
            return cmdlines.bwrap_argv(self.config, workspace, uid, limits, command)
        return cmdlines.launcher_argv(
            workspace,
            uid,
            limits,
            command,
            confine=self.layer == "landlock",
            keep_read_cap=self.keep_read_cap,
            extra_ro_paths=self.config.extra_ro_paths,
        )

    def kill(self, proc: subprocess.Popen, uid: int | None) -> None:
        """End the whole tree of one call.

        bwrap: SIGKILL to bwrap kills its init (--die-with-parent), which tears down the pid
        namespace with every process in it. Launcher: SIGTERM makes it kill all its
        descendants (it is their subreaper); if it does not finish in time, SIGKILL it and
        kill everything the slot uid owns.
        """
        if self.layer == "bwrap":
            proc.kill()
            return
        proc.terminate()
        try:
            proc.wait(timeout=_KILL_GRACE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            if uid is not None:
                kill_uid(uid)


def kill_uid(uid: int) -> None:
    """SIGKILL every process of a slot uid (kill(-1) as that uid reaches exactly those)."""
    setpriv, killer = shutil.which("setpriv"), shutil.which("kill")
    if os.geteuid() != 0 or not setpriv or not killer:
        return
    for _ in range(2):  # a fork bomb may spawn between rounds; the process limit bounds it
        subprocess.run(
            [setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--", killer, "-KILL", "-1"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={"PATH": cmdlines.SAFE_PATH},
            check=False,
        )


class UidLease:
    """A slot uid held exclusively (across processes) while the lock file stays locked."""

    _dir = Path(tempfile.gettempdir()) / "agentic-grpo-sandbox-uids"

    def __init__(self, first: int, count: int) -> None:
        self._dir.mkdir(mode=0o700, exist_ok=True)
        info = os.lstat(self._dir)
        if info.st_uid != os.geteuid() or info.st_mode & 0o077:
            # Someone else made it first: they could hold every uid's lock or plant links here.
            raise RuntimeError(f"{self._dir} must be a private directory of uid {os.geteuid()}")
        for uid in range(first, first + count):
            fd = os.open(self._dir / str(uid), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            self.uid, self._fd = uid, fd
            return
        raise RuntimeError(f"all {count} sandbox slot uids from {first} are in use")

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def make_workspace(root: Path, name: str, uid: int | None) -> Path:
    """A fresh private directory, owned by the slot uid when there is one."""
    workspace = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=root))
    if uid is not None:
        os.chown(workspace, uid, uid)
    workspace.chmod(0o700)
    return workspace


def remove_tree(path: Path) -> None:
    """rmtree that survives code which chmod-ed its own directories to 000."""

    def fix(func, failed, _exc):  # noqa: ANN001 - shutil.rmtree onerror signature
        for target in (os.path.dirname(failed), failed):
            try:
                if not os.path.islink(target):  # never chmod through a link the code planted
                    os.chmod(target, 0o700)
            except OSError:
                pass
        try:
            func(failed)
        except OSError:
            pass

    shutil.rmtree(path, onerror=fix)


class SandboxSlot:
    """One isolated slot, owned by one live trajectory until the pool releases it.

    Attributes:
        workspace: the slot's fresh private directory, the only place its commands can write.
        uid: the slot's own uid when the trainer runs as root (None otherwise).
        layer: the isolation layer its commands run under.
    """

    def __init__(self, pool: SandboxPool, workspace: Path, uid: int | None, lease: UidLease | None = None) -> None:
        self.pool = pool
        self.workspace = workspace
        self.uid = uid
        self.layer = pool.layer
        self._lease = lease
        self.closed = False

    def run(
        self,
        argv: list[str],
        *,
        stdin: str | bytes | None = None,
        timeout: float | None = None,
        memory_mb: int | None = None,
        max_output_bytes: int | None = None,
    ) -> ExecResult:
        """Run argv in the slot (cwd = workspace) under the pool's limits; thread-safe.

        Args:
            argv: the command; argv[0] is looked up on the slot's PATH (/usr/local/bin:/usr/bin:/bin).
            stdin: data fed to the command's standard input (none: /dev/null).
            timeout: wall-clock seconds before the whole process tree is killed (default: config.timeout_s).
            memory_mb: address-space limit (default: config.memory_mb).
            max_output_bytes: bytes kept per stream (default: config.max_output_bytes).
        """
        if self.closed:
            raise RuntimeError("this sandbox slot was released")
        if not argv:
            raise ValueError("argv must name a command")
        config = self.pool.config
        timeout = config.timeout_s if timeout is None else float(timeout)
        limits = cmdlines.rlimits(config, timeout, memory_mb or config.memory_mb)
        spawner = self.pool.spawner
        uid = self.uid
        return execute(
            spawner.argv(str(self.workspace), uid, limits, [str(a) for a in argv]),
            env={"PATH": cmdlines.SAFE_PATH},
            stdin=stdin,
            timeout=timeout,
            max_output_bytes=config.max_output_bytes if max_output_bytes is None else max_output_bytes,
            kill=lambda proc: spawner.kill(proc, uid),
        )

    def run_python(self, code: str, **kwargs) -> ExecResult:
        """Run Python `code` with the trainer's interpreter in isolated mode (-I), cwd = workspace.

        Takes the same keyword arguments as `run`.
        """
        if len(code.encode()) <= _ARG_MAX_CODE:
            return self.run([sys.executable, "-I", "-c", code], **kwargs)
        script = self.workspace / ".agentic_grpo_main.py"
        try:
            script.unlink()
        except FileNotFoundError:
            pass
        # O_EXCL|O_NOFOLLOW: the code may have planted a link here; never write through it.
        fd = os.open(script, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(code)
            if self.uid is not None:
                os.fchown(f.fileno(), self.uid, self.uid)
        return self.run([sys.executable, "-I", str(script)], **kwargs)

    def release(self) -> None:
        """Kill anything left in the slot and remove its workspace (the pool calls this)."""
        if self.closed:
            return
        self.closed = True
        try:
            # bwrap: nothing outlives a call (the pid namespace dies with it); the launcher layers can
            # leave something only if the launcher itself was SIGKILLed, so sweep the slot uid.
            if self.uid is not None and self.layer != "bwrap":
                kill_uid(self.uid)
            remove_tree(self.workspace)
        finally:
            if self._lease is not None:
                self._lease.release()

    def __enter__(self) -> SandboxSlot:
        return self

    def __exit__(self, *exc: object) -> None:
        self.pool.release(self)

    def __repr__(self) -> str:
        return f"SandboxSlot(layer={self.layer!r}, workspace={str(self.workspace)!r}, uid={self.uid})"


__all__ = ["SandboxSlot", "Spawner", "UidLease", "kill_uid", "make_workspace", "remove_tree"]
