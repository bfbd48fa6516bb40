"""Landlock through raw syscalls (ctypes), for the no-user-namespace layer.

No Python library applies a Landlock ruleset to a child process without a compiler or
extra wheels, so this module speaks the kernel ABI itself (the seccomp filter is in
`seccomp.py`).
It must import with the standard library only: the launcher runs it under `python -I -S`.
"""

from __future__ import annotations

import ctypes
import errno as errno_mod
import os
import struct

_LIBC = ctypes.CDLL(None, use_errno=True)
_LIBC.syscall.restype = ctypes.c_long
_LIBC.prctl.restype = ctypes.c_int
_LIBC.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]

_SYS_LANDLOCK_CREATE_RULESET, _SYS_LANDLOCK_ADD_RULE, _SYS_LANDLOCK_RESTRICT_SELF = 444, 445, 446  # same on every arch

PR_SET_NO_NEW_PRIVS, PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER = 38, 1, 36

# Landlock filesystem rights, in ABI order (1: bits 0-12, 2: REFER, 3: TRUNCATE, 5: IOCTL_DEV).
FS_EXECUTE, FS_WRITE_FILE, FS_READ_FILE, FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
FS_REFER, FS_TRUNCATE, FS_IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
_FILE_ONLY = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV
NET_BIND_TCP, NET_CONNECT_TCP = 1, 2
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1, 2


def abi_version() -> int:
    """The Landlock ABI the kernel offers: 0 when absent or disabled."""
    version = _LIBC.syscall(_SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    return max(int(version), 0)


def features(abi: int) -> dict[str, bool]:
    """What a ruleset enforces at this ABI: the names `sandbox check` reports and the probe requires."""
    return {
        "filesystem": abi >= 1,
        "refer": abi >= 2,  # below it, every cross-directory rename/link is denied (stricter, not weaker)
        "truncate": abi >= 3,
        "tcp": abi >= 4,
        "ioctl_dev": abi >= 5,
        "scope_signal": abi >= 6,
        "scope_abstract_unix": abi >= 6,
    }


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


def read_grants(read_paths: list[str], hidden: list[str] = (), listable: list[str] = ()) -> list[tuple[str, bool]]:
    """(path, whole) rules that grant `read_paths` but nothing of `hidden` below them.

    A Landlock right on a directory covers its whole tree and cannot be taken back below it, so a
    directory with a hidden path inside is granted entry by entry instead (links skipped: their
    targets are reachable where granted themselves). Such a split directory can then not be listed,
    unless it is in `listable` (a `sys.path` directory the interpreter must list to import from);
    listing is hierarchical, so the names, never the contents, below it show.
    """
    hide = {os.path.realpath(p) for p in hidden}
    lists = {os.path.realpath(p) for p in listable}
    grants: list[tuple[str, bool]] = []
    seen: set[str] = set()

    def visit(path: str) -> None:
        if path in seen or path in hide:
            return
        seen.add(path)
        if not any(h.startswith(path.rstrip("/") + "/") for h in hide) or not os.path.isdir(path):
            grants.append((path, True))
            return
        if path in lists:
            grants.append((path, False))
        try:
            names = os.listdir(path)
        except OSError:
            return
        for name in names:
            child = os.path.join(path, name)
            if not os.path.islink(child):
                visit(child)

    for path in read_paths:
        visit(os.path.realpath(path))
    return grants


def restrict(
    read_paths: list[str],
    write_paths: list[str],
    device_paths: list[str],
    abi: int | None = None,
    *,
    hidden: list[str] = (),
    listable: list[str] = (),
) -> dict:
    """Confine this process and its future children with Landlock.

    read_paths may be read and executed, except `hidden` paths below them (see `read_grants`);
    write_paths are fully writable, device_paths (e.g. /dev/null) may be read and written.
    Everything else on the filesystem, every TCP bind/connect (ABI >= 4), abstract unix sockets
    and signals to processes outside the domain (ABI >= 6) are denied. Returns what was enforced.
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
    rules = [
        (path, read_rights if whole else FS_READ_DIR) for path, whole in read_grants(read_paths, hidden, listable)
    ]
    rules += [(path, handled_fs) for path in write_paths] + [(path, device_rights) for path in device_paths]
    try:
        for path, rights in rules:
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
    return {"abi": abi, **features(abi)}


def set_child_subreaper() -> None:
    """Orphaned descendants (setsid, double fork) are re-parented to this process, not to init."""
    _check(_LIBC.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0), "subreaper")


def set_parent_death_signal(sig: int) -> None:
    """Receive `sig` when the parent dies."""
    _check(_LIBC.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0), "pdeathsig")
