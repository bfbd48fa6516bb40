"""The attack suite: hostile programs run against a live pool, each checked for harm from outside.

One list serves both `pytest tests/test_sandbox_attacks.py` and `agentic-grpo sandbox check`,
so what CI proves is exactly what a user verifies on a new cluster. Harm is judged on the
host (did the decoy file change, did the listener get a connection, did the heartbeat of
an orphan keep beating), not only by what the sandboxed code claims. Every attack is
bounded: the fork bomb stops by itself, the allocation is refused at once.

This module holds the registry and the first round's network and process attacks;
`files` its filesystem ones; `kernel`, `ipc` and `resources`
the second round (keyrings, namespaces, IPC, memory, disk, CPU, cleanup); `host` and
`limits` what Landlock does not mediate (other processes' priority and limits, file
metadata, ptrace of pid 1) and limits outside RLIMIT_AS (kernel buffers, long code);
`python` the trainer's packages; `channels` what a slot learns of the host and
of its neighbours (locks, host-wide /proc, `stat`); `lifetime` how a slot's processes end
(a cleared parent-death signal, the trainer's ignored signals) and what other local users reach.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ..pool import SandboxPool
from ..slot import SandboxSlot
from .channels import host_proc_files, lock_side_channel, page_cache_probe, stat_outside
from .files import (
    read_opt_data,
    read_shadow,
    read_sibling,
    read_trainer_environ,
    symlink_escape,
    write_outside,
)
from .host import metadata_outside, other_process_priority, ptrace_init, xattr_carryover
from .ipc import sysv_ipc, unix_abstract_squat, unix_socket_by_path, unix_socket_types
from .kernel import (
    host_uevents,
    inotify_shared_files,
    keyring_session,
    keyring_user_carryover,
    namespaces_and_uring,
    vsock_port_space,
)
from .lifetime import heavy_children, ignored_signals, pdeathsig_cleared, self_kill_status, workspace_open_to_others
from .limits import big_code, host_wide_resources, kernel_buffer_memory
from .python import trainer_environment
from .resources import (
    cpu_share,
    deep_tree_cleanup,
    disk_bandwidth,
    disk_quota,
    launcher_cpu_cleanup,
    launcher_nofile_cleanup,
    memfd_memory,
    readonly_tree_cleanup,
)
from .support import AttackResult, Context, run_code, still_growing, uid_processes


def network_loopback(ctx: Context, slot: SandboxSlot) -> AttackResult:
    before = ctx.connections
    result = run_code(
        slot,
        f"""
        import socket
        for family, kind, send in ((socket.AF_INET, socket.SOCK_STREAM, None), (socket.AF_INET, socket.SOCK_DGRAM, 1)):
            try:
                s = socket.socket(family, kind)
                s.settimeout(2)
                if send:
                    s.sendto(b"x", ("127.0.0.1", {ctx.udp_port}))
                else:
                    s.connect(("127.0.0.1", {ctx.port}))
                print("CONNECTED", kind)
            except OSError as exc:
                print("denied", kind, exc)
        """,
        timeout=10,
    )
    time.sleep(0.3)
    harmed = ctx.connections > before or ctx.udp_received()
    return AttackResult("network_loopback", not harmed, result.stdout.strip() + result.stderr[-300:])


def network_outside(ctx: Context, slot: SandboxSlot) -> AttackResult:
    # Never leaves the box: with no interface (or sockets denied) the connect fails at once.
    result = run_code(
        slot,
        """
        import errno, socket, time
        for addr in ("192.0.2.1", "10.255.255.1"):
            t = time.monotonic()
            try:
                socket.create_connection((addr, 80), timeout=3)
                print("CONNECTED", addr)
            except OSError as exc:
                print("errno", exc.errno, errno.errorcode.get(exc.errno, "timeout"), round(time.monotonic() - t, 2))
        """,
        timeout=15,
    )
    lines = [line.split() for line in result.stdout.splitlines()]
    refused = {"ENETUNREACH", "EHOSTUNREACH", "EACCES", "EPERM", "EAFNOSUPPORT"}
    blocked = len(lines) == 2 and all(parts[0] == "errno" and parts[2] in refused for parts in lines)
    return AttackResult("network_outside", blocked, result.stdout.strip() + result.stderr[-300:])


def fork_bomb(ctx: Context, slot: SandboxSlot) -> AttackResult:
    limit = ctx.pool.config.max_processes
    result = run_code(
        slot,
        """
        import os, time
        n = 0
        for _ in range(1000):  # bounded: stops by itself even with no limit at all
            try:
                if os.fork() == 0:
                    time.sleep(30)
                    os._exit(0)
                n += 1
            except OSError:
                break
        print(n)
        """,
        timeout=20,
    )
    try:
        forks = int(result.stdout.split()[-1])
    except (ValueError, IndexError):
        forks = -1
    left = uid_processes(slot.uid)
    blocked = 0 <= forks < limit and not left
    return AttackResult("fork_bomb", blocked, f"forked {forks} (limit {limit}), left behind {left}")


def big_allocation(ctx: Context, slot: SandboxSlot) -> AttackResult:
    result = run_code(slot, "x = bytearray(10 * 1024**3); x[::4096] = b'1' * len(x[::4096]); print('ALLOCATED')")
    blocked = "ALLOCATED" not in result.stdout and "MemoryError" in result.stderr
    return AttackResult("big_allocation", blocked, (result.stderr.strip().splitlines() or ["(none)"])[-1])


_HEARTBEAT = """
import os, time
def beat(path):
    while True:
        with open(path, 'a') as f:
            f.write('.')
        time.sleep(0.05)
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        beat('heartbeat')
    os._exit(0)
