"""Attacks on what a slot can learn of the host and of slots running beside it: locks, /proc, `stat`.

None of these reads a gold answer directly; each is a way for code in one slot to see the trainer's files or
activity, or to pass data to a concurrent slot (G trajectories of one policy run at once).
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
import struct
import tempfile
import threading
import time
from pathlib import Path

from ..slot import SandboxSlot
from ..workspace import remove_tree
from .support import AttackResult, Context, last_json, run_code

# Host-wide files a pid namespace does not scope that say who and what runs on the host: bwrap's command line
# (pid 1 as root), the uids holding keys, the kernel's boot line.
PROC_FILES = ("/proc/1/cmdline", "/proc/key-users", "/proc/cmdline")
_FLOCK = "hhqqi4x"  # struct flock on 64-bit Linux: type, whence, start, len, pid


def lock_side_channel(ctx: Context, slot: SandboxSlot) -> AttackResult:
    """Lock a module of the interpreter every slot reads (flock, a POSIX and an OFD lock) and watch its directory
    with dnotify: a concurrent slot testing those locks, or woken by that watch, would receive bits.

    The trainer stands in for the second slot: harm is a lock it can see while the code holds it, or a
    directory watch placed outside the workspace.
    """
    ready, done = Path(slot.workspace) / "locked", Path(slot.workspace) / "seen"
    code = f"""
        import fcntl, json, os, struct, time
        path = os.path.realpath(os.__file__)
        out = {{"path": path, "ino": os.stat(path).st_ino}}
        def attempt(name, call):
            try:
                call(os.open(path, os.O_RDONLY))
                out[name] = "OK"
            except OSError as exc:
                out[name] = exc.errno
        attempt("flock", lambda fd: fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB))
        attempt("posix", lambda fd: fcntl.lockf(fd, fcntl.LOCK_SH | fcntl.LOCK_NB, 1, 0))
        attempt("ofd", lambda fd: fcntl.fcntl(fd, fcntl.F_OFD_SETLK, struct.pack("{_FLOCK}", 0, 0, 2, 1, 0)))
        try:
            directory = os.open(os.path.dirname(path), os.O_RDONLY)
            fcntl.fcntl(directory, fcntl.F_NOTIFY, fcntl.DN_ACCESS | fcntl.DN_MULTISHOT)
            out["dnotify"] = "OK"
        except OSError as exc:
            out["dnotify"] = exc.errno
        with open("locked.part", "w") as f:
            json.dump(out, f)
        os.rename("locked.part", "locked")
        for _ in range(100):  # hold the locks until the trainer has looked
            if os.path.exists("seen"):
                break
            time.sleep(0.05)
        print(json.dumps(out))
        """
    outcome: dict = {}
    runner = threading.Thread(target=lambda: outcome.setdefault("result", run_code(slot, code)), daemon=True)
    runner.start()
    seen: list[str] = []
    deadline = time.monotonic() + 15
    while not ready.exists() and runner.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        claimed = json.loads(ready.read_text())
    except (OSError, ValueError):
        claimed = {}
    if claimed:
        seen = _locks_seen(claimed["path"], claimed["ino"])
    try:
        done.write_text("")
    except OSError:
        pass
    runner.join(timeout=20)
    out = last_json(outcome["result"]) if "result" in outcome else claimed
    if not out:
        return AttackResult("lock_side_channel", False, f"the code did not report: {outcome}")
    if "skipped" in seen:
        return AttackResult("lock_side_channel", True, f"code said {out}", skipped=seen[-1])
    if out.get("dnotify") == "OK":
        seen.append("dnotify watch on the interpreter's modules")
    return AttackResult("lock_side_channel", not seen, f"seen from outside: {seen}; code said {out}")


def _locks_seen(path: str, inode: int) -> list[str]:
    """Which of the code's locks on `path` another process can see (test them without taking any for long)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        return ["skipped", f"the code's file {path} is not the host's: {exc}"]
    try:
        if os.fstat(fd).st_ino != inode:
            return ["skipped", f"{path} in the slot is another file than the host's"]
        seen = []
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.flock(fd, fcntl.LOCK_UN)
        except BlockingIOError:
            seen.append("flock held")
        query = struct.pack(_FLOCK, fcntl.F_WRLCK, 0, 0, 0, 0)  # the whole file, any owner
        answer = struct.unpack(_FLOCK, fcntl.fcntl(fd, fcntl.F_OFD_GETLK, query))
        if answer[0] != fcntl.F_UNLCK:
            seen.append(f"POSIX/OFD lock held on bytes {answer[2]}+{answer[3]}")
        return seen
    finally:
        os.close(fd)


def host_proc_files(ctx: Context, slot: SandboxSlot) -> AttackResult:
    """Read /proc files that are the host's whatever the pid namespace: bwrap's command line, the uids holding
    keys, the boot line. Harm is any of them read with content."""
    result = run_code(slot, f"""
        import json
        out = {{}}
        for path in {list(PROC_FILES)!r}:
            try:
                with open(path, "rb") as f:
                    out[path] = f.read(200).decode(errors="replace")
            except OSError as exc:
                out[path] = exc.errno
        print(json.dumps(out))
        """)  # fmt: skip
    out = last_json(result)
    read = {path: text for path, text in out.items() if isinstance(text, str) and text.strip("\0\n ")}
    return AttackResult("host_proc_files", bool(out) and not read, f"read: {read} code said {out or result.stderr}")


