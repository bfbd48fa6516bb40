"""The ReAct format: Thought / Action / Action Input / Observation / Final Answer.

The model writes a thought, names a tool and gives its arguments as JSON; generation
stops at `Observation:`, the framework writes the tool's output after it, and the
model goes on until it writes `Final Answer:`. Parsing is regex-and-JSON on one
turn's text and never raises: whatever the model wrote becomes a `ToolCall`, a
`FinalAnswer` or a `Malformed` with a reason the model will read.
"""

from __future__ import annotations

import json
import re
from typing import Any

from agentic_grpo.formats import ActionChoices, FinalAnswer, Malformed, Parsed
from agentic_grpo.trajectory import ToolCall, ToolResult

DEFAULT_INSTRUCTIONS = """You solve the user's problem step by step and can use tools.

Tools:
{tools}

Answer in exactly this format:
Thought: what to do next
Action: the tool to use, one of [{tool_names}]
Action Input: the tool's arguments as a JSON object
Observation: the tool's result (written for you, never by you)
... (Thought, Action, Action Input and Observation can repeat)
Thought: I know the answer
Final Answer: the answer alone"""

_ACTION = re.compile(r"(?<![A-Za-z])Action\s*:[ \t]*([^\n]*)")
_ACTION_INPUT = re.compile(r"Action\s*Input\s*:\s*", re.IGNORECASE)
_FINAL = re.compile(r"Final\s*Answer\s*:", re.IGNORECASE)
_NEXT_MARKER = re.compile(r"\n\s*(?:Thought|Action|Observation|Final\s*Answer)\s*:", re.IGNORECASE)


