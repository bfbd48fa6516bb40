"""What the choice-gradient tests share with their two-process script: scripted `MathToolbox` turns, rows naming
their expected tool, a trainer with the experimental choice gradient on, and the slot probabilities read from a
plain forward pass."""

from __future__ import annotations

import torch

from tests.credit_support import build_trainer
from tests.scripted import ScriptedBackend, case_prompt


def _call(tool: str, arguments: str) -> str:
    return f"Thought: go.\nAction: {tool}\nAction Input: {arguments}\nObservation:"


SCRIPTS = {
    "calc": [_call("calculator", '{"expression": "2 + 3"}'), "Final Answer: 5<|im_end|>"],
    "py": [_call("python", '{"code": "print(5)"}'), "Final Answer: 5<|im_end|>"],
    "calc2": [_call("calculator", '{"expression": "2 * 3"}'), "Final Answer: 6<|im_end|>"],
    "direct": ["Final Answer: 7<|im_end|>"],
}
# (case, the row's expected tool): the first calls calculator where python is expected; the last calls nothing.
ROWS = [("calc", "python"), ("py", "python"), ("calc2", "calculator"), ("direct", "python")]


def choice_trainer(model_dir: str, output_dir: str, **config):
    trainer = build_trainer(
        model_dir, output_dir, "outcome", environment="agentic_grpo.tools.toolbox:MathToolbox",
        format_kwargs={"constrain_actions": True},
        experimental={"canonical_actions": True, "choice_gradient_weight": 1.0}, **config,
    )  # fmt: skip
    trainer.generation_backend = ScriptedBackend(trainer.processing_class, SCRIPTS)
    return trainer


def choice_rows() -> list[dict]:
    return [
        {"prompt": case_prompt(case), "question": case, "answer": "9999", "values": [], "expected_tools": tool}
        for case, tool in ROWS
    ]


def slot_probabilities(trainer, inputs) -> torch.Tensor:
    """Each row's probability of its expected tools at its slot, from a plain forward pass of the whole row."""
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    logits = trainer.model(input_ids=ids, attention_mask=mask).logits
    width = inputs["prompt_ids"].size(1)
    probabilities = []
    for row, slot in enumerate(inputs["choice_slots"].tolist()):
        if slot >= 0:
            choice = logits[row, width + slot - 1, trainer.choice_tokens].softmax(-1)
            probabilities.append((choice * inputs["choice_targets"][row]).sum())
    return torch.stack(probabilities)
