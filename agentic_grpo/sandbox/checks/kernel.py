"""Attacks on kernel state shared with the host: keyrings, vsock's port space, namespaces, io_uring, userfaultfd.

Each plants a decoy on the host (a key in the trainer's session keyring, a listening vsock
port), runs a hostile program in the slot, and judges harm on the host: is the decoy
intact, did something connect, did a key outlive the slot.
"""

from __future__ import annotations

import ctypes
import errno
import secrets
import socket
import threading

from .. import seccomp
from ..slot import SandboxSlot
from .support import AttackResult, Context, last_json, run_code

_LIBC = ctypes.CDLL(None, use_errno=True)
_LIBC.syscall.restype = ctypes.c_long
_LIBC.shmat.restype = ctypes.c_void_p
_LIBC.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
_KEYCTL_JOIN, _KEYCTL_UNLINK, _KEYCTL_SEARCH, _KEYCTL_READ = 1, 9, 10, 11
_SESSION, _USER = -3, -4
_IPC_CREAT, _IPC_RMID = 0o1000, 0
_L = ctypes.c_long

# The hostile side: raw syscalls through ctypes, numbers for this machine passed in.
_KEYS_CODE = """
import ctypes, json
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
NR, L = {nr!r}, ctypes.c_long
def call(name, *args):
    r = libc.syscall(L(NR[name]), *args)
    return r if r >= 0 else -ctypes.get_errno()
def read(key):
    buf = ctypes.create_string_buffer(512)
    n = call("keyctl", L(11), L(key), buf, L(512))
    return buf.raw[:n].decode(errors="replace") if n >= 0 else n
out = {{}}
"""


def _nr() -> dict[str, int]:
    return seccomp._NR[seccomp.machine()]["deny"]


def _keyctl(*args: object) -> int:
    wrapped = [_L(a) if isinstance(a, int) else a for a in args]
    result = _LIBC.syscall(_L(_nr()["keyctl"]), *wrapped)
    return result if result >= 0 else -ctypes.get_errno()


def _keyring_ids(ring: int) -> list[int]:
    buf = ctypes.create_string_buffer(4096)
    n = _keyctl(_KEYCTL_READ, ring, buf, 4096)
    return [int.from_bytes(buf.raw[i : i + 4], "little", signed=True) for i in range(0, max(n, 0), 4)]


def keyring_session(ctx: Context, slot: SandboxSlot) -> AttackResult:
    """The trainer runs in a session keyring holding a key; the code looks for it, reads, plants, unlinks."""
    desc = f"agrpo-decoy-{secrets.token_hex(4)}".encode()
    state: dict = {}

    def in_own_session() -> None:  # session keyrings are per thread: this one, not the trainer's, gets it
        if _keyctl(_KEYCTL_JOIN, None) < 0:
            state["skip"] = f"no keyrings here (errno {ctypes.get_errno()})"
            return
        nr = _nr()
        key = _LIBC.syscall(_L(nr["add_key"]), b"user", desc, ctx.secret.encode(), _L(len(ctx.secret)), _L(_SESSION))
        state["key"] = key
        code = (
            _KEYS_CODE.format(nr=nr)
            + f"""
k = call("request_key", b"user", {desc!r}, None, L(0))
out["request_key"] = k
if k >= 0:
    out["read"] = read(k)
    out["unlink"] = call("keyctl", L(9), L(k), L({_SESSION}))
out["add_key"] = call("add_key", b"user", b"agrpo-planted", b"x", L(1), L({_SESSION}))
print(json.dumps(out))
"""
        )
        state["result"] = run_code(slot, code)
        state["linked"] = _keyring_ids(_SESSION)

    thread = threading.Thread(target=in_own_session)
    thread.start()
    thread.join()
    if "skip" in state:
        return AttackResult("keyring_session", True, state["skip"])
    result, linked = state["result"], state["linked"]
    harmed = [
        *(["read the trainer's key"] if ctx.secret in result.stdout else []),
        *(["unlinked the trainer's key"] if state["key"] not in linked else []),
        *(["added a key to the trainer's keyring"] if len(linked) > 1 else []),
    ]
    return AttackResult("keyring_session", not harmed, f"harmed: {harmed} " + result.stdout.strip()[-300:])


def keyring_user_carryover(ctx: Context, slot: SandboxSlot) -> AttackResult:
    """One call stores a key in its uid's user keyring; the next slot (same uid, reused) looks for it."""
    desc = f"agrpo-carry-{secrets.token_hex(4)}".encode()
    token = secrets.token_hex(8)
    first = run_code(slot, _KEYS_CODE.format(nr=_nr()) + f"""
out["add_key"] = call("add_key", b"user", {desc!r}, {token.encode()!r}, L(16), L({_USER}))
print(json.dumps(out))
""")  # fmt: skip
    uid = slot.uid
    ctx.pool.release(slot)
    second_slot = ctx.pool.acquire()
    try:
        second = run_code(second_slot, _KEYS_CODE.format(nr=_nr()) + f"""
k = call("keyctl", L(10), L({_USER}), b"user", {desc!r}, L(0))
out["search"] = k
if k >= 0:
    out["read"] = read(k)
print(json.dumps(out))
""")  # fmt: skip
        same_uid = second_slot.uid == uid
    finally:
        ctx.pool.release(second_slot)
    # unsafe-local stored it in the trainer's own user keyring: take it out again.
    found = _keyctl(_KEYCTL_SEARCH, _USER, b"user", desc, 0)
    if found >= 0:
        _keyctl(_KEYCTL_UNLINK, found, _USER)
    harmed = token in second.stdout
    detail = f"same uid={same_uid} first={first.stdout.strip()[-120:]} second={second.stdout.strip()[-160:]}"
    return AttackResult("keyring_user_carryover", not harmed, detail)


