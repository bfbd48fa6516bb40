"""The rollout manager: G multi-turn tool-use trajectories per query, all live ones at once.

This is the piece no library gives us: TRL's own tool loop re-renders each turn through
the chat template and runs tools in the trainer's process. Here each turn is one batched
`generate` over every live trajectory of the batch; the turn's tool calls run
concurrently, each trajectory in its own environment (and sandbox slot, for code);
tool output is cut to a token budget and appended as a segment that is never trained
on. The ids the model sampled are the ids trained on.

It plugs into TRL as `rollout_func` and returns `env_mask` (1 = model token), which
TRL multiplies into the loss mask.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from agentic_grpo.backends import GenerationBackend
from agentic_grpo.environment import ToolEnvironment
from agentic_grpo.formats import FinalAnswer, Malformed, TrajectoryFormat
from agentic_grpo.trajectory import Segment, ToolCall, ToolResult, Trajectory
from agentic_grpo.truncation import encode_untrusted, truncate_tool_output


@dataclass
class RolloutLimits:
    """The budgets of one trajectory (see `AgenticGRPOConfig` for each field's meaning)."""

    max_turns: int = 6
    max_tokens_per_turn: int = 256
    max_completion_tokens: int = 1024
    max_tool_output_tokens: int = 256
    tool_timeout: float = 10.0
    tool_workers: int = 16

    @classmethod
    def from_config(cls, config: Any) -> RolloutLimits:
        """The limits an `AgenticGRPOConfig` sets (its `max_completion_length` is the trajectory budget)."""
        return cls(
            max_turns=config.max_turns,
            max_tokens_per_turn=config.max_tokens_per_turn,
            max_completion_tokens=config.max_completion_length,
            max_tool_output_tokens=config.max_tool_output_tokens,
            tool_timeout=config.tool_timeout,
            tool_workers=config.tool_workers,
        )


@dataclass
class RolloutStats:
    """Wall time of one rollout call, split into generation and tools."""

    generation_seconds: float = 0.0
    tool_seconds: float = 0.0
    turns: int = 0


class RolloutManager:
    """Runs the turn loop for a batch of prompts.

    Args:
        environment_factory: builds one fresh `ToolEnvironment` per trajectory.
        trajectory_format: describes tools, parses turns, renders observations.
        tokenizer: the policy's tokenizer (chat template included).
        limits: turn, token and time budgets.
        sandbox_pool: hands out one slot per trajectory when the environment needs one.
    """

    def __init__(
        self,
        environment_factory: Callable[[], ToolEnvironment],
        trajectory_format: TrajectoryFormat,
        tokenizer: Any,
        limits: RolloutLimits,
        sandbox_pool: Any = None,
    ) -> None:
        self.environment_factory = environment_factory
        self.format = trajectory_format
        self.tokenizer = tokenizer
        self.limits = limits
        self.sandbox_pool = sandbox_pool
        self._wrapper = user_turn_wrapper(tokenizer)
        self._executor = ThreadPoolExecutor(max_workers=limits.tool_workers, thread_name_prefix="tools")

    def rollout(
        self, prompts: list[Any], rows: list[dict[str, Any]], backend: GenerationBackend
    ) -> tuple[list[Trajectory], RolloutStats]:
        """One trajectory per prompt (prompts arrive already repeated G times per query)."""
        stats = RolloutStats()
        trajectories = [self._start(prompt) for prompt in prompts]
        environments: list[tuple[ToolEnvironment, Any]] = []
        try:
            for row in rows:
                environments.append(self._open_environment(row))
            for _ in range(self.limits.max_turns):
                live = [i for i, t in enumerate(trajectories) if t.finish_reason == "running"]
                if not live:
                    break
                stats.turns += 1
                calls = self._model_turn(trajectories, live, backend, stats)
                self._tool_turn(trajectories, environments, calls, stats)
            for t in trajectories:
                if t.finish_reason == "running":
                    t.finish_reason = "max_turns"
        finally:
            for environment, slot in environments:
                self._close_environment(environment, slot)
        return trajectories, stats

    def _start(self, prompt: Any) -> Trajectory:
        if isinstance(prompt, str):
            ids = self.tokenizer(prompt, add_special_tokens=False)["input_ids"]
        else:
            ids = self.tokenizer.apply_chat_template(
                prompt, add_generation_prompt=True, tokenize=True, return_dict=False
            )
        prefix = getattr(self.format, "response_prefix", "")
        if prefix:  # the answer's opening words belong to the prompt: given, not trained
            ids = list(ids) + self.tokenizer(prefix, add_special_tokens=False)["input_ids"]
        return Trajectory(prompt=prompt, segments=[Segment("prompt", list(ids), self.tokenizer.decode(ids))])

    def _model_turn(
        self, trajectories: list[Trajectory], live: list[int], backend: GenerationBackend, stats: RolloutStats
    ) -> dict[int, tuple[ToolCall | Malformed, str]]:
        """Generate one turn for every live trajectory; return the calls (or parse errors) to answer."""
        room = {i: self.limits.max_completion_tokens - len(trajectories[i].completion_ids) for i in live}
        max_new = min(self.limits.max_tokens_per_turn, max(room.values()))
        start = time.perf_counter()
        generations = backend.generate(
            [trajectories[i].prompt_ids + trajectories[i].completion_ids for i in live], self.format.stop, max_new
        )
        stats.generation_seconds += time.perf_counter() - start

        calls: dict[int, tuple[ToolCall | Malformed, str]] = {}
        for i, generation in zip(live, generations, strict=True):
            trajectory = trajectories[i]
            tokens = generation.token_ids[: room[i]]
            stop_reason = generation.stop_reason if len(tokens) == len(generation.token_ids) else "length"
            trajectory.segments.append(Segment("model", tokens, self.tokenizer.decode(tokens)))
            trajectory.turns += 1
            if stop_reason == "length":
                # A turn cut by a token budget is unfinished text: its "answer" may be a cut number
                # ("77" of "77,750") and its code a cut block. Neither is acted on; the trajectory ends.
                trajectory.finish_reason = "length"
                continue
            parsed = self.format.parse(self.tokenizer.decode(tokens, skip_special_tokens=True))
            if isinstance(parsed, FinalAnswer):
                trajectory.final_answer = parsed.answer
                trajectory.finish_reason = "final_answer"
            elif len(trajectory.completion_ids) >= self.limits.max_completion_tokens:
                trajectory.finish_reason = "length"
            else:
                if isinstance(parsed, Malformed):
                    trajectory.malformed_turns += 1
                calls[i] = (parsed, stop_reason)
        return calls

    def _tool_turn(
        self,
        trajectories: list[Trajectory],
        environments: list[tuple[ToolEnvironment, Any]],
        calls: dict[int, tuple[ToolCall | Malformed, str]],
        stats: RolloutStats,
    ) -> None:
        """Run this turn's calls concurrently and append each observation as a non-trainable segment."""
        start = time.perf_counter()
        futures = {
            i: self._executor.submit(environments[i][0].execute, call)
            for i, (call, _) in calls.items()
            if isinstance(call, ToolCall)
        }
        for i, (call, stop_reason) in calls.items():
            trajectory = trajectories[i]
            if isinstance(call, ToolCall):
                result = futures[i].result()
                result.output, cut = truncate_tool_output(
                    result.output, self.tokenizer, self.limits.max_tool_output_tokens
                )
                result.truncated = result.truncated or cut
                trajectory.tool_calls.append((call, result))
            else:
                result = ToolResult(output=f"Error: {call.reason}.", error=call.reason)
            text, ids = self._observation(result, stop_reason)
            if len(trajectory.completion_ids) + len(ids) >= self.limits.max_completion_tokens:
                trajectory.finish_reason = "length"
                continue
            trajectory.segments.append(Segment("tool", ids, text))
        stats.tool_seconds += time.perf_counter() - start

    def _observation(self, result: ToolResult, stop_reason: str) -> tuple[str, list[int]]:
        body = self.format.render_observation(result, after_stop=stop_reason == "stop")
        if stop_reason != "eos":
            return body, encode_untrusted(self.tokenizer, body)
        # The model closed its chat turn: the observation arrives as a user turn and the
        # next assistant turn is opened, with the template's own markers.
        prefix, suffix = self._wrapper
        body = body.strip()
        ids = (
            self.tokenizer(prefix, add_special_tokens=False)["input_ids"]
            + encode_untrusted(self.tokenizer, body)
            + self.tokenizer(suffix, add_special_tokens=False)["input_ids"]
        )
        return prefix + body + suffix, ids

    def _open_environment(self, row: dict[str, Any]) -> tuple[ToolEnvironment, Any]:
        environment = self.environment_factory()
        environment.tool_timeout = self.limits.tool_timeout
        slot = None
        if environment.needs_sandbox:
            if self.sandbox_pool is None:
                raise RuntimeError(f"{type(environment).__name__} runs code and needs a sandbox pool")
            slot = self.sandbox_pool.acquire()
            environment.sandbox, environment.workspace = slot, slot.workspace
        try:
            environment.reset(row)
        except Exception:
            self._close_environment(environment, slot)
            raise
        return environment, slot

    def _close_environment(self, environment: ToolEnvironment, slot: Any) -> None:
        try:
            environment.close()
        finally:
            if slot is not None:
                self.sandbox_pool.release(slot)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


def user_turn_wrapper(tokenizer: Any) -> tuple[str, str]:
    """Text before and after a user message that follows a closed assistant turn, from the chat template.

    Rendered once on a dummy conversation; used only for observations after the model
    emitted EOS. Falls back to plain newlines for tokenizers without a chat template.
    """
    reply, question = "AGRPO_REPLY_SENTINEL", "AGRPO_USER_SENTINEL"
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": reply},
        {"role": "user", "content": question},
    ]
    try:
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    except Exception:  # noqa: BLE001 - no usable template: plain text is the honest fallback
        return "\n", "\n"
    after = text[text.index(reply) + len(reply) :]
    eos = tokenizer.eos_token or ""
    if eos and after.startswith(eos):
        after = after[len(eos) :]
    prefix, _, suffix = after.partition(question)
    return prefix, suffix
