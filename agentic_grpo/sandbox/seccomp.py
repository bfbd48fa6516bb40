"""The seccomp filter every confined layer shares: kernel surface a tool never needs, refused.

Built as classic BPF with the standard library only, so the Landlock launcher (which runs
under `python -I -S`) can install it with prctl, and bubblewrap can load the same program
from a file descriptor (`--seccomp FD`). Refused with EPERM unless noted:

- keyrings (add_key, request_key, keyctl): the trainer's session keyring is inherited and a
  slot uid's user keyring outlives the call;
- SysV IPC (shm, msg, sem) and POSIX message queues: objects outlive the call and the slot,
  and their pages sit outside RLIMIT_AS;
- new namespaces (unshare, setns, clone with CLONE_NEW*; clone3 answers ENOSYS so libc falls
  back to clone): user namespaces would hand the code capabilities and mounts;
- io_uring, userfaultfd, bpf, perf_event_open, file handles (open_by_handle_at escapes),
  memfd_secret, and memfd_create when no memory cgroup charges its pages;
- sockets outside an allow-list of address families (AF_VSOCK's port space is the host's);
  on the Landlock layer, whose slots share the host's network namespace, also
  connect(), bind() and every unix socket but a stream one (see `build`);
- calls that change another process: prlimit64, sched_setaffinity, sched_setscheduler,
  sched_setparam and sched_setattr on any pid but 0 (the caller, which setrlimit, `prlimit`,
  `taskset` and Python's os.sched_* use), setpriority on anything but (PRIO_PROCESS, 0) and
  ioprio_set on anything but (IOPRIO_WHO_PROCESS, 0) (`nice` and `ionice CMD` use those).
  Without root a slot shares the uid of its launcher and of the trainer: it could lower their
  limits (an open-file limit of 0 breaks the launcher's cleanup, a CPU limit of 0 kills it; a
  file-size limit of 0 breaks the trainer's writes), pin them to one CPU or idle their CPU and
  I/O priority, one process, one group or the whole uid at once. The filter cannot tell the
  caller's own non-zero pid from another one, so `renice -p $$` is refused too;
- ptrace and process_vm_readv/writev: no tool debugs another process, and under bwrap
  without root the namespace's pid 1 would otherwise be a same-uid process to inject into;
- prctl(PR_SET_PDEATHSIG) succeeds without effect: under bwrap without root the code is the
  namespace's pid 1, which dies with the trainer's bwrap only through the parent-death signal
  bwrap gives it; cleared, the code and every process of its namespace outlive the deadline,
  the slot's release and the trainer itself;
- io_setup: async I/O contexts come from one host-wide pool (fs.aio-max-nr), which a slot could
  empty (the host's own io_setup then fails with EAGAIN); code falls back to plain reads and writes;
- vmsplice: pages spliced into a pipe stay pinned outside RLIMIT_AS (1.5 GB past a 256 MB limit);
- inotify and fanotify: a watch on a file every slot reads (the interpreter's modules) shows
  what a concurrent slot, or the trainer, opens;
- netlink's uevent family (NETLINK_KOBJECT_UEVENT): bwrap as root makes a network namespace
  of the host's user namespace, and the kernel sends the host's device events to those;
- extended attribute writes (setxattr, removexattr and their l/f/at forms) answer EOPNOTSUPP,
  as on a filesystem without xattrs (`cp -a` and shutil.copy2 carry on): Landlock does not
  mediate them, and a user.* attribute on a shared file is a message to the next slot;
- with deny_metadata (Landlock without root), chmod, chown and utime in every form: Landlock
  does not mediate them either, and the trainer's uid owns the pool directory, the run's
  files and the interpreter's environment;
- kernel buffer memory outside RLIMIT_AS: setsockopt SO_SNDBUF/SO_RCVBUF (and their FORCE forms)
  succeed without effect, so a socket keeps net.core.wmem_default rather than up to twice
  wmem_max; fcntl F_SETPIPE_SZ is refused, so a pipe keeps its 64 KiB;
- file locks (flock, and fcntl's F_SETLK, F_SETLKW and their OFD forms) succeed without
  effect: a lock lives on the inode, so two slots locking a file both read (the
  interpreter's modules) could signal each other. Refusing them would break sqlite and make
  `filelock` wait forever; as no-ops, each slot's code runs as if it were alone, and a
  lock taken by one process of a slot does not exclude another. F_GETLK stays: no slot
  ever holds a lock for it to see. Leases (F_SETLEASE) and directory notifications
  (F_NOTIFY, dnotify: inotify's older form) are refused;
- the page cache as a probe: every slot reads the same interpreter and libraries, so whether a
  page of one of them is cached carries bits between slots, and what a neighbour imports.
  posix_fadvise(POSIX_FADV_DONTNEED) and madvise(MADV_COLD, MADV_PAGEOUT), which evict a shared
  file's pages, succeed without effect; preadv2 with RWF_NOWAIT (which fails only when the page
  is not cached) answers EOPNOTSUPP, as on a filesystem without it, and code falls back to a plain
  read; mincore and cachestat, which report residency, answer ENOSYS. Timing a first read still
  tells a cached page from one on disk (docs/sandbox.md lists it as open);
- syscalls of a foreign ABI (i386 on x86_64) kill the process; x32 ones are refused.
"""

