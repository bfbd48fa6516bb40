"""Rewards that test recipes name by string (`tests.varied_rewards:NAME`).

`distinct_characters` differs between samples of a random model, so GRPO advantages are non-zero.

A tiny random model writes every trajectory to the length cap and never answers: rule
rewards are then equal within each group, advantages 0, loss 0, and "the loss after a
resume equals the uninterrupted run's" would hold even if the resume were wrong.
"""

from __future__ import annotations

from typing import Any


def distinct_characters(prompts: list, completions: list, trajectory: list, **_: Any) -> list[float]:
    """The number of distinct characters of the trajectory's text, scaled to about [0, 1]."""
    return [len(set(t.completion_text)) / 50 for t in trajectory]


def raising(prompts: list, completions: list, **_: Any) -> list[float]:
    """A reward with a bug: it always raises (for the tests of `on_reward_error`)."""
    raise RuntimeError("the reward broke")


def needs_difficulty(prompts: list, completions: list, difficulty: list, **_: Any) -> list[float]:
    """A reward that needs a `difficulty` column (for the start-up check of reward columns)."""
    return [1.0 for _ in completions]


def verdict_text(prompts: list, completions: list, **_: Any) -> list[str]:
    """A reward with a bug: it returns its verdicts as text, not numbers (for the check of reward values)."""
    return ["1.0" for _ in completions]


def never_scores(prompts: list, completions: list, **_: Any) -> list[None]:
    """A reward with nothing to say about any completion (for the end summary's count of unscored ones)."""
    return [None for _ in completions]
