"""Plug-ins for the sub-agent tests: formats that act on whatever a random tiny model writes, and a tool.

A tiny random model never writes a well-formed ReAct call, so a test that needs real generation to drive
sub-agent calls uses `CallingFormat`: every turn is a call to one tool with the turn's text as its argument
(or, with `tool=None`, the turn's text is the final answer). Turns end at a space or a newline, which the
tiny model's byte-level tokens write within a few tokens; a turn cut by the token budget ends its
trajectory, as in every format.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from peft import LoraConfig

from agentic_grpo import ToolEnvironment
from agentic_grpo.formats import FinalAnswer
from agentic_grpo.trajectory import ToolCall, ToolResult
from tests.helpers import build_trainer
from tests.varied_rewards import distinct_characters


class CallingFormat:
    """Every turn calls `tool` with `{argument: the turn's text}`; with `tool=None` every turn is the final answer."""

    response_prefix = ""

    def __init__(
        self, tool_schemas: list[dict[str, Any]], tool: str | None = None, argument: str = "task",
        stop: list[str] | None = None,
    ) -> None:  # fmt: skip
        self.tool_schemas = tool_schemas
        self.tool = tool
        self.argument = argument
        self.stop = [" ", "\n"] if stop is None else stop

    def prompt_messages(self, question: str) -> list[dict[str, str]]:
        return [{"role": "system", "content": self.system_prompt()}, {"role": "user", "content": question}]

    def system_prompt(self, tool_schemas: list[dict[str, Any]] | None = None) -> str:
        names = [s["function"]["name"] for s in (tool_schemas or self.tool_schemas)]
        return f"Tools: {', '.join(names) or 'none'}."

    def parse(self, text: str):
        if self.tool is None:
            return FinalAnswer(text.strip() or "(nothing)")
        return ToolCall(self.tool, {self.argument: text.strip() or "(nothing)"}, text)

    def render_observation(self, result: ToolResult, after_stop: bool) -> str:
        return f" [{result.output}]\n"


class Echo(ToolEnvironment):
    """Says back what it is given."""

    def reset(self, row: dict) -> None:
        self.row = row

    def echo(self, text: str) -> str:
        """Say it back.

        Args:
            text: Anything.
        """
        return f"echo {text}"


class RecordingGenerate:
    """Wraps a model's `generate` (the real one runs) and records the rows of every call, and the adapter active."""

    def __init__(self, model: Any) -> None:
        self.inner = model.generate
        self.model = model
        self.rows: list[int] = []
        self.adapters: list[Any] = []
        model.generate = self

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.rows.append(int(kwargs["input_ids"].shape[0]))
        self.adapters.append(getattr(self.model, "active_adapter", None))
        return self.inner(*args, **kwargs)


class BrokenReset(ToolEnvironment):
    """An environment whose `reset` raises: the sub-agent's whole rollout fails before it starts."""

    def reset(self, row: dict) -> None:
        raise RuntimeError("no such city")

    def noop(self) -> str:
        """Do nothing."""
        return ""


# --- a co-training trainer (tests/test_cotraining.py, tests/test_canaries.py) ---

LORA = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)


def helper(**extra) -> dict:
    return {"name": "helper", "description": "Answers a sub-task.", "adapter": "helper", "max_turns": 1,
            "format": "tests.subagent_support:CallingFormat", "format_kwargs": {"tool": None},
            "max_tokens_per_turn": 8, "train": True, **extra}  # fmt: skip


def make_trainer(model_dir: str, out: Path, subagent: dict, **overrides) -> Any:
    """A trainer whose policy calls `subagent` at every turn, on 8 rows, with LoRA (`LORA`)."""
    settings = dict(
        environment="agentic_grpo.environment:ToolEnvironment", subagents=[subagent],
        format="tests.subagent_support:CallingFormat", format_kwargs={"tool": "helper"}, max_turns=2,
        max_tokens_per_turn=8, max_completion_length=96, max_steps=2, learning_rate=1e-2, beta=0.04, temperature=1.0,
        save_trajectories_steps=1, logging_steps=1,
    )  # fmt: skip
    if subagent.get("train"):
        settings["experimental"] = {"cotrain_subagents": True}
    settings.update(overrides)
    rows = [{"prompt": [{"role": "user", "content": f"What is {a} * 7?"}], "question": f"What is {a} * 7?"}
            for a in range(100, 108)]  # fmt: skip
    return build_trainer(model_dir, out, [distinct_characters], rows, peft_config=LORA, stepped_by_hand=False,
                         **settings)  # fmt: skip
