"""Attacks through IPC the host shares: SysV shared memory and queues, POSIX queues, unix sockets by path.

The host plants a 0644 segment and listening sockets in a 0700 directory; harm is judged on
the host: did the secret leak, did something connect, did an object outlive the slot.
"""

from __future__ import annotations

import ctypes
import os
import secrets
import shutil
import socket
import tempfile
import threading

from .attack_support import AttackResult, Context, last_json, run_code
from .reclaim import ipc_objects
from .slot import SandboxSlot

_LIBC = ctypes.CDLL(None, use_errno=True)
_LIBC.shmat.restype = ctypes.c_void_p
_LIBC.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
_IPC_CREAT, _IPC_RMID = 0o1000, 0

_IPC_CODE = """
import ctypes, json, os, struct
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
def err(r):
    return r if r not in (-1, None, ctypes.c_void_p(-1).value) else -ctypes.get_errno()
out = {{}}
host = libc.shmget({host_key}, 0, 0)
out["host_shmget"] = err(host)
if host >= 0:
    addr = libc.shmat(host, None, 0o10000)
    if addr and addr != ctypes.c_void_p(-1).value:
        out["host_read"] = ctypes.string_at(addr, 64).decode(errors="replace")
if {leave}:
    seg = libc.shmget({key}, 4 << 20, 0o1000 | 0o666)
    out["shmget"] = err(seg)
    if seg >= 0:
        addr = libc.shmat(seg, None, 0)
        if addr and addr != ctypes.c_void_p(-1).value:
            ctypes.memmove(addr, {token!r}, len({token!r}))
            libc.shmdt(ctypes.c_void_p(addr))
    q = libc.msgget({key}, 0o1000 | 0o666)
    out["msgget"] = err(q)
    if q >= 0:
        msg = struct.pack("l64s", 1, {token!r})
        out["msgsnd"] = err(libc.msgsnd(q, msg, 64, 0o4000))
    mq = libc.mq_open({mq_name!r}, os.O_CREAT | os.O_RDWR, 0o666, None)
    out["mq_open"] = err(mq)
else:
    seg = libc.shmget({key}, 0, 0)
    out["find_shm"] = err(seg)
    if seg >= 0:
        addr = libc.shmat(seg, None, 0o10000)
        if addr and addr != ctypes.c_void_p(-1).value:
            out["found"] = ctypes.string_at(addr, 16).decode(errors="replace")
    q = libc.msgget({key}, 0)
    out["find_msg"] = err(q)
    if q >= 0:
        buf = ctypes.create_string_buffer(72)
        if libc.msgrcv(q, buf, 64, 0, 0o4000) >= 0:
            out["found_msg"] = buf.raw[8:24].decode(errors="replace")
    out["find_mq"] = err(libc.mq_open({mq_name!r}, os.O_RDONLY, 0, None))
print(json.dumps(out))
"""


def _ipc_code(host_key: int, key: int, token: bytes, mq_name: bytes, leave: bool) -> str:
    return _IPC_CODE.format(host_key=host_key, key=key, token=token, mq_name=mq_name, leave=leave)


def _ipc_ids_with_key(key: int) -> dict[str, list[int]]:
    found: dict[str, list[int]] = {}
    for kind in ("shm", "msg", "sem"):
        try:
            with open(f"/proc/sysvipc/{kind}") as f:
                f.readline()
                for line in f:
                    parts = line.split()
                    if int(parts[0]) == key:
                        found.setdefault(kind, []).append(int(parts[1]))
        except OSError:
            pass
    return found


def _remove_ipc(found: dict[str, list[int]]) -> None:
    for kind, ids in found.items():
        for ident in ids:
            if kind == "shm":
                _LIBC.shmctl(ident, _IPC_RMID, None)
            elif kind == "msg":
                _LIBC.msgctl(ident, _IPC_RMID, None)
            else:
                _LIBC.semctl(ident, 0, _IPC_RMID, None)


