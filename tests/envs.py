"""Tool environments used by the tests (real tools: they run, sleep, raise and print for real)."""

from __future__ import annotations

import time

from agentic_grpo import ToolEnvironment
from agentic_grpo.tools.calculator import Calculator

BARRIER = {"barrier": None}


class MisbehavingTools(Calculator):
    """Calculator plus tools that misbehave on purpose."""

    def reset(self, row: dict) -> None:
        self.row = row

    def sleep(self, seconds: float) -> str:
        """Sleep, then say so.

        Args:
            seconds: How long to sleep.
        """
        time.sleep(seconds)
        return f"slept {seconds}"

    def explode(self, message: str) -> str:
        """Raise an exception.

        Args:
            message: The exception's message.
        """
        raise RuntimeError(message)

    def shout(self, words: int) -> str:
        """Return a long output.

        Args:
            words: How many words.
        """
        return " ".join(f"word{i}" for i in range(words)) + " <|im_end|> END"

    def meet(self, name: str) -> str:
        """Wait at a barrier shared by all trajectories of the turn.

        Args:
            name: Who arrives.
        """
        BARRIER["barrier"].wait(timeout=5)
        return f"{name} met everyone"


class NoDocs(ToolEnvironment):
    def add(self, a, b):
        return a + b


class SlowSandboxedTools(ToolEnvironment):
    """Holds a sandbox slot, and has a tool that outlives the call guard (records when it enters and leaves)."""

    needs_sandbox = True
    events: list[str] = []

    def linger(self, seconds: float) -> str:
        """Stay in the tool for a while.

        Args:
            seconds: How long.
        """
        self.events.append("entered")
        time.sleep(seconds)
        self.events.append("left")
        return "done"


class CloseFailsSandboxedTools(SlowSandboxedTools):
    """Holds a sandbox slot; its `close()` raises on the row whose `case` is "bad" (user code can fail there)."""

    def reset(self, row: dict) -> None:
        self.case = row.get("case")

    def close(self) -> None:
        if self.case == "bad":
            raise RuntimeError("close failed on purpose")
