"""Attacks through IPC the host shares: SysV shared memory and queues, POSIX queues, unix sockets.

The host plants a 0644 segment, listening sockets in a 0700 directory, a world-writable
datagram socket (like /dev/log) and abstract socket names of its own; harm is judged on the
host: did the secret leak, did something connect or arrive, did an object outlive the slot,
could the host still bind its own socket name.
"""

from __future__ import annotations

import ctypes
import os
import secrets
import shutil
import socket
import tempfile
import threading
from pathlib import Path

from ..reclaim import ipc_objects
from ..slot import SandboxSlot
from .support import AttackResult, Context, last_json, run_code

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


def _host_sockets(
    listen_path: str, kind: int, dgram_path: str
) -> tuple[socket.socket, socket.socket, list[bool], threading.Event, threading.Thread]:
    """A host listener of `kind` (accepting one connection in a thread until `done` is set: `accepted` gets
    whether one came) and a host datagram socket, both 0777 so that only the directory and the sandbox stand
    in the way; returns (listener, datagram socket, accepted, done, thread)."""
    listener = socket.socket(socket.AF_UNIX, kind)
    listener.bind(listen_path)
    listener.listen(4)
    listener.settimeout(0.5)
    dgram = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    dgram.bind(dgram_path)
    dgram.settimeout(0.2)
    for path in (listen_path, dgram_path):
        os.chmod(path, 0o777)
    accepted: list[bool] = []
    done = threading.Event()
    thread = threading.Thread(target=lambda: accepted.append(_accept_one(listener, done)))
    thread.start()
    return listener, dgram, accepted, done, thread


def unix_socket_by_path(ctx: Context, slot: SandboxSlot) -> AttackResult:
    """Host sockets (stream and datagram) in a 0700 directory of the trainer's uid: connect, send, list, stat."""
    directory = tempfile.mkdtemp(prefix="agentic-grpo-private-")  # 0700, the trainer's
    name = f"secret-{secrets.token_hex(4)}"
    stream_path, dgram_path = os.path.join(directory, name), os.path.join(directory, "dgram")
    stream, dgram, accepted, done, thread = _host_sockets(stream_path, socket.SOCK_STREAM, dgram_path)
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


def unix_socket_types(ctx: Context, slot: SandboxSlot) -> AttackResult:
    """Every unix socket type against host sockets any uid may use (a 0777 socket in a 0711 directory).

    SOCK_RAW is a datagram socket to the kernel, and a datagram socketpair sendto()s any address
    too: each tries the host's datagram socket; SOCK_SEQPACKET tries the host's seqpacket listener.
    """
    directory = tempfile.mkdtemp(prefix="agentic-grpo-unix-")
    os.chmod(directory, 0o711)  # searchable, not listable: only the sandbox stands in the way
    dgram_path, seq_path = os.path.join(directory, "dgram"), os.path.join(directory, "seqpacket")
    seq, dgram, accepted, done, thread = _host_sockets(seq_path, socket.SOCK_SEQPACKET, dgram_path)
    try:
        result = run_code(slot, f"""
            import json, socket
            out = {{}}
            NB = getattr(socket, "SOCK_NONBLOCK", 0)
            tries = (("raw", socket.SOCK_RAW), ("raw_nonblock", socket.SOCK_RAW | NB), ("dgram", socket.SOCK_DGRAM))
            for label, kind in tries:
                try:
                    socket.socket(socket.AF_UNIX, kind).sendto(label.encode(), {dgram_path!r})
                    out[label] = "SENT"
                except OSError as exc:
                    out[label] = exc.errno
            for label, kind in (("pair_raw", socket.SOCK_RAW), ("pair_dgram", socket.SOCK_DGRAM)):
                try:
                    socket.socketpair(socket.AF_UNIX, kind)[0].sendto(label.encode(), {dgram_path!r})
                    out[label] = "SENT"
                except OSError as exc:
                    out[label] = exc.errno
            try:
                s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET); s.settimeout(1); s.connect({seq_path!r})
                s.send(b"seqpacket")
                out["seqpacket"] = "CONNECTED"
            except OSError as exc:
                out["seqpacket"] = exc.errno
            print(json.dumps(out))
            """)  # fmt: skip
        done.set()
        thread.join()
        received = []
        while True:
            try:
                received.append(dgram.recv(64).decode(errors="replace"))
            except OSError:
                break
    finally:
        dgram.close()
        seq.close()
        shutil.rmtree(directory, ignore_errors=True)
    out = last_json(result)
    harmed = [
        *([f"datagrams delivered: {received}"] if received else []),
        *(["seqpacket connected"] if accepted[0] else []),
    ]
    ran = bool(out)  # a program that never ran proves nothing
    detail = f"harmed: {harmed} {out or result.stderr[-300:]}"
    return AttackResult("unix_socket_types", ran and not harmed, detail[:600])


