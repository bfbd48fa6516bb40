"""A sub-agent: another policy's whole multi-turn rollout, offered to the parent as one tool.

The parent sees a tool `name(task: str)` described by `description`. A call runs the sub-agent's own
rollout on the task (its own system prompt, tools, budgets and sandbox slots) and returns its final
answer as the call's observation. The child's trajectory is kept under the parent's
(`Trajectory.children`, with a `Delegation` saying who called it with what); its tokens are never part
of the parent's completion, so never of its loss: the parent reads the answer as tool tokens.

Batching (`DelegatedCalls`): every call to one sub-agent made in one parent turn, from all the live
trajectories of the batch, goes to one `answer` job, which runs them as one nested rollout: the
sub-agent generates once per child turn for all of them. The rollout manager knows the turn's calls
before any runs, so the batch is complete by construction: no waiting window, no count of expected
callers, the same batches on every run. Jobs of different sub-agents, and the turn's ordinary tool
calls, run at the same time in the parent's tool threads.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agentic_grpo.environment import check_arguments
from agentic_grpo.subagents.sources import PolicySource
from agentic_grpo.trajectory import Delegation, Segment, ToolCall, ToolResult, Trajectory

if TYPE_CHECKING:
    from agentic_grpo.rollout_parts import RolloutParts

logger = logging.getLogger(__name__)

TASK_DESCRIPTION = "The sub-task in words, with everything needed to solve it (the agent sees nothing else)."


@dataclass
class SubAgent:
    """A policy the parent calls as a tool.

    Args:
        name: the tool's name, as the parent writes it (its role).
        description: what the parent reads about the tool: what the agent is good at, what to give it.
        parts: the sub-agent's own environment, format (system prompt), budgets and sandbox settings.
        source: who writes its turns: `PolicySource` (the policy's model, e.g. under a LoRA adapter),
            `ModelSource` (a frozen model) or `EndpointSource` (an OpenAI-compatible server).
        row_columns: columns of the parent's dataset row copied into the sub-task's row (its environment's
            `reset(row)` sees them); the row's `question` is always the task.
        train: its LoRA adapter trains with the policy (`agentic_grpo.subagents.cotrain`); otherwise frozen.
        learning_rate: its adapter's learning rate when trained (None: the run's).
        rewards: its own (reward function, weight) pairs when trained, added to the shared outcome reward.
    """

    name: str
    description: str
    parts: RolloutParts
    source: Any
    row_columns: tuple[str, ...] = ()
    train: bool = False
    learning_rate: float | None = None
    rewards: tuple[tuple[Any, float], ...] = ()

    @staticmethod
    def delegate(*args: Any) -> DelegatedCalls:
        """One turn's calls to sub-agents, as the rollout manager hands them over (see `DelegatedCalls`)."""
        return DelegatedCalls(*args)

    def tool_schema(self) -> dict[str, Any]:
        """The JSON schema the parent's format describes the tool with."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": {
                    "type": "object",
                    "properties": {"task": {"type": "string", "description": TASK_DESCRIPTION}},
                    "required": ["task"],
                },
            },
        }

    @property
    def adapter(self) -> str | None:
        """The LoRA adapter its turns are generated under, when it runs on the policy's base model."""
        return self.source.adapter if isinstance(self.source, PolicySource) else None

    def task_row(self, task: str, parent_row: dict[str, Any]) -> dict[str, Any]:
        return {**{c: parent_row[c] for c in self.row_columns if c in parent_row}, "question": task}

    def answer(
        self, calls: list[ToolCall], parent_rows: list[dict[str, Any]], places: list[tuple[int, int]],
        backend: Any, tokenizer: Any, sandbox_pool: Any,
    ) -> list[tuple[ToolResult, Trajectory | None]]:  # fmt: skip
        """One nested rollout for all `calls`: each call's observation and its child trajectory (None when the
        call's arguments were wrong). `places` holds each call's (parent turn, index in the parent's tool calls);
        `backend` is the trained policy's (`model: policy` sub-agents run on its model, at any depth), `tokenizer`
        the caller's."""
        start = time.perf_counter()
        answers: list[tuple[ToolResult, Trajectory | None] | None] = [None] * len(calls)
        valid = []
        for k, call in enumerate(calls):
            problem = check_arguments(self.tool_schema(), call.arguments)
            if problem:
                message = f"Error: bad arguments for `{self.name}`: {problem}"
                answers[k] = (ToolResult(output=message, error=message), None)
            else:
                valid.append(k)
        rows = [self.task_row(str(calls[k].arguments["task"]), parent_rows[k]) for k in valid]
        children: list[Trajectory] = []
        if rows:
            try:
                prompts = [self.parts.trajectory_format.prompt_messages(row["question"]) for row in rows]
                children = self.source.rollout(self.parts, prompts, rows, backend, tokenizer, sandbox_pool)
            except Exception as exc:  # noqa: BLE001 - a sub-agent that breaks is the parent's observation, not a crash
                logger.exception("sub-agent `%s` failed on a batch of %d task(s)", self.name, len(rows))
                error = f"{type(exc).__name__}: {exc}"
                children = [failed_child(row["question"], error) for row in rows]
        seconds = time.perf_counter() - start
        for k, row, child in zip(valid, rows, children, strict=True):
            parent_turn, call_index = places[k]
            child.delegation = Delegation(
                agent=self.name, policy=self.source.describe(), row=row, parent_turn=parent_turn,
                call_index=call_index, adapter=self.adapter,
            )  # fmt: skip
            answers[k] = (self.observation(child, seconds), child)
        return answers  # type: ignore[return-value]

    def observation(self, child: Trajectory, seconds: float) -> ToolResult:
        """The child's final answer, or why it has none (an error the parent can read)."""
        if child.finish_reason == "final_answer" and child.final_answer is not None:
            return ToolResult(output=child.final_answer, seconds=seconds)
        why = child.notes.get("error") or {
            "max_turns": f"it used all {self.parts.limits.max_turns} turns",
            "length": "it ran out of tokens",
        }.get(child.finish_reason, child.finish_reason)
        message = f"Error: sub-agent `{self.name}` gave no answer ({why})."
        return ToolResult(output=message, error=message, timed_out="Timeout" in str(why), seconds=seconds)