def stat_outside(ctx: Context, slot: SandboxSlot) -> AttackResult:
    """`stat` the trainer's private file (size and time: a file in a 0700 directory of the trainer) and a host
    process's /proc entry (which pids exist). Landlock mediates opening, not `stat`: a documented gap there."""
    private = Path(tempfile.mkdtemp(prefix="agentic-grpo-private-"))
    secret_file = private / "answers.jsonl"
    size = 1000 + secrets.randbelow(9000)
    secret_file.write_bytes(secrets.token_bytes(size))
    stamp = 1_000_000_000 + secrets.randbelow(10**8)
    os.utime(secret_file, (stamp, stamp))
    try:
        result = run_code(slot, f"""
            import json, os
            out = {{}}
            try:
                info = os.stat({str(secret_file)!r})
                out["file"] = [info.st_size, int(info.st_mtime)]
            except OSError as exc:
                out["file"] = exc.errno
            out["pid"] = os.path.exists("/proc/{ctx.decoy_proc.pid}")
            print(json.dumps(out))
            """)  # fmt: skip
    finally:
        remove_tree(private)
    out = last_json(result)
    harmed = []
    if out.get("file") == [size, stamp]:
        harmed.append("size and time of a private file")
    if out.get("pid") is True:
        harmed.append(f"host pid {ctx.decoy_proc.pid} exists")
    gap = "Landlock does not mediate stat()" if harmed and ctx.pool.layer == "landlock" else ""
    return AttackResult("stat_outside", bool(out) and not harmed, f"harmed: {harmed} code said {out}", gap)


def page_cache_probe(ctx: Context, slot: SandboxSlot) -> AttackResult:
    """Read and evict the page cache of a file every slot reads (a module source of the interpreter's standard
    library): probe a page without loading it (preadv2 with RWF_NOWAIT, mincore on a mapping never touched,
    cachestat), then evict it (posix_fadvise DONTNEED, madvise PAGEOUT). Together they carry bits to a concurrent
    or a later slot and show what a neighbour imports.

    The trainer caches the page first and looks afterwards (its own RWF_NOWAIT read): harm is any probe that
    tells a cached page, or the page gone from the cache after the code's eviction. A first read's timing
    tells it too: that channel stays open (docs/sandbox.md).
    """
    where = last_json(run_code(slot, """
        import json, json.decoder, os
        print(json.dumps({"path": os.path.realpath(json.decoder.__file__)}))
        """))  # fmt: skip
    path = where.get("path", "")
    if path:
        with open(path, "rb") as f:
            f.read(4096)
    if not path or not _host_cached(path):
        return AttackResult("page_cache_probe", True, f"code said {where}", skipped=f"cannot probe {path!r} here")
    result = run_code(slot, f"""
        import ctypes, json, mmap, os
        path, out = {path!r}, {{}}
        libc = ctypes.CDLL(None, use_errno=True)
        fd = os.open(path, os.O_RDONLY)
        try:
            out["nowait"] = os.preadv(fd, [bytearray(4096)], 0, os.RWF_NOWAIT)
        except OSError as exc:
            out["nowait"] = exc.strerror
        vec = (ctypes.c_ubyte * 1)()
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
        mapped = libc.mmap(None, 4096, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if libc.mincore(ctypes.c_void_p(mapped), 4096, vec) == 0:
            out["mincore_resident"] = vec[0] & 1
        else:
            out["mincore"] = os.strerror(ctypes.get_errno())
        stat = (ctypes.c_uint64 * 5)()
        span = (ctypes.c_uint64 * 2)(0, 4096)
        if libc.syscall(451, fd, span, stat, 0) == 0:
            out["cachestat_cached"] = stat[0]
        else:
            out["cachestat"] = os.strerror(ctypes.get_errno())
        libc.madvise(ctypes.c_void_p(mapped), 4096, 21)  # MADV_PAGEOUT
        libc.munmap(ctypes.c_void_p(mapped), 4096)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        print(json.dumps(out))
        """)  # fmt: skip
    out = last_json(result)
    probed = [name for name in ("nowait", "mincore_resident", "cachestat_cached") if isinstance(out.get(name), int)]
    evicted = not _host_cached(path)
    harmed = bool(probed) or evicted or not out
    detail = f"{path}: probes that answered {probed}, evicted {evicted}; code said {out or result.stderr[-300:]}"
    return AttackResult("page_cache_probe", not harmed, detail)


def _host_cached(path: str) -> bool:
    """Whether the first page of `path` is in the page cache, asked without loading it (False when the kernel
    cannot say without blocking)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.preadv(fd, [bytearray(4096)], 0, os.RWF_NOWAIT) > 0
    except OSError:
        return False
    finally:
        os.close(fd)
