"""A reasoning-gym task's own verifier as a reward: `score_answer(final answer, entry)`, in [0, 1].

Rows come from a recipe's `dataset: {reasoning_gym: TASK, ...}` (see
`agentic_grpo.reasoning_gym_tasks`), which keeps each task entry as JSON in `rg_entry`.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

from agentic_grpo.trajectory import Trajectory


@lru_cache(maxsize=64)
def _task(name: str, config_json: str) -> Any:
    import reasoning_gym

    return reasoning_gym.create_dataset(name, seed=0, size=1, **json.loads(config_json))


class TaskScore:
    """The task's `score_answer` on the final answer (0.0 without one).

    Note: reasoning-gym's default verifier gives partial credit when the reference appears
    inside a longer answer (len(reference) / len(answer)); `agentic-grpo audit-rewards` shows
    what each task's verifier pays for such answers.
    """

    __name__ = "task_score"
    required_columns = ("rg_task", "rg_config", "rg_entry")

    def __call__(
        self,
        prompts: list,
        completions: list,
        trajectory: list[Trajectory],
        rg_task: list,
        rg_config: list,
        rg_entry: list,
        **_: Any,
    ) -> list[float]:
        scores = []
        for t, name, config, entry in zip(trajectory, rg_task, rg_config, rg_entry, strict=True):
            if t.final_answer is None:
                scores.append(0.0)
                continue
            task = _task(name, config or "{}")
            scores.append(float(task.score_answer(t.final_answer, json.loads(entry))))
        return scores
