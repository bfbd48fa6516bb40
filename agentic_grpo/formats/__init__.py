"""Trajectory formats: how tools are described to the model and how its text is parsed.

A format is a small class with four members (see `TrajectoryFormat`). `react` is the
default; a recipe may also name any class by import path (`my_pkg.formats:MyFormat`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from agentic_grpo.trajectory import ToolCall, ToolResult


@dataclass
class FinalAnswer:
    """The model ended the episode with this answer."""

    answer: str


@dataclass
class Malformed:
    """The model's turn could not be parsed; `reason` is shown to it as the observation."""

    reason: str


Parsed = ToolCall | FinalAnswer | Malformed


@dataclass(frozen=True)
class ActionChoices:
    """After the last `marker` in a turn, the text must go on as one of `continuations`."""

    marker: str
    continuations: tuple[str, ...]
    names: tuple[str, ...] = ()
    """The tool each continuation calls, in the same order (empty when the format does not say)."""

    def continuation_of(self, name: str) -> str | None:
        """The continuation that calls the tool `name`, or None when no continuation is known to."""
        return self.continuations[self.names.index(name)] if name in self.names else None

    def remainders(self, written: str, among: tuple[str, ...] | None = None) -> list[str]:
        """What is left to write of each continuation (of `among`, when given) that `written` (the text after
        the marker) begins; empty when the slot is closed (a continuation was written whole, or the text left
        every one)."""
        candidates = self.continuations if among is None else among
        return [c[len(written) :] for c in candidates if len(c) > len(written) and c.startswith(written)]


class TrajectoryFormat(Protocol):
    """What the rollout manager needs from a format."""

    stop: list[str]
    """Strings that end a model turn (besides EOS), e.g. "Observation:" for ReAct."""

    response_prefix: str
    """Text the model's answer starts with; part of the prompt, never trained ("" for none)."""

    action_choices: ActionChoices | None
    """Where decoding is held to a few continuations (a tool's name after `Action:`), or None; optional."""

    def prompt_messages(self, question: str) -> list[dict[str, str]]:
        """The chat that opens a trajectory for `question` (system prompt, examples, question)."""

    def system_prompt(self, tool_schemas: list[dict[str, Any]]) -> str:
        """The system message that describes the tools and the format."""

    def parse(self, text: str) -> Parsed:
        """Parse one model turn. Must never raise."""

    def render_observation(self, result: ToolResult, after_stop: bool) -> str:
        """The text that shows `result` to the model; `after_stop` is True when the turn ended on a stop string."""

    def closes_call(self, text: str) -> bool:
        """Optional: True when `text`, a turn cut by the token budget, ends with a whole tool call (the model's
        next token could only have ended the turn), so the call is run; a format without it never runs a cut
        turn's call."""


FORMATS = {
    "react": "agentic_grpo.formats.react:ReActFormat",
    "artist": "agentic_grpo.formats.artist:ArtistFormat",
    "tool_call": "agentic_grpo.formats.tool_call:ToolCallFormat",
}


def load_format(name: str, tool_schemas: list[dict[str, Any]], **kwargs: Any) -> TrajectoryFormat:
    """Build the format named `name` (a short name from `FORMATS` or an import path)."""
    from agentic_grpo.plugins import check_options, import_object

    cls = import_object(FORMATS.get(name, name), what="format")
    check_options(cls, kwargs, f"format `{name}` (recipe field `format_kwargs`)")
    return cls(tool_schemas=tool_schemas, **kwargs)