from __future__ import annotations

import ctypes
import errno
import platform
import struct

# Per architecture: AUDIT_ARCH and the syscall numbers the filter looks at.
_NR = {
    "x86_64": {
        "arch": 0xC000003E,
        "socket": 41,
        "bind": 49,
        "socketpair": 53,
        "connect": 42,
        "clone": 56,
        "clone3": 435,
        "memfd_create": 319,
        "prlimit64": 302,
        "setpriority": 141,
        "ioprio_set": 251,
        "setsockopt": 54,
        "fcntl": 72,
        "flock": 73,
        "prctl": 157,
        "fadvise64": 221,
        "madvise": 28,
        "preadv2": 327,
        "residency": {"mincore": 27, "cachestat": 451},
        "own_pid": {"sched_setparam": 142, "sched_setscheduler": 144, "sched_setaffinity": 203, "sched_setattr": 314},
        "xattr": {"setxattr": 188, "lsetxattr": 189, "fsetxattr": 190, "removexattr": 197, "lremovexattr": 198,
                  "fremovexattr": 199, "setxattrat": 463, "removexattrat": 466},
        "metadata": {"chmod": 90, "fchmod": 91, "fchmodat": 268, "fchmodat2": 452, "chown": 92, "fchown": 93,
                     "lchown": 94, "fchownat": 260, "utime": 132, "utimes": 235, "futimesat": 261, "utimensat": 280},
        "deny": {
            "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "io_setup": 206, "vmsplice": 278,
            "inotify_init": 253, "inotify_init1": 294, "fanotify_init": 300,
            "open_by_handle_at": 304, "name_to_handle_at": 303, "bpf": 321, "perf_event_open": 298,
            "userfaultfd": 323, "keyctl": 250, "add_key": 248, "request_key": 249, "io_uring_setup": 425,
            "io_uring_enter": 426, "io_uring_register": 427, "unshare": 272, "setns": 308, "memfd_secret": 447,
            "shmget": 29, "shmat": 30, "shmctl": 31, "shmdt": 67, "semget": 64, "semop": 65, "semctl": 66,
            "semtimedop": 220, "msgget": 68, "msgsnd": 69, "msgrcv": 70, "msgctl": 71, "mq_open": 240,
            "mq_unlink": 241, "mq_timedsend": 242, "mq_timedreceive": 243, "mq_notify": 244, "mq_getsetattr": 245,
        },
    },
    "aarch64": {
        "arch": 0xC00000B7,
        "socket": 198,
        "bind": 200,
        "socketpair": 199,
        "connect": 203,
        "clone": 220,
        "clone3": 435,
        "memfd_create": 279,
        "prlimit64": 261,
        "setpriority": 140,
        "ioprio_set": 30,
        "setsockopt": 208,
        "fcntl": 25,
        "flock": 32,
        "prctl": 167,
        "fadvise64": 223,
        "madvise": 233,
        "preadv2": 286,
        "residency": {"mincore": 232, "cachestat": 451},
        "own_pid": {"sched_setparam": 118, "sched_setscheduler": 119, "sched_setaffinity": 122, "sched_setattr": 274},
        "xattr": {"setxattr": 5, "lsetxattr": 6, "fsetxattr": 7, "removexattr": 14, "lremovexattr": 15,
                  "fremovexattr": 16, "setxattrat": 463, "removexattrat": 466},
        "metadata": {"fchmod": 52, "fchmodat": 53, "fchmodat2": 452, "fchown": 55, "fchownat": 54, "utimensat": 88},
        "deny": {
            "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271, "io_setup": 0, "vmsplice": 75,
            "inotify_init1": 26, "fanotify_init": 262,
            "open_by_handle_at": 265, "name_to_handle_at": 264, "bpf": 280, "perf_event_open": 241,
            "userfaultfd": 282, "keyctl": 219, "add_key": 217, "request_key": 218, "io_uring_setup": 425,
            "io_uring_enter": 426, "io_uring_register": 427, "unshare": 97, "setns": 268, "memfd_secret": 447,
            "shmget": 194, "shmat": 196, "shmctl": 195, "shmdt": 197, "semget": 190, "semop": 193, "semctl": 191,
            "semtimedop": 192, "msgget": 186, "msgsnd": 189, "msgrcv": 188, "msgctl": 187, "mq_open": 180,
            "mq_unlink": 181, "mq_timedsend": 182, "mq_timedreceive": 183, "mq_notify": 184, "mq_getsetattr": 185,
        },
    },
}  # fmt: skip

