"""Attacks on resources: memory outside rlimits (memfd), disk and inodes, CPU share, disk bandwidth, and trees that
break cleanup.

Harm is measured on the host (bytes and entries in the workspace, processes in the slot's
cpu group, whether the workspace is gone after release). Where the pool's report says a
resource is NOT bounded on this host (no cgroup, no root for a tmpfs quota), harm is
returned as a documented `gap` rather than a pass.
"""

from __future__ import annotations

import os
import secrets
import signal
import stat
import threading
import time

from ..slot import SandboxSlot
from ..workspace import remove_tree
from .support import AttackResult, Context, last_json, run_code


def memfd_memory(ctx: Context, slot: SandboxSlot) -> AttackResult:
    """Memory the address-space limit never sees: pages written into memfds, 16 MB each, past the limit."""
    limit = ctx.pool.config.memory_mb
    target = limit + 128
    result = run_code(slot, f"""
        import json, os
        held, fds = 0, []
        chunk = b"\\1" * (1 << 20)
        try:
            while held < {target}:
                fd = os.memfd_create("x")
                fds.append(fd)
                for _ in range(16):
                    os.write(fd, chunk)
                held += 16
                print(json.dumps({{"held_mb": held}}), flush=True)
        except OSError as exc:
            print(json.dumps({{"held_mb": held, "stopped": str(exc)}}), flush=True)
        """, timeout=60)  # fmt: skip
    held = last_json(result).get("held_mb", 0)
    harmed = held >= target
    return AttackResult(
        "memfd_memory", not harmed, f"held {held} MB in memfds (limit {limit} MB), exit={result.exit_code}"
    )


def disk_quota(ctx: Context, slot: SandboxSlot) -> AttackResult:
    """Fill the workspace past its size quota with 32 MB files, and past its inode quota with empty files."""
    config = ctx.pool.config
    size_mb, inodes = config.workspace_mb + 32, config.workspace_inodes + 256
    result = run_code(slot, f"""
        import json, os
        out = {{"mb": 0, "files": 0}}
        zeros = b"\\0" * (1 << 20)
        try:
            for i in range({size_mb} // 32 + 1):
                with open(f"big{{i}}", "wb") as f:
                    for _ in range(32):
                        f.write(zeros)
                        out["mb"] += 1
        except OSError as exc:
            out["mb_stopped"] = str(exc)
        try:
            os.mkdir("many")
            for i in range({inodes}):
                open(f"many/{{i}}", "w").close()
                out["files"] += 1
        except OSError as exc:
            out["files_stopped"] = str(exc)
        print(json.dumps(out))
        """, timeout=60)  # fmt: skip
    used, entries = _usage(slot.workspace)
    harmed = used > config.workspace_mb << 20 or entries > config.workspace_inodes
    detail = f"host sees {used >> 20} MB and {entries} entries (quota {config.workspace_mb} MB, "
    detail += f"{config.workspace_inodes} inodes); code says {last_json(result)}"
    gap = "no workspace quota (needs root and workspace_mb > 0)" if harmed and not ctx.pool.quota else ""
    return AttackResult("disk_quota", not harmed, detail, gap)