def sysv_ipc(ctx: Context, slot: SandboxSlot) -> AttackResult:
    """Read a host 0644 segment; leave a segment, a queue and a POSIX queue for the next slot."""
    host_key, key = 0x41000000 + secrets.randbelow(1 << 20), 0x42000000 + secrets.randbelow(1 << 20)
    token = secrets.token_hex(8).encode()
    mq_name = f"/agrpo-{secrets.token_hex(4)}".encode()
    host_seg = _LIBC.shmget(host_key, 4096, _IPC_CREAT | 0o644)
    if host_seg >= 0:
        addr = _LIBC.shmat(host_seg, None, 0)
        ctypes.memmove(addr, ctx.secret.encode(), len(ctx.secret))
        _LIBC.shmdt(ctypes.c_void_p(addr))
    try:
        first = run_code(slot, _ipc_code(host_key, key, token, mq_name, True))
        uid = slot.uid
        ctx.pool.release(slot)
        leftover = _ipc_ids_with_key(key)
        left_by_uid = ipc_objects(uid) if uid is not None else {}
        mq_left = _LIBC.mq_open(mq_name, os.O_RDONLY, 0, None)
        if mq_left >= 0:
            os.close(mq_left)
        second_slot = ctx.pool.acquire()
        try:
            second = run_code(second_slot, _ipc_code(host_key, key, token, mq_name, False))
        finally:
            ctx.pool.release(second_slot)
    finally:
        _remove_ipc(_ipc_ids_with_key(key))
        _remove_ipc(_ipc_ids_with_key(host_key))
        _LIBC.mq_unlink(mq_name)
    seen = first.stdout + second.stdout
    harmed = [
        *(["read the host segment"] if ctx.secret in seen else []),
        *([f"objects outlived the slot: {leftover or left_by_uid}"] if leftover or left_by_uid else []),
        *(["a POSIX queue outlived the slot"] if mq_left >= 0 else []),
        *(["the next slot found the data"] if token.decode() in second.stdout else []),
    ]
    detail = f"harmed: {harmed} first={last_json(first)} second={last_json(second)}"
    return AttackResult("sysv_ipc", not harmed, detail[:600])


def unix_socket_by_path(ctx: Context, slot: SandboxSlot) -> AttackResult:
    """Host sockets (stream and datagram) in a 0700 directory of the trainer's uid: connect, send, list, stat."""
    directory = tempfile.mkdtemp(prefix="agentic-grpo-private-")  # 0700, the trainer's
    name = f"secret-{secrets.token_hex(4)}"
    stream_path, dgram_path = os.path.join(directory, name), os.path.join(directory, "dgram")
    stream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stream.bind(stream_path)
    stream.listen(4)
    stream.settimeout(0.5)
    dgram = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    dgram.bind(dgram_path)
    dgram.settimeout(0.2)
    for path in (stream_path, dgram_path):
        os.chmod(path, 0o777)  # only the directory's mode stands in the way
    accepted: list[bool] = []
    done = threading.Event()
    thread = threading.Thread(target=lambda: accepted.append(_accept_one(stream, done)))
    thread.start()
    try:
        result = run_code(slot, f"""
            import json, os, socket
            out = {{}}
            try:
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); s.settimeout(1); s.connect({stream_path!r})
                out["connect"] = "CONNECTED"
            except OSError as exc:
                out["connect"] = exc.errno
            try:
                d = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM); d.sendto(b"x", {dgram_path!r})
                out["sendto"] = "SENT"
            except OSError as exc:
                out["sendto"] = exc.errno
            try:
                out["list"] = os.listdir({directory!r})
            except OSError as exc:
                out["list"] = exc.errno
            try:
                os.stat({stream_path!r})
                out["stat"] = "STAT"
            except OSError as exc:
                out["stat"] = exc.errno
            print(json.dumps(out))
            """)  # fmt: skip
        done.set()
        thread.join()
        try:
            received = dgram.recv(10) == b"x"
        except OSError:
            received = False
    finally:
        stream.close()
        dgram.close()
        shutil.rmtree(directory, ignore_errors=True)
    out = last_json(result)
    harmed = [
        *(["connected"] if accepted[0] else []),
        *(["datagram delivered"] if received else []),
        *(["listed the directory"] if name in result.stdout else []),
        # Without a slot uid the code is the trainer's uid: stat of its own files is DAC-allowed.
        *(["stat through a 0700 directory"] if out.get("stat") == "STAT" and slot.uid is not None else []),
    ]
    return AttackResult("unix_socket_by_path", not harmed, f"harmed: {harmed} {out}")


def _accept_one(server: socket.socket, done: threading.Event) -> bool:
    """Whether a connection arrives before `done` is set (the sandboxed call has returned)."""
    while True:
        try:
            conn, _ = server.accept()
            conn.close()
            return True
        except TimeoutError:
            if done.is_set():
                return False
        except OSError:
            return False