AF_UNIX, AF_INET, AF_INET6, AF_NETLINK = 1, 2, 10, 16
NETLINK_KOBJECT_UEVENT = 15
SOCK_STREAM, SOCK_SEQPACKET = 1, 5
PRIO_PROCESS, IOPRIO_WHO_PROCESS = 0, 1
SOL_SOCKET, F_SETPIPE_SZ = 1, 1031
F_SETLEASE, F_NOTIFY = 1024, 1026
PR_SET_PDEATHSIG = 1
POSIX_FADV_DONTNEED, MADV_COLD, MADV_PAGEOUT, RWF_NOWAIT = 4, 20, 21, 0x8  # same on x86_64 and aarch64
SET_LOCK_COMMANDS = (6, 7, 37, 38)  # F_SETLK, F_SETLKW, F_OFD_SETLK, F_OFD_SETLKW (same on every 64-bit arch)
BUFFER_OPTIONS = (7, 8, 32, 33)  # SO_SNDBUF, SO_RCVBUF, SO_SNDBUFFORCE, SO_RCVBUFFORCE (same on every arch)
# CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET
CLONE_NEW_MASK = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000
BWRAP_FAMILIES = (AF_UNIX, AF_INET, AF_INET6, AF_NETLINK)  # inet/netlink are confined by the network namespace
LANDLOCK_FAMILIES = (AF_UNIX,)

_LD_W_ABS, _JEQ, _JGE, _JSET, _RET, _ALU_AND = 0x20, 0x15, 0x35, 0x45, 0x06, 0x54
_ALLOW, _KILL, _ERRNO = 0x7FFF0000, 0x80000000, 0x00050000
PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2


def machine() -> str:
    """The kernel's architecture name (`uname -m`)."""
    return platform.machine()


def supported() -> bool:
    """Whether the filter knows this architecture's syscall numbers."""
    return machine() in _NR


def denied_syscalls() -> list[str]:
    """Names of the syscalls refused outright on every layer (for reports)."""
    return sorted([*_NR[machine()]["deny"], *_NR[machine()]["xattr"]]) if supported() else []


def assemble(program: list[tuple]) -> bytes:
    """Classic BPF from (code, k, jt, jf) rows, where jt/jf are offsets or label names, and ("label", name) markers."""
    labels, rows = {}, []
    for row in program:
        if row[0] == "label":
            labels[row[1]] = len(rows)
        else:
            rows.append(row)
    out = b""
    for index, (code, k, jt, jf) in enumerate(rows):
        jt_off = labels[jt] - index - 1 if isinstance(jt, str) else jt
        jf_off = labels[jf] - index - 1 if isinstance(jf, str) else jf
        if not (0 <= jt_off < 256 and 0 <= jf_off < 256):  # classic BPF jumps forward by at most 255 rows
            raise ValueError(f"BPF jump out of range at row {index}: {jt_off}, {jf_off}")
        out += struct.pack("<HBBI", code, jt_off, jf_off, k & 0xFFFFFFFF)
    return out


