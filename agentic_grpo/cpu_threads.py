"""Say once, at start-up, when training processes will fight over the CPU's cores.

torch gives every process one compute thread per core. Two processes that each do so on the same cores (two
runs at once, or `accelerate launch` of several CPU processes with more threads than cores) do not each run
half as fast: their threads contend, and a step can take ten times longer than alone. Nothing fails, so
without a word the user sees only a slow run.
"""

from __future__ import annotations

import os
import time


def shared_cores_advice(cores: int, processes: int, threads: int, others: int) -> str | None:
    """One line of advice when the cores are oversubscribed, else None.

    Args:
        cores: the cores this process may run on.
        processes: this run's training processes on this machine.
        threads: torch's compute threads per process.
        others: runnable processes on this machine that are not this run's (another run, a benchmark).
    """
    if others >= cores:
        share = max(1, cores // (processes + 1))
        return (
            f"the {cores} CPU cores are already busy ({others} other runnable processes, another training run "
            f"perhaps): torch's threads will contend and each run can be many times slower than alone; run one "
            f"at a time, or give each run OMP_NUM_THREADS={share}"
        )
    if processes * threads > cores:
        share = max(1, cores // processes)
        return (
            f"{processes} training processes x {threads} torch threads each on {cores} CPU cores: the threads "
            f"will contend and each step can be many times slower; set OMP_NUM_THREADS={share} (or run fewer "
            f"processes)"
        )
    return None


def runnable_processes(samples: int = 5, interval_s: float = 0.05) -> int | None:
    """The fewest runnable processes on the machine over a few samples of /proc/loadavg (this one included);
    None where there is no /proc."""
    counts = []
    for k in range(samples):
        try:
            with open("/proc/loadavg") as f:
                counts.append(int(f.read().split()[3].split("/")[0]))
        except (OSError, ValueError, IndexError):
            return None
        if k + 1 < samples:
            time.sleep(interval_s)
    return min(counts)


def check_shared_cores(processes: int) -> str | None:
    """The advice for this machine now, for a CPU run of `processes` local processes (None on a GPU run)."""
    import torch

    if torch.cuda.is_available():
        return None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    running = runnable_processes()
    others = max(0, running - processes) if running is not None else 0
    return shared_cores_advice(cores, processes, torch.get_num_threads(), others)
