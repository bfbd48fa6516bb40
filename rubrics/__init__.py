"""Shipped judge rubrics (Markdown templates), installed as package data for `agentic_grpo.rewards.judge`."""