def disk_bandwidth(ctx: Context, slot: SandboxSlot) -> AttackResult:
    """Read the largest host file a slot can see straight from the disk (O_DIRECT, past the page cache): 4 KB at
    random offsets, then 1 MB at a time, a second and a half each. Unbounded, one slot can take a slow disk from
    the host's own reads; blocked when both rates stay within twice the slot's caps (`io_ops_per_s`,
    `io_mb_per_s`), which the kernel's throttle holds to within about a tenth."""
    config = ctx.pool.config
    result = run_code(slot, """
        import json, mmap, os, random, sys, time
        big, size = None, 0
        for top in (os.path.join(sys.base_prefix, "lib"), "/usr/lib", "/usr/bin"):
            for directory, _, files in os.walk(top):
                for name in files:
                    path = os.path.join(directory, name)
                    try:
                        if not os.path.islink(path) and os.path.getsize(path) > size:
                            big, size = path, os.path.getsize(path)
                    except OSError:
                        pass
        try:
            fd = os.open(big, os.O_RDONLY | os.O_DIRECT)
            os.preadv(fd, [mmap.mmap(-1, 4096)], 0)
        except (OSError, TypeError) as exc:
            print(json.dumps({"no_direct": f"{big}: {exc}"}))
            raise SystemExit
        out = {"file": big, "size_mb": size >> 20}
        for name, chunk, unit in (("ops_per_s", 4096, 4096), ("mb_per_s", 1 << 20, 1 << 20)):
            buf, blocks, done, start = mmap.mmap(-1, chunk), max(1, size // chunk), 0, time.monotonic()
            while time.monotonic() - start < 1.5:
                done += os.preadv(fd, [buf], random.randrange(blocks) * chunk)
            out[name] = round(done / unit / (time.monotonic() - start), 1)
        print(json.dumps(out))
        """, timeout=30)  # fmt: skip
    seen = last_json(result)
    if "no_direct" in seen or "ops_per_s" not in seen:
        return AttackResult("disk_bandwidth", True, f"exit={result.exit_code} {seen or result.stderr[-300:]}",
                            skipped=f"no file here takes O_DIRECT reads: {seen.get('no_direct', '')}")  # fmt: skip
    over_ops = not config.io_ops_per_s or seen["ops_per_s"] > 2 * config.io_ops_per_s
    over_mb = not config.io_mb_per_s or seen["mb_per_s"] > 2 * config.io_mb_per_s
    harmed = over_ops or over_mb
    detail = f"read {seen['ops_per_s']} ops/s of 4 KB and {seen['mb_per_s']} MB/s from {seen['file']} "
    detail += f"(caps {config.io_ops_per_s} ops/s, {config.io_mb_per_s:g} MB/s)"
    gap = ""
    if harmed and "io" not in ctx.pool.cgroups.bounded:
        gap = "no cgroup I/O controller in force (needs root, or a delegated v2 group with io)"
    elif harmed and not (config.io_ops_per_s and config.io_mb_per_s):
        gap = "io_ops_per_s or io_mb_per_s is 0 (no cap)"
    return AttackResult("disk_bandwidth", not harmed, detail, gap)


def _usage(root) -> tuple[int, int]:  # noqa: ANN001 - a Path
    used = entries = 0
    for directory, dirs, files in os.walk(root):
        for name in files + dirs:
            entries += 1
            try:
                used += os.lstat(os.path.join(directory, name)).st_blocks * 512
            except OSError:
                pass
    return used, entries


def cpu_share(ctx: Context, slot: SandboxSlot) -> AttackResult:
    """Six processes spin for a second; blocked when every one of them runs under the slot's cpu quota."""
    group = slot.cgroup
    cpu_dirs = (
        [d for d in group.dirs if (d / "cpu.max").exists() or (d / "cpu.cfs_quota_us").exists()] if group else []
    )
    seen: list[int] = []
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            for d in cpu_dirs:
                try:
                    seen.append(len((d / "cgroup.procs").read_text().split()))
                except OSError:
                    pass
            time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        result = run_code(slot, """
            import json, os, time
            start = time.monotonic()
            pids = []
            for _ in range(6):
                pid = os.fork()
                if pid == 0:
                    end = time.monotonic() + 1.0
                    while time.monotonic() < end:
                        pass
                    os._exit(0)
                pids.append(pid)
            for pid in pids:
                os.waitpid(pid, 0)
            t = os.times()
            print(json.dumps({"cores_used": round((t.children_user + t.children_system) / (time.monotonic() - start), 2)}))
            """, timeout=30)  # fmt: skip
    finally:
        done.set()
        watcher.join()
    quota = _quota_cores(cpu_dirs[0]) if cpu_dirs else None
    contained = bool(cpu_dirs) and max(seen, default=0) >= 6
    blocked = contained and quota is not None and quota <= ctx.pool.config.cpu_cores + 1e-6
    detail = f"spinners in a cpu group: {contained} (quota {quota} cores); measured {last_json(result)}"
    gap = "" if blocked or cpu_dirs else "no cpu cgroup here: CPU is bounded by RLIMIT_CPU and nice only"
    return AttackResult("cpu_share", blocked, detail, gap)


