"""A rollout whose trajectories end after a number of turns set by their rows, on a random model: every turn is a
tool call (a turn cut by its token budget included), and each row's tool answers with `pad` words, so a row with a
long answer fills the completion budget after its first turn and a row with a short one runs to `max_turns`."""

from __future__ import annotations

from typing import Any

from agentic_grpo.environment import ToolEnvironment
from agentic_grpo.rollout import RolloutLimits, RolloutManager
from tests.subagent_support import CallingFormat

LIMITS = dict(max_turns=4, max_tokens_per_turn=6, max_completion_tokens=120, max_tool_output_tokens=128,
              tool_timeout=10.0, tool_workers=2)  # fmt: skip


class EveryTurnCalls(CallingFormat):
    """Every turn calls `echo`, also one its token budget cut (random text rarely writes a stop string)."""

    def __init__(self) -> None:
        super().__init__(Padded.tool_schemas(), tool="echo", argument="text", stop=["\n"])

    def closes_call(self, text: str) -> bool:
        return True


class Padded(ToolEnvironment):
    """Answers every call with the row's `pad` words."""

    def reset(self, row: dict) -> None:
        self.pad = int(row["pad"])

    def echo(self, text: str) -> str:
        """Answer with the row's padding.

        Args:
            text: Anything.
        """
        return " ".join(["ok"] * self.pad)


def uneven_rows(rank: int) -> tuple[list[Any], list[dict[str, Any]]]:
    """Four prompts and rows: process 0's end after one turn, process 1's run to `max_turns` (two) or stop earlier."""
    pads = [100, 100, 100, 100] if rank == 0 else [1, 1, 30, 1]
    prompts = [[{"role": "user", "content": f"Question {rank}.{i}: what is {i} + {rank}?"}] for i in range(4)]
    return prompts, [{"pad": pad} for pad in pads]


def manager(tokenizer: Any) -> RolloutManager:
    return RolloutManager(Padded, EveryTurnCalls(), tokenizer, RolloutLimits(**LIMITS))
