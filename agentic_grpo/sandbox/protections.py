"""What each layer's protections rest on, in words: the text `sandbox check` prints.

Resource bounds that depend on the pool (cgroup, workspace quota) are described by
`bounds()`, which the pool calls once it knows what it could set up.
"""

from __future__ import annotations

from .config import SandboxConfig

_KERNEL = (
    "seccomp refuses keyrings (add_key/request_key/keyctl), SysV IPC and POSIX message queues, new "
    "namespaces (unshare/setns/clone with CLONE_NEW*, clone3), io_uring, userfaultfd, bpf, perf, file handles, "
    "ptrace and process_vm_readv/writev, io_setup, vmsplice, inotify, fanotify, dnotify and leases, extended attribute writes "
    "(EOPNOTSUPP), and prlimit, setpriority, ioprio_set and sched_setaffinity/setscheduler/setparam/setattr on "
    "any process but the caller; file locks and prctl(PR_SET_PDEATHSIG) succeed without effect (no lock is shared "
    "between slots; the parent-death signal that ends a namespace's pid 1 stays)"
)
_OWN_PID_1 = (
    "; pid 1 is a shell under the code's own filter and limits (--as-pid-1), the code its child: no bwrap "
    "process with the trainer's limits and no filter is inside to ptrace, and code that kills itself ends as killed"
)
_SHARED_UID_METADATA = (
    "; seccomp refuses chmod, chown and utime in every form (Landlock does not mediate them, and the "
    "trainer's uid owns the pool and the run's files): shutil.copy/copy2/copytree fail after copying, "
    "shutil.copyfile works; stat() of host paths is NOT mediated either (sizes and times of the trainer's "
    "files, which pids exist)"
)
_ROOT_METADATA = (
    "; the slot uid owns nothing else; stat() of host paths is NOT mediated (which pids exist, sizes and times "
    "of files in directories any user can search)"
)
_WMEM_DEFAULT = "/proc/sys/net/core/wmem_default"
_PIPE_BYTES = 65536


def _socket_buffer_bytes() -> int:
    """The send buffer every socket keeps (the filter refuses SO_SNDBUF/SO_RCVBUF changes)."""
    try:
        with open(_WMEM_DEFAULT) as f:
            return int(f.read())
    except (OSError, ValueError):
        return 212992  # the kernel's default


def protections(layer: str, root: bool, abi: int) -> dict[str, str]:
    """Layer → {protection: what it rests on} (no resource bounds: see `bounds`)."""
    uid_note = "a per-slot uid (no real user's), " if root else ""
    if layer == "bwrap":
        return {
            "filesystem": "bwrap mount namespace: read-only binds of /usr and the interpreter, only the workspace "
            "writable, /tmp and /dev/shm read-only, no /etc secrets",
            "network": "bwrap network namespace: no interface but a downed loopback; seccomp allows only "
            "unix, inet, inet6 and netlink sockets (AF_VSOCK's port space is the host's)",
            "isolation": f"{uid_note}pid, IPC and mount namespaces (own /proc with bwrap's command line, key users and "
            "the boot line masked; other workspaces not mounted)" + ("" if root else _OWN_PID_1),
            "kernel": _KERNEL,
            "privileges": "setpriv drops to the slot uid with no capability (ambient, inheritable, bounding) and "
            "no_new_privs; user namespaces refused by seccomp"
            if root
            else "user namespace with --cap-drop ALL and --disable-userns",
            "timeout": "SIGKILL to bwrap kills its init (--die-with-parent): the pid namespace dies with every "
            "process in it, setsid or not",
            "zombies": "bwrap's init is pid 1 of the namespace and reaps orphans",
            "environment": "--clearenv: only PATH, HOME, TMPDIR, locale and thread-count variables",
        }
    if layer == "landlock":
        scope = "; Landlock scoping blocks signals to and ptrace of processes outside the slot" if abi >= 6 else ""
        return {
            "filesystem": f"Landlock ABI {abi}: read/execute on system dirs and the interpreter, write only in the "
            "workspace" + (_ROOT_METADATA if root else _SHARED_UID_METADATA),
            "network": ("Landlock denies TCP bind/connect; " if abi >= 4 else "")
            + "seccomp allows only unix sockets, no connect() and no datagram unix sockets (host sockets by path)",
            "isolation": f"{uid_note}Landlock (no /proc, other workspaces not granted){scope}",
            "kernel": _KERNEL,
            "privileges": "setpriv drops to the slot uid with no capability at all, no_new_privs"
            if root
            else "no_new_privs",
            "timeout": "the launcher is a child subreaper: on timeout it SIGKILLs every descendant (setsid ones "
            "are re-parented to it)" + ("; the slot uid is killed wholesale at release" if root else ""),
            "zombies": "the launcher reaps every re-parented orphan",
            "environment": "replaced: only PATH, HOME, TMPDIR, locale and thread-count variables",
        }
    return {
        "filesystem": "NONE: the code can read and write whatever the trainer can",
        "network": "NONE",
        "isolation": "NONE: the code can read the trainer's memory, environment and files",
        "kernel": "NONE: no seccomp filter",
        "timeout": "the launcher (subreaper) kills every descendant",
        "environment": "replaced (no secrets passed), but readable from /proc",
    }


