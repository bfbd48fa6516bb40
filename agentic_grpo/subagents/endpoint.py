"""A sub-agent served by any OpenAI-compatible endpoint (OpenAI, vLLM, llama.cpp, TGI), through the `openai` client.

A chat API takes messages, not token ids, so the endpoint's children run a chat-level turn loop: the
sub-agent's format opens the chat (system prompt, question), each reply is parsed by the same format,
its tool call runs in the child's own environment (and sandbox slot), and the observation goes back as
the next user message. Every child of a batch runs at once, at most `max_concurrency` requests in flight.

Failures never raise: the client retries connection errors, timeouts, 429 and 5xx with exponential
backoff (honouring Retry-After) up to `max_retries` times, each attempt bounded by `timeout` seconds;
a call that still fails ends the child with `finish_reason="error"`, and the parent reads the error as
the call's observation. Token ids are not known here: the children's segments carry text, and the
endpoint's token counts are kept in `notes["usage"]`. Budgets count the endpoint's completion tokens
plus the observation tokens in the policy's tokenizer.
"""

from __future__ import annotations

import asyncio
import os
from typing import TYPE_CHECKING, Any

from agentic_grpo.environment import encode_untrusted, truncate_tool_output
from agentic_grpo.formats import FinalAnswer, Malformed
from agentic_grpo.trajectory import Segment, ToolCall, ToolResult, Trajectory

if TYPE_CHECKING:
    from agentic_grpo.rollout import RolloutManager
    from agentic_grpo.rollout_parts import RolloutParts


class EndpointSource:
    """Chat completions at `endpoint` (`http://host:port/v1`) from the served model `model`.

    Args:
        endpoint: the server's base URL.
        model: the model name the server serves.
        api_key_env: the environment variable holding the API key (None: local servers need none).
        timeout: seconds per attempt.
        max_retries: further attempts after a failed one.
        max_concurrency: requests in flight at once.
        temperature: sampling temperature (0 or None: greedy).
    """

    def __init__(
        self, endpoint: str, model: str, api_key_env: str | None = None, timeout: float = 60.0, max_retries: int = 2,
        max_concurrency: int = 8, temperature: float | None = None,
    ) -> None:  # fmt: skip
        self.endpoint = endpoint.rstrip("/")
        self.model = model
        self.api_key_env = api_key_env
        if api_key_env and not os.environ.get(api_key_env):
            raise ValueError(f"sub-agent endpoint {endpoint}: the API key variable `{api_key_env}` is not set")
        self.timeout = timeout
        self.max_retries = max_retries
        self.max_concurrency = max_concurrency
        self.temperature = temperature or 0.0

    def __repr__(self) -> str:  # never show the key
        return f"EndpointSource(endpoint={self.endpoint!r}, model={self.model!r})"

    def describe(self) -> str:
        return f"endpoint:{self.endpoint}#{self.model}"

    def rollout(
        self, parts: RolloutParts, prompts: list[Any], rows: list[dict[str, Any]], parent: Any, tokenizer: Any,
        sandbox_pool: Any,
    ) -> list[Trajectory]:  # fmt: skip
        """The children of one batch, all at once (called in a tool thread: the loop is this call's own)."""
        manager = parts.rollout_manager(tokenizer, sandbox_pool)  # the environments' lifecycle, as for local children
        return asyncio.run(self._all(manager, prompts, rows))

    async def _all(self, manager: RolloutManager, prompts: list[Any], rows: list[dict[str, Any]]) -> list[Trajectory]:
        import openai

        api_key = os.environ.get(self.api_key_env) if self.api_key_env else "EMPTY"
        client = openai.AsyncOpenAI(
            base_url=self.endpoint, api_key=api_key, timeout=self.timeout, max_retries=self.max_retries
        )
        slots = asyncio.Semaphore(self.max_concurrency)
        async with client:
            return list(
                await asyncio.gather(
                    *(self._child(client, slots, manager, p, r) for p, r in zip(prompts, rows, strict=True))
                )
            )

    async def _child(
        self, client: Any, slots: asyncio.Semaphore, manager: RolloutManager, prompt: list[dict[str, str]],
        row: dict[str, Any],
    ) -> Trajectory:  # fmt: skip
        fmt, limits, tokenizer = manager.format, manager.limits, manager.tokenizer
        messages = [dict(m) for m in prompt]
        text = "\n".join(f"{m['role']}: {m['content']}" for m in messages)
        trajectory = Trajectory(prompt=prompt, segments=[Segment("prompt", [], text)])
        usage = trajectory.notes.setdefault("usage", {"prompt_tokens": 0, "completion_tokens": 0})
        environment, slot = await asyncio.to_thread(manager.open_environment, row)
        spent = 0  # of the trajectory's token budget
        try:
            for _ in range(limits.max_turns):
                trajectory.turn_states.append(environment.state_hash())
                room = min(limits.max_tokens_per_turn, limits.max_completion_tokens - spent)
                try:
                    async with slots:
                        response = await client.chat.completions.create(
                            model=self.model, messages=messages, max_tokens=room, temperature=self.temperature,
                            stop=fmt.stop or None,
                        )  # fmt: skip
                    choice = response.choices[0]
                    reply = choice.message.content or ""
                except Exception as exc:  # noqa: BLE001 - openai errors, or a reply that is not a completion
                    trajectory.finish_reason = "error"
                    trajectory.notes["error"] = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                    break
                written = (
                    response.usage.completion_tokens if response.usage else len(encode_untrusted(tokenizer, reply))
                )
                usage["completion_tokens"] += written
                usage["prompt_tokens"] += response.usage.prompt_tokens if response.usage else 0
                spent += written
                trajectory.segments.append(Segment("model", [], reply))
                trajectory.turns += 1
                if choice.finish_reason == "length":  # a cut turn is not acted on (as for local children)
                    trajectory.finish_reason = "length"
                    break
                parsed = fmt.parse(reply)
                if isinstance(parsed, FinalAnswer):
                    trajectory.final_answer, trajectory.finish_reason = parsed.answer, "final_answer"
                    break
                if isinstance(parsed, Malformed):
                    trajectory.malformed_turns += 1
                    result = ToolResult(output=f"Error: {parsed.reason}.", error=parsed.reason)
                else:
                    result = await self._run_tool(manager, environment, parsed, trajectory)
                manager.book_payments(trajectory, environment)
                observation = fmt.render_observation(result, after_stop=False).strip()
                spent += len(encode_untrusted(tokenizer, observation))
                if spent >= limits.max_completion_tokens:
                    trajectory.finish_reason = "length"
                    break
                trajectory.segments.append(Segment("tool", [], observation))
                messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": observation}]
            if trajectory.finish_reason == "running":
                trajectory.finish_reason = "max_turns"
        finally:
            await asyncio.to_thread(manager.close_environment, environment, slot)
        return trajectory

    @staticmethod
    async def _run_tool(
        manager: RolloutManager, environment: Any, call: ToolCall, trajectory: Trajectory
    ) -> ToolResult:
        result = await asyncio.to_thread(environment.execute, call, manager.limits.tool_timeout)
        result.output, cut = truncate_tool_output(
            result.output, manager.tokenizer, manager.limits.max_tool_output_tokens
        )
        result.truncated = result.truncated or cut
        trajectory.tool_calls.append((call, result))
        return result
