"""How `agentic-grpo show` draws one trajectory record: a panel, with its sub-agents' trajectories as a tree.

A record is `Trajectory.to_dict()` plus what the run added (`row`, `reward`, `advantage`, ...). The model's
tokens (trained) are green, tool output (not trained) is yellow. Each sub-agent call's child trajectory
hangs under its parent, titled with the sub-agent, who generated it and the parent turn that called it;
a child's own sub-agents hang under it in turn. Tool output and model text are hostile: their control
characters (terminal escape sequences that set a window title, write the clipboard or move the cursor
to forge a line) are shown as `\\x1b`-style escapes, never sent to the terminal.
"""

from __future__ import annotations

import re
from typing import Any

from rich.console import RenderableType
from rich.panel import Panel
from rich.text import Text
from rich.tree import Tree

STYLES = {"model": "green", "tool": "yellow"}
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: Any) -> str:
    """`text` as a string with every control character but newline and tab written as an escape (`\\x1b`)."""
    return _CONTROL.sub(lambda found: f"\\x{ord(found.group()):02x}", str(text))


def trajectory_view(record: dict[str, Any], title: str) -> RenderableType:
    """A panel for `record`; a tree with the panel at its root when the trajectory called sub-agents."""
    panel = Panel(record_body(record), title=Text(printable(title)), title_align="left")
    if not record.get("children"):
        return panel
    tree = Tree(panel, guide_style="magenta")
    _add_children(tree, record["children"])
    return tree


def _add_children(node: Tree, children: list[dict[str, Any]]) -> None:
    for child in children:
        delegation = child.get("delegation") or {}
        title = (
            f"{delegation.get('agent', 'sub-agent')}  [{delegation.get('policy', '?')}]  called in turn "
            f"{delegation.get('parent_turn', -1) + 1}  finish={child.get('finish_reason')}"
        )
        body = record_body(child, question=(delegation.get("row") or {}).get("question"))
        # A Text title: `[adapter:x]` is data, not rich markup.
        branch = node.add(Panel(body, title=Text(printable(title)), title_align="left", border_style="magenta"))
        _add_children(branch, child.get("children") or [])


def record_body(record: dict[str, Any], question: Any = None) -> Text:
    """The question, the segments coloured by author, the answer, the scores and the per-turn credit."""
    body = Text()
    row = record.get("row") or {}
    gold = f"  gold={row.get('answer')!r}" if question is None else ""  # a sub-task has no reference answer
    if question is None:
        question = row.get("question") or record.get("prompt")
    body.append(printable(f"Q: {question}\n"), style="bold")
    for segment in record["segments"][1:]:
        body.append(printable(segment["text"]), style=STYLES.get(segment["role"], ""))
    # Scores go in the body, which wraps; a panel title is cut at the terminal's width.
    shown = dict(record.get("rewards") or {})
    shown.update({k: record[k] for k in ("reward", "advantage", "correct", "error") if k in record})
    if (record.get("notes") or {}).get("error"):
        shown["error"] = record["notes"]["error"]
    scores = [f"{k}={round(v, 4) if isinstance(v, float) else v}" for k, v in shown.items()]
    body.append(printable(f"\n\nanswer={record.get('final_answer')!r}{gold}\n"), style="bold")
    body.append(printable("  ".join(scores)), style="bold")
    body.append(turn_line(record), style="cyan")
    return body


def turn_line(record: dict[str, Any]) -> str:
    """Per-turn rewards (and advantages, when a turn-level estimator set them), one entry per model turn."""
    rewards, advantages = record.get("turn_rewards"), record.get("turn_advantages")
    if not rewards and not advantages:
        return ""
    turns = max(len(rewards or []), len(advantages or []))
    parts = []
    for k in range(turns):
        part = f"{k + 1}:"
        if rewards and k < len(rewards):
            part += f" r={round(rewards[k], 4)}"
        if advantages and k < len(advantages):
            part += f" A={round(advantages[k], 4)}"
        parts.append(part)
    return "\nturns  " + "  ".join(parts)
