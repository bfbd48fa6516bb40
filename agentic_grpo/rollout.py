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

import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from agentic_grpo.backends import GenerationBackend
from agentic_grpo.environment import SANDBOX_GRACE_S, ToolEnvironment, encode_untrusted, truncate_tool_output
from agentic_grpo.formats import FinalAnswer, Malformed, TrajectoryFormat
from agentic_grpo.trajectory import Segment, ToolCall, ToolResult, Trajectory

logger = logging.getLogger(__name__)


def _recipe_default(name: str) -> Any:
    """A budget's one default: the recipe field's (`AgenticGRPOConfig`)."""
    from agentic_grpo.config import AgenticGRPOConfig

    return AgenticGRPOConfig.__dataclass_fields__[name].default


@dataclass
class RolloutLimits:
    """The budgets of one trajectory; each field's default and meaning is the recipe field's (`AgenticGRPOConfig`)."""

    max_turns: int = field(default_factory=lambda: _recipe_default("max_turns"))
    max_tokens_per_turn: int = field(default_factory=lambda: _recipe_default("max_tokens_per_turn"))
    max_completion_tokens: int = field(default_factory=lambda: _recipe_default("max_completion_length"))
    max_tool_output_tokens: int = field(default_factory=lambda: _recipe_default("max_tool_output_tokens"))
    tool_timeout: float = field(default_factory=lambda: _recipe_default("tool_timeout"))
    tool_workers: int = field(default_factory=lambda: _recipe_default("tool_workers"))

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
        agents: sub-agents the model can call as tools (`agentic_grpo.subagents`); each turn's calls to one
            sub-agent run as one nested, batched rollout, and each child trajectory is kept under its parent.
    """

    def __init__(
        self,
        environment_factory: Callable[[], ToolEnvironment],
        trajectory_format: TrajectoryFormat,
        tokenizer: Any,
        limits: RolloutLimits,
        sandbox_pool: Any = None,
        agents: Sequence[Any] = (),
    ) -> None:
        self.environment_factory = environment_factory
        self.format = trajectory_format
        self.tokenizer = tokenizer
        self.limits = limits
        self.sandbox_pool = sandbox_pool
        self.agents = {agent.name: agent for agent in agents}
        self.user_turn = user_turn_wrapper(tokenizer)
        self._executor: ThreadPoolExecutor | None = None

    def rollout(
        self,
        prompts: list[Any],
        rows: list[dict[str, Any]],
        backend: GenerationBackend,
        first_actions: list[str | None] | None = None,
    ) -> tuple[list[Trajectory], RolloutStats]:
        """One trajectory per prompt (prompts arrive already repeated G times per query).

        `first_actions[i]`, when given and not None, is the continuation trajectory i's first action slot takes
        (a format that constrains its slot: `agentic_grpo.action_choices`); the rest of the turn is sampled."""
        if first_actions is not None and getattr(self.format, "action_choices", None) is None:
            raise ValueError("`first_actions` hold an action slot, and this format constrains none")
        stats = RolloutStats()
        first = first_actions
        environments: list[tuple[ToolEnvironment, Any]] = []
        # A backend that keeps each trajectory's keys and values does so for this rollout only.
        session = getattr(backend, "session", contextlib.nullcontext)
        try:
            for row in rows:
                environments.append(self.open_environment(row))
            # Each prompt as the model reads it: with the text a TRL environment's `reset` returned, if any.
            trajectories = [
                self.start(with_observation(prompt, getattr(environment, "reset_observation", None)))
                for prompt, (environment, _) in zip(prompts, environments, strict=True)
            ]
            with session():
                for _ in range(self.limits.max_turns):
                    live = [i for i, t in enumerate(trajectories) if t.finish_reason == "running"]
                    if not turn_is_due(backend, len(live)):
                        break
                    if not live:  # other processes still generate, in collectives this one must join
                        backend.idle_turn(self.limits.max_tokens_per_turn)
                        continue
                    stats.turns += 1
                    for i in live:  # the state each turn's action is taken from (the `anchor` advantage groups by it)
                        trajectories[i].turn_states.append(environments[i][0].state_hash())
                    assigned = [first[i] for i in live] if first is not None and stats.turns == 1 else None
                    calls = self._model_turn(trajectories, live, backend, stats, assigned)
                    self._tool_turn(trajectories, environments, calls, stats, rows, backend)
                    for i in live:
                        self.book_payments(trajectories[i], environments[i][0])
            for t in trajectories:
                if t.finish_reason == "running":
                    t.finish_reason = "max_turns"
            for t, (environment, _) in zip(trajectories, environments, strict=True):
                final_reward = getattr(environment, "final_reward", None)
                if final_reward is not None:  # what the environment pays from its own state (TRL's `get_reward`)
                    t.environment_reward = final_reward()
        finally:
            self._close_all(environments)
        return trajectories, stats

    def _close_all(self, environments: list[tuple[ToolEnvironment, Any]]) -> None:
        """Close every environment and give back every slot, whatever one `close()` raises; then raise the first."""
        failure: Exception | None = None
        for environment, slot in environments:
            try:
                self.close_environment(environment, slot)
            except Exception as exc:  # noqa: BLE001 - the rest of the batch's slots must still go back
                logger.error("closing %s raised %s: %s", type(environment).__name__, type(exc).__name__, exc)
                failure = failure or exc
        if failure is not None:
            raise failure

    def start(self, prompt: Any) -> Trajectory:
        """A trajectory holding only `prompt` (a chat or a string), tokenized as generation continues it."""
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
        self,
        trajectories: list[Trajectory],
        live: list[int],
        backend: GenerationBackend,
        stats: RolloutStats,
        assigned: list[str | None] | None = None,
    ) -> dict[int, tuple[ToolCall | Malformed, str]]:
        """Generate one turn for every live trajectory; return the calls (or parse errors) to answer."""
        room = {i: self.limits.max_completion_tokens - len(trajectories[i].completion_ids) for i in live}
        max_new = min(self.limits.max_tokens_per_turn, max(room.values()))
        start = time.perf_counter()
        generations = backend.generate(
            [trajectories[i].prompt_ids + trajectories[i].completion_ids for i in live],
            self.format.stop,
            max_new,
            choices=getattr(self.format, "action_choices", None),
            assigned=assigned,
        )
        stats.generation_seconds += time.perf_counter() - start

        calls: dict[int, tuple[ToolCall | Malformed, str]] = {}
        for i, generation in zip(live, generations, strict=True):
            trajectory = trajectories[i]
            tokens = generation.token_ids[: room[i]]
            stop_reason = generation.stop_reason if len(tokens) == len(generation.token_ids) else "length"
            logprobs = generation.logprobs[: len(tokens)] if generation.logprobs is not None else None
            trajectory.segments.append(Segment("model", tokens, self.tokenizer.decode(tokens), logprobs))
            trajectory.turns += 1
            text = self.tokenizer.decode(tokens, skip_special_tokens=True)
            parsed = self.format.parse(text)
            if stop_reason == "length":
                # A turn cut by a token budget is unfinished text: its "answer" may be a cut number
                # ("77" of "77,750") and its code a cut block. Neither is acted on; the trajectory ends.
                # Only a whole tool call that filled the budget exactly is run, as if the turn had ended.
                closes_call = getattr(self.format, "closes_call", None)
                if not (isinstance(parsed, ToolCall) and closes_call is not None and closes_call(text)):
                    trajectory.finish_reason = "length"
                    continue
                if not self.format.stop:  # an EOS-ended format: the observation opens the next chat turn
                    stop_reason = "eos"
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
        rows: list[dict[str, Any]],
        backend: GenerationBackend,
    ) -> None:
        """Run this turn's calls concurrently and append each observation as a non-trainable segment.

        Calls to sub-agents are bounded by the sub-agents' own budgets, not by `tool_timeout`.
        """
        start = time.perf_counter()
        if self._executor is None:  # started on first use, again after `close()`
            self._executor = ThreadPoolExecutor(max_workers=self.limits.tool_workers, thread_name_prefix="tools")
        delegated = None
        if self.agents:  # the sub-agents' own class runs their calls (`agentic_grpo.subagents.agent`)
            delegate = type(next(iter(self.agents.values()))).delegate
            delegated = delegate(
                self._executor, self.agents, trajectories, calls, rows, backend, self.tokenizer, self.sandbox_pool
            )
        futures = {
            i: self._executor.submit(environments[i][0].execute, call, self.limits.tool_timeout)
            for i, (call, _) in calls.items()
            if isinstance(call, ToolCall) and not (delegated is not None and i in delegated)
        }
        for i, (call, stop_reason) in calls.items():
            trajectory = trajectories[i]
            handed_to = None
            if isinstance(call, ToolCall):
                if delegated is not None and i in delegated:
                    result, child = delegated.result(i)
                    if child is not None:
                        trajectory.children.append(child)
                    if self.agents[call.name].ends_caller(child):
                        handed_to = child
                else:
                    result = futures[i].result()
                result.output, cut = truncate_tool_output(
                    result.output, self.tokenizer, self.limits.max_tool_output_tokens
                )
                result.truncated = result.truncated or cut
                trajectory.tool_calls.append((call, result))
            else:
                result = ToolResult(output=f"Error: {call.reason}.", error=call.reason)
            text, ids = self.observation(result, stop_reason, trajectory.segments[-1].token_ids[-1:])
            fits = len(trajectory.completion_ids) + len(ids) < self.limits.max_completion_tokens
            if fits:
                trajectory.segments.append(Segment("tool", ids, text))
            if handed_to is not None:  # a handoff: the sub-agent's answer is this trajectory's, and it ends here
                trajectory.final_answer = handed_to.final_answer
                trajectory.finish_reason = "final_answer"
            elif not fits:
                trajectory.finish_reason = "length"
        stats.tool_seconds += time.perf_counter() - start

    @staticmethod
    def book_payments(trajectory: Trajectory, environment: ToolEnvironment) -> None:
        """This turn's rewards: what the environment paid while running the turn's tool call."""
        trajectory.turn_rewards.extend([0.0] * (trajectory.turns - len(trajectory.turn_rewards)))
        for fact, amount in environment.take_payments():
            trajectory.pay(trajectory.turns - 1, fact, amount)

    def observation(self, result: ToolResult, stop_reason: str, last_ids: list[int]) -> tuple[str, list[int]]:
        """The text and token ids that show `result` after a model turn that ended on `stop_reason`, whose last
        token is `last_ids`."""
        body = self.format.render_observation(result, after_stop=stop_reason == "stop")
        if stop_reason != "eos":
            return body, encode_untrusted(self.tokenizer, body)
        # The model closed its chat turn: the observation arrives as a user turn and the
        # next assistant turn is opened, with the template's own markers. The template's
        # end-of-turn text is dropped when the model's own EOS token already wrote it,
        # whichever of the model's EOS ids that was.
        prefix, suffix = self.user_turn
        ended_with = self.tokenizer.decode(last_ids)
        if ended_with and prefix.startswith(ended_with):
            prefix = prefix[len(ended_with) :]
        body = body.strip()
        ids = (
            self.tokenizer(prefix, add_special_tokens=False)["input_ids"]
            + encode_untrusted(self.tokenizer, body)
            + self.tokenizer(suffix, add_special_tokens=False)["input_ids"]
        )
        return prefix + body + suffix, ids

    def open_environment(self, row: dict[str, Any]) -> tuple[ToolEnvironment, Any]:
        """A fresh environment for one trajectory, reset on `row`, with its own sandbox slot when it runs code."""
        environment = self.environment_factory()
        slot = None
        if environment.needs_sandbox:
            if self.sandbox_pool is None:
                raise RuntimeError(f"{type(environment).__name__} runs code and needs a sandbox pool")
            slot = self.sandbox_pool.acquire()
            environment.sandbox, environment.workspace = slot, slot.workspace
        try:
            environment.reset(row)
        except Exception:
            self.close_environment(environment, slot)
            raise
        return environment, slot

    def close_environment(self, environment: ToolEnvironment, slot: Any) -> None:
        """Close a trajectory's environment and give its slot back (kept, not reused, while a call still runs)."""
        try:
            environment.close()
        finally:
            # A call that outlived its guard may still be inside the slot; the sandbox's own deadline ends it.
            if slot is not None and environment.wait_idle(slot.timeout_s + SANDBOX_GRACE_S):
                self.sandbox_pool.release(slot)
            elif slot is not None:
                logger.error("a tool call is still running in sandbox slot %s; the slot is kept, not reused", slot)

    def close(self) -> None:
        """Stop the tool threads; a later `rollout` starts new ones."""
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None


def user_turn_wrapper(tokenizer: Any) -> tuple[str, str]:
    """Text after an assistant reply and before a user message (the end of the assistant turn included),
    and after that message up to the next assistant turn, from the chat template.

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
    after = text[text.index(reply) + len(reply) :]  # starts with the template's end of an assistant turn
    prefix, _, suffix = after.partition(question)
    return prefix, suffix


def with_observation(prompt: Any, observation: str | None) -> Any:
    """`prompt` (a chat or a string) with `observation` appended to its last message, as TRL appends what an
    environment's `reset` returns; `prompt` itself when there is none."""
    if not observation:
        return prompt
    if isinstance(prompt, str):
        return prompt + observation
    last = prompt[-1]
    content = last["content"]
    if isinstance(content, list):
        content = [*content, {"type": "text", "text": observation}]
    else:
        content = content + observation
    return [*prompt[:-1], {**last, "content": content}]


def turn_is_due(backend: GenerationBackend, live_here: int) -> bool:
    """Whether a turn is due: this process has live trajectories, or, for a backend whose processes decode in
    lockstep (`agentic_grpo.shrinking_batch`), any process has."""
    ask = getattr(backend, "any_process_live", None)
    return ask(live_here) if ask is not None else live_here > 0
