"""Sub-agents inside the real trainer: a child's tokens never enter the parent's loss, and a policy whose tool
is a LoRA-adapter sub-agent on its own base model trains for two real GRPO steps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from peft import LoraConfig

from agentic_grpo.config import AgenticGRPOConfig
from tests.helpers import build_trainer
from tests.scripted import case_prompt
from tests.subagent_support import RecordingGenerate
from tests.varied_rewards import distinct_characters

ASK = 'Thought: delegate.\nAction: helper\nAction Input: {"task": "What is 12 * 34?"}\nObservation:'
SCRIPTS = {"ask": [ASK, "Final Answer: 408<|im_end|>"], "direct": ["Final Answer: 408<|im_end|>"],
           "twice": [ASK, ASK, "Final Answer: 1<|im_end|>"]}  # fmt: skip
SCORED: list = []


def exact(prompts, completions, trajectory, answer, **_):
    SCORED[:] = trajectory
    return [float(t.final_answer == a) + 0.1 * len(t.children) for t, a in zip(trajectory, answer, strict=True)]


def test_child_tokens_reach_the_parent_only_as_tool_tokens_with_zero_loss_mask(tiny_model_dir, tmp_path):
    helper = {"name": "helper", "description": "Answers a sub-task.", "model": tiny_model_dir, "max_turns": 1,
              "format": "tests.subagent_support:CallingFormat", "format_kwargs": {"tool": None},
              "max_tokens_per_turn": 12}  # fmt: skip
    rows = [
        {"prompt": case_prompt(name), "question": name, "answer": "408"} for name in ["ask", "direct", "twice", "ask"]
    ]
    trainer = build_trainer(
        tiny_model_dir, tmp_path, [exact], rows, scripts=SCRIPTS, environment="agentic_grpo.tools.calculator:Calculator",
        subagents=[helper], max_completion_length=200, max_tokens_per_turn=80, beta=0.04, save_trajectories_steps=0,
    )  # fmt: skip
    inputs = trainer.generate_and_score(rows)

    assert [len(t.children) for t in SCORED] == [1, 0, 2, 1]
    answers = []  # positions of the children's answers in the parent's completion
    for row, parent in enumerate(SCORED):
        n = len(parent.completion_ids)
        assert inputs["completion_ids"][row, :n].tolist() == parent.completion_ids  # no child token appended
        assert inputs["tool_mask"][row, :n].tolist() == parent.loss_mask
        start = 0
        for segment in parent.completion_segments:
            if segment.role == "tool" and any(
                c.final_answer and c.final_answer in segment.text for c in parent.children
            ):
                answers += [(row, start + k) for k in range(len(segment.token_ids))]
                assert inputs["tool_mask"][row, start : start + len(segment.token_ids)].sum() == 0
            start += len(segment.token_ids)
    assert answers and trainer._metrics["train"]["subagents/calls_per_trajectory"][-1] == 1.0

    # Through TRL's loss: the positions of the children's answers get no gradient.
    captured = {}

    def keep_hidden(module, args, output):
        output.retain_grad()
        captured["hidden"] = output

    handle = trainer.model.model.norm.register_forward_hook(keep_hidden)
    try:
        trainer.compute_loss(trainer.model, inputs).backward()
    finally:
        handle.remove()
    width = inputs["completion_ids"].shape[1]
    grad = captured["hidden"].grad[:, -width - 1 : -1, :].abs().sum(-1)  # the state before token j predicts it
    assert all(grad[row, position].item() == 0.0 for row, position in answers)
    assert grad[inputs["tool_mask"].bool() & inputs["completion_mask"].bool()].sum() > 0


@pytest.mark.integration  # trains for several steps
def test_two_grpo_steps_with_a_lora_adapter_subagent_on_the_policys_base_model(tiny_model_dir, tmp_path):
    helper = {"name": "helper", "description": "Answers a sub-task.", "adapter": "helper", "max_turns": 1,
              "format": "tests.subagent_support:CallingFormat", "format_kwargs": {"tool": None},
              "max_tokens_per_turn": 8}  # fmt: skip
    rows = [{"prompt": [{"role": "user", "content": f"What is {a} * 7?"}], "question": f"What is {a} * 7?"}
            for a in range(100, 108)]  # fmt: skip
    trainer = build_trainer(
        tiny_model_dir, tmp_path, [distinct_characters], rows, stepped_by_hand=False,
        peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0),
        environment="agentic_grpo.environment:ToolEnvironment", subagents=[helper],
        format="tests.subagent_support:CallingFormat", format_kwargs={"tool": "helper"}, max_turns=2,
        max_tokens_per_turn=8, max_completion_length=96, max_steps=2, learning_rate=1e-2, beta=0.04, temperature=1.0,
        save_trajectories_steps=1, logging_steps=1,
    )  # fmt: skip
    model = trainer.model
    before = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}
    spy = RecordingGenerate(model)
    trainer.train()

    assert set(spy.adapters) == {"default", "helper"}  # both roles generated on the one model

    steps = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert len(steps) == 2 and all(entry["subagents/calls_per_trajectory"] > 0 for entry in steps)
    assert all(entry["subagents/tokens_per_trajectory"] > 0 for entry in steps)
    records = [
        json.loads(line) for line in (Path(tmp_path) / "trajectories" / "step_000001.jsonl").read_text().splitlines()
    ]
    children = [child for record in records for child in record.get("children", [])]
    assert children and all(c["delegation"]["adapter"] == "helper" for c in children)
    assert all(c["segments"][1]["role"] == "model" and c["segments"][1]["token_ids"] for c in children)
    # The policy's adapter trained; the sub-agent's adapter (frozen) did not; the policy's adapter is active again.
    after = dict(model.named_parameters())
    assert any(not torch.equal(before[n], after[n]) for n in before if ".default." in n)
    assert all(torch.equal(before[n], after[n]) and not after[n].requires_grad for n in before if ".helper." in n)
    assert model.active_adapter == "default"


def test_eval_runs_adapter_subagents_on_the_policy_and_reports_their_cost(tiny_model_dir, tmp_path):
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentic_grpo.evaluate import evaluate
    from agentic_grpo.run_parts import build_rollout_parts

    helper = {"name": "helper", "description": "Answers a sub-task.", "adapter": "helper", "max_turns": 1,
              "format": "tests.subagent_support:CallingFormat", "format_kwargs": {"tool": None}}  # fmt: skip
    config = AgenticGRPOConfig(output_dir=str(tmp_path), environment="agentic_grpo.environment:ToolEnvironment",
                               subagents=[helper], format="tests.subagent_support:CallingFormat",
                               format_kwargs={"tool": "helper"}, max_turns=2, max_tokens_per_turn=8, report_to=[])  # fmt: skip
    policy = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model_dir),
                            LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))  # fmt: skip
    rows = [{"question": f"What is {a} * 7?", "answer": str(a * 7)} for a in range(100, 104)]
    metrics, records = evaluate(policy, AutoTokenizer.from_pretrained(tiny_model_dir), build_rollout_parts(config),
                                [distinct_characters], rows, progress=False, correctness="distinct_characters")  # fmt: skip
    calls = sum(len(r.get("children", [])) for r in records)
    assert calls > 0 and metrics["subagents/calls_per_trajectory"] == calls / len(rows)
    assert metrics["subagents/tokens_per_trajectory"] > 0 and "helper" in policy.peft_config
