"""What the LLM judge reads: its rubric template, and the question and trajectories filled into it.

A judge is only as good as what it is shown. It sees the agent's whole trajectory: thoughts, each tool call
with the output the tool really returned (long outputs cut in the middle), and the final answer, or why
there is none. Rubrics are plain files with named placeholders; only those names are substituted, so a
rubric may show JSON examples with braces freely.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from agentic_grpo.resources import find_shipped
from agentic_grpo.trajectory import Trajectory

DEFAULT_RUBRICS = {"trajectory": "tool_use", "group": "tool_use_group"}  # shipped in agentic_grpo.rubrics
PLACEHOLDERS = {
    "trajectory": {"question", "reference", "trajectory"},
    "group": {"question", "reference", "trajectories", "n"},
}
REQUIRED_PLACEHOLDER = {"trajectory": "trajectory", "group": "trajectories"}
NO_REFERENCE = "(none given: judge the final answer on its own merits)"


def load_rubric(rubric: str | os.PathLike | None, mode: str) -> tuple[Path, str]:
    """The rubric's path and text (a file, or a shipped name; None: the mode's default), checked for its placeholder."""
    try:
        path = find_shipped(rubric if rubric is not None else DEFAULT_RUBRICS[mode], "rubrics", ".md")
    except ValueError as exc:
        raise ValueError(f"LLMJudge field `rubric`: {exc}") from None
    text = path.read_text(encoding="utf-8")
    required = REQUIRED_PLACEHOLDER[mode]
    if "{" + required + "}" not in text:
        known = ", ".join("{" + p + "}" for p in sorted(PLACEHOLDERS[mode]))
        hint = f" (the shipped group rubric is `{DEFAULT_RUBRICS['group']}`)" if mode == "group" else ""
        raise ValueError(
            f"LLMJudge field `rubric`: {path} has no {{{required}}} placeholder, needed in mode `{mode}`{hint}; "
            f"placeholders it may use: {known}"
        )
    return path, text


def fill_rubric(rubric: str, **values: str) -> str:
    """The rubric with each `{name}` given in `values` replaced; any other braces stay as written."""
    return re.sub(r"\{(\w+)\}", lambda m: values.get(m[1], m[0]), rubric)


def question_text(prompt: Any) -> str:
    """The question of a prompt: the last user message of a conversation, or the prompt itself."""
    if isinstance(prompt, list):
        users = [m.get("content", "") for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
        return str(users[-1]) if users else json.dumps(prompt, default=str)
    return str(prompt)


def completion_text(completion: Any) -> str:
    """A completion without a trajectory (a plain TRL completion), as the judge reads it."""
    if isinstance(completion, list):
        completion = "\n".join(str(m.get("content", "")) for m in completion if isinstance(m, dict))
    return f"[agent]\n{str(completion).strip()}"


def render_trajectory(trajectory: Trajectory, max_tool_output_chars: int = 2000) -> str:
    """The trajectory as the judge reads it: agent turns, real tool outputs (with their call), final answer."""
    parts: list[str] = []
    calls = list(trajectory.tool_calls)
    tool_index = 0
    for segment in trajectory.completion_segments:
        if segment.role == "model":
            parts.append(f"[agent]\n{segment.text.strip()}")
            continue
        output = _clip(segment.text.strip(), max_tool_output_chars)
        if tool_index < len(calls):
            parts.append(f"[tool output: {_describe_call(*calls[tool_index])}]\n{output}")
        else:
            parts.append(f"[tool output]\n{output}")
        tool_index += 1
    for call, result in calls[tool_index:]:  # calls whose output is not in a segment of its own
        parts.append(
            f"[tool output: {_describe_call(call, result)}]\n{_clip(result.output.strip(), max_tool_output_chars)}"
        )
    if trajectory.final_answer is not None:
        parts.append(f"[final answer]\n{trajectory.final_answer.strip()}")
    else:
        parts.append(f"[final answer]\n(none: the agent stopped without one; reason: {trajectory.finish_reason})")
    return "\n\n".join(parts)


def consecutive_groups(questions: list[str], prompts: list[Any]) -> list[list[int]]:
    """Indices of consecutive completions of the same query (TRL repeats each prompt G times in a row)."""
    keys = [json.dumps([q, p], sort_keys=True, default=str) for q, p in zip(questions, prompts, strict=True)]
    groups: list[list[int]] = []
    for i, key in enumerate(keys):
        if groups and keys[groups[-1][0]] == key:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def _describe_call(call: Any, result: Any) -> str:
    arguments = json.dumps(call.arguments, ensure_ascii=False, default=str)
    notes = [f"error: {result.error}" if result.error else "", "timed out" if result.timed_out else ""]
    notes.append("cut to fit the agent's budget" if result.truncated else "")
    status = "; ".join(n for n in notes if n)
    return f"{call.name}({arguments})" + (f"; {status}" if status else "")


def _clip(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    head, tail = text[: limit // 2], text[-(limit // 2) :]
    return f"{head}\n[... {len(text) - len(head) - len(tail)} characters not shown ...]\n{tail}"
