"""Attacks on the host's processes and files through calls Landlock does not mediate.

Without root a Landlock slot runs as the trainer's uid, so ownership no longer stands
between the code and the trainer: scheduling and I/O priority of its processes, extended
attributes, modes and times of its files. Under bwrap without root the namespace's pid 1
would be a same-uid process outside the filter. Each attack plants stand-ins on the host (a
process of the trainer's uid, a file and directories it owns) and judges harm there.
"""

from __future__ import annotations

import ctypes
import errno
import os
import resource
import secrets
import stat
import subprocess

from .. import seccomp
from ..slot import SandboxSlot
from .support import AttackResult, Context, last_json, run_code

_LIBC = ctypes.CDLL(None, use_errno=True)
_LIBC.syscall.restype = ctypes.c_long
_IOPRIO_WHO_PROCESS, _IOPRIO_BE_7 = 1, (2 << 13) | 7
_SCHED_IDLE, _SCHED_BATCH = 5, 3
_NO_SUCH_PID = 0x7FFFFFF0  # above any pid_max: a call that reaches the kernel answers ESRCH
_NO_SUCH_UID = 0x7FFFFFF0  # owns no process: ESRCH again

_PRIORITY_CODE = """
import ctypes, json, os, resource, struct
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
L, NR, T = ctypes.c_long, {nr!r}, {targets!r}
def sys_call(*args):
    return "OK" if libc.syscall(*[L(a) if isinstance(a, int) else a for a in args]) >= 0 else ctypes.get_errno()
def attr(policy, nice):  # struct sched_attr, first version (48 bytes)
    return ctypes.create_string_buffer(struct.pack("IIQiIQQQ", 48, policy, 0, nice, 0, 0, 0, 0), 48)
def py(call, *args):
    try:
        call(*args)
        return "OK"
    except OSError as exc:
        return exc.errno
param = os.sched_param(0)
calls = {{
    "setpriority_process": lambda pid: py(os.setpriority, os.PRIO_PROCESS, pid, 19),
    "setpriority_pgrp": lambda pid: py(os.setpriority, os.PRIO_PGRP, pid, 19),
    "sched_setaffinity": lambda pid: py(os.sched_setaffinity, pid, {{min(os.sched_getaffinity(0))}}),
    "sched_setscheduler": lambda pid: py(os.sched_setscheduler, pid, {idle}, param),
    "sched_setattr": lambda pid: sys_call(NR["sched_setattr"], pid, attr({batch}, 19), 0),
    "sched_setparam": lambda pid: py(os.sched_setparam, pid, param),
    "ioprio_process": lambda pid: sys_call(NR["ioprio_set"], 1, pid, {ioprio}),
    "ioprio_pgrp": lambda pid: sys_call(NR["ioprio_set"], 2, pid, {ioprio}),
    "prlimit": lambda pid: py(resource.prlimit, pid, resource.RLIMIT_NOFILE, (16, 16)),
}}
out = {{"effect": {{}}, "reached": {{}}}}
for label, pid in T.items():  # each on a process of the trainer's uid of its own
    out["effect"][label] = calls[label](pid)
for label, call in calls.items():  # aimed at no process: an answer but EPERM means the kernel ran it
    out["reached"][label] = call({no_pid})
out["reached"]["setpriority_user"] = py(os.setpriority, os.PRIO_USER, {no_uid}, 19)
out["reached"]["ioprio_user"] = sys_call(NR["ioprio_set"], 3, {no_uid}, {ioprio})
print(json.dumps(out))
"""


def _ioprio(pid: int) -> int:
    return _LIBC.syscall(ctypes.c_long(_nr()["ioprio_get"]), ctypes.c_long(_IOPRIO_WHO_PROCESS), ctypes.c_long(pid))


def _nr() -> dict[str, int]:
    table = seccomp._NR[seccomp.machine()]
    # ioprio_get is ioprio_set + 1 on every architecture the filter knows
    return {"ioprio_set": table["ioprio_set"], "ioprio_get": table["ioprio_set"] + 1, **table["own_pid"]}


