"""Slots: a private workspace (and, as root, a private uid and cgroup) that one live trajectory owns.

A `Spawner` turns "run argv in this slot" into the layer's command line and knows how to
kill the layer's process tree; `SandboxSlot` is what tools hold. Slot uids are reserved
with `flock` on a per-uid lock file, so two pools (two ranks, or `sandbox check` next to a
training run) never hand the same uid to two live slots.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Protocol

from . import bwrap as cmdlines
from . import seccomp
from .cgroup import CgroupSet, SlotCgroup
from .config import ExecResult, SandboxConfig
from .reclaim import kill_uid, remove_ipc
from .runner import execute
from .slot_python import slot_python
from .workspace import release_workspace

logger = logging.getLogger(__name__)

_ARG_MAX_CODE = 100_000  # longer code goes through a file: one argv string may not exceed 128 KiB
# The launcher's clean-up waits up to its REAP_LIMIT_S (10 s) for killed processes to exit; a launcher that has
# not finished a little after that is killed, and the slot swept.
_KILL_GRACE_S = 12.0


def private_dir() -> Path:
    """This uid's private directory for lock files and the probe cache (refused if anyone else could write it)."""
    directory = Path(tempfile.gettempdir()) / f"agentic-grpo-state-{os.geteuid()}"
    directory.mkdir(mode=0o700, exist_ok=True)
    info = os.lstat(directory)
    if info.st_uid != os.geteuid() or info.st_mode & 0o077 or not os.path.isdir(directory):
        # Someone else made it first: they could hold every uid's lock, plant links or a forged probe result.
        raise RuntimeError(f"{directory} must be a private directory of uid {os.geteuid()}")
    return directory


class Spawner:
    """How one layer starts a command in a slot and kills what it started.

    Args:
        layer: "bwrap", "landlock" or "unsafe-local".
        config: the pool's limits.
        allow_memfd: a memory cgroup charges memfd pages, so seccomp may let memfd_create through.
        landlock_require: Landlock features the probe reported; the launcher refuses to run with fewer.
    """

    def __init__(
        self,
        layer: str,
        config: SandboxConfig,
        *,
        allow_memfd: bool = False,
        landlock_require: tuple[str, ...] = (),
    ) -> None:
        self.layer = layer
        self.config = config
        self.landlock_require = landlock_require
        self.filter = b""
        if layer != "unsafe-local":
            families = seccomp.BWRAP_FAMILIES if layer == "bwrap" else seccomp.LANDLOCK_FAMILIES
            # Landlock without root: slots run as the trainer's uid, and Landlock does not mediate chmod/chown/utime.
            shared_uid = layer == "landlock" and os.geteuid() != 0
            self.filter = seccomp.build(
                families, allow_memfd=allow_memfd, deny_connect=layer == "landlock", deny_metadata=shared_uid
            )

    def seccomp_fd(self) -> int | None:
        """A fresh pipe holding the filter, for bwrap's --seccomp (bwrap reads it to the end)."""
        if self.layer != "bwrap":
            return None
        read, write = os.pipe()
        try:
            os.write(write, self.filter)  # a few hundred bytes: fits the pipe buffer
        finally:
            os.close(write)
        return read

    def argv(
        self,
        workspace: str,
        uid: int | None,
        limits: dict[str, int],
        command: list[str],
        *,
        seccomp_fd: int | None = None,
        cgroup: SlotCgroup | None = None,
        report_fd: int | None = None,
        read_paths: tuple[str, ...] = (),
    ) -> list[str]:
        """The full command line of one call (a cgroup-joining shell first when the slot has a group).

        read_paths: more paths the command may read (the slot interpreter's prefix).
        """
        # Without a cpu cgroup, a lower priority is the only CPU share control left.
        nice = 0 if cgroup is not None and cgroup.has("cpu") else cmdlines.NICE
        if self.layer == "bwrap":
            argv = cmdlines.bwrap_argv(
                self.config, workspace, uid, limits, command, seccomp_fd=seccomp_fd, read_paths=read_paths
            )
            if nice:
                argv = [shutil.which("nice") or "nice", "-n", str(nice), *argv]
            argv = [*cmdlines.default_signals_argv(), *argv]  # the launcher resets them itself
        else:
            confine = self.layer == "landlock"
            argv = cmdlines.launcher_argv(
                workspace,
                uid,
                limits,
                command,
                seccomp_hex=self.filter.hex() if confine else None,
                landlock_require=list(self.landlock_require) if confine else None,
                nice=nice,
                extra_ro_paths=[*self.config.extra_ro_paths, *read_paths],
                report_fd=report_fd,
            )
        return cgroup.wrap(argv) if cgroup is not None else argv

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

    def report_pipe(self) -> tuple[int, int] | None:
        """(read, write): the launcher writes the code's process group id to `write` (launcher layers only)."""
        if self.layer == "bwrap":
            return None
        read, write = os.pipe()
        os.set_blocking(read, False)
        return read, write

    def sweep(self, report_read: int | None, uid: int | None, cgroup: SlotCgroup | None) -> None:
        """After a launcher was killed (the code can set its RLIMIT_CPU to 0): kill what its cleanup would have.

        The code's process group (the pid the launcher reported; a non-empty group keeps that pid
        from being reused), then, as root, the slot uid, and the slot's cgroup. Processes that left
        the group (setsid) of a slot with neither uid nor cgroup cannot be told from the trainer's own.
        """
        pgid = 0
        if report_read is not None:
            try:
                pgid = int(os.read(report_read, 64).split()[0])
            except (OSError, ValueError, IndexError):
                pgid = 0
        if pgid > 1:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except OSError:
                pass
        if uid is not None:
            kill_uid(uid)
        if cgroup is not None:
            cgroup.kill()


