"""Command lines of the two spawners: bubblewrap (layer 1) and the Landlock launcher (layer 2, unsafe-local).

Each returns the argv the trainer starts; limits that need code in the child (rlimits,
Landlock, seccomp, dropping to the slot uid) are done by small exec-chained programs
(`setpriv`, `prlimit`, `launcher.py`) because a threaded trainer must not use `preexec_fn`.
"""

from __future__ import annotations

import functools
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

from . import slot_python
from .config import SandboxConfig

LAUNCHER = str(Path(__file__).resolve().with_name("launcher.py"))
SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"
SHELL = "/bin/sh"  # pid 1 of a slot under bwrap without root (`bwrap_argv`)
# /etc entries programs need to start (loader, users, locale, certificates); never shadow, keys or the rest.
ETC_FILES = (
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/passwd",
    "/etc/group",
    "/etc/nsswitch.conf",
    "/etc/localtime",
    "/etc/alternatives",
    "/etc/ssl/certs",
    "/etc/ca-certificates",
    "/etc/mime.types",
    "/etc/os-release",
    "/etc/python3",
    f"/etc/python3.{sys.version_info.minor}",
)
# Read-only in every slot. Not /opt: training data (/opt/ml/input/data) and other installs live there; an
# interpreter under it (/opt/conda) gets its own prefix from interpreter_paths, nothing else of /opt.
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
NICE = 10  # CPU priority of sandboxed code when no cpu cgroup bounds it
# Host-wide /proc files a slot's own procfs still shows that say who and what runs on the host, masked: bwrap's
# own command line (pid 1 as root: host paths), the uids holding keys, the kernel's boot line. The host's
# activity counters (load, tasks, memory, I/O, interrupts) stay, as in a container: `ps`, `uptime` and `free`
# read them, sysinfo(2) gives the main ones to any process, and every mount here costs each call time.
PROC_MASKED = ("/proc/1/cmdline", "/proc/key-users", "/proc/cmdline")
DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")


def interpreter_paths() -> list[str]:
    """What the base interpreter needs outside the system directories (`slot_python.interpreter_paths`), read-only.

    Never the trainer's venv or site-packages: those are `hidden_paths`.
    """
    system = tuple(os.path.realpath(d) for d in SYSTEM_DIRS)
    return [p for p in slot_python.interpreter_paths() if not any(p == s or p.startswith(s + "/") for s in system)]