def _quota_cores(directory) -> float | None:  # noqa: ANN001 - a Path
    try:
        if (directory / "cpu.max").exists():
            quota, period = (directory / "cpu.max").read_text().split()
            return None if quota == "max" else int(quota) / int(period)
        quota = int((directory / "cpu.cfs_quota_us").read_text())
        return None if quota < 0 else quota / int((directory / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None


# chmod is refused where slots share the trainer's uid (Landlock without root): the trees are
# then as locked as mkdir's mode alone makes them, and the cleanup is checked on those.
_LOCK = """
def lock(path, mode):
    try:
        os.chmod(path, mode)
    except PermissionError:
        print("chmod refused", path)
"""
DEEP_TREE_CODE = (
    "import os\n"
    + _LOCK
    + """
top = os.getcwd()
os.mkdir("deep")
os.chdir("deep")
for i in range({depth}):  # deeper than PATH_MAX and than Python's recursion limit
    os.mkdir("d")
    os.chdir("d")
    if i % 500 == 0:
        open("f", "w").close()
os.chdir(top)
os.makedirs("locked/inner")
for i in range(200):
    open(f"locked/inner/{{i}}", "w").close()
lock("locked/inner", 0)
lock("locked", 0)
os.mkdir("born_locked", 0)
os.symlink("/", "locked_link")
print("BUILT")
"""
)


def deep_tree_cleanup(ctx: Context, slot: SandboxSlot) -> AttackResult:
    """A 3,000-deep tree and directories chmod-ed to 000: the host must still remove the workspace on release."""
    result = run_code(slot, DEEP_TREE_CODE.format(depth=3000), timeout=60)
    built = "BUILT" in result.stdout
    gone, detail = _released_and_gone(ctx, slot)
    return AttackResult("deep_tree_cleanup", built and gone, f"built={built} {detail}")


READONLY_TREE_CODE = (
    "import os\n"
    + _LOCK
    + """
os.symlink({outside!r}, "to_outside")  # bait: a host directory without u+w
for top, mode in (("readonly", 0o500), ("locked", 0o000), ("mixed", 0o500)):
    os.makedirs(f"{{top}}/inner/leaf")
    os.makedirs(f"{{top}}/born", mode)  # made with the mode: no chmod needed
    os.symlink({outside!r}, f"{{top}}/inner/to_outside")
    for directory in (f"{{top}}/inner/leaf", f"{{top}}/inner", top):
        for i in range(50):
            with open(f"{{directory}}/{{i}}", "wb") as f:
                f.write(b"x" * 4096)
        lock(directory, 0o000 if (top, directory) == ("mixed", "mixed/inner") else mode)
lock(".", 0o500)  # the workspace itself
print("BUILT")
"""
)


def readonly_tree_cleanup(ctx: Context, slot: SandboxSlot) -> AttackResult:
    """Directories chmod-ed to 500 and 000, the workspace too: release must remove them without root or links followed.

    Root removes them whatever their modes; an unprivileged trainer needs write permission on
    each directory first, so this is harm only where the pool runs without root. The links
    point at a read-only host directory: a cleanup that followed one would chmod or empty it.
    """
    outside = ctx.decoy_dir / f"readonly-{secrets.token_hex(4)}"
    outside.mkdir()
    (outside / "keep.txt").write_text("original")
    outside.chmod(0o555)
    try:
        result = run_code(slot, READONLY_TREE_CODE.format(outside=str(outside)), timeout=60)
        built = "BUILT" in result.stdout
        gone, detail = _released_and_gone(ctx, slot)
        untouched = stat.S_IMODE(os.lstat(outside).st_mode) == 0o555 and (outside / "keep.txt").exists()
    finally:
        outside.chmod(0o755)
        remove_tree(outside)
    detail = f"built={built} {detail} outside untouched={untouched} {result.stderr[-200:]}"
    return AttackResult("readonly_tree_cleanup", built and gone and untouched, detail.strip())


def _released_and_gone(ctx: Context, slot: SandboxSlot) -> tuple[bool, str]:
    """Release the slot; whether its workspace is gone with no crash and no failure logged, and what happened."""
    workspace = slot.workspace
    before = ctx.pool.release_failures
    try:
        ctx.pool.release(slot)
        crashed = ""
    except Exception as exc:  # noqa: BLE001 - the harm these attacks look for
        crashed = f"{type(exc).__name__}: {exc}"[:200]
    left = os.path.lexists(workspace)
    failed = ctx.pool.release_failures > before
    detail = f"release crashed={crashed!r} workspace left={left} logged failure={failed}"
    return not left and not crashed and not failed, detail


_OUTLIVE_CODE = """
import json, os, resource, subprocess, sys
env = {{"PATH": "/usr/bin:/bin", "AGRPO_OUTLIVE": {marker!r}}}
started = [
    subprocess.Popen(["sleep", "600"], env=env, start_new_session=True).pid,  # a session of its own
    subprocess.Popen(["sleep", "601"], env=env).pid,  # the code's own process group
]
print(json.dumps({{"started": started}}), flush=True)
try:  # the launcher (our parent) runs as our uid: cripple its cleanup
    resource.prlimit(os.getppid(), resource.{limit}, (0, 0))
    print(json.dumps({{"started": started, "limited": True}}), flush=True)
except OSError as exc:
    print(json.dumps({{"started": started, "limited": str(exc)}}), flush=True)
{wake}"""
# A process's CPU clock is checked only while it runs: wake the launcher (it reaps every orphan
# re-parented to it) until the kernel kills it, and us with it (our parent-death signal). A fork refused at the
# slot's process limit is retried: its traceback in stderr would read as the launcher's cleanup crashing.
_WAKE_LAUNCHER = """
import time
end = time.monotonic() + 3
while time.monotonic() < end:
    try:
        child = os.fork()
    except BlockingIOError:  # the process limit, until the launcher reaps the orphans: not the launcher's crash
        time.sleep(0.01)
        continue
    if child == 0:
        try:
            if os.fork() == 0:
                os._exit(0)
        finally:
            os._exit(0)
    os.wait()
print(json.dumps({"started": started, "launcher_survived": True}), flush=True)
"""


def launcher_nofile_cleanup(ctx: Context, slot: SandboxSlot) -> AttackResult:
    """Background processes (one in a new session, one in the code's group), then the launcher's RLIMIT_NOFILE set to 0.

    A cleanup that opens /proc to find what is left crashes with EMFILE: harm is a crash in
    the call's stderr or a background process still alive once the call returned.
    """
    return _outlive(ctx, slot, "launcher_nofile_cleanup", "RLIMIT_NOFILE", "")


def launcher_cpu_cleanup(ctx: Context, slot: SandboxSlot) -> AttackResult:
    """The same background processes, then the launcher's RLIMIT_CPU set to 0: the kernel kills the launcher.

    Nothing is left to clean up inside the slot, so the trainer must sweep the slot when its
    launcher dies: harm is a background process still alive once the call returned.
    """
    return _outlive(ctx, slot, "launcher_cpu_cleanup", "RLIMIT_CPU", _WAKE_LAUNCHER)


def _outlive(ctx: Context, slot: SandboxSlot, name: str, limit: str, wake: str) -> AttackResult:
    marker = f"agrpo-outlive-{secrets.token_hex(6)}"
    result = run_code(slot, _OUTLIVE_CODE.format(marker=marker, limit=limit, wake=wake), timeout=20)
    said = last_json(result)
    left = _marked_processes(marker)
    for pid in left:  # the attack's own leftovers: never let them run on
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    crashed = "Traceback" in result.stderr
    started = len(said.get("started", []))
    detail = f"started={started} limited={said.get('limited')!r} launcher survived={said.get('launcher_survived')} "
    detail += f"alive after the call={left} "
    detail += f"cleanup crashed={crashed} exit={result.exit_code} {result.stderr[-300:]}"
    if started < 2:  # the program never got as far as its background processes: nothing was tried
        return AttackResult(name, True, detail.strip(), skipped=f"no background process started: {detail}"[:300])
    return AttackResult(name, not left and not crashed, detail.strip())


def _marked_processes(marker: str) -> list[int]:
    """Host pids whose environment carries `marker`, once SIGKILLed ones had a moment to be reaped."""
    needle = marker.encode()
    for _ in range(20):
        found = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/environ", "rb") as f:
                        if needle in f.read():
                            found.append(int(entry))
                except OSError:
                    pass
        if not found:
            return []
        time.sleep(0.1)
    return found