def _sched_state(pid: int) -> dict[str, object]:
    return {
        "nice": os.getpriority(os.PRIO_PROCESS, pid),
        "affinity": sorted(os.sched_getaffinity(pid)),
        "policy": os.sched_getscheduler(pid),
        "ioprio": _ioprio(pid),
        "nofile": resource.prlimit(pid, resource.RLIMIT_NOFILE),
    }


def other_process_priority(ctx: Context, slot: SandboxSlot) -> AttackResult:
    """Renice, pin, idle and re-limit processes of the trainer's uid (stand-ins for the trainer and the launcher).

    Each call gets a `sleep` of its own (a session leader, so its group is itself alone) and
    the host compares its niceness, affinity, policy, I/O priority and open-file limit before
    and after. Every call is also aimed at a pid and a uid with no process: an answer other
    than the filter's EPERM means the kernel ran a call on another process (the uid-wide forms
    cannot be tried on a real target without reaching the trainer itself).
    """
    labels = ["setpriority_process", "setpriority_pgrp", "sched_setaffinity", "sched_setscheduler",
              "sched_setattr", "ioprio_process", "ioprio_pgrp", "prlimit"]  # fmt: skip
    decoys = {label: subprocess.Popen(["sleep", "60"], start_new_session=True) for label in labels}
    try:
        before = {label: _sched_state(proc.pid) for label, proc in decoys.items()}
        code = _PRIORITY_CODE.format(
            nr=_nr(), targets={label: proc.pid for label, proc in decoys.items()}, idle=_SCHED_IDLE,
            batch=_SCHED_BATCH, ioprio=_IOPRIO_BE_7, no_pid=_NO_SUCH_PID, no_uid=_NO_SUCH_UID,
        )  # fmt: skip
        result = run_code(slot, code, timeout=20)
        after = {label: _sched_state(proc.pid) for label, proc in decoys.items()}
    finally:
        for proc in decoys.values():
            proc.kill()
            proc.wait()
    changed = {label: [k for k in before[label] if before[label][k] != after[label][k]] for label in labels}
    out = last_json(result)
    harmed = [f"{label} changed {what}" for label, what in changed.items() if what]
    harmed += [f"{label} reached the kernel" for label, answer in out.get("reached", {}).items()
               if answer != errno.EPERM]  # fmt: skip
    detail = f"harmed: {harmed} effect={out.get('effect') or result.stderr[-300:]}"
    return AttackResult("other_process_priority", bool(out) and not harmed, detail[:600])


# The start of the attacks' code: `py(label, call, ...)` records "OK" or the errno of each call in `out`.
_RECORDED_CALLS = """
import ctypes, json, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
out = {{}}
def py(label, call, *args, **kwargs):
    try:
        call(*args, **kwargs)
        out[label] = "OK"
    except OSError as exc:
        out[label] = exc.errno
"""
_XATTR_WRITE = (
    _RECORDED_CALLS
    + """import struct
py("setxattr", os.setxattr, {path!r}, "user.agrpo_msg", {token!r})
py("lsetxattr", os.setxattr, {path!r}, "user.agrpo_msg", {token!r}, follow_symlinks=False)
py("removexattr", os.removexattr, {path!r}, "user.agrpo_keep")
open("mine", "w").close()
py("own_file", os.setxattr, "mine", "user.agrpo_msg", {token!r})
# setxattrat(AT_FDCWD, path, 0, name, &{{value, size, flags}}, 16): the newest form, where the kernel has it
value = ctypes.create_string_buffer({token!r})
args = ctypes.create_string_buffer(struct.pack("QII", ctypes.addressof(value), len({token!r}), 0), 16)
r = libc.syscall(ctypes.c_long({setxattrat}), ctypes.c_long(-100), {path!r}.encode(), ctypes.c_long(0),
                 b"user.agrpo_at", args, ctypes.c_long(16))
out["setxattrat"] = "OK" if r >= 0 else ctypes.get_errno()
print(json.dumps(out))
"""
)
_XATTR_READ = """
import json, os
try:
    print(json.dumps({{"read": os.getxattr({path!r}, "user.agrpo_msg").decode()}}))
except OSError as exc:
    print(json.dumps({{"read": exc.errno}}))
"""


