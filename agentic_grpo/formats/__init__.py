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


class TrajectoryFormat(Protocol):
    """What the rollout manager needs from a format."""

    stop: list[str]
    """Strings that end a model turn (besides EOS), e.g. "Observation:" for ReAct."""

    response_prefix: str
    """Text the model's answer starts with; part of the prompt, never trained ("" for none)."""

    def prompt_messages(self, question: str) -> list[dict[str, str]]:
        """The chat that opens a trajectory for `question` (system prompt, examples, question)."""

    def system_prompt(self, tool_schemas: list[dict[str, Any]]) -> str:
        """The system message that describes the tools and the format."""

    def parse(self, text: str) -> Parsed:
        """Parse one model turn. Must never raise."""

    def render_observation(self, result: ToolResult, after_stop: bool) -> str:
        """The text that shows `result` to the model; `after_stop` is True when the turn ended on a stop string."""


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