def _within(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def hidden_paths(granted: list[str], keep: list[str]) -> list[str]:
    """The trainer's paths (`slot_python.trainer_paths`) that lie inside a granted tree, so must be masked there.

    One that holds a path slots need (`keep`: the interpreter, a workspace, a granted path) stays visible.
    """
    trees = [os.path.realpath(p) for p in granted]
    needed = [os.path.realpath(p) for p in keep] + trees
    return [
        path
        for path in slot_python.trainer_paths()
        if any(_within(path, t) and path != t for t in trees) and not any(_within(n, path) for n in needed)
    ]


def environment(workspace: str) -> dict[str, str]:
    """The whole environment a sandboxed command sees: nothing inherited from the trainer."""
    return {
        "PATH": SAFE_PATH,
        "HOME": workspace,
        "TMPDIR": workspace,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONUNBUFFERED": "1",
        "MPLBACKEND": "Agg",
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }


def rlimits(config: SandboxConfig, timeout: float, memory_mb: int) -> dict[str, int]:
    """The rlimits of a command, as prlimit/launcher names them."""
    return {
        "as": memory_mb * 1024 * 1024,
        "cpu": max(1, math.ceil(timeout) + 1),
        "nproc": config.max_processes,
        "fsize": config.max_file_mb * 1024 * 1024,
        "nofile": config.max_open_files,
        "core": 0,
    }


@functools.cache
def default_signals_argv() -> tuple[str, ...]:
    """`env --default-signal` (GNU coreutils >= 8.31), where this host's env has it: the command starts with every
    signal at its default, whatever the trainer ignores (started under `nohup` or in the background)."""
    env = shutil.which("env") or "/usr/bin/env"
    try:
        works = subprocess.run([env, "--default-signal", "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        works = False
    return (env, "--default-signal") if works else ()


def prlimit_argv(limits: dict[str, int]) -> list[str]:
    return [shutil.which("prlimit") or "prlimit", *(f"--{k}={v}" for k, v in limits.items()), "--"]


def setpriv_argv(uid: int) -> list[str]:
    """Drop to the slot uid with no groups, no capabilities (ambient, inheritable, bounding) and no_new_privs."""
    caps = ["--inh-caps=-all", "--ambient-caps=-all", "--bounding-set=-all"]
    return [shutil.which("setpriv") or "setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *caps, "--"]


def bwrap_argv(
    config: SandboxConfig,
    workspace: str,
    uid: int | None,
    limits: dict[str, int],
    command: list[str],
    *,
    seccomp_fd: int | None = None,
    read_paths: tuple[str, ...] | list[str] = (),
) -> list[str]:
    """bubblewrap: all namespaces, a read-only system, the workspace the only writable bind.

    As root, bwrap runs privileged (no user namespace needed) and the command then drops to
    the slot uid through setpriv inside; unprivileged, bwrap's user namespace maps the caller.
    seccomp_fd: a descriptor holding the filter program (`seccomp.build`), loaded before the command.
    read_paths: more paths bound read-only for this command (the slot interpreter's prefix).
    The trainer's own paths inside any bound tree are masked by empty read-only mounts (`hidden_paths`).
    """
    argv = [shutil.which("bwrap") or "bwrap", "--unshare-all", "--die-with-parent", "--new-session", "--clearenv"]
    if uid is None:
        argv[1:2] = ["--unshare-user", "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts"]
        # --as-pid-1: no bwrap process inside the namespace. Its init would be a same-uid process
        # with the trainer's limits and no seccomp filter, which the code could ptrace or write
        # through /proc/1/mem. Pid 1 is the command's shell (below); its exit ends the namespace.
        argv += ["--unshare-cgroup-try", "--disable-userns", "--cap-drop", "ALL", "--as-pid-1"]
    else:
        argv[1:2] = ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try"]
    for key, value in environment(workspace).items():
        argv += ["--setenv", key, value]
    made: set[str] = set()

    def parents(path: str) -> list[str]:
        out = []
        parent = os.path.dirname(path)
        while parent not in ("/", "") and parent not in made:
            out.append(parent)
            parent = os.path.dirname(parent)
        made.update(out)
        return [arg for p in reversed(out) for arg in ("--perms", "0755", "--dir", p)]

    for directory in SYSTEM_DIRS:
        if os.path.islink(directory):
            argv += ["--symlink", os.readlink(directory), directory]
        elif os.path.isdir(directory):
            argv += ["--ro-bind", directory, directory]
        made.add(directory)
    granted = [*interpreter_paths(), *config.extra_ro_paths, *read_paths]
    for path in [*ETC_FILES, *granted]:
        if os.path.exists(path):
            argv += parents(path) + ["--ro-bind", path, path]
            made.add(path)
    for path in hidden_paths([*SYSTEM_DIRS, *granted], [workspace, *granted]):
        if os.path.isdir(path):
            argv += ["--perms", "0555", "--tmpfs", path, "--remount-ro", path]
        else:
            argv += ["--ro-bind", "/dev/null", path]
    # /dev is remounted read-only below: its device nodes still work, /dev/shm cannot be written.
    argv += ["--proc", "/proc"]
    for path in PROC_MASKED:
        if os.path.exists(path):
            argv += ["--ro-bind", "/dev/null", path]  # unreadable: a device node on a nodev mount
    # No pseudo-terminals: their count is one host-wide pool (kernel.pty.max) that a slot could empty.
    argv += ["--dev", "/dev", "--perms", "0555", "--tmpfs", "/dev/pts", "--perms", "0555", "--dir", "/tmp"]
    made.add("/tmp")
    argv += parents(workspace) + ["--bind", workspace, workspace, "--chdir", workspace]
    argv += ["--remount-ro", "/dev", "--remount-ro", "/"]
    if seccomp_fd is not None:
        argv += ["--seccomp", str(seccomp_fd)]
    argv.append("--")
    if uid is not None:
        argv += setpriv_argv(uid)
        return argv + prlimit_argv(limits) + list(command)
    # Without root, a shell under the same filter and limits is the namespace's pid 1 and the code its child: a
    # namespace's init cannot signal itself to death, so code that is pid 1 and kills itself would end the call
    # with its own exit status; as the shell's child it ends as killed (128 + N), which the shell passes on.
    return argv + prlimit_argv(limits) + [SHELL, "-c", '"$@"; exit $?', "sh", *command]


def launcher_argv(
    workspace: str,
    uid: int | None,
    limits: dict[str, int],
    command: list[str],
    *,
    seccomp_hex: str | None,
    landlock_require: list[str] | None,
    nice: int = 0,
    extra_ro_paths: list[str] | None = None,
    report_fd: int | None = None,
) -> list[str]:
    """The launcher (as the slot uid when root) with rlimits and a priority; Landlock and seccomp when given.

    landlock_require: None for no Landlock (unsafe-local), else the features it must enforce.
    report_fd: an inherited pipe the launcher writes the code's process group to (see `Spawner.sweep`).
    """
    spec: dict = {"cwd": workspace, "env": environment(workspace), "rlimits": limits}
    if nice:
        spec["nice"] = nice
    if landlock_require is not None:
        granted = [*interpreter_paths(), *(extra_ro_paths or [])]
        read = [*SYSTEM_DIRS, *ETC_FILES, *granted]
        spec["landlock"] = {"read": read, "write": [workspace], "devices": list(DEVICES), "require": landlock_require}
        # Landlock cannot take a right back below a granted directory: the launcher grants around these.
        spec["landlock"]["hidden"] = hidden_paths(read, [workspace, *granted])
        spec["landlock"]["listable"] = slot_python.stdlib_dirs()
    if seccomp_hex:
        spec["seccomp"] = seccomp_hex
    if report_fd is not None:
        spec["report_fd"] = report_fd
    argv = setpriv_argv(uid) if uid is not None else []
    # The command follows the spec as argv strings of its own: inside the JSON its escapes (\n,
    # \uXXXX) could push code under run_python's file threshold past the kernel's 128 KiB per string.
    return argv + [sys.executable, "-I", "-S", LAUNCHER, json.dumps(spec), *command]