def xattr_carryover(ctx: Context, slot: SandboxSlot) -> AttackResult:
    """Write a message into an extended attribute of a file every uid may write (a trainer's 0666 file in a
    0777 directory), remove the host's own attribute, and read the message back from the next slot."""
    path = ctx.decoy_dir / f"xattr-{secrets.token_hex(4)}"
    path.write_text("original")
    path.chmod(0o666)  # only the sandbox stands between the code and the file's attributes
    try:
        os.setxattr(path, "user.agrpo_keep", b"host")
    except OSError as exc:
        path.unlink()
        return AttackResult("xattr_carryover", True, str(exc), skipped=f"no user xattrs here: {exc.strerror}")
    token = secrets.token_hex(8).encode()
    setxattrat = seccomp._NR[seccomp.machine()]["xattr"]["setxattrat"]
    try:
        first = run_code(slot, _XATTR_WRITE.format(path=str(path), token=token, setxattrat=setxattrat))
        ctx.pool.release(slot)
        with ctx.pool.acquire() as second_slot:
            second = run_code(second_slot, _XATTR_READ.format(path=str(path)))
        names = set(os.listxattr(path))
    finally:
        path.unlink()
    out, read = last_json(first), last_json(second)
    harmed = [
        *([f"host sees {sorted(names - {'user.agrpo_keep'})}"] if names - {"user.agrpo_keep"} else []),
        *(["removed the host's attribute"] if "user.agrpo_keep" not in names else []),
        *(["the next slot read the message"] if read.get("read") == token.decode() else []),
    ]
    detail = f"harmed: {harmed} first={out or first.stderr[-200:]} next={read}"
    return AttackResult("xattr_carryover", bool(out) and not harmed, detail[:600])


_METADATA_CODE = (
    _RECORDED_CALLS
    + """py("chmod_pool", os.chmod, {pool!r}, 0)
py("chmod_dir", os.chmod, {directory!r}, 0o700)
py("chmod_file", os.chmod, {path!r}, 0o777)
py("utime_file", os.utime, {path!r}, (0, 0))
py("touch_file", os.utime, {path!r}, None)
py("chown_file", os.chown, {path!r}, -1, os.getgid())
r = libc.syscall(ctypes.c_long({fchmodat2}), ctypes.c_long(-100), {pool!r}.encode(), ctypes.c_long(0), ctypes.c_long(0))
out["fchmodat2_pool"] = "OK" if r >= 0 else ctypes.get_errno()
try:  # through a descriptor, where Landlock lets the code open the file at all
    fd = os.open({path!r}, os.O_RDONLY)
    py("fchmod_file", os.fchmod, fd, 0o777)
except OSError as exc:
    out["open_file"] = exc.errno
open("mine", "w").close()
py("chmod_own_file", os.chmod, "mine", 0o700)
print(json.dumps(out))
"""
)


def metadata_outside(ctx: Context, slot: SandboxSlot) -> AttackResult:
    """chmod the pool directory to 000 (every later slot fails to start), and change the mode, times and group of
    a trainer's 0644 file: calls Landlock does not mediate, which only ownership or the filter can stop."""
    path = ctx.decoy_dir / f"meta-{secrets.token_hex(4)}"
    path.write_text("original")
    path.chmod(0o644)
    os.utime(path, (1_000_000_000, 1_000_000_000))
    watched = {p: _meta(p) for p in (ctx.pool.root, ctx.decoy_dir, path)}
    fchmodat2 = seccomp._NR[seccomp.machine()]["metadata"]["fchmodat2"]
    try:
        code = _METADATA_CODE.format(pool=str(ctx.pool.root), directory=str(ctx.decoy_dir), path=str(path),
                                     fchmodat2=fchmodat2)  # fmt: skip
        result = run_code(slot, code)
        changed = {str(p): (before, _meta(p)) for p, before in watched.items() if _meta(p) != before}
    finally:
        for p, (mode, *_rest) in watched.items():  # put back what the code changed: the context lives on
            os.chmod(p, mode)
        path.unlink()
    out = last_json(result)
    harmed = [f"{p}: {before} -> {now}" for p, (before, now) in changed.items()]
    detail = f"harmed: {harmed} code said {out or result.stderr[-300:]}"
    return AttackResult("metadata_outside", bool(out) and not harmed, detail[:600])


