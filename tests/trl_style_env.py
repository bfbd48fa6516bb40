"""Environments written the way TRL's documentation writes them for `GRPOTrainer(environment_factory=...)`: plain
classes, no import from this project, `reset(**kwargs)` (returning an observation or None), tools as typed and
documented public methods (one async), and `get_reward()` from the environment's own state."""

from __future__ import annotations


class CounterEnv:
    """Count up to a target the row gives."""

    def __init__(self):
        self.count = 0
        self.target = None

    def reset(self, **kwargs) -> str:
        self.count = 0
        self.target = int(kwargs["target"])
        return f"\nThe counter is at 0; reach {self.target}."

    def increment(self, step: int) -> str:
        """
        Add to the counter.

        Args:
            step: How much to add.

        Returns:
            The counter's new value.
        """
        self.count += step
        return f"counter: {self.count}"

    async def peek(self) -> str:
        """
        Read the counter without changing it.

        Returns:
            The counter's value.
        """
        return f"counter: {self.count}"

    def get_reward(self) -> float:
        return 1.0 if self.count == self.target else 0.0


class SilentEnv:
    """An environment whose reset returns nothing and that owns no reward."""

    def reset(self, **kwargs):
        self.calls = 0

    def ping(self, text: str) -> str:
        """
        Echo a text.

        Args:
            text: What to echo.
        """
        self.calls += 1
        return text


class GuessEnv:
    """Guess the row's target; owns its reward, as the counter does."""

    def reset(self, **kwargs):
        self.target, self.guessed = int(kwargs["target"]), None

    def guess(self, number: int) -> str:
        """
        Guess the number.

        Args:
            number: The guess.
        """
        self.guessed = number
        return "right" if number == self.target else "wrong"

    def get_reward(self) -> float:
        return 0.5 if self.guessed == self.target else 0.0
