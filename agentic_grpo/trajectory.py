"""What one rollout is: a prompt, then alternating model and tool segments.

Token ids are stored once, per segment; the completion ids and the loss mask that
TRL trains on are derived from the segments, so they can never disagree.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

SegmentRole = Literal["prompt", "model", "tool"]


@dataclass
class ToolCall:
    """A tool call as the model wrote it: the parsed name and arguments, and the raw text."""

    name: str
    arguments: dict[str, Any]
    raw_text: str = ""


@dataclass
class ToolResult:
    """What running a tool produced.

    `output` is what the model sees (already including any error text); `error` is set
    when the call failed (unknown tool, bad arguments, exception, non-zero exit),
    `timed_out` when the wall timeout killed it, `truncated` when output was cut.
    """

    output: str
    error: str | None = None
    timed_out: bool = False
    truncated: bool = False
    seconds: float = 0.0
    exit_code: int | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and not self.timed_out


@dataclass
class Segment:
    """A run of tokens with one author. Only `model` segments are trained on."""

    role: SegmentRole
    token_ids: list[int]
    text: str

    @property
    def trainable(self) -> bool:
        return self.role == "model"


FinishReason = Literal["final_answer", "max_turns", "length", "eos", "running"]
"""Why a trajectory ended: `final_answer` (a complete turn gave one), `max_turns` (out of turns),
`length` (a turn was cut by `max_tokens_per_turn` or the trajectory's token budget: whatever that
turn wrote, answer or tool call, is not acted on). Only `length` counts as truncated."""


@dataclass
class Trajectory:
    """One sampled rollout of a query.

    `segments[0]` is the prompt; everything after it is the completion. `tool_calls`
    pairs each parsed call with its result, in order. `final_answer` is the text after
    the format's answer marker, or None when the model never gave one.
    """

    prompt: Any
    segments: list[Segment]
    tool_calls: list[tuple[ToolCall, ToolResult]] = field(default_factory=list)
    final_answer: str | None = None
    finish_reason: FinishReason = "running"
    turns: int = 0
    malformed_turns: int = 0
    notes: dict[str, Any] = field(default_factory=dict)
    """What rewards recorded about this trajectory (e.g. a judge's raw reply), saved with it."""

    @property
    def prompt_ids(self) -> list[int]:
        return [t for s in self.segments if s.role == "prompt" for t in s.token_ids]

    @property
    def completion_segments(self) -> list[Segment]:
        return [s for s in self.segments if s.role != "prompt"]

    @property
    def completion_ids(self) -> list[int]:
        return [t for s in self.completion_segments for t in s.token_ids]

    @property
    def loss_mask(self) -> list[int]:
        """1 for every completion token the model sampled, 0 for tool output tokens."""
        return [int(s.trainable) for s in self.completion_segments for _ in s.token_ids]

    @property
    def completion_text(self) -> str:
        return "".join(s.text for s in self.completion_segments)

    @property
    def invalid(self) -> bool:
        """No final answer, or at least one turn the format could not parse."""
        return self.final_answer is None or self.malformed_turns > 0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready record (token ids included) for trajectory files and `agentic-grpo show`."""
        return {
            "prompt": self.prompt,
            "segments": [asdict(s) for s in self.segments],
            "tool_calls": [{"call": asdict(c), "result": asdict(r)} for c, r in self.tool_calls],
            "final_answer": self.final_answer,
            "finish_reason": self.finish_reason,
            "turns": self.turns,
            "malformed_turns": self.malformed_turns,
            "notes": self.notes,
        }
