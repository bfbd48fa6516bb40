"""The token round-trip canary: at start-up, the rollout's tokens of a scripted trajectory against the template's.

A rollout builds a trajectory's token ids a piece at a time: the prompt through the chat template with its
generation prompt, each model turn as sampled, each observation through the format (after a turn that ended
on EOS, wrapped as a user turn with the template's own markers, `rollout.user_turn_wrapper`). The model
meets the same conversation, outside training, rendered whole by its chat template. Where the two differ (a
template whose turns end with a token that does not stop generation, a wrapper read wrong from an unusual
template, a response prefix out of place), the policy is trained on token sequences it will never see, and
nothing fails.

`check_token_round_trip` renders one scripted trajectory (a tool call, its observation, a final answer) in
the recipe's format both ways and refuses to start when they differ, naming the first differing token and
the turn it is in. Formats it cannot script (other than react, artist and tool_call, or subclasses of them)
are not checked, and it says so.
"""

from __future__ import annotations

import logging
from typing import Any

from agentic_grpo.canaries import CanaryError
from agentic_grpo.trajectory import ToolResult

logger = logging.getLogger(__name__)

QUESTION = "What is 12 * 34?"
CALL = ("calculator", {"expression": "12 * 34"})
OBSERVATION = "408"
ANSWER = "408"


def end_of_turn_token(manager: Any, tokenizer: Any) -> int:
    """The token the chat template ends an assistant turn with (the tokenizer's EOS without a template)."""
    prefix, _ = manager.user_turn
    ids = tokenizer(prefix, add_special_tokens=False)["input_ids"] if prefix.strip() else []
    return ids[0] if ids else tokenizer.eos_token_id


def scripted_turns(trajectory_format: Any) -> tuple[str, str] | None:
    """A tool-call turn and a final-answer turn in `trajectory_format`, or None when it cannot be scripted."""
    from agentic_grpo.audit.probes import ProbeWriter

    try:
        writer = ProbeWriter("", trajectory_format)
        call, answer = writer.thought("I multiply.") + writer.call(*CALL), writer.answer(ANSWER)
    except ValueError:
        return None
    prefix = getattr(trajectory_format, "response_prefix", "") or ""
    return (call[len(prefix) :] if prefix and call.startswith(prefix) else call), answer  # the prompt wrote it


def rollout_tokens(
    manager: Any, tokenizer: Any, end: int, turns: tuple[str, str]
) -> tuple[list[int], list[tuple[int, str]]]:
    """The scripted trajectory's ids as the rollout builds them, with where each piece starts and what it is."""
    call, answer = turns
    stops = manager.format.stop
    ids = list(manager.start(manager.format.prompt_messages(QUESTION)).prompt_ids)
    spans = [(0, "the prompt")]
    call_ids = tokenizer(call, add_special_tokens=False)["input_ids"]
    stop_reason = "stop" if any(call.endswith(s) for s in stops) else "eos"
    if stop_reason == "eos":
        call_ids = call_ids + [end]
    spans.append((len(ids), "turn 1 (the model's tool call)"))
    ids += call_ids
    _, observation = manager.observation(ToolResult(OBSERVATION), stop_reason, call_ids[-1:])
    spans.append((len(ids), "turn 1 (the observation)"))
    ids += observation
    spans.append((len(ids), "turn 2 (the model's answer)"))
    ids += tokenizer(answer, add_special_tokens=False)["input_ids"] + [end]
    return ids, spans


def template_tokens(manager: Any, tokenizer: Any, turns: tuple[str, str]) -> list[int]:
    """The same conversation rendered whole by the chat template: an EOS-ended format's observation is a user
    turn; a format that stops on a string keeps the whole exchange in one assistant message."""
    call, answer = turns
    fmt = manager.format
    prefix = getattr(fmt, "response_prefix", "") or ""
    messages = list(fmt.prompt_messages(QUESTION))
    if any(call.endswith(s) for s in fmt.stop):
        observation = fmt.render_observation(ToolResult(OBSERVATION), after_stop=True)
        messages.append({"role": "assistant", "content": prefix + call + observation + answer})
    else:
        observation = fmt.render_observation(ToolResult(OBSERVATION), after_stop=False).strip()
        messages += [
            {"role": "assistant", "content": prefix + call},
            {"role": "user", "content": observation},
            {"role": "assistant", "content": answer},
        ]
    return list(tokenizer.apply_chat_template(messages, tokenize=True, return_dict=False))


def check_token_round_trip(manager: Any, tokenizer: Any, eos_token_ids: list[int]) -> None:
    """Raise `CanaryError` when the rollout's tokens of the scripted trajectory are not the template's."""
    if not getattr(tokenizer, "chat_template", None):
        return  # no template to disagree with: prompts and observations are plain text
    turns = scripted_turns(manager.format)
    if turns is None:
        logger.info("token round-trip not checked: format %s cannot be scripted", type(manager.format).__name__)
        return
    end = end_of_turn_token(manager, tokenizer)
    if end not in eos_token_ids:
        raise CanaryError(
            f"canary: the chat template ends an assistant turn with {tokenizer.decode([end])!r} (id {end}), which "
            f"does not stop generation (the EOS ids are {eos_token_ids}: "
            f"{[tokenizer.decode([t]) for t in eos_token_ids]}): the model's turns would not end where the template "
            "ends them. Add that token to the generation config's `eos_token_id`, or use a template that ends "
            "turns with an EOS token."
        )
    ours, spans = rollout_tokens(manager, tokenizer, end, turns)
    theirs = template_tokens(manager, tokenizer, turns)
    # The template may write text after the last turn's end (a newline); the trajectory ends at its EOS.
    at = next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b), None)
    if at is None and len(theirs) >= len(ours):
        return
    at = min(len(ours), len(theirs)) if at is None else at
    where = next(what for start, what in reversed(spans) if start <= at)

    def shown(ids: list[int]) -> str:
        return repr(tokenizer.decode(ids[at : at + 8])) if at < len(ids) else "(the end)"

    raise CanaryError(
        f"canary: the rollout tokenizes a scripted trajectory in format `{type(manager.format).__name__}` "
        f"differently from the chat template rendering the same conversation, from token {at}, in {where}: the "
        f"rollout has {shown(ours)}, the template {shown(theirs)} (before it: "
        f"{tokenizer.decode(ours[max(0, at - 12) : at])!r}). The policy would be trained on token sequences it "
        "never meets outside training. Likely: a chat template that renders turns other than as written (check "
        "its assistant and user turns), or a format whose response prefix or observations do not fit it."
    )