def unix_abstract_squat(ctx: Context, slot: SandboxSlot) -> AttackResult:
    """Take a host service's abstract socket name first: the service cannot bind, its clients reach the slot.

    Abstract names belong to the network namespace, so only where the slot shares the host's
    (the Landlock layer) could a bind squat one. The slot binds two names (a listening socket
    and one end of a socketpair) and says so in a file; the host then binds and connects.
    """
    names = [f"\0agentic-grpo-squat-{secrets.token_hex(6)}".encode() for _ in range(2)]
    for name in names:
        try:
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            probe.bind(name)  # the host itself can use abstract names here, before the slot tries
            probe.close()
        except OSError as exc:
            return AttackResult(
                "unix_abstract_squat", True, str(exc), skipped=f"host cannot bind abstract names: {exc}"
            )
    marker = slot.workspace / f"squat-{secrets.token_hex(4)}"
    host: dict[str, str] = {}
    done = threading.Event()
    thread = threading.Thread(target=_host_service, args=(names, marker, done, host))
    thread.start()
    try:
        result = run_code(slot, f"""
            import json, os, socket, struct, time
            out, keep = {{}}, []
            for label, name in (("listen", {names[0]!r}), ("pair", {names[1]!r})):
                try:
                    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) if label == "listen" else socket.socketpair()[0]
                    s.bind(name)
                    if label == "listen":
                        s.listen(4)
                        s.settimeout(0.05)
                    keep.append((label, s))
                    out[label] = "BOUND"
                except OSError as exc:
                    out[label] = exc.errno
            with open({marker.name!r}, "w") as f:
                f.write("ready")
            deadline = time.monotonic() + 5
            while keep and time.monotonic() < deadline and not os.path.exists({marker.name + ".done"!r}):
                if keep[0][0] != "listen":
                    time.sleep(0.05)
                    continue
                try:  # what a squatter learns of the host's client
                    conn, _ = keep[0][1].accept()
                    pid, uid, gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
                    out["accepted"] = {{"pid": pid, "uid": uid}}
                except OSError:
                    pass
            print(json.dumps(out))
            """, timeout=20)  # fmt: skip
    finally:
        done.set()
        thread.join()
    out = last_json(result)
    harmed = [f"{what}: {how}" for what, how in host.items() if how != "ok"]
    ran = bool(out) and len(host) == 4  # the program ran and the host tried every name
    detail = f"harmed: {harmed} slot said {out or result.stderr[-300:]} host={host}"
    return AttackResult("unix_abstract_squat", ran and not harmed, detail[:600])


def _host_service(names: list[bytes], marker: Path, done: threading.Event, host: dict[str, str]) -> None:
    """Once the slot wrote `marker`: bind each name as a host service would, connect as its client would.

    The slot holds its sockets until `marker`.done appears (or a few seconds pass).
    """
    while not marker.exists() and not done.wait(0.05):
        pass
    if not marker.exists():
        return  # the program never got that far: nothing was tried
    for index, name in enumerate(names):
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            server.bind(name)
            host[f"host bind {index}"] = "ok"
        except OSError as exc:
            host[f"host bind {index}"] = f"failed: {exc.strerror}"
        finally:
            server.close()
        client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        client.settimeout(2)
        try:
            client.connect(name)
            host[f"host client {index}"] = "reached the slot"
        except OSError:
            host[f"host client {index}"] = "ok"  # nobody listens under the name: the client is safe
        finally:
            client.close()
    marker.with_name(marker.name + ".done").write_text("done")


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