class ReActFormat:
    """ReAct text format.

    Args:
        tool_schemas: JSON schemas of the tools (from `ToolEnvironment.tool_schemas()`).
        instructions: system prompt template with `{tools}` and `{tool_names}` placeholders.
        examples: worked examples appended to the system prompt (few-shot), as plain text.
        example_turns: worked examples given as earlier chat turns instead: a list of
            `{question: ..., response: ...}`, rendered as user/assistant message pairs.
        response_prefix: text the model's answer starts with (part of the prompt, never
            trained), e.g. "Thought:" to start it in the format.
        constrain_actions: after the model writes `Action:`, decoding may only go on with a tool's name
            and the `Action Input:` line (`agentic_grpo.action_choices`): the model still chooses the
            tool and writes its arguments, but cannot name a tool that does not exist or leave the
            arguments out. Transformers backends only (vLLM refuses it).
        constrain_arguments: with `constrain_actions`, the `Action Input:` line also opens the named tool's JSON
            object with its first argument's key (`{"query": "`), as function-calling servers hold arguments to
            the tool's schema; the model writes the value and the rest. A small model otherwise writes keys of
            its own (`{"date": ...}` to a tool whose argument is `query`), which the tool refuses.
    """

    stop = ["Observation:"]

    def __init__(
        self,
        tool_schemas: list[dict[str, Any]],
        instructions: str | None = None,
        examples: list[str] | None = None,
        example_turns: list[dict[str, str]] | None = None,
        response_prefix: str = "",
        constrain_actions: bool = False,
        constrain_arguments: bool = False,
    ) -> None:
        self.tool_schemas = {s["function"]["name"]: s["function"] for s in tool_schemas}
        self.instructions = instructions or DEFAULT_INSTRUCTIONS
        for placeholder in ("{tools}",):
            if placeholder not in self.instructions:
                raise ValueError(f"ReAct instructions need a {placeholder} placeholder")
        shapes = (
            "ReAct takes few-shot examples two ways: `examples`, a list of plain-text strings appended to the "
            "system prompt, or `example_turns`, a list of `{question: ..., response: ...}` mappings given as "
            "earlier chat turns"
        )
        if examples is not None and (not isinstance(examples, list) or not all(isinstance(e, str) for e in examples)):
            raise ValueError(f"format_kwargs `examples` must be a list of strings, got {examples!r:.120}. {shapes}")
        if example_turns is not None and (
            not isinstance(example_turns, list)
            or not all(isinstance(t, dict) and set(t) == {"question", "response"} for t in example_turns)
        ):
            raise ValueError(
                "format_kwargs `example_turns` must be a list of mappings with exactly `question` and `response`, "
                f"got {example_turns!r:.120}. {shapes}"
            )
        self.examples = list(examples or [])
        self.example_turns = list(example_turns or [])
        self.response_prefix = response_prefix
        if constrain_arguments and not constrain_actions:
            raise ValueError("format_kwargs `constrain_arguments` needs `constrain_actions: true`")
        self.action_choices = (
            ActionChoices(
                "Action:",
                tuple(
                    f" {name}\nAction Input:" + (f" {_arguments_opening(fn)}" if constrain_arguments else "")
                    for name, fn in self.tool_schemas.items()
                ),
                tuple(self.tool_schemas),
            )
            if constrain_actions
            else None
        )

    def prompt_messages(self, question: str) -> list[dict[str, str]]:
        """The chat that opens a trajectory: system prompt, example turns, then the question."""
        messages = [{"role": "system", "content": self.system_prompt()}]
        for turn in self.example_turns:
            messages.append({"role": "user", "content": turn["question"].strip()})
            messages.append({"role": "assistant", "content": turn["response"].strip()})
        messages.append({"role": "user", "content": question})
        return messages

    def system_prompt(self, tool_schemas: list[dict[str, Any]] | None = None) -> str:
        schemas = [s["function"] for s in tool_schemas] if tool_schemas else list(self.tool_schemas.values())
        lines = []
        for fn in schemas:
            props = fn.get("parameters", {}).get("properties", {})
            args = ", ".join(f'"{k}": {v.get("type", "any")}' for k, v in props.items())
            lines.append(f"- {fn['name']}: {fn.get('description', '').strip()} Arguments: {{{args}}}")
            for key, prop in props.items():
                if prop.get("description"):
                    lines.append(f"    {key}: {prop['description']}")
        prompt = self.instructions.format(tools="\n".join(lines), tool_names=", ".join(f["name"] for f in schemas))
        if self.examples:
            prompt += "\n\n" + "\n\n".join(f"Example:\n{e.strip()}" for e in self.examples)
        return prompt

    def parse(self, text: str) -> Parsed:
        try:
            return self._parse(text)
        except Exception as exc:  # noqa: BLE001 - the contract is "never raises"; a bug here is a malformed turn
            return Malformed(f"could not read your answer ({type(exc).__name__})")

    def _parse(self, text: str) -> Parsed:
        text = text.rstrip()
        if text.endswith(self.stop[0]):
            text = text[: -len(self.stop[0])]
        action = _ACTION.search(text)
        final = _FINAL.search(text)
        if final and (not action or final.start() < action.start()):
            answer = text[final.end() :]
            cut = _NEXT_MARKER.search(answer)
            answer = (answer[: cut.start()] if cut else answer).strip()
            return FinalAnswer(answer) if answer else Malformed("the Final Answer is empty")
        if not action:
            return Malformed('write "Action:" and "Action Input:" to use a tool, or "Final Answer:" to answer')
        name = action.group(1).strip().strip("`'\"[]() ").strip()
        if not name:
            return Malformed('"Action:" must name a tool')
        rest = text[action.end() :]
        given = _ACTION_INPUT.search(rest)
        if not given:
            return Malformed(f'"Action: {name}" needs an "Action Input:" line with the arguments as JSON')
        raw_input = rest[given.end() :]
        cut = _NEXT_MARKER.search("\n" + raw_input)
        raw_input = (raw_input[: cut.start() - 1] if cut and cut.start() > 0 else raw_input).strip()
        arguments = self._arguments(name, raw_input)
        if isinstance(arguments, Malformed):
            return arguments
        return ToolCall(name=name, arguments=arguments, raw_text=text[action.start() :].strip())

    def _arguments(self, name: str, raw: str) -> dict[str, Any] | Malformed:
        raw = raw.strip().strip("`").strip()
        if raw.startswith("json"):
            raw = raw[4:].strip()
        value: Any = None
        start = raw.find("{")
        if start >= 0:
            try:
                value, _ = json.JSONDecoder().raw_decode(raw[start:])
            except json.JSONDecodeError:
                value = None
        if isinstance(value, dict):
            return value
        # A tool with one argument may be called with the bare value: `Action Input: 12 * 7`.
        params = self.tool_schemas.get(name, {}).get("parameters", {}).get("properties", {})
        if len(params) == 1 and raw:
            ((key, prop),) = params.items()
            # Almost-JSON such as {"expression": 12 * 7}: take the value as written.
            loose = re.fullmatch(r'\{\s*"?' + re.escape(key) + r'"?\s*:\s*(.*?)\s*\}', raw, re.DOTALL)
            if loose:
                raw = loose.group(1)
            if prop.get("type") == "string":
                return {key: raw.strip("'\"")}
            try:
                return {key: json.loads(raw)}
            except json.JSONDecodeError:
                pass
        example = ", ".join(f'"{k}": ...' for k in params) if params else '"argument": ...'
        return Malformed(f"Action Input must be a JSON object like {{{example}}}")

    def closes_call(self, text: str) -> bool:
        """The turn ends with `Action Input:` and a JSON object closed by its last character: a bare value
        (`Action Input: 77`) may be cut ("77" of "77,750"), a closed object cannot."""
        given = list(_ACTION_INPUT.finditer(text))
        if not given or not _ACTION.search(text[: given[-1].start()]):
            return False
        raw = text[given[-1].end() :].strip().strip("`").strip()
        raw = raw[4:].lstrip() if raw.startswith("json") else raw
        try:
            value, end = json.JSONDecoder().raw_decode(raw)
        except json.JSONDecodeError:
            return False
        return isinstance(value, dict) and not raw[end:].strip()

    def render_observation(self, result: ToolResult, after_stop: bool) -> str:
        return f" {result.output}\n" if after_stop else f"\nObservation: {result.output}\n"


def _arguments_opening(function: dict[str, Any]) -> str:
    """The start of a call's JSON arguments up to its first argument's value: `{"query": "` for a string,
    `{"n": ` for anything else, `{}` for a tool without arguments."""
    parameters = function.get("parameters", {})
    properties = parameters.get("properties", {})
    if not properties:
        return "{}"
    key = (parameters.get("required") or list(properties))[0]
    quote = '"' if properties.get(key, {}).get("type") == "string" else ""
    return f'{{"{key}": {quote}'
