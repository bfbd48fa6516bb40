"""Reproducible measurements that print JSON; `agentic-grpo bench NAME` runs `agentic_grpo.benchmarks.NAME`."""
