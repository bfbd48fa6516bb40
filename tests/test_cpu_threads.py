"""The start-up note on oversubscribed cores: when it is said, and what it suggests."""

from __future__ import annotations

from agentic_grpo.cpu_threads import runnable_processes, shared_cores_advice


def test_two_processes_with_a_thread_per_core_each_are_told_a_thread_count():
    advice = shared_cores_advice(cores=2, processes=2, threads=2, others=0)
    assert advice is not None and "OMP_NUM_THREADS=1" in advice and "2 training processes x 2" in advice


def test_a_second_run_on_busy_cores_is_told_so():
    advice = shared_cores_advice(cores=2, processes=1, threads=2, others=2)
    assert advice is not None and "already busy (2 other runnable" in advice and "OMP_NUM_THREADS=1" in advice


def test_nothing_is_said_when_the_cores_suffice():
    assert shared_cores_advice(cores=2, processes=1, threads=2, others=1) is None
    assert shared_cores_advice(cores=16, processes=2, threads=8, others=0) is None


def test_the_runnable_count_includes_the_reader():
    count = runnable_processes(samples=2, interval_s=0.0)
    assert count is None or count >= 1  # None only where there is no /proc
