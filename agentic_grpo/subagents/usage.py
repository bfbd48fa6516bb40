"""What delegating cost: sub-agent calls and the tokens sub-agents wrote, over whole trees of trajectories.

These are the cost side of routing (which sub-agent to ask, and whether to ask at all): logged per
trajectory, i.e. per attempt at a query, in training (`subagents/*`) and in `agentic-grpo eval`.
"""

from __future__ import annotations

from collections.abc import Callable

from agentic_grpo.trajectory import Trajectory


def descendants(trajectory: Trajectory) -> list[Trajectory]:
    """Every sub-agent trajectory under `trajectory`, children before grandchildren of later children."""
    found = []
    for child in trajectory.children:
        found.append(child)
        found.extend(descendants(child))
    return found


def generated_tokens(trajectory: Trajectory) -> int:
    """Tokens the trajectory's model wrote (an endpoint's own count when its token ids are unknown)."""
    local = sum(len(s.token_ids) for s in trajectory.segments if s.trainable)
    return local or int(trajectory.notes.get("usage", {}).get("completion_tokens", 0))


def subagent_usage(trajectories: list[Trajectory]) -> tuple[int, int, int]:
    """Sub-agent calls, tokens the sub-agents wrote, and calls that gave no answer, over the trees of `trajectories`."""
    children = [c for t in trajectories for c in descendants(t)]
    failed = sum(c.finish_reason != "final_answer" for c in children)
    return len(children), sum(generated_tokens(c) for c in children), failed


def subagent_metrics(
    trajectories: list[Trajectory], sum_over_processes: Callable[[list[float]], list[float]]
) -> dict[str, float]:
    """`subagents/calls_per_trajectory`, `subagents/tokens_per_trajectory` and `subagents/no_answer_rate` of a
    batch, summed over processes before dividing (collective: every process calls it)."""
    n, calls, tokens, failed = sum_over_processes(
        [float(len(trajectories)), *map(float, subagent_usage(trajectories))]
    )
    return {
        "subagents/calls_per_trajectory": calls / n,
        "subagents/tokens_per_trajectory": tokens / n,
        "subagents/no_answer_rate": failed / calls if calls else 0.0,
    }