def build(families: tuple[int, ...], *, allow_memfd: bool, deny_connect: bool, deny_metadata: bool = False) -> bytes:
    """The filter program (raw `struct sock_filter` rows) for one layer.

    Args:
        families: socket address families socket() may create; any other answers EAFNOSUPPORT.
        allow_memfd: let memfd_create through (only when a memory cgroup charges its pages).
        deny_connect: the Landlock layer's unix socket rules (its slots share the host's
            network namespace, and Landlock mediates neither connect() nor sendto()).
        deny_metadata: refuse chmod, chown and utime in every form (EPERM): for slots that
            run as the trainer's uid outside a mount namespace, where only ownership would
            otherwise stand between the code and the trainer's files.

    With deny_connect, what could reach or impersonate a host unix socket is refused:

    - connect(): reaches host stream sockets by path or abstract name;
    - bind(): a slot could take an abstract name first (those names are per network
      namespace, not per filesystem): the host service then fails with EADDRINUSE and its
      clients talk to the slot. The filter cannot read the address, and every socket on this
      layer is a unix one, so bind() is refused outright: with connect() refused nothing in
      the slot could reach a bound socket anyway. Landlock's ABI 6 scope (enforced where the
      kernel has it) only stops the slot reaching abstract sockets outside its domain, not
      binding a name or the host connecting in, so it does not replace this;
    - socket(AF_UNIX, type) for any type but SOCK_STREAM: a datagram socket (SOCK_DGRAM, and
      SOCK_RAW, which the kernel turns into SOCK_DGRAM) reaches any host datagram socket with
      sendto(); SOCK_SEQPACKET needs connect() or bind() to do anything;
    - socketpair(AF_UNIX, type) for any type but SOCK_STREAM and SOCK_SEQPACKET: a datagram
      pair also sendto()s any address, while a connection-oriented pair only talks to itself
      (the kernel ignores a seqpacket sendto() address).
    """
    nr = _NR[machine()]
    prog: list[tuple] = [(_LD_W_ABS, 4, 0, 0), (_JEQ, nr["arch"], 1, 0), (_RET, _KILL, 0, 0), (_LD_W_ABS, 0, 0, 0)]
    if machine() == "x86_64":
        prog.append((_JGE, 0x40000000, "eperm", 0))  # x32 syscalls: not needed, not filtered
    for number in sorted(nr["deny"].values()):
        prog.append((_JEQ, number, "eperm", 0))
    for number in sorted(nr["xattr"].values()):
        prog.append((_JEQ, number, "eopnotsupp", 0))
    if deny_metadata:
        for number in sorted(nr["metadata"].values()):
            prog.append((_JEQ, number, "eperm", 0))
    if not allow_memfd:
        prog.append((_JEQ, nr["memfd_create"], "eperm", 0))
    if deny_connect:
        prog += [(_JEQ, nr["connect"], "eperm", 0), (_JEQ, nr["bind"], "eperm", 0)]
    for number in sorted([nr["prlimit64"], *nr["own_pid"].values()]):
        prog.append((_JEQ, number, "pid_is_0", 0))
    prog += [
        (_JEQ, nr["setpriority"], "setpriority", 0),
        (_JEQ, nr["ioprio_set"], "ioprio_set", 0),
        (_JEQ, nr["setsockopt"], "setsockopt", 0),
        (_JEQ, nr["fcntl"], "fcntl", 0),
        (_JEQ, nr["flock"], "ignore", 0),
        (_JEQ, nr["prctl"], "prctl", 0),
        (_JEQ, nr["fadvise64"], "fadvise", 0),
        (_JEQ, nr["madvise"], "madvise", 0),
        (_JEQ, nr["preadv2"], "preadv2", 0),
        *[(_JEQ, number, "enosys", 0) for number in sorted(nr["residency"].values())],
        (_JEQ, nr["clone3"], "enosys", 0),
        (_JEQ, nr["clone"], "clone", 0),
        (_JEQ, nr["socketpair"], "socketpair", 0),
        (_JEQ, nr["socket"], "socket", "allow"),
        ("label", "pid_is_0"),
        (_LD_W_ABS, 16, 0, 0),  # args[0] (low half): the pid; pid_t is 32 bits, 0 is the caller
        (_JEQ, 0, "allow", "eperm"),
        ("label", "setpriority"),
        (_LD_W_ABS, 16, 0, 0),  # args[0]: which (PRIO_PGRP and PRIO_USER reach many processes)
        (_JEQ, PRIO_PROCESS, "who_is_0", "eperm"),
        ("label", "ioprio_set"),
        (_LD_W_ABS, 16, 0, 0),  # args[0]: which (IOPRIO_WHO_PGRP and IOPRIO_WHO_USER reach many)
        (_JEQ, IOPRIO_WHO_PROCESS, "who_is_0", "eperm"),
        ("label", "who_is_0"),
        (_LD_W_ABS, 24, 0, 0),  # args[1] (low half): who; 0 is the caller
        (_JEQ, 0, "allow", "eperm"),
        ("label", "setsockopt"),
        (_LD_W_ABS, 24, 0, 0),  # args[1]: the level
        (_JEQ, SOL_SOCKET, 0, "allow"),
        (_LD_W_ABS, 32, 0, 0),  # args[2]: the option
        *[(_JEQ, option, "ignore", 0) for option in BUFFER_OPTIONS],
        (_RET, _ALLOW, 0, 0),
        ("label", "fcntl"),
        (_LD_W_ABS, 24, 0, 0),  # args[1]: the command
        *[(_JEQ, command, "ignore", 0) for command in SET_LOCK_COMMANDS],
        (_JEQ, F_SETLEASE, "eperm", 0),
        (_JEQ, F_NOTIFY, "eperm", 0),
        (_JEQ, F_SETPIPE_SZ, "eperm", "allow"),
        ("label", "prctl"),
        (_LD_W_ABS, 16, 0, 0),  # args[0]: the option
        (_JEQ, PR_SET_PDEATHSIG, "ignore", "allow"),
        ("label", "fadvise"),
        (_LD_W_ABS, 40, 0, 0),  # args[3]: the advice
        (_JEQ, POSIX_FADV_DONTNEED, "ignore", "allow"),
        ("label", "madvise"),
        (_LD_W_ABS, 32, 0, 0),  # args[2]: the advice
        (_JEQ, MADV_COLD, "ignore", 0),
        (_JEQ, MADV_PAGEOUT, "ignore", "allow"),
        ("label", "preadv2"),
        (_LD_W_ABS, 56, 0, 0),  # args[5] (low half): the RWF_* flags
        (_JSET, RWF_NOWAIT, "eopnotsupp", "allow"),
        ("label", "clone"),
        (_LD_W_ABS, 16, 0, 0),  # args[0] (low half): the clone flags
        (_JSET, CLONE_NEW_MASK, "eperm", "allow"),
        ("label", "socketpair"),
        (_LD_W_ABS, 16, 0, 0),
        (_JEQ, AF_UNIX, "pair_type" if deny_connect else "allow", "eafnosupport"),
        ("label", "socket"),
        (_LD_W_ABS, 16, 0, 0),  # args[0] (low half): the address family
    ]
    for family in families:
        target = "unix_type" if family == AF_UNIX and deny_connect else "netlink" if family == AF_NETLINK else "allow"
        prog.append((_JEQ, family, target, 0))
    prog += [
        ("label", "eafnosupport"),
        (_RET, _ERRNO | errno.EAFNOSUPPORT, 0, 0),
        ("label", "netlink"),
        (_LD_W_ABS, 32, 0, 0),  # args[2] (low half): the netlink protocol
        (_JEQ, NETLINK_KOBJECT_UEVENT, "eperm", "allow"),
        ("label", "pair_type"),
        (_LD_W_ABS, 24, 0, 0),  # args[1] (low half): the socket type and SOCK_* flags
        (_ALU_AND, 0xF, 0, 0),  # the type without SOCK_NONBLOCK/SOCK_CLOEXEC (the kernel's SOCK_TYPE_MASK)
        (_JEQ, SOCK_SEQPACKET, "allow", "stream_only"),
        ("label", "unix_type"),
        (_LD_W_ABS, 24, 0, 0),
        (_ALU_AND, 0xF, 0, 0),
        ("label", "stream_only"),
        (_JEQ, SOCK_STREAM, "allow", "eperm"),
        ("label", "enosys"),
        (_RET, _ERRNO | errno.ENOSYS, 0, 0),
        ("label", "eopnotsupp"),
        (_RET, _ERRNO | errno.EOPNOTSUPP, 0, 0),
        ("label", "ignore"),
        (_RET, _ERRNO | 0, 0, 0),  # skip the call and return 0 (buffer sizes, locks)
        ("label", "eperm"),
        (_RET, _ERRNO | errno.EPERM, 0, 0),
        ("label", "allow"),
        (_RET, _ALLOW, 0, 0),
    ]
    return assemble(prog)


def install(code: bytes) -> None:
    """Load a filter built by `build` into this process (and its future children), with no_new_privs."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    filt = ctypes.create_string_buffer(code, len(code))
    prog = ctypes.create_string_buffer(struct.pack("<HxxxxxxQ", len(code) // 8, ctypes.addressof(filt)), 16)
    for args, what in (((PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs"),
                       ((PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(prog), 0, 0), "seccomp")):  # fmt: skip
        if libc.prctl(*args) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"{what}: {errno.errorcode.get(err, err)}")