def _meta(path: os.PathLike) -> tuple[int, int, int, int]:
    info = os.lstat(path)
    return stat.S_IMODE(info.st_mode), info.st_mtime_ns, info.st_uid, info.st_gid


_PTRACE_CODE = """
import ctypes, json, os
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.restype = ctypes.c_long
libc.process_vm_readv.restype = ctypes.c_ssize_t
out = {"self": os.getpid()}

def bounds(pid):  # the seccomp mode and the limits a process runs under
    try:
        with open(f"/proc/{pid}/status") as f:
            mode = next(line.split()[1] for line in f if line.startswith("Seccomp:"))
        with open(f"/proc/{pid}/limits") as f:
            return [mode, f.read()]
    except (OSError, StopIteration):
        return None

for pid in sorted({1, os.getppid()} - {0, os.getpid()}):
    try:
        with open(f"/proc/{pid}/comm") as f:
            out[f"{pid} is"] = f.read().strip()
    except OSError as exc:
        out[f"{pid} is"] = exc.errno
    out[f"{pid} bounded as the code"] = bounds(pid) == bounds("self")
    if libc.ptrace(ctypes.c_long(16), ctypes.c_long(pid), None, None) == 0:  # PTRACE_ATTACH
        out[f"attach {pid}"] = "OK"
        os.waitpid(pid, 0)
        libc.ptrace(ctypes.c_long(17), ctypes.c_long(pid), None, None)  # PTRACE_DETACH
    else:
        out[f"attach {pid}"] = ctypes.get_errno()
    try:
        open(f"/proc/{pid}/mem", "r+b").close()
        out[f"mem {pid}"] = "OK"
    except OSError as exc:
        out[f"mem {pid}"] = exc.errno
    buf = ctypes.create_string_buffer(8)
    local = (ctypes.c_void_p * 2)(ctypes.addressof(buf), 8)
    remote = (ctypes.c_void_p * 2)(0x400000, 8)  # any address: permission is checked first
    r = libc.process_vm_readv(pid, local, 1, remote, 1, 0)
    out[f"vm_readv {pid}"] = "OK" if r >= 0 else ctypes.get_errno()
print(json.dumps(out))
"""


def ptrace_init(ctx: Context, slot: SandboxSlot) -> AttackResult:
    """Attach to pid 1 of the slot's view and to the code's parent, open their /proc/PID/mem for writing, read
    their memory: under bwrap without root a bwrap init there would keep the trainer's limits and no filter.
    Harm is reaching a process that runs with fewer bounds than the code (another seccomp mode or other limits):
    the shell that is pid 1 of a slot without root runs under the code's own filter and limits, so what the
    code makes it do it could do itself.

    EFAULT from process_vm_readv means the permission check passed (the address was just unmapped).
    """
    result = run_code(slot, _PTRACE_CODE)
    out = last_json(result)
    harmed = [k for k, v in out.items() if k.split()[0] in ("attach", "mem", "vm_readv")
              and (v == "OK" or v == errno.EFAULT) and not out.get(f"{k.split()[1]} bounded as the code")]  # fmt: skip
    detail = f"harmed: {harmed} code said {out or result.stderr[-300:]}"
    return AttackResult("ptrace_init", bool(out) and not harmed, detail[:600])
