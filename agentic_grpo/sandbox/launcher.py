"""The in-slot launcher of the Landlock and unsafe-local layers: a tiny process between trainer and code.

The trainer is threaded, so it cannot use `preexec_fn` to set limits in its children. It
starts this script instead (`python -I -S launcher.py SPEC_JSON COMMAND...`), which, single-threaded:
becomes a child subreaper (orphans and setsid grandchildren re-parent to it), forks the
command with rlimits, a new session, a lower CPU priority, Landlock and seccomp applied, waits for it, and then
kills every descendant that is left, so nothing outlives a call. On SIGTERM (the trainer's
wall timeout) it does the same cleanup. The code runs as the launcher's uid and may lower the
launcher's rlimits (prlimit): cleanup opens no file (the children list is opened before the
fork) and kills the code's process group first; if the launcher itself is killed (RLIMIT_CPU 0),
the trainer kills that group (the pid written to `report_fd`) and the slot's uid and cgroup.
Standard library only: it runs without `site`.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # -I leaves the script's directory out
import landlock  # noqa: E402 - the sibling modules, loaded as top-level ones (no package, no site)
import seccomp  # noqa: E402

REAP_LIMIT_S = 10.0
"""How long the clean-up waits for killed processes to exit (the trainer waits a little longer for it)."""

_RLIMITS = {
    "as": resource.RLIMIT_AS,
    "cpu": resource.RLIMIT_CPU,
    "nproc": resource.RLIMIT_NPROC,
    "fsize": resource.RLIMIT_FSIZE,
    "nofile": resource.RLIMIT_NOFILE,
    "core": resource.RLIMIT_CORE,
}


class _Stop(Exception):
    pass


def _on_signal(signum, frame):  # noqa: ARG001 - signal handler signature
    raise _Stop


def _open_children() -> int | None:
    """Our children list, opened once before the code runs: the code may set our RLIMIT_NOFILE to 0 (prlimit).

    With no descriptor to spare no file can be opened afterwards, so cleanup re-reads this one.
    """
    pid = os.getpid()
    try:
        return os.open(f"/proc/{pid}/task/{pid}/children", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None


def _children(fd: int | None) -> list[int]:
    if fd is not None:
        os.lseek(fd, 0, os.SEEK_SET)
        data = b""
        while chunk := os.read(fd, 65536):
            data += chunk
        return [int(x) for x in data.split()]
    # No CONFIG_PROC_CHILDREN: scan /proc for processes whose parent is us.
    pid = os.getpid()
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(name))
    return found


def _kill_group(pgid: int) -> None:
    """SIGKILL a process group (needs no file descriptor, unlike finding our children)."""
    if pgid > 0:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except OSError:
            pass


def _reap_all(children_fd: int | None, group: int) -> None:
    """Kill every descendant: killing a child re-parents its own children to us, so loop until none is left.

    First the code's process group (its session leader's), which needs no file descriptor; then
    whatever left that group, found in our children list. A killed child's children become ours only once it
    has freed its memory, which takes a while for a large address space, so the loop ends when no child is
    left (or after `REAP_LIMIT_S`), never after a number of rounds. Never raises.
    """
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    _kill_group(group)
    deadline = time.monotonic() + REAP_LIMIT_S
    while True:
        try:
            children = _children(children_fd)
        except (OSError, ValueError) as exc:
            # Only the /proc scan can fail so (no descriptor left): what left the code's group stays.
            _kill_group(group)
            os.write(2, f"sandbox: cleanup cannot list the leftover processes: {exc}\n".encode())
            return
        for child in children:
            try:
                os.kill(child, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            while os.waitpid(-1, os.WNOHANG)[0] > 0:
                pass
        except ChildProcessError:
            return  # no child at all, alive or dead
        if time.monotonic() > deadline:
            os.write(2, f"sandbox: {len(children)} killed processes still exiting after {REAP_LIMIT_S} s\n".encode())
            return
        time.sleep(0.002)  # the killed children are freeing their memory


def _child(spec: dict) -> None:
    try:
        os.setsid()
        landlock.set_parent_death_signal(signal.SIGKILL)
        for name, value in spec.get("rlimits", {}).items():
            resource.setrlimit(_RLIMITS[name], (value, value))
        os.chdir(spec["cwd"])
        if spec.get("nice"):
            os.nice(spec["nice"])
        fs = spec.get("landlock")
        if fs is not None:
            enforced = landlock.restrict(fs["read"], fs["write"], fs["devices"], hidden=fs.get("hidden", []),
                                         listable=fs.get("listable", []))  # fmt: skip
            # The probe reported these as enforced: a kernel that now enforces less must not run the code.
            missing = [name for name in fs.get("require", []) if not enforced.get(name)]
            if missing:
                raise OSError(f"Landlock ABI {enforced['abi']} does not enforce {missing}")
        if spec.get("seccomp"):
            seccomp.install(bytes.fromhex(spec["seccomp"]))
        # Every signal at its default and none blocked, whatever the trainer ignores (nohup, a background job).
        for sig in signal.valid_signals() - {signal.SIGKILL, signal.SIGSTOP}:
            try:
                signal.signal(sig, signal.SIG_DFL)
            except (OSError, ValueError):
                pass  # signals the C library keeps for itself
        signal.pthread_sigmask(signal.SIG_SETMASK, set())
        os.execvpe(spec["argv"][0], spec["argv"], spec["env"])
    except BaseException as exc:  # noqa: BLE001 - report any setup failure as the command's error
        try:
            os.write(2, f"sandbox: cannot run {spec['argv'][0]!r}: {exc}\n".encode())
        finally:
            os._exit(127)


def main() -> None:
    spec = json.loads(sys.argv[1])
    spec["argv"] = sys.argv[2:]  # separate strings: each may use the kernel's whole 128 KiB
    landlock.set_child_subreaper()
    landlock.set_parent_death_signal(signal.SIGTERM)  # trainer gone: clean up and leave
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGHUP, _on_signal)
    children_fd = _open_children()
    report_fd = spec.get("report_fd")
    if report_fd is not None:
        os.set_inheritable(report_fd, False)  # the code must not hold the trainer's pipe
    status, pid = None, 0
    try:
        pid = os.fork()
        if pid == 0:
            _child(spec)
        if report_fd is not None:
            # The code's process group, for the trainer to kill should this launcher be killed.
            try:
                os.write(report_fd, f"{pid}\n".encode())
            finally:
                os.close(report_fd)
        while True:
            # WNOWAIT: the exited child stays a zombie, so its pid (its group's id) cannot be reused yet.
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOWAIT)
            if info.si_pid == pid:
                break
            os.waitpid(info.si_pid, 0)  # an orphan re-parented to us
        _kill_group(pid)
        status = os.waitpid(pid, 0)[1]
    except _Stop:
        status = None
    finally:
        _reap_all(children_fd, pid)
    if status is None:
        os._exit(137)
    if os.WIFSIGNALED(status):
        os._exit(128 + os.WTERMSIG(status))  # the shell's (and bwrap's) convention for "killed by signal N"
    os._exit(os.waitstatus_to_exitcode(status))


if __name__ == "__main__":
    main()