def bounds(
    layer: str, config: SandboxConfig, root: bool, cgroup: list[str], quota: bool, quota_problem: str = ""
) -> dict[str, str]:
    """{resource: what bounds it per slot, or NOT bounded and why}, given the cgroup controllers in force.

    quota_problem: why a workspace tmpfs could not be mounted although root asked for one.
    """
    why_no_quota = (
        f" ({quota_problem})"
        if quota_problem
        else " (a tmpfs quota needs root)"
        if not root and config.workspace_mb
        else " (workspace_mb = 0)"
    )
    shared_uid = not root
    memfd = "memfd pages are charged to the group" if "memory" in cgroup else "memfd_create refused by seccomp"
    if layer == "unsafe-local":
        memfd = "memfd NOT bounded"
    out = {
        "memory": f"cgroup memory limit {config.memory_mb} MB for the whole slot (tmpfs, shared memory, page "
        f"cache included), RLIMIT_AS {config.memory_mb} MB per process"
        if "memory" in cgroup
        else f"RLIMIT_AS {config.memory_mb} MB per process only: NOT bounded per slot (up to max_processes x "
        f"{config.memory_mb} MB); {memfd}",
        "processes": f"cgroup pids.max {config.max_processes} and RLIMIT_NPROC"
        if "pids" in cgroup
        else f"RLIMIT_NPROC {config.max_processes}"
        + (" on the trainer's uid (shared!)" if shared_uid and layer != "bwrap" else ""),  # fmt: skip
        "cpu": f"cgroup cpu quota {config.cpu_cores:g} core(s) per slot (however many processes)"
        if "cpu" in cgroup
        else "RLIMIT_CPU per process and nice 10 only: NOT bounded per slot",
        "disk": f"tmpfs workspace of {config.workspace_mb} MB and {config.workspace_inodes} inodes, "
        f"RLIMIT_FSIZE {config.max_file_mb} MB per file"
        if quota
        else f"RLIMIT_FSIZE {config.max_file_mb} MB per file only: total size and file count NOT bounded"
        + why_no_quota,
        "disk I/O": _disk_io(config, "io" in cgroup),
        "files": f"RLIMIT_NOFILE {config.max_open_files} per process",
        "buffers": _buffers(config, layer, "memory" in cgroup),
    }
    if "memory" in cgroup:
        out["memory"] += f"; {memfd}"
    return out


def _disk_io(config: SandboxConfig, io_cgroup: bool) -> str:
    """Disk bandwidth: only a cgroup's I/O controller bounds it (a slot reading past the page cache slows the host's
    own reads)."""
    if not io_cgroup:
        return "NOT bounded (no cgroup I/O controller in force: needs root, or a delegated v2 group with io)"
    if not (config.io_mb_per_s or config.io_ops_per_s):
        return "NOT bounded (io_mb_per_s and io_ops_per_s are 0)"
    caps = [f"{config.io_mb_per_s:g} MB/s" if config.io_mb_per_s else "",
            f"{config.io_ops_per_s} operations/s" if config.io_ops_per_s else ""]  # fmt: skip
    return f"cgroup I/O limit {' and '.join(c for c in caps if c)} per disk for the whole slot"


def _buffers(config: SandboxConfig, layer: str, memory_cgroup: bool) -> str:
    """Socket and pipe buffers: kernel memory RLIMIT_AS never sees, bounded by descriptors times buffer size."""
    if layer == "unsafe-local":
        return "socket and pipe buffers NOT bounded (no seccomp filter: SO_SNDBUF and F_SETPIPE_SZ allowed)"
    socket_bytes = _socket_buffer_bytes()
    # A process holds max_open_files descriptors and as many again in flight inside unix sockets
    # (the kernel's limit on passed descriptors is RLIMIT_NOFILE too); each holds one queue, which
    # the kernel lets a queue pass its size by part of one packet (hence the 5/4 margin).
    per_process_mb = 2 * config.max_open_files * max(socket_bytes, _PIPE_BYTES) * 5 // 4 >> 20
    out = (f"socket send buffers fixed at net.core.wmem_default ({socket_bytes >> 10} KiB), pipes at 64 KiB "
           f"(seccomp: SO_SNDBUF/SO_RCVBUF changes ignored, F_SETPIPE_SZ refused): at most about "
           f"{per_process_mb} MB of kernel buffers per process, outside RLIMIT_AS")  # fmt: skip
    if memory_cgroup:
        return out + "; the memory cgroup bounds the slot's total"
    return out + f"; NOT bounded per slot (up to max_processes x {per_process_mb} MB)"
