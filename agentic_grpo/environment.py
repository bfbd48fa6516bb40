"""The tool-environment contract: a small class whose public methods are the tools.

A user subclasses `ToolEnvironment`, writes typed, documented methods (the
transformers `get_json_schema` convention, as TRL does), and optionally `reset(row)`.
The rollout manager creates one instance per trajectory, so per-trajectory state lives
on the instance. `execute` is the one place a call meets the tool: unknown tools, bad
arguments, exceptions and timeouts all come back as a `ToolResult`, never a raise.

Tools that run code set `needs_sandbox = True`; the rollout manager then hands the
instance a fresh sandbox slot (`self.sandbox`) and a private workspace. Pure tools
run in the trainer's process in a worker thread under the wall timeout.

What a call returns is bounded. A pure tool runs in a thread of the trainer's process, where `print` writes to
the one `sys.stdout` every thread shares (a tool that printed 10 MB made a 20 MB log): `captured_output()` routes
what the calling thread writes to `sys.stdout` and `sys.stderr` into a buffer of its own, which keeps the first
`limit` characters and counts the rest; every other thread still writes to the console. (Code tools run in a
sandboxed process whose output is piped and bounded by the sandbox.) The observation the model reads is then cut
to `max_tool_output_tokens` (`truncate_tool_output`).
"""

from __future__ import annotations

import contextlib
import copy
import difflib
import functools
import inspect
import sys
import threading
import time
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

from agentic_grpo.trajectory import ToolCall, ToolResult

RESERVED = {"reset", "close", "execute", "tools", "tool_schemas", "wait_idle", "pay", "state_hash", "take_payments"}
# How long after a code tool's own (sandbox) deadline the caller stops waiting for it.
SANDBOX_GRACE_S = 5.0
_JSON_TYPES = {"string": str, "integer": int, "number": (int, float), "boolean": bool, "array": list, "object": dict}


