"""Sandbox overhead and throughput: prints JSON.

Per-call latency of `python3 -c pass` (the system interpreter) bare and in a sandbox slot
(median of --calls), their ratio, and executions per second with 1, 8 and 64 slots running
at once (each slot in its own thread, as the rollout manager does; a slot is acquired,
runs --per-slot calls and is released, cgroup and tmpfs workspace included). Not a test:
numbers depend on the machine and its load, which is printed alongside.

    python benchmarks/sandbox.py [--mode auto] [--calls 20] [--per-slot 2] [--no-cgroup] [--workspace-mb 256]

With --disk it measures instead what one slot reading the disk past the page cache (O_DIRECT, four processes of
random 4 KB reads) does to the host's own 4 KB reads of another file: their latency alone, beside a slot with
the default I/O caps, and beside one without caps (`io_mb_per_s` and `io_ops_per_s` 0).
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import random
import shutil
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from agentic_grpo.sandbox import SandboxConfig, SandboxPool  # noqa: E402

# The command, `python3 -c pass`, resolved on the sandbox's PATH (the system
# interpreter), and the same binary bare: the ratio compares like with like. The
# trainer's venv interpreter would add ~20 ms of site-packages start-up to both.
PYTHON3 = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin") or sys.executable
COMMAND = [PYTHON3, "-c", "pass"]


def bare_call() -> float:
    start = time.perf_counter()
    subprocess.run(COMMAND, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def throughput(pool: SandboxPool, slots: int, per_slot: int) -> float:
    def worker(_: int) -> int:
        slot = pool.acquire()
        try:
            for _ in range(per_slot):
                assert slot.run(COMMAND).exit_code == 0
            return per_slot
        finally:
            pool.release(slot)

    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=slots) as ex:
        done = sum(ex.map(worker, range(slots)))
    return done / (time.perf_counter() - start)


# Four processes of random O_DIRECT 4 KB reads of the largest file the slot sees, for `seconds`.
_HAMMER = """
import mmap, os, random, sys, time
big = max((os.path.join(d, f) for top in (os.path.join(sys.base_prefix, "lib"), "/usr/lib")
           for d, _, fs in os.walk(top) for f in fs if not os.path.islink(os.path.join(d, f))), key=os.path.getsize)
blocks, end, reads = os.path.getsize(big) // 4096, time.monotonic() + {seconds}, 0
for _ in range(3):
    if os.fork() == 0:
        break
fd, buf = os.open(big, os.O_RDONLY | os.O_DIRECT), mmap.mmap(-1, 4096)
while time.monotonic() < end:
    os.preadv(fd, [buf], random.randrange(blocks) * 4096)
    reads += 1
print(reads, flush=True)
"""


def host_read_ms(path: str, reads: int) -> dict[str, float]:
    """Median and 90th percentile of the host's own random 4 KB O_DIRECT reads of `path`, in ms."""
    fd, buf = os.open(path, os.O_RDONLY | os.O_DIRECT), mmap.mmap(-1, 4096)
    blocks, times = os.path.getsize(path) // 4096, []
    try:
        for _ in range(reads):
            start = time.perf_counter()
            os.preadv(fd, [buf], random.randrange(blocks) * 4096)
            times.append((time.perf_counter() - start) * 1000)
            time.sleep(0.005)
    finally:
        os.close(fd)
    times.sort()
    return {"median_ms": round(statistics.median(times), 3), "p90_ms": round(times[int(0.9 * len(times))], 3)}


def disk(mode: str, reads: int) -> dict:
    """The host's read latency alone, beside a capped slot and beside an uncapped one."""
    path = max((str(p) for p in Path(sys.prefix).rglob("*.so*") if p.is_file()), key=os.path.getsize)
    out: dict = {"host_file": path, "alone": host_read_ms(path, reads)}
    for name, caps in (("beside_capped_slot", {}), ("beside_uncapped_slot", {"io_mb_per_s": 0, "io_ops_per_s": 0})):
        pool = SandboxPool(SandboxConfig(mode=mode, timeout_s=60, **caps))
        try:
            out["cgroup"], out[f"{name}_caps"] = pool.report.cgroup, pool.report.bounds["disk I/O"]
            with pool.acquire() as slot:
                seconds, done = reads * 0.006 + 5, []
                code = _HAMMER.format(seconds=seconds)
                hammer = threading.Thread(target=lambda: done.append(slot.run_python(code)))  # noqa: B023
                hammer.start()
                time.sleep(2)  # the slot's interpreter starts and finds its file
                out[name] = host_read_ms(path, reads)
                hammer.join()
                slot_reads = sum(int(line) for line in done[0].stdout.split() if line.isdigit())
                out[name]["slot_reads_per_s"] = round(slot_reads / seconds)
        finally:
            pool.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(prog="agentic-grpo bench sandbox", description=__doc__.splitlines()[0])
    parser.add_argument("--mode", default="auto")
    parser.add_argument("--calls", type=int, default=20, help="calls per latency median (at least 20)")
    parser.add_argument("--per-slot", type=int, default=2, help="executions per slot in the throughput runs")
    parser.add_argument("--no-cgroup", action="store_true", help="use_cgroup=False (to measure what cgroups cost)")
    parser.add_argument("--workspace-mb", type=int, default=256, help="workspace quota (0: no tmpfs)")
    parser.add_argument("--disk", action="store_true", help="measure the host's disk reads beside a slot instead")
    parser.add_argument("--reads", type=int, default=400, help="host reads per --disk measurement")
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    if args.disk:
        print(json.dumps({**disk(args.mode, args.reads), "load_average_1min": round(load_before, 2)}, indent=2))
        return
    pool = SandboxPool(SandboxConfig(mode=args.mode, use_cgroup=not args.no_cgroup, workspace_mb=args.workspace_mb))
    try:
        bare_call()  # warm the page cache
        bare = statistics.median(bare_call() for _ in range(max(args.calls, 20)))
        with pool.acquire() as slot:
            slot.run(COMMAND)

            def sandboxed_call() -> float:
                start = time.perf_counter()
                assert slot.run(COMMAND).exit_code == 0
                return time.perf_counter() - start

            sandboxed = statistics.median(sandboxed_call() for _ in range(max(args.calls, 20)))
        rates = {str(n): round(throughput(pool, n, args.per_slot), 1) for n in (1, 8, 64)}
    finally:
        pool.close()
    ratio = sandboxed / bare
    print(
        json.dumps(
            {
                "layer": pool.layer,
                "cgroup": pool.report.cgroup,
                "workspace": pool.report.bounds["disk"],
                "command": " ".join(COMMAND),
                "cpus": os.cpu_count(),
                "bare_ms": round(bare * 1000, 2),
                "sandboxed_ms": round(sandboxed * 1000, 2),
                "overhead_ratio": round(ratio, 2),
                "executions_per_s": rates,
                "targets": {"overhead_ratio_max": 2.5, "executions_per_s_at_64_min": 60},
                "met": {"overhead_ratio": ratio <= 2.5, "executions_per_s_at_64": rates["64"] >= 60},
                "load_average_1min": {"before": round(load_before, 2), "after": round(os.getloadavg()[0], 2)},
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
