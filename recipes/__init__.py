"""Shipped recipes (YAML), installed as package data: `agentic-grpo train --config cpu_demo` finds them by name."""