def failed_child(prompt: Any, error: str) -> Trajectory:
    """The record of a child whose rollout could not run at all."""
    return Trajectory(
        prompt=prompt, segments=[Segment("prompt", [], "")], finish_reason="error", notes={"error": error}
    )


class DelegatedCalls:
    """One turn's sub-agent calls, submitted as one `answer` job per sub-agent (see the module's docstring).

    Args:
        executor: the parent's tool threads.
        agents: the parent's sub-agents by name.
        trajectories: the parent batch's trajectories.
        calls: this turn's parsed calls by trajectory index (ordinary tools and malformed turns are left alone).
        rows: the parent batch's dataset rows.
        backend, tokenizer, sandbox_pool: the parent's.
    """

    def __init__(
        self, executor: Executor, agents: dict[str, SubAgent], trajectories: list[Trajectory],
        calls: dict[int, tuple[Any, str]], rows: list[dict[str, Any]], backend: Any, tokenizer: Any,
        sandbox_pool: Any,
    ) -> None:  # fmt: skip
        by_agent: dict[str, list[int]] = {}
        for i, (call, _) in calls.items():
            if isinstance(call, ToolCall) and call.name in agents:
                by_agent.setdefault(call.name, []).append(i)
        self._jobs: dict[int, tuple[Future, int]] = {}
        # A sub-agent's own backend remembers the policy's: sub-agents of sub-agents on `model: policy` run on the
        # trained policy's model too, not on their caller's.
        policy_backend = getattr(backend, "policy_backend", None) or backend
        for name, indices in by_agent.items():
            places = [(trajectories[i].turns - 1, len(trajectories[i].tool_calls)) for i in indices]
            job = executor.submit(
                agents[name].answer, [calls[i][0] for i in indices], [rows[i] for i in indices], places,
                policy_backend, tokenizer, sandbox_pool,
            )  # fmt: skip
            for k, i in enumerate(indices):
                self._jobs[i] = (job, k)

    def __contains__(self, index: int) -> bool:
        return index in self._jobs

    def result(self, index: int) -> tuple[ToolResult, Trajectory | None]:
        """The observation of trajectory `index`'s call and its child (waits for the sub-agent's batch)."""
        job, k = self._jobs[index]
        return job.result()[k]
