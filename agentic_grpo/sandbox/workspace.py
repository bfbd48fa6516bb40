"""Slot workspaces: created private (a size- and inode-limited tmpfs when root), removed whatever is in them.

Removal walks the tree iteratively through directory file descriptors, so depth (a tree
deeper than PATH_MAX, or than Python's recursion limit), permissions the code took away
(chmod 500 or 000: each directory is made u+rwx before its entries go, so no root is needed)
and immutable or append-only flags cannot crash or stop it, and it holds one directory
descriptor at a time whatever the depth. It never follows a link and never changes anything
above the tree it was given.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import logging
import os
import re
import stat
import struct
import tempfile
from pathlib import Path

logger = logging.getLogger(__name__)

_LIBC = ctypes.CDLL(None, use_errno=True)
_MS_NOSUID, _MS_NODEV, _MNT_DETACH = 0x2, 0x4, 0x2
_FS_IOC_GETFLAGS, _FS_IOC_SETFLAGS = 0x80086601, 0x40086602
_FS_IMMUTABLE_FL, _FS_APPEND_FL = 0x10, 0x20
GATED = "workspace"  # a slot uid's workspace: the one entry of its gate directory
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def make_workspace(root: Path, name: str, uid: int | None, *, size_mb: int = 0, inodes: int = 0) -> tuple[Path, bool]:
    """A fresh private directory, owned by the slot uid when there is one (then inside a gate only that uid's
    group can pass).

    As root with a positive size_mb, the directory is a tmpfs of that size and inode count
    (nosuid, nodev): the slot's total disk use and file count are bounded by the kernel.
    Returns (path, whether a tmpfs was mounted there).
    """
    workspace = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=root))
    if uid is not None:
        # A gate the code cannot open: root's, passable by the slot's group (its uid's number) alone. Whatever the
        # code does to its own workspace (opens it to all, leaves a FIFO or a setuid copy), no other user reaches it.
        os.chown(workspace, 0, uid)
        workspace.chmod(0o710)
        workspace = workspace / GATED
        workspace.mkdir(mode=0o700)
    mounted = False
    if size_mb > 0 and os.geteuid() == 0:
        owner = f",uid={uid},gid={uid}" if uid is not None else ""
        options = f"size={size_mb}m,nr_inodes={max(inodes, 16)},mode=0700{owner}".encode()
        if _LIBC.mount(b"tmpfs", str(workspace).encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV, options) != 0:
            err = ctypes.get_errno()
            os.rmdir(workspace)
            if workspace.name == GATED:
                os.rmdir(workspace.parent)
            raise OSError(err, f"cannot mount the workspace tmpfs on {workspace}: {os.strerror(err)}")
        mounted = True
    if uid is not None:
        os.chown(workspace, uid, uid)
    workspace.chmod(0o700)
    return workspace, mounted


def remove_stale_pools(parent: Path, prefix: str) -> None:
    """Remove pool directories (named prefix + pid + '-r' + rank + '-...') of trainers that died without closing them.

    Their workspace tmpfs mounts are detached first, so a killed trainer does not leak RAM or mounts.
    """
    try:
        entries = list(parent.iterdir())
    except OSError:
        return
    mounts = _mount_points()
    pattern = re.compile(re.escape(prefix) + r"(\d+)-r\d+-")
    for entry in entries:
        match = pattern.match(entry.name)
        if not match or os.path.exists(f"/proc/{match.group(1)}"):
            continue
        if entry.is_symlink() or not entry.is_dir() or entry.stat().st_uid != os.geteuid():
            continue
        try:
            for mount in sorted((m for m in mounts if m.startswith(str(entry) + "/")), reverse=True):
                unmount(Path(mount))
            remove_tree(entry)
        except OSError as exc:
            logger.warning("sandbox: stale pool directory %s stays: %s", entry, exc)


def _mount_points() -> list[str]:
    try:
        with open("/proc/self/mountinfo") as f:
            # The mount point is the 5th field, with spaces and the like octal-escaped.
            return [line.split()[4].encode().decode("unicode_escape") for line in f]
    except OSError:
        return []


def unmount(path: Path) -> None:
    """Detach a workspace tmpfs (lazily: a straggler's open file cannot keep it from going)."""
    if _LIBC.umount2(str(path).encode(), _MNT_DETACH) != 0:
        err = ctypes.get_errno()
        if err not in (errno.EINVAL, errno.ENOENT):  # EINVAL: not a mount point (already gone)
            raise OSError(err, f"cannot unmount {path}: {os.strerror(err)}")


def _clear_flags(fd: int) -> None:
    """Drop immutable/append-only flags (needs CAP_LINUX_IMMUTABLE; harmless without it)."""
    try:
        buf = bytearray(struct.pack("l", 0))
        fcntl.ioctl(fd, _FS_IOC_GETFLAGS, buf)
        flags = struct.unpack("l", buf)[0]
        if flags & (_FS_IMMUTABLE_FL | _FS_APPEND_FL):
            fcntl.ioctl(fd, _FS_IOC_SETFLAGS, struct.pack("l", flags & ~(_FS_IMMUTABLE_FL | _FS_APPEND_FL)))
    except OSError:
        pass


def _unlink(name: str, dir_fd: int, is_dir: bool) -> None:
    """Remove one entry; on EPERM/EACCES, fix the flags and permissions in the way and retry once."""
    remove = os.rmdir if is_dir else os.unlink
    try:
        remove(name, dir_fd=dir_fd)
        return
    except FileNotFoundError:
        return
    except (PermissionError, OSError) as exc:
        if exc.errno not in (errno.EPERM, errno.EACCES):
            raise
    _clear_flags(dir_fd)  # an append-only/immutable directory forbids removing its entries
    try:
        fd = os.open(name, (os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC), dir_fd=dir_fd)
    except OSError:
        fd = -1
    if fd >= 0:
        try:
            _clear_flags(fd)
        finally:
            os.close(fd)
    remove(name, dir_fd=dir_fd)


def _open_dir(name: str, parent_fd: int) -> int:
    """Open a directory of the tree (never through a link) and make it u+rwx, so its entries can be removed."""
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    except PermissionError:
        # Not readable (chmod 000 by the code): change its mode through a handle that needs no permission on it.
        handle = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent_fd)
        try:
            os.chmod(f"/proc/self/fd/{handle}", 0o700)  # fchmod refuses O_PATH handles; this is the same inode
        finally:
            os.close(handle)
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    mode = os.fstat(fd).st_mode
    if mode & 0o700 != 0o700:
        # Read-only (chmod 500): without root, unlinking its entries needs write permission on it.
        try:
            os.fchmod(fd, stat.S_IMODE(mode) | 0o700)
        except OSError:
            pass  # not ours and no root: the removals below fail and say which entries stay
    return fd


