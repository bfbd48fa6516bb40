"""Landlock and seccomp through raw syscalls (ctypes), for the no-user-namespace layer.

No Python library applies a Landlock ruleset and a seccomp socket filter to a child
process without a compiler or extra wheels, so this module speaks the kernel ABI itself.
It must import with the standard library only: the launcher runs it under `python -I -S`.
"""

from __future__ import annotations

import ctypes
import errno as errno_mod
import os
import platform
import struct

_LIBC = ctypes.CDLL(None, use_errno=True)
_LIBC.syscall.restype = ctypes.c_long
_LIBC.prctl.restype = ctypes.c_int
_LIBC.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]

# New syscalls share one number on every architecture (since 5.x); older ones differ.
_SYS_LANDLOCK_CREATE_RULESET, _SYS_LANDLOCK_ADD_RULE, _SYS_LANDLOCK_RESTRICT_SELF = 444, 445, 446
_ARCH = {
    # machine: (AUDIT_ARCH, socket, open_by_handle_at, name_to_handle_at, bpf, perf_event_open, userfaultfd,
    #           keyctl, add_key, request_key)
    "x86_64": (0xC000003E, 41, 304, 303, 321, 298, 323, 250, 248, 249),
    "aarch64": (0xC00000B7, 198, 265, 264, 280, 241, 282, 219, 217, 218),
}
_IO_URING = (425, 426, 427)

PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER = 38, 22, 1, 36
SECCOMP_MODE_FILTER = 2

# Landlock filesystem rights, in ABI order (1: bits 0-12, 2: REFER, 3: TRUNCATE, 5: IOCTL_DEV).
FS_EXECUTE, FS_WRITE_FILE, FS_READ_FILE, FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
FS_REFER, FS_TRUNCATE, FS_IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
_FILE_ONLY = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV
NET_BIND_TCP, NET_CONNECT_TCP = 1, 2
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1, 2


def machine() -> str:
    """The kernel's architecture name (`uname -m`)."""
    return platform.machine()


def abi_version() -> int:
    """The Landlock ABI the kernel offers: 0 when absent or disabled."""
    version = _LIBC.syscall(_SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    return max(int(version), 0)


def fs_rights(abi: int) -> int:
    """Every filesystem right this ABI can handle (all of them are denied unless a rule grants them)."""
    rights = (1 << 13) - 1
    if abi >= 2:
        rights |= FS_REFER
    if abi >= 3:
        rights |= FS_TRUNCATE
    if abi >= 5:
        rights |= FS_IOCTL_DEV
    return rights


def _check(result: int, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result


def restrict(read_paths: list[str], write_paths: list[str], device_paths: list[str], abi: int | None = None) -> dict:
    """Confine this process and its future children with Landlock.

    read_paths may be read and executed, write_paths are fully writable, device_paths
    (e.g. /dev/null) may be read and written. Everything else on the filesystem, every TCP
    bind/connect (ABI >= 4), abstract unix sockets and signals to processes outside the
    domain (ABI >= 6) are denied. Returns what was enforced.
    """
    abi = abi_version() if abi is None else abi
    if abi < 1:
        raise OSError(errno_mod.ENOSYS, "Landlock is not available in this kernel")
    handled_fs = fs_rights(abi)
    handled_net = NET_BIND_TCP | NET_CONNECT_TCP if abi >= 4 else 0
    scoped = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if abi >= 6 else 0
    attr = struct.pack("<QQQ", handled_fs, handled_net, scoped)
    size = 8 if abi < 4 else 16 if abi < 6 else 24
    buf = ctypes.create_string_buffer(attr, 24)
    ruleset = _check(
        _LIBC.syscall(_SYS_LANDLOCK_CREATE_RULESET, buf, ctypes.c_size_t(size), ctypes.c_uint32(0)), "ruleset"
    )
    read_rights = FS_EXECUTE | FS_READ_FILE | FS_READ_DIR
    device_rights = FS_READ_FILE | FS_WRITE_FILE | (FS_IOCTL_DEV if abi >= 5 else 0)
    try:
        for paths, rights in ((read_paths, read_rights), (write_paths, handled_fs), (device_paths, device_rights)):
            for path in paths:
                try:
                    fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
                except OSError:
                    continue  # a path this host lacks is simply not granted
                try:
                    allowed = rights & handled_fs
                    if not os.path.isdir(path):
                        allowed &= _FILE_ONLY
                    rule = ctypes.create_string_buffer(struct.pack("<Qi", allowed, fd), 12)
                    _check(_LIBC.syscall(_SYS_LANDLOCK_ADD_RULE, ruleset, 1, rule, 0), f"landlock rule {path}")
                finally:
                    os.close(fd)
        _check(_LIBC.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
        _check(_LIBC.syscall(_SYS_LANDLOCK_RESTRICT_SELF, ruleset, 0), "landlock_restrict_self")
    finally:
        os.close(ruleset)
    return {"abi": abi, "filesystem": True, "tcp": bool(handled_net), "signals_and_abstract_unix": bool(scoped)}


def _assemble(program: list[tuple]) -> bytes:
    """Classic BPF from (code, k, jt_label, jf_label) rows and ("label", name) markers."""
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
        out += struct.pack("<HBBI", code, jt_off, jf_off, k & 0xFFFFFFFF)
    return out


def seccomp_filter_supported() -> bool:
    """Whether this architecture has a socket filter here."""
    return machine() in _ARCH


def install_seccomp() -> None:
    """Deny non-unix sockets, io_uring (which could open sockets behind the filter's back),
    file handles (open_by_handle_at escapes), bpf, perf, userfaultfd and keyrings; kill foreign ABIs.

    Needed because Landlock does not cover UDP, raw or netlink sockets.
    """
    arch, sock, *denied = _ARCH[machine()]
    denied = list(denied) + list(_IO_URING)
    ld_w_abs, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06
    allow, kill = 0x7FFF0000, 0x80000000
    program: list[tuple] = [(ld_w_abs, 4, 0, 0), (jeq, arch, 1, 0), (ret, kill, 0, 0), (ld_w_abs, 0, 0, 0)]
    if machine() == "x86_64":
        program.append((jge, 0x40000000, "eperm", 0))  # x32 syscalls: not needed, not filtered
    for nr in denied:
        program.append((jeq, nr, "eperm", 0))
    program += [
        (jeq, sock, 0, "allow"),
        (ld_w_abs, 16, 0, 0),  # args[0] (low half): the address family
        (jeq, 1, "allow", 0),  # AF_UNIX
        (ret, 0x00050000 | errno_mod.EAFNOSUPPORT, 0, 0),
        ("label", "eperm"),
        (ret, 0x00050000 | errno_mod.EPERM, 0, 0),
        ("label", "allow"),
        (ret, allow, 0, 0),
    ]
    code = _assemble(program)
    filt = ctypes.create_string_buffer(code, len(code))
    prog = struct.pack("<HxxxxxxQ", len(code) // 8, ctypes.addressof(filt))
    prog_buf = ctypes.create_string_buffer(prog, len(prog))
    _check(_LIBC.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    _check(_LIBC.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(prog_buf), 0, 0), "seccomp")


def set_child_subreaper() -> None:
    """Orphaned descendants (setsid, double fork) are re-parented to this process, not to init."""
    _check(_LIBC.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0), "subreaper")


def set_parent_death_signal(sig: int) -> None:
    """Receive `sig` when the parent dies."""
    _check(_LIBC.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0), "pdeathsig")