def vsock_port_space(ctx: Context, slot: SandboxSlot) -> AttackResult:
    """The host holds a vsock port; the code tries to bind the same port and to connect to it."""
    try:
        host = socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)
    except (OSError, AttributeError) as exc:
        return AttackResult("vsock_port_space", True, f"no AF_VSOCK on this host: {exc}")
    try:
        port = 20000 + secrets.randbelow(40000)
        host.bind((socket.VMADDR_CID_ANY, port))
        host.listen(1)
        host.settimeout(0.2)
    except OSError as exc:
        host.close()
        return AttackResult("vsock_port_space", True, f"the host cannot bind vsock: {exc}")
    try:
        result = run_code(slot, f"""
            import json, socket
            out = {{}}
            try:
                s = socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)
                try:
                    s.bind((socket.VMADDR_CID_ANY, {port}))
                    out["bind"] = "BOUND"
                except OSError as exc:
                    out["bind"] = exc.errno
                for cid in (1, 2):
                    c = socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM); c.settimeout(0.5)
                    try:
                        c.connect((cid, {port})); out[f"connect{{cid}}"] = "CONNECTED"
                    except OSError as exc:
                        out[f"connect{{cid}}"] = exc.errno
            except OSError as exc:
                out["socket"] = exc.errno
            print(json.dumps(out))
            """)  # fmt: skip
        try:
            host.accept()[0].close()
            connected = True
        except OSError:
            connected = False
    finally:
        host.close()
    out = last_json(result)
    harmed = [*(["shares the host's port space"] if out.get("bind") == errno.EADDRINUSE else []),
              *(["connected to the host"] if connected else [])]  # fmt: skip
    return AttackResult("vsock_port_space", not harmed and bool(out), f"harmed: {harmed} {out}")


def namespaces_and_uring(ctx: Context, slot: SandboxSlot) -> AttackResult:
    """User namespaces (uid 0 and mounts inside), io_uring and user-mode userfaultfd: surface a tool never needs."""
    nr = _nr()
    result = run_code(slot, f"""
        import ctypes, json, os, shutil, subprocess
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        L = ctypes.c_long
        out = {{}}
        pid = os.fork()
        if pid == 0:  # in a child, so this process keeps its namespaces
            os._exit(0 if libc.unshare(0x10000000) == 0 else 1)
        out["unshare_user"] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
        if shutil.which("unshare"):
            p = subprocess.run(["unshare", "-Urm", "sh", "-c", "id -u && mount -t tmpfs none /tmp && echo MOUNTED"],
                               capture_output=True, text=True)
            out["unshare_cmd"] = p.stdout.split()
        params = ctypes.create_string_buffer(120)
        out["io_uring"] = libc.syscall(L({nr["io_uring_setup"]}), L(4), params) >= 0
        out["userfaultfd"] = libc.syscall(L({nr["userfaultfd"]}), L(0o2000000 | 1)) >= 0
        print(json.dumps(out))
        """)  # fmt: skip
    out = last_json(result)
    harmed = [k for k in ("unshare_user", "io_uring", "userfaultfd") if out.get(k)]
    if "MOUNTED" in out.get("unshare_cmd", []) or "0" in out.get("unshare_cmd", []):
        harmed.append("unshare -Urm: uid 0 and a mount")
    return AttackResult("namespaces_and_uring", not harmed and bool(out), f"harmed: {harmed} {out}")


def host_uevents(ctx: Context, slot: SandboxSlot) -> AttackResult:
    """Listen to the kernel's device events: a network namespace of the host's user namespace (bwrap as root)
    receives the host's, so a bound uevent socket would show what the host plugs, mounts and loads.

    Nothing is triggered on the host: harm is a socket bound to the uevent group at all.
    """
    result = run_code(slot, """
        import json, socket
        out = {}
        try:
            s = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, 15)  # NETLINK_KOBJECT_UEVENT
            s.bind((0, 1))
            out["bound"] = "OK"
        except OSError as exc:
            out["bound"] = exc.errno
        print(json.dumps(out))
        """)  # fmt: skip
    out = last_json(result)
    return AttackResult("host_uevents", bool(out) and out.get("bound") != "OK", f"code said {out or result.stderr}")


def inotify_shared_files(ctx: Context, slot: SandboxSlot) -> AttackResult:
    """Watch the interpreter's standard library, which every slot and the trainer read: each open by a concurrent
    slot would show here (which modules it imports). inotify and fanotify watches are tried.

    Harm is a watch placed on a file outside the workspace (no second slot is needed to show that).
    """
    result = run_code(slot, """
        import ctypes, json, os
        libc = ctypes.CDLL(None, use_errno=True)
        target = os.path.dirname(os.__file__).encode()
        out = {}
        fd = libc.inotify_init1(0)
        if fd < 0:
            out["inotify"] = ctypes.get_errno()
        else:
            out["inotify"] = "OK" if libc.inotify_add_watch(fd, target, 0x20 | 0x1) >= 0 else ctypes.get_errno()
        fd = libc.fanotify_init(0x200, 0)  # FAN_REPORT_FID: the form unprivileged users may create
        if fd < 0:
            out["fanotify"] = ctypes.get_errno()
        else:
            mark = libc.fanotify_mark(fd, 1, ctypes.c_uint64(0x20), -100, target)  # FAN_MARK_ADD, FAN_OPEN
            out["fanotify"] = "OK" if mark >= 0 else ctypes.get_errno()
        print(json.dumps(out))
        """)  # fmt: skip
    out = last_json(result)
    harmed = [k for k, v in out.items() if v == "OK"]
    return AttackResult("inotify_shared_files", bool(out) and not harmed, f"harmed: {harmed} code said {out}")
