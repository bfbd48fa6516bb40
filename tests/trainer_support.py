"""A one-step trainer set-up on the tiny model whose policy text is scripted: a question answered with the
Python tool, and one answered directly (shared by the trainer set-up and reward value tests)."""

from __future__ import annotations

from agentic_grpo.config import AgenticGRPOConfig

CODE = 'Action: python\nAction Input: {"code": "print(6 * 7)"}\nObservation:'
SCRIPTS = {"code": [CODE, "Final Answer: 42<|im_end|>"], "direct": ["Final Answer: 41<|im_end|>"]}


def exact(prompts, completions, trajectory, answer, **_):
    return [float(t.final_answer == a) for t, a in zip(trajectory, answer, strict=False)]


def config(tmp_path, **overrides) -> AgenticGRPOConfig:
    fields = dict(
        output_dir=str(tmp_path), environment="agentic_grpo.tools.python:PythonInterpreter", num_generations=2,
        per_device_train_batch_size=4, max_completion_length=96, max_tokens_per_turn=48, beta=0.0,
        gradient_checkpointing=False, report_to=[], save_strategy="no", save_trajectories_steps=0, seed=0,
        max_steps=1, logging_steps=1,
    )  # fmt: skip
    fields.update(overrides)
    return AgenticGRPOConfig(**fields)