"""


def setsid_grandchild_timeout(ctx: Context, slot: SandboxSlot) -> AttackResult:
    result = run_code(slot, _HEARTBEAT + "while True:\n    pass\n", timeout=1.5)
    beating = still_growing(slot.workspace / "heartbeat")
    left = uid_processes(slot.uid)
    blocked = result.timed_out and not beating and not left
    return AttackResult(
        "setsid_grandchild_timeout", blocked, f"timed_out={result.timed_out} beating={beating} left={left}"
    )


def background_leftover(ctx: Context, slot: SandboxSlot) -> AttackResult:
    result = run_code(
        slot, _HEARTBEAT + "import subprocess\nsubprocess.Popen(['sleep', '600'], start_new_session=True)\n"
    )
    beating = still_growing(slot.workspace / "heartbeat")
    left = uid_processes(slot.uid)
    blocked = not result.timed_out and not beating and not left
    return AttackResult("background_leftover", blocked, f"exit={result.exit_code} beating={beating} left={left}")


def output_flood(ctx: Context, slot: SandboxSlot) -> AttackResult:
    cap = 4096
    result = run_code(
        slot,
        """
        import os
        chunk = b'x' * (1 << 20)
        for _ in range(100):
            os.write(1, chunk)
            os.write(2, chunk)
        """,
        timeout=60,
        max_output_bytes=cap,
    )
    blocked = result.exit_code == 0 and result.truncated and len(result.stdout) <= cap and len(result.stderr) <= cap
    return AttackResult(
        "output_flood",
        blocked,
        f"exit={result.exit_code} timed_out={result.timed_out} kept={len(result.stdout)}+{len(result.stderr)}",
    )


def kill_parent(ctx: Context, slot: SandboxSlot) -> AttackResult:
    result = run_code(
        slot,
        f"""
        import os, signal, time
        parent = os.getppid()
        for pid, sig in ((parent, signal.SIGKILL), ({ctx.decoy_proc.pid}, signal.SIGKILL), ({ctx.trainer_pid}, 0)):
            try:
                os.kill(pid, sig)
                print('signalled', pid)
            except OSError as exc:
                print('denied', pid, exc.errno)
        time.sleep(0.3)
        print('parent still', os.getppid() == parent)
        """,
    )
    decoy_alive = ctx.decoy_proc.poll() is None
    parent_ok = "parent still True" in result.stdout
    again = slot.run(["true"])
    blocked = decoy_alive and parent_ok and again.exit_code == 0 and not result.timed_out
    return AttackResult(
        "kill_parent", blocked, f"decoy_alive={decoy_alive} parent_ok={parent_ok} next_run={again.exit_code}"
    )


ATTACKS: dict[str, Callable[[Context, SandboxSlot], AttackResult]] = {
    f.__name__: f
    for f in (
        network_loopback,
        network_outside,
        read_shadow,
        read_sibling,
        read_opt_data,
        read_trainer_environ,
        write_outside,
        symlink_escape,
        fork_bomb,
        big_allocation,
        setsid_grandchild_timeout,
        background_leftover,
        output_flood,
        kill_parent,
        keyring_session,
        keyring_user_carryover,
        sysv_ipc,
        unix_socket_by_path,
        unix_socket_types,
        unix_abstract_squat,
        vsock_port_space,
        namespaces_and_uring,
        memfd_memory,
        disk_quota,
        cpu_share,
        disk_bandwidth,
        deep_tree_cleanup,
        readonly_tree_cleanup,
        launcher_nofile_cleanup,
        launcher_cpu_cleanup,
        trainer_environment,
        other_process_priority,
        xattr_carryover,
        metadata_outside,
        ptrace_init,
        kernel_buffer_memory,
        big_code,
        host_uevents,
        inotify_shared_files,
        lock_side_channel,
        host_proc_files,
        stat_outside,
        page_cache_probe,
        pdeathsig_cleared,
        heavy_children,
        self_kill_status,
        ignored_signals,
        workspace_open_to_others,
        host_wide_resources,
    )
}


def run_attack(name: str, ctx: Context) -> AttackResult:
    """One attack in a fresh slot, released afterwards; an exception counts as not blocked."""
    slot = ctx.pool.acquire()
    try:
        return ATTACKS[name](ctx, slot)
    except Exception as exc:  # noqa: BLE001 - a crashing check must not look like a pass
        return AttackResult(name, False, f"attack check crashed: {type(exc).__name__}: {exc}")
    finally:
        ctx.pool.release(slot)


def run_all(pool: SandboxPool, names: list[str] | None = None) -> list[AttackResult]:
    """Every attack (or the named ones) against the pool's live configuration."""
    ctx = Context(pool)
    try:
        return [run_attack(name, ctx) for name in names or list(ATTACKS)]
    finally:
        ctx.close()


__all__ = ["ATTACKS", "AttackResult", "Context", "run_all", "run_attack"]
