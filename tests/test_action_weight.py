"""Weighing the tokens that name a tool (`action_token_weight`): found by the format's action slot in the real
tiny BPE tokenizer's tokens, multiplied into the per-token advantages TRL's loss takes, refused without a slot."""

from __future__ import annotations

import pytest
import torch

from agentic_grpo.action_weight import name_spans, name_token_positions, weigh_action_tokens
from agentic_grpo.formats import ActionChoices
from agentic_grpo.trajectory import Segment, Trajectory
from tests.credit_support import CASES, SCRIPTS, TURN_TERMS, build_trainer, rows
from tests.test_turn_credit import expected_tokens

CHOICES = ActionChoices("Action:", (), 1.0, ("calculator", "lookup", "string_tool", "string"))


def test_name_spans_take_the_longest_tool_name_after_each_marker():
    text = 'Thought: x.\nAction: string_tool\nAction Input: {}\nObservation: 3\nAction:lookup\nAction: "run"'
    spans = name_spans(text, CHOICES)
    assert [text[a:b] for a, b in spans] == ["string_tool", "lookup"]  # not "string"; the quoted word is no tool
    assert name_spans("Final Answer: 4", CHOICES) == []


def test_name_tokens_spell_the_name_and_nothing_else(tokenizer):
    text = 'Thought: count.\nAction: string_tool\nAction Input: {"operation": "length"}\nObservation:'
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    positions = name_token_positions(ids, tokenizer, CHOICES)
    assert positions == list(range(positions[0], positions[-1] + 1))  # one run of tokens
    written = tokenizer.decode([ids[i] for i in positions])
    assert written.strip() == "string_tool" and "Action" not in written
    assert name_token_positions(tokenizer("Final Answer: 7")["input_ids"], tokenizer, CHOICES) == []


def _trajectory(tokenizer, *parts: tuple[str, str]) -> Trajectory:
    segments = [Segment("prompt", tokenizer("Q?")["input_ids"], "Q?")]
    segments += [Segment(role, tokenizer(text, add_special_tokens=False)["input_ids"], text) for role, text in parts]
    return Trajectory(prompt="Q?", segments=segments)


def test_only_name_tokens_of_model_turns_are_weighed(tokenizer):
    call = "Thought: t.\nAction: lookup\nAction Input: {}\nObservation:"
    tool_text = " Action: lookup again\n"  # an observation that reads like a call is the tool's text: never weighed
    first = _trajectory(tokenizer, ("model", call), ("tool", tool_text), ("model", "Final Answer: 26"))
    second = _trajectory(tokenizer, ("model", "Final Answer: 3"))
    width = len(first.completion_ids) + 2
    weighed = weigh_action_tokens(torch.tensor([0.5, -1.0]), [first, second], tokenizer, CHOICES, 4.0, width)
    assert weighed.shape == (2, width)
    names = name_token_positions(first.segments[1].token_ids, tokenizer, CHOICES)
    expected = torch.full((width,), 0.5)
    expected[names] = 2.0
    assert torch.equal(weighed[0], expected)
    assert torch.equal(weighed[1], torch.full((width,), -1.0))
    per_token = torch.arange(2 * width, dtype=torch.float32).view(2, width)  # a turn estimator's advantages
    again = weigh_action_tokens(per_token, [first, second], tokenizer, CHOICES, 4.0, width)
    assert torch.equal(again[0, names], 4.0 * per_token[0, names]) and torch.equal(again[1], per_token[1])
    assert torch.equal(per_token, torch.arange(2 * width, dtype=torch.float32).view(2, width))  # input untouched


def test_trainer_weighs_the_name_tokens_of_each_turns_advantage(tiny_model_dir, tmp_path):
    trainer = build_trainer(tiny_model_dir, str(tmp_path), "turn", action_token_weight=10.0,
                            format_kwargs={"constrain_actions": True})  # fmt: skip
    inputs = trainer._generate_and_score_completions(rows())
    tokenizer = trainer.processing_class
    for row, case in enumerate(CASES):
        plain = expected_tokens(trainer, row, case, inputs)
        weighed = inputs["advantages"][row]
        changed = (weighed != plain).nonzero().flatten().tolist()
        assert torch.allclose(weighed[changed], 10.0 * plain[changed])
        # the scripts' `Action: calculator` turns whose advantage is not 0 (ten times 0 is 0)
        calls = sum(
            "Action: calculator" in turn and term != 0
            for turn, term in zip(SCRIPTS[case], TURN_TERMS[case], strict=True)
        )
        names = tokenizer.decode(inputs["completion_ids"][row, changed]).split()
        assert names == ["calculator"] * calls, (case, names)


def test_a_weight_needs_a_marked_slot_and_must_be_positive(tmp_path):
    from agentic_grpo.config import AgenticGRPOConfig
    from agentic_grpo.train import prepare

    with pytest.raises(ValueError, match="action_token_weight must be above 0"):
        AgenticGRPOConfig(output_dir=str(tmp_path), action_token_weight=0.0)
    argv = ["--config", "recipes/ci_tiny.yaml", "--output_dir", str(tmp_path / "out"), "--action_token_weight", "5"]
    with pytest.raises(ValueError, match="constrain_actions"):
        prepare(argv)
    with pytest.raises(ValueError, match="constrain_actions"):  # user code that builds a trainer itself
        weigh_action_tokens(torch.zeros(1), [], None, None, 5.0, 1)
