"""Attacks on limits outside RLIMIT_AS and argv: kernel buffers one process can fill, code too long for one argument,
what the whole host shares (async I/O contexts, pinned pipe pages, pseudo-terminals).

Socket and pipe buffers are kernel memory: the address-space limit never sees them, and
without root there is no memory cgroup to charge them to. What bounds them is the number of
descriptors a process may hold (in its table and in flight inside unix sockets) times the
size of each buffer, which the filter keeps at the host's default.
"""

from __future__ import annotations

from .. import seccomp
from ..slot import SandboxSlot
from .support import AttackResult, Context, last_json, run_code

_BUFFERS_CODE = """
import array, fcntl, json, os, socket, struct
TIOCOUTQ, F_SETPIPE_SZ = 0x5411, 1031
target = {target_mb} << 20
out = {{"socket_mb": 0, "pipe_mb": 0, "items": 0, "in_flight": 0}}
held = {{"socket": 0, "pipe": 0}}
chunk = b"x" * 65536

def fill(write):
    n = 0
    while True:
        try:
            n += write(chunk)
        except (BlockingIOError, InterruptedError):
            return n

def make(kind):
    if kind == "pipe":
        r, w = os.pipe()
        try:
            fcntl.fcntl(w, F_SETPIPE_SZ, 1 << 20)
        except OSError as exc:
            out["set_pipe_size"] = exc.errno
        os.set_blocking(w, False)
        return [r, w], fill(lambda data: os.write(w, data))
    a, b = socket.socketpair()
    queued = 0
    for s in (a, b):
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 30)  # the kernel caps it at twice wmem_max
        s.setblocking(False)
        fill(s.send)
        queued += struct.unpack("i", fcntl.ioctl(s.fileno(), TIOCOUTQ, bytes(4)))[0]  # bytes charged to s
    out["sndbuf"] = a.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
    return [a.detach(), b.detach()], queued

carrier, passing = socket.socketpair(), True
try:
    while sum(held.values()) < target:
        kind = "pipe" if out["items"] % 2 else "socket"
        fds, size = make(kind)
        held[kind] += size
        out["items"] += 1
        while passing:  # in flight inside a unix socket: out of the table, buffers still held
            try:
                rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))]
                carrier[0].sendmsg([b"x"], rights, socket.MSG_DONTWAIT)
                for fd in fds:
                    os.close(fd)
                out["in_flight"] += len(fds)
                break
            except BlockingIOError:
                carrier = socket.socketpair()  # this one is full: the old one stays open
            except OSError as exc:
                out["passing_stopped"] = str(exc)
                passing = False
        out["socket_mb"], out["pipe_mb"] = held["socket"] >> 20, held["pipe"] >> 20
        if out["items"] % 32 == 0:
            print(json.dumps(out), flush=True)
except OSError as exc:
    out["stopped"] = str(exc)
print(json.dumps(out), flush=True)
"""


def kernel_buffer_memory(ctx: Context, slot: SandboxSlot) -> AttackResult:
    """One process fills socketpairs (SO_SNDBUF raised) and pipes (F_SETPIPE_SZ raised), keeping some in flight
    inside a unix socket to hold more than its descriptor table: harm is more than `memory_mb` of buffers.

    The process reports what the kernel charged each socket (SIOCOUTQ) and what it wrote into
    each pipe; it stops at memory_mb + 128 MB. Where a memory cgroup charges the buffers it may
    be killed first, which is the bound working.
    """
    limit = ctx.pool.config.memory_mb
    result = run_code(slot, _BUFFERS_CODE.format(target_mb=limit + 128), timeout=60)
    out = last_json(result)
    held = out.get("socket_mb", 0) + out.get("pipe_mb", 0)
    detail = f"held {held} MB of kernel buffers in one process (limit {limit} MB), exit={result.exit_code}: {out or result.stderr[-300:]}"
    return AttackResult("kernel_buffer_memory", bool(out) and held < limit, detail[:600])


def big_code(ctx: Context, slot: SandboxSlot) -> AttackResult:
    """Code of 200 kB, and code of 90 kB whose JSON form passes the kernel's 128 KiB per argument: both must run.

    The first goes through a file in the workspace, the second on the command line; a layer
    that packs the command into one JSON argument fails the second with "Argument list too long".
    """
    cases = {
        "200 kB": ("x = 0\n" + "x += 1\n" * 29_000 + "print('result', x)\n", "result 29000"),
        "escapes": ("s = '" + "\u00e9" * 45_000 + "'\nprint('result', len(s))\n", "result 45000"),
    }
    failed = {}
    for label, (code, expected) in cases.items():
        result = slot.run_python(code, timeout=30)
        if result.exit_code != 0 or result.stdout.strip() != expected:
            failed[label] = f"exit={result.exit_code} {(result.stdout + result.stderr).strip()[-200:]}"
    sizes = {label: len(code.encode()) for label, (code, _) in cases.items()}
    return AttackResult("big_code", not failed, f"bytes={sizes} failed={failed}")


_HOST_WIDE_CODE = """
import ctypes, json, os
libc = ctypes.CDLL(None, use_errno=True)
out = {}
contexts = []
for _ in range(64):  # io_setup: async I/O contexts come from one host-wide pool (fs.aio-max-nr)
    ctx = ctypes.c_ulong(0)
    if libc.syscall({io_setup}, 4096, ctypes.byref(ctx)) != 0:
        out["io_setup"] = ctypes.get_errno()
        break
    contexts.append(ctx)
out["aio_contexts"] = len(contexts)
r, w = os.pipe()  # vmsplice: pages pinned in a pipe are memory RLIMIT_AS never counts
page = ctypes.create_string_buffer(4096)
iov = (ctypes.c_void_p * 2)(ctypes.addressof(page), 4096)
spliced = libc.syscall({vmsplice}, w, iov, 1, 0)
out["vmsplice"] = "OK" if spliced >= 0 else ctypes.get_errno()
try:  # pseudo-terminals: one host-wide count (kernel.pty.max), shared with every other pty instance
    master, _ = os.openpty()
    out["pty"] = "OK"
except OSError as exc:
    out["pty"] = exc.errno
print(json.dumps(out))
"""


def host_wide_resources(ctx: Context, slot: SandboxSlot) -> AttackResult:
    """Take from what the whole host shares with no per-slot bound: async I/O contexts (the host's own io_setup
    then fails with EAGAIN), pages pinned in pipes (1.5 GB past a 256 MB address-space limit), pseudo-terminals
    (another slot's openpty then fails). Harm: any of the three granted."""
    if not seccomp.supported():
        return AttackResult(
            "host_wide_resources", True, "not run", skipped=f"no syscall numbers for {seccomp.machine()}"
        )
    numbers = seccomp._NR[seccomp.machine()]["deny"]  # the filter's own table, as the kernel attacks read it
    code = _HOST_WIDE_CODE.replace("{io_setup}", str(numbers["io_setup"])).replace(
        "{vmsplice}", str(numbers["vmsplice"])
    )
    result = run_code(slot, code)
    out = last_json(result)
    harmed = [k for k in ("vmsplice", "pty") if out.get(k) == "OK"] + (["io_setup"] if out.get("aio_contexts") else [])
    detail = f"harmed: {harmed} code said {out or result.stderr[-300:]}"
    return AttackResult("host_wide_resources", bool(out) and not harmed, detail[:600])
