"""A hand-made group for the turn-credit tests: four scripted trajectories of one shop problem, of 1-3 turns,
with per-turn rewards paid by the real `StepwiseCalculator`."""

from __future__ import annotations

from typing import Any

from agentic_grpo.trainer import AgenticGRPOTrainer
from tests import helpers
from tests.scripted import case_prompt


def call(expression: str) -> str:
    return f'Thought: next step.\nAction: calculator\nAction Input: {{"expression": "{expression}"}}\nObservation:'


ANSWER = "Final Answer: 1000<|im_end|>"
# values of the problem: 84 * 20 = 1680, 1680 - 533 = 1147; each pays 0.5 the first time it is computed.
SCRIPTS = {
    "both": [call("84 * 20"), call("1680 - 533"), ANSWER],  # turn rewards [0.5, 0.5, 0]
    "first": [call("84 * 20"), ANSWER],  # [0.5, 0]
    "repeat": [call("84 * 20"), call("84 * 20"), ANSWER],  # [0.5, 0, 0]: paid once per value
    "direct": ["Final Answer: 7<|im_end|>"],  # [0]
}
CASES = list(SCRIPTS)
# The `turn` estimator with lambda = gamma = 1 on this group, by hand (agentic_grpo.advantages):
# returns G: both [1, .5, 0], first [.5, 0], repeat [.5, 0, 0], direct [0]; baselines are the other members'
# mean at that turn. Outcome advantages are 0 when every trajectory gets the same reward.
TURN_TERMS = {
    "both": [1 - (0.5 + 0.5 + 0) / 3, 0.5 - (0 + 0) / 2, 0 - 0],
    "first": [0.5 - (1 + 0.5 + 0) / 3, 0 - (0.5 + 0) / 2],
    "repeat": [0.5 - (1 + 0.5 + 0) / 3, 0 - (0.5 + 0) / 2, 0 - 0],
    "direct": [0 - (1 + 0.5 + 0.5) / 3],
}


def answer_is_right(prompts, completions, trajectory, answer, **_: Any) -> list[float]:
    return [float(t.final_answer == a) for t, a in zip(trajectory, answer, strict=True)]


def rows(answer: str = "9999", cases: list[str] = CASES) -> list[dict[str, Any]]:
    return [{"prompt": case_prompt(c), "question": c, "answer": answer, "values": ["1680", "1147"]} for c in cases]


def build_trainer(
    model_dir: str,
    output_dir: str,
    advantage: str,
    per_device: int = 4,
    environment: str = "agentic_grpo.tools.stepwise:StepwiseCalculator",
    peft_config: Any = None,
    **config: Any,
) -> AgenticGRPOTrainer:
    """The group above on `tests.helpers.build_trainer`, scripted, for stepping by hand (`advantage`: the
    experimental estimator, joined to any other `experimental` options)."""
    experimental = {**config.pop("experimental", {}), "advantage": advantage}
    return helpers.build_trainer(
        model_dir, output_dir, [answer_is_right], rows(), scripts=SCRIPTS, peft_config=peft_config,
        environment=environment, experimental=experimental, per_device_train_batch_size=per_device, max_turns=3,
        max_completion_length=200, max_tokens_per_turn=60, beta=0.04, **config,
    )  # fmt: skip
