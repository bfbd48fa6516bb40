"""Native chat-template tool calls, Hermes / Qwen2.5 style: `<tool_call>{"name": ..., "arguments": ...}</tool_call>`.

Models tuned for function calling (Qwen2.5-Instruct, Hermes, ...) already speak this
format: the system prompt lists the tools' JSON schemas inside `<tools>`, the model
answers with one or more `<tool_call>` blocks and ends its turn, and each result comes
back as `<tool_response>` in the next user turn, which is what Qwen2.5's own template
renders for a `tool` message. A turn without a tool call is the final answer. Several
calls in one turn are read; the first is run (the rest are reported to the model).
"""

from __future__ import annotations

import json
import re
from typing import Any

from agentic_grpo.formats import FinalAnswer, Malformed, Parsed
from agentic_grpo.trajectory import ToolCall, ToolResult

DEFAULT_INSTRUCTIONS = """You are a helpful assistant.

# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{tools}
</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> \
XML tags:
<tool_call>
{{"name": <function-name>, "arguments": <args-json-object>}}
</tool_call>
When you have the answer, reply with it and no tool call."""

_CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)


class ToolCallFormat:
    """Hermes / Qwen `<tool_call>` JSON format.

    Args:
        tool_schemas: JSON schemas of the environment's tools.
        instructions: system prompt template with a `{tools}` placeholder (one JSON schema per line).
        answer_pattern: optional regex whose first group extracts the answer from the final message
            (default: the whole message).
    """

    stop: list[str] = []  # the model ends its turn (EOS) after its calls
    response_prefix = ""

    def __init__(
        self, tool_schemas: list[dict[str, Any]], instructions: str | None = None, answer_pattern: str | None = None
    ) -> None:
        self.tool_schemas = tool_schemas
        self.instructions = instructions or DEFAULT_INSTRUCTIONS
        if "{tools}" not in self.instructions:
            raise ValueError("tool-call format instructions need a {tools} placeholder")
        self.answer_pattern = re.compile(answer_pattern, re.DOTALL) if answer_pattern else None

    def system_prompt(self, tool_schemas: list[dict[str, Any]] | None = None) -> str:
        schemas = tool_schemas or self.tool_schemas
        return self.instructions.format(tools="\n".join(json.dumps(s) for s in schemas))

    def prompt_messages(self, question: str) -> list[dict[str, str]]:
        return [{"role": "system", "content": self.system_prompt()}, {"role": "user", "content": question}]

    def parse(self, text: str) -> Parsed:
        try:
            blocks = _CALL.findall(text)
            if not blocks:
                answer = text.strip()
                if self.answer_pattern:
                    found = self.answer_pattern.search(answer)
                    answer = found.group(1).strip() if found else ""
                return FinalAnswer(answer) if answer else Malformed("reply with a <tool_call> or with the answer")
            try:
                call = json.loads(blocks[0])
            except json.JSONDecodeError:
                return Malformed('a <tool_call> must hold JSON: {"name": ..., "arguments": {...}}')
            if not isinstance(call, dict) or not isinstance(call.get("name"), str):
                return Malformed('a <tool_call> needs a "name" string and an "arguments" object')
            arguments = call.get("arguments", {})
            if isinstance(arguments, str):  # some models double-encode the arguments
                try:
                    arguments = json.loads(arguments)
                except json.JSONDecodeError:
                    return Malformed('"arguments" must be a JSON object')
            if not isinstance(arguments, dict):
                return Malformed('"arguments" must be a JSON object')
            return ToolCall(call["name"], arguments, raw_text=blocks[0])
        except Exception as exc:  # noqa: BLE001 - the contract is "never raises"
            return Malformed(f"could not read your answer ({type(exc).__name__})")

    def closes_call(self, text: str) -> bool:
        return text.rstrip().endswith("</tool_call>")

    def render_observation(self, result: ToolResult, after_stop: bool) -> str:
        return f"<tool_response>\n{result.output}\n</tool_response>"
