"""Token-level handling of tool output: never let it be read as special tokens, and cut it to a budget.

Tool output is text the model did not write and may be hostile: tokenized with
`split_special_tokens=True`, a literal `<|im_end|>` in it stays text and cannot end
the model's turn or forge a chat role. Long output keeps its head and tail (where
errors and results usually are) around a marker that says how much was cut.
"""

from __future__ import annotations

from typing import Any


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
