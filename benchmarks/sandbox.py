"""Sandbox overhead and throughput: prints JSON.

Per-call latency of `python3 -c pass` (the system interpreter) bare and in a sandbox slot
(median of --calls), their ratio, and executions per second with 1, 8 and 64 slots running
at once (each slot in its own thread, as the rollout manager does; a slot is acquired,
runs --per-slot calls and is released, cgroup and tmpfs workspace included). Not a test:
numbers depend on the machine and its load, which is printed alongside.

    python benchmarks/sandbox.py [--mode auto] [--calls 20] [--per-slot 2] [--no-cgroup] [--workspace-mb 256]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

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


def main() -> None:
    parser = argparse.ArgumentParser(prog="agentic-grpo bench sandbox", description=__doc__.splitlines()[0])
    parser.add_argument("--mode", default="auto")
    parser.add_argument("--calls", type=int, default=20, help="calls per latency median (at least 20)")
    parser.add_argument("--per-slot", type=int, default=2, help="executions per slot in the throughput runs")
    parser.add_argument("--no-cgroup", action="store_true", help="use_cgroup=False (to measure what cgroups cost)")
    parser.add_argument("--workspace-mb", type=int, default=256, help="workspace quota (0: no tmpfs)")
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
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