class ToolEnvironment:
    """Base class for tool environments; every public method is a tool.

    Attributes set by the rollout manager before `reset`:
        workspace: a fresh private directory for this trajectory (or None).
        sandbox: a sandbox slot when the class sets `needs_sandbox = True`; it owns the deadline of the code
            it runs (the recipe's `tool_timeout`).
    """

    needs_sandbox: ClassVar[bool] = False

    def __init__(self) -> None:
        self.workspace: Path | None = None
        self.sandbox: Any = None
        self._workers: list[threading.Thread] = []

    def pay(self, fact: Any, amount: float) -> bool:
        """Pay `amount` to the turn whose tool call is running, once per `fact` per trajectory; True when paid.

        Call it from a tool, e.g. `self.pay(("value", 408), 0.5)` when the call produced a new correct
        intermediate value. A fact already paid earns nothing, so a turn cannot be farmed by repeating it.
        """
        key = str(fact)
        paid = self.__dict__.setdefault("_paid", set())  # set here: a subclass may skip our __init__
        if key in paid:
            return False
        paid.add(key)
        self.__dict__.setdefault("_payments", []).append((key, float(amount)))
        return True

    def take_payments(self) -> list[tuple[str, float]]:
        """The (fact, amount) pairs paid since the last call (the rollout manager books them to the turn)."""
        return self.__dict__.pop("_payments", [])

    def state_hash(self) -> str | None:
        """A string naming the environment's state now, for the `anchor` advantage (override to enable it).

        Turns of the same group taken from equal states are compared with each other, so the hash should
        hold what matters for what comes next (e.g. the set of values verified so far) and nothing else.
        None (the default) means the environment defines no state.
        """
        return None

    def reset(self, row: dict[str, Any]) -> None:
        """Prepare for a new trajectory on dataset row `row` (override to keep state)."""

    def close(self) -> None:
        """Release what `reset` took (override when needed)."""

    @classmethod
    def tools(cls) -> dict[str, typing.Callable]:
        """The tool methods by name: public, defined on a subclass, not lifecycle hooks."""
        found = {}
        for klass in reversed(cls.__mro__):
            if klass in (ToolEnvironment, object):
                continue
            for name, member in vars(klass).items():
                if name.startswith("_") or name in RESERVED or not inspect.isfunction(member):
                    continue
                found[name] = member
        return found

    @classmethod
    def tool_schemas(cls) -> list[dict[str, Any]]:
        """JSON schemas of the tools, from type hints and Google-style docstrings (a copy the caller may change)."""
        return copy.deepcopy(list(_schemas_of(cls).values()))

    def execute(self, call: ToolCall, timeout: float) -> ToolResult:
        """Run one call; every failure becomes a `ToolResult` the model can read.

        A pure tool gets `timeout` seconds. A code tool's deadline belongs to its sandbox slot alone
        (`self.sandbox.timeout_s`), which kills the process tree and returns what the code printed; here it
        only gets a safety net `SANDBOX_GRACE_S` after that deadline, for a sandbox that does not answer.
        """
        start = time.perf_counter()
        tools = self.tools()
        if call.name not in tools:
            known = ", ".join(sorted(tools)) or "none"
            guess = closest_tool_name(call.name, list(tools))
            hint = f" Did you mean `{guess}`?" if guess else ""
            # The hint comes first: a long tool list is what a token budget cuts (in the middle).
            return _failed(f"Error: unknown tool `{call.name}`.{hint} Available tools: {known}.", start)
        problem = check_arguments(_schemas_of(type(self))[call.name], call.arguments)
        if problem:
            return _failed(f"Error: bad arguments for `{call.name}`: {problem}", start)

        outcome: dict[str, Any] = {}

        def run() -> None:
            with captured_output() as printed:  # a tool's own printing: kept off the console, bounded
                try:
                    outcome["value"] = getattr(self, call.name)(**call.arguments)
                except Exception as exc:  # noqa: BLE001 - a tool's exception is an observation, not a crash
                    outcome["error"] = f"{type(exc).__name__}: {exc}"
            outcome["printed"] = printed.text()

        # A daemon thread, because a pure tool that hangs cannot be killed from Python; code
        # that could hang for real runs in the sandbox, whose timeout kills the process tree.
        worker = threading.Thread(target=run, daemon=True, name=f"tool-{call.name}")
        self._workers = [w for w in self._workers if w.is_alive()] + [worker]
        worker.start()
        if self.needs_sandbox and self.sandbox is not None:
            timeout = self.sandbox.timeout_s  # reported below if even the safety net fires
            worker.join(timeout + SANDBOX_GRACE_S)
        else:
            worker.join(timeout)
        if worker.is_alive():
            return ToolResult(
                output=f"Error: `{call.name}` timed out after {timeout:g} s.",
                error="timeout",
                timed_out=True,
                seconds=time.perf_counter() - start,
            )
        if "error" in outcome:
            result = _failed(f"Error: {outcome['error']}", start)
        elif isinstance(outcome.get("value"), ToolResult):
            result = outcome["value"]
            result.seconds = result.seconds or time.perf_counter() - start
        else:
            value = outcome.get("value")
            result = ToolResult(output="" if value is None else str(value), seconds=time.perf_counter() - start)
        result.printed = result.printed or outcome.get("printed", "")  # unset if the tool raised past `Exception`
        return result

    def wait_idle(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for calls still running (past their guard); True once none is."""
        deadline = time.monotonic() + timeout
        for worker in self._workers:
            worker.join(max(0.0, deadline - time.monotonic()))
        self._workers = [w for w in self._workers if w.is_alive()]
        return not self._workers


@functools.cache
def _schemas_of(cls: type[ToolEnvironment]) -> dict[str, dict[str, Any]]:
    """Tool name -> JSON schema, built once per class: `execute` checks every call against it. A tool function
    with a `tool_schema` attribute gives its schema as is."""
    from transformers.utils import get_json_schema  # here, not at import: `agentic-grpo sandbox exec` starts fast

    schemas = {}
    for name, fn in cls.tools().items():
        if hasattr(fn, "tool_schema"):  # a tool that brings its own schema: an MCP server's (mcp_environment)
            schemas[name] = copy.deepcopy(fn.tool_schema)
            continue
        try:
            schema = get_json_schema(fn)
        except Exception as exc:  # noqa: BLE001 - re-raised with the tool named
            raise TypeError(
                f"tool `{cls.__name__}.{name}` needs type hints on every argument and a Google-style "
                f"docstring with an `Args:` entry per argument: {exc}"
            ) from exc
        schema["function"]["parameters"]["properties"].pop("self", None)
        schemas[name] = schema
    return schemas


def closest_tool_name(name: str, tools: list[str]) -> str | None:
    """The tool a misspelt or made-up name most likely meant (`conversion` -> `convert_units`), or None.

    A tool whose name contains the word, or is contained in it, wins (`date` -> `date_calculator`); then the
    most similar name by `difflib`, if similar enough.
    """
    word = name.strip().lower()
    if not word:
        return None
    contains = [t for t in tools if word in t.lower() or t.lower() in word]
    if len(contains) == 1:
        return contains[0]
    close = difflib.get_close_matches(word, contains or tools, n=1, cutoff=0.5)
    return close[0] if close else None


def _failed(message: str, start: float) -> ToolResult:
    return ToolResult(output=message, error=message, seconds=time.perf_counter() - start)


def check_arguments(schema: dict[str, Any], arguments: Any) -> str | None:
    """Why `arguments` does not fit the tool's JSON schema, or None when it does."""
    if not isinstance(arguments, dict):
        return f"expected a JSON object, got {type(arguments).__name__}"
    params = schema["function"]["parameters"]
    properties = params.get("properties", {})
    missing = [k for k in params.get("required", []) if k not in arguments]
    if missing:
        return f"missing {', '.join(missing)}; expected {sorted(properties)}"
    unknown = [k for k in arguments if k not in properties]
    if unknown and not params.get("additionalProperties"):  # a schema may take keys it does not list (MCP servers')
        return f"unknown {', '.join(unknown)}; expected {sorted(properties)}"
    for key, value in arguments.items():
        expected = _JSON_TYPES.get(properties.get(key, {}).get("type", ""))
        if expected and (not isinstance(value, expected) or (expected is not bool and isinstance(value, bool))):
            return f"`{key}` should be {properties[key]['type']}, got {type(value).__name__}"
    return None


PRINTED_LIMIT = 4_000  # characters of a call's own printing kept (the trajectory file holds them)

_calls = threading.local()


class PrintedText:
    """The first `limit` characters written, and how many more there were."""

    def __init__(self, limit: int) -> None:
        self.limit, self.parts, self.kept, self.dropped = limit, [], 0, 0

    def add(self, text: str) -> None:
        room = max(0, self.limit - self.kept)
        self.parts.append(text[:room])
        self.kept += min(room, len(text))
        self.dropped += max(0, len(text) - room)

    def text(self) -> str:
        more = f"\n[... {self.dropped} more characters]" if self.dropped else ""
        return "".join(self.parts) + more


class RoutedStream:
    """A stand-in for `sys.stdout`/`sys.stderr`: a thread inside `captured_output()` writes to its buffer, any
    other thread to the stream it replaced."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        printed = getattr(_calls, "printed", None)
        if printed is None:
            return self.stream.write(text)
        printed.add(text)
        return len(text)

    def flush(self) -> None:
        if getattr(_calls, "printed", None) is None:
            self.stream.flush()

    def __getattr__(self, name: str) -> Any:  # fileno, isatty, encoding, ...: the real stream's
        return getattr(self.stream, name)


def _route(name: str) -> None:
    stream = getattr(sys, name)
    if not isinstance(stream, RoutedStream):  # installed once (again if someone replaced it since)
        setattr(sys, name, RoutedStream(stream))


@contextlib.contextmanager
def captured_output(limit: int = PRINTED_LIMIT) -> Iterator[PrintedText]:
    """What this thread prints (stdout and stderr) inside the block, into the `PrintedText` it yields."""
    _route("stdout")
    _route("stderr")
    _calls.printed = printed = PrintedText(limit)
    try:
        yield printed
    finally:
        _calls.printed = None


# --- truncation -----------------------------------------------------------------------------------
# Token-level handling of tool output: never let it be read as special tokens, and cut it to a budget.
#
# Tool output is text the model did not write and may be hostile: tokenized with
# `split_special_tokens=True`, a literal `<|im_end|>` in it stays text and cannot end
# the model's turn or forge a chat role. Long output keeps its head and tail (where
# errors and results usually are) around a marker that says how much was cut.


def encode_untrusted(tokenizer: Any, text: str) -> list[int]:
    """Token ids of `text` with special-token strings kept as plain text."""
    return tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]


def truncate_tool_output(text: str, tokenizer: Any, max_tokens: int) -> tuple[str, bool]:
    """`text` cut to at most `max_tokens` tokens (head + marker + tail); returns (text, was_truncated)."""
    ids = encode_untrusted(tokenizer, text)
    if len(ids) <= max_tokens:
        return text, False
    marker = f"\n[... {len(ids)} tokens, middle cut ...]\n"
    # Re-tokenizing at the two seams can merge or split a token or two; keep a margin.
    keep = max(0, max_tokens - len(encode_untrusted(tokenizer, marker)) - 4)
    head, tail = keep - keep // 2, keep // 2
    cut = tokenizer.decode(ids[:head]) + marker + (tokenizer.decode(ids[-tail:]) if tail else "")
    while len(encode_untrusted(tokenizer, cut)) > max_tokens and (head or tail):
        head, tail = max(0, head - 1), max(0, tail - 1)
        cut = tokenizer.decode(ids[:head]) + marker + (tokenizer.decode(ids[-tail:]) if tail else "")
    if len(encode_untrusted(tokenizer, cut)) <= max_tokens:
        return cut, True
    # A budget smaller than the marker: the head alone, as much of it as fits (the flag says it was cut).
    keep = max_tokens
    cut = tokenizer.decode(ids[:keep])
    while keep and len(encode_untrusted(tokenizer, cut)) > max_tokens:
        keep -= 1
        cut = tokenizer.decode(ids[:keep])
    return cut, True