def remove_tree(path: Path | str) -> None:
    """Remove `path` and everything below it, iteratively; a link is removed, never followed.

    Raises OSError only for what it could not remove (after trying every entry).
    """
    path = os.path.abspath(path)
    parent_fd = os.open(os.path.dirname(path) or "/", _DIR_FLAGS)
    try:
        name = os.path.basename(path)
        try:
            info = os.lstat(name, dir_fd=parent_fd)
        except FileNotFoundError:
            return
        if not stat.S_ISDIR(info.st_mode):
            _unlink(name, parent_fd, False)
            return
        _clear_dir(parent_fd, name)
        _unlink(name, parent_fd, True)
    finally:
        os.close(parent_fd)


def _clear_dir(top_parent_fd: int, top_name: str) -> None:
    """Empty the directory top_name (in top_parent_fd), holding one descriptor per moment.

    The walk keeps, per level, the entries still to visit and the (dev, ino) of the directory;
    going up opens ".." and checks it is the directory it came from.
    """
    fd = _open_dir(top_name, top_parent_fd)
    top_id = _id(fd)
    stack: list[tuple[tuple[int, int], list[str], str]] = []  # (dir id, names left, name in parent)
    names = _names(fd)
    failures: list[str] = []
    try:
        while True:
            descended = False
            while names:
                name = names.pop()
                try:
                    info = os.lstat(name, dir_fd=fd)
                except FileNotFoundError:
                    continue
                if not stat.S_ISDIR(info.st_mode):
                    try:
                        _unlink(name, fd, False)
                    except OSError as exc:
                        failures.append(f"{name}: {exc}")
                    continue
                try:
                    os.rmdir(name, dir_fd=fd)  # empty directories need no descent
                    continue
                except OSError:
                    pass
                try:
                    child = _open_dir(name, fd)
                except OSError as exc:
                    failures.append(f"{name}: {exc}")
                    continue
                stack.append((_id(fd), names, name))
                os.close(fd)
                fd, names, descended = child, _names(child), True
                break
            if descended:
                continue
            if not stack:
                break
            parent_id, names, name = stack.pop()
            parent = os.open("..", _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = parent
            if _id(fd) != parent_id:
                raise OSError(errno.ESTALE, "a directory moved during removal; stopped")
            try:
                _unlink(name, fd, True)
            except OSError as exc:
                failures.append(f"{name}: {exc}")
        if _id(fd) != top_id:
            raise OSError(errno.ESTALE, "removal ended outside the tree it started in")
    finally:
        os.close(fd)
    if failures:
        raise OSError(errno.ENOTEMPTY, f"could not remove {len(failures)} entries, e.g. {failures[:3]}")


def _id(fd: int) -> tuple[int, int]:
    info = os.fstat(fd)
    return info.st_dev, info.st_ino


def _names(fd: int) -> list[str]:
    with os.scandir(fd) as entries:  # fd comes from _open_dir: readable
        return [entry.name for entry in entries]


def release_workspace(path: Path, mounted: bool) -> None:
    """Unmount (if a tmpfs) and remove a workspace; raises OSError if something stays."""
    if mounted:
        unmount(path)
    remove_tree(path)
    if path.name == GATED:
        os.rmdir(path.parent)
