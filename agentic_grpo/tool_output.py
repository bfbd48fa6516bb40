"""What a tool's own code prints, kept off the trainer's console: captured per call, and bounded.

A pure tool runs in a thread of the trainer's process, where `print` writes to the one `sys.stdout` every thread
shares; a tool that printed 10 MB made a 20 MB log. `captured_output()` routes what the calling thread writes to
`sys.stdout` and `sys.stderr` into a buffer of its own, which keeps the first `limit` characters and counts the
rest; every other thread still writes to the console. (Code tools run in a sandboxed process whose output is
piped and bounded by the sandbox.)
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator
from typing import Any

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
