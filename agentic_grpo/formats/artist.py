"""The ARTIST-style tag format: `<think>`, `<python>` code, `<output>` results, `<answer>`.

As in ARTIST (agentic reasoning with tool integration): the model reasons in
`<think>`, writes code in `<python>...</python>` (generation stops at the closing tag),
the framework runs it in the sandbox and writes `<output>...</output>`, and the model
ends with `<answer>...</answer>`. Any tool with a single string argument can stand
behind `<python>` (`tool` names it); parsing never raises.
"""

from __future__ import annotations

import re
from typing import Any

from agentic_grpo.formats import FinalAnswer, Malformed, Parsed
from agentic_grpo.trajectory import ToolCall, ToolResult

DEFAULT_INSTRUCTIONS = """Solve the problem. Think inside <think> </think>. To run Python, write the code inside \
<python> </python>; its printed output comes back inside <output> </output>. You can run code several times. \
Put the final answer alone inside <answer> </answer>."""

_CODE = re.compile(r"<python>(.*?)(?:</python>|$)", re.DOTALL)
_ANSWER = re.compile(r"<answer>(.*?)(?:</answer>|$)", re.DOTALL)


class ArtistFormat:
    """Tag format for code-as-tool reasoning.

    Args:
        tool_schemas: JSON schemas of the environment's tools.
        tool: the tool that runs `<python>` blocks (default: `python`); it must take one string argument.
        instructions: the system prompt.
        response_prefix: text the answer starts with (prompt, not trained), e.g. "<think>".
    """

    stop = ["</python>"]

    def __init__(
        self,
        tool_schemas: list[dict[str, Any]],
        tool: str = "python",
        instructions: str | None = None,
        response_prefix: str = "",
    ) -> None:
        schemas = {s["function"]["name"]: s["function"] for s in tool_schemas}
        if tool not in schemas:
            raise ValueError(f"ARTIST format: the environment has no `{tool}` tool (it has {sorted(schemas)})")
        params = schemas[tool].get("parameters", {}).get("properties", {})
        if len(params) != 1:
            raise ValueError(f"ARTIST format: tool `{tool}` must take exactly one string argument")
        self.tool, self.argument = tool, next(iter(params))
        self.instructions = instructions or DEFAULT_INSTRUCTIONS
        self.response_prefix = response_prefix

    def system_prompt(self, tool_schemas: list[dict[str, Any]] | None = None) -> str:
        return self.instructions

    def prompt_messages(self, question: str) -> list[dict[str, str]]:
        return [{"role": "system", "content": self.system_prompt()}, {"role": "user", "content": question}]

    def parse(self, text: str) -> Parsed:
        try:
            code, answer = _CODE.search(text), _ANSWER.search(text)
            if answer and (not code or answer.start() < code.start()):
                value = answer.group(1).strip()
                return FinalAnswer(value) if value else Malformed("the <answer> is empty")
            if code:
                source = code.group(1).strip("\n")
                if not source.strip():
                    return Malformed("the <python> block is empty")
                return ToolCall(self.tool, {self.argument: source}, raw_text=code.group(0))
            return Malformed("write code inside <python> </python> or the answer inside <answer> </answer>")
        except Exception as exc:  # noqa: BLE001 - the contract is "never raises"
            return Malformed(f"could not read your answer ({type(exc).__name__})")

    def render_observation(self, result: ToolResult, after_stop: bool) -> str:
        return f"\n<output>\n{result.output}\n</output>\n"