class UidLease:
    """A slot uid held exclusively (across processes) while the lock file stays locked."""

    def __init__(self, first: int, count: int) -> None:
        directory = private_dir()
        for uid in range(first, first + count):
            fd = os.open(directory / f"uid-{uid}", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
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


class SlotOwner(Protocol):
    """What a slot uses of the pool that made it (`SandboxPool` is one): its limits, how it starts and
    kills commands, where a released slot's cgroup goes back, and `release`, which `with slot:` calls."""

    config: SandboxConfig
    layer: str
    spawner: Spawner
    cgroups: CgroupSet

    def release(self, slot: SandboxSlot) -> None: ...


class SandboxSlot:
    """One isolated slot, owned by one live trajectory until the pool releases it.

    Attributes:
        workspace: the slot's fresh private directory, the only place its commands can write.
        uid: the slot's own uid when the trainer runs as root (None otherwise).
        layer: the isolation layer its commands run under.
        cgroup: the slot's own cgroup when one is in force (None otherwise).
    """

    def __init__(
        self,
        pool: SlotOwner,
        workspace: Path,
        uid: int | None,
        lease: UidLease | None = None,
        *,
        cgroup: SlotCgroup | None = None,
        mounted: bool = False,
    ) -> None:
        self.pool = pool
        self.workspace = workspace
        self.uid = uid
        self.layer = pool.layer
        self.cgroup = cgroup
        self._mounted = mounted
        self._lease = lease
        self.closed = False

    @property
    def timeout_s(self) -> float:
        """The wall-clock deadline of each command run here (the pool's `timeout_s`, the recipe's `tool_timeout`)."""
        return self.pool.config.timeout_s

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
        return self._run(
            argv, (), stdin=stdin, timeout=timeout, memory_mb=memory_mb, max_output_bytes=max_output_bytes
        )

    def _run(
        self,
        argv: list[str],
        read_paths: tuple[str, ...],
        *,
        stdin: str | bytes | None = None,
        timeout: float | None = None,
        memory_mb: int | None = None,
        max_output_bytes: int | None = None,
    ) -> ExecResult:
        if self.closed:
            raise RuntimeError("this sandbox slot was released")
        if not argv:
            raise ValueError("argv must name a command")
        config = self.pool.config
        timeout = config.timeout_s if timeout is None else float(timeout)
        limits = cmdlines.rlimits(config, timeout, memory_mb or config.memory_mb)
        spawner = self.pool.spawner
        uid = self.uid
        fd = spawner.seccomp_fd()
        report = spawner.report_pipe()
        report_write = report[1] if report else None
        try:
            command = [str(a) for a in argv]
            result = execute(
                spawner.argv(
                    str(self.workspace),
                    uid,
                    limits,
                    command,
                    seccomp_fd=fd,
                    cgroup=self.cgroup,
                    report_fd=report_write,
                    read_paths=read_paths,
                ),
                env={"PATH": cmdlines.SAFE_PATH},
                stdin=stdin,
                timeout=timeout,
                max_output_bytes=config.max_output_bytes if max_output_bytes is None else max_output_bytes,
                kill=lambda proc: spawner.kill(proc, uid),
                pass_fds=tuple(f for f in (fd, report_write) if f is not None),
            )
            if report is not None and result.exit_code is not None and result.exit_code < 0:
                # The launcher was killed by a signal (it exits 128+N for its command): nothing cleaned up.
                spawner.sweep(report[0], uid, self.cgroup)
            return result
        finally:
            for each in (fd, *(report or ())):
                if each is not None:
                    os.close(each)

    def run_python(self, code: str, *, packages: tuple[str, ...] | list[str] | None = None, **kwargs) -> ExecResult:
        """Run Python `code` in isolated mode (-I), cwd = workspace, with only `packages` importable.

        The interpreter is the trainer's base interpreter, but never its environment: the standard library
        plus `packages` (default `slot_python.DEFAULT_PACKAGES`: numpy, sympy, mpmath, where installed),
        taken from the trainer's environment. Takes the same keyword arguments as `run`.
        """
        python = slot_python(packages, self.pool.config.workspace_root)
        if len(code.encode()) <= _ARG_MAX_CODE:
            return self._run([python.executable, "-I", "-c", code], (python.root,), **kwargs)
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
        return self._run([python.executable, "-I", str(script)], (python.root,), **kwargs)

    def release(self) -> list[str]:
        """Kill anything left in the slot, clear what its uid left in the kernel, remove its workspace.

        Never raises: every step runs whatever the others did, and the uid is freed only when
        nothing of this slot could be left to its next owner. Returns the problems it logged.
        """
        if self.closed:
            return []
        self.closed = True
        problems: list[str] = []

        def attempt(what: str, step) -> None:  # noqa: ANN001 - a zero-argument callable
            try:
                step()
            except Exception as exc:  # noqa: BLE001 - one failed step must not skip the next ones
                problems.append(f"{what}: {type(exc).__name__}: {exc}")

        # bwrap: nothing outlives a call (the pid namespace dies with it); the launcher layers can
        # leave something only if the launcher itself was SIGKILLed, so sweep the slot uid.
        if self.uid is not None and self.layer != "bwrap":
            attempt("kill slot uid", lambda: kill_uid(self.uid))
        if self.cgroup is not None:
            attempt("cgroup", lambda: self.pool.cgroups.give_back(self.cgroup))
        if self.uid is not None:
            attempt("SysV IPC", lambda: _raise_if(remove_ipc(self.uid)))
        attempt("workspace", lambda: release_workspace(self.workspace, self._mounted))
        ipc_clean = not any(p.startswith(("kill", "SysV")) for p in problems)
        if self._lease is not None and ipc_clean:
            self._lease.release()
        elif self._lease is not None:
            problems.append(f"uid {self.uid} kept out of use (its processes or IPC objects could not be cleared)")
        for problem in problems:
            logger.error("sandbox: releasing slot %s: %s", self.workspace, problem)
        return problems

    def __enter__(self) -> SandboxSlot:
        return self

    def __exit__(self, *exc: object) -> None:
        self.pool.release(self)

    def __repr__(self) -> str:
        return f"SandboxSlot(layer={self.layer!r}, workspace={str(self.workspace)!r}, uid={self.uid})"


def _raise_if(failures: list[str]) -> None:
    if failures:
        raise OSError("; ".join(failures))


__all__ = ["SandboxSlot", "SlotOwner", "Spawner", "UidLease", "kill_uid", "private_dir"]
