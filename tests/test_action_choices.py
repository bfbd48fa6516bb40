"""Constrained action slots: after `Action:` the model may only write a tool's name and `Action Input:`.

Real tiny Llama and BPE tokenizer, real `generate` through `TransformersBackend` (kept caches with a shrinking
batch, and whole contexts). A random model never writes `Action:` on its own, so the generation config's
`sequence_bias` pushes it to; what follows each marker is then the model's own sampling, held or not.
"""

from __future__ import annotations

import dataclasses
import random
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM, GenerationConfig

from agentic_grpo.action_choices import ActionChoiceMask, ActionChoiceProcessor
from agentic_grpo.backends import TransformersBackend
from agentic_grpo.formats import ActionChoices, load_format
from agentic_grpo.tools.toolbox import Toolbox
from agentic_grpo.vllm_backend import VLLMBackend

CHOICES = ActionChoices("Action:", (" calculator\nAction Input:", " lookup\nAction Input:", " python\nAction Input:"))


def test_remainders_follow_what_was_written():
    assert CHOICES.remainders(" calc") == ["ulator\nAction Input:"]
    assert sorted(CHOICES.remainders("")) == sorted(CHOICES.continuations)
    assert CHOICES.remainders(" calculator\nAction Input:") == []  # written whole: the slot is closed
    assert CHOICES.remainders(" search") == []  # left every continuation: not held


def test_any_walk_through_allowed_tokens_spells_one_continuation(tokenizer):
    mask = ActionChoiceMask(tokenizer, CHOICES)
    rng = random.Random(0)
    spelled = set()
    for _ in range(60):
        written = ""
        while (allowed := mask.allowed(written)) is not None:
            written += tokenizer.decode([rng.choice(allowed.tolist())])
        assert written in CHOICES.continuations
        spelled.add(written)
    assert spelled == set(CHOICES.continuations)  # every tool stays reachable


def test_processor_masks_only_rows_inside_a_slot(tokenizer):
    processor = ActionChoiceProcessor(ActionChoiceMask(tokenizer, dataclasses.replace(CHOICES, temperature=2.0)))
    context = tokenizer("Question: what is 2 + 2?\n")["input_ids"]
    vocab = len(tokenizer)
    processor(torch.tensor([context, context]), torch.zeros(2, vocab))  # first call: where new tokens begin
    in_slot = context + tokenizer("Thought: add.\nAction:")["input_ids"]
    outside = context + tokenizer("Thought: add them")["input_ids"]
    width = max(len(in_slot), len(outside))
    pad = tokenizer.pad_token_id
    ids = torch.tensor([in_slot + [pad] * (width - len(in_slot)), outside + [pad] * (width - len(outside))])
    scores = torch.randn(2, vocab)
    before = scores.clone()
    out = processor(ids, scores)
    allowed = processor.mask.allowed("").tolist()
    assert torch.isinf(out[0]).sum() == vocab - len(allowed)
    assert torch.allclose(out[0, allowed], before[0, allowed] / 2.0)  # the choice is drawn hotter
    assert torch.equal(out[1], before[1])


def _biased_backend(tiny_model_dir, tokenizer, reuse: bool) -> TransformersBackend:
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    marker = tokenizer("\nAction:", add_special_tokens=False)["input_ids"]
    # Once begun, "\nAction:" is finished; begun often enough for a few markers per turn.
    bias = {tuple(marker[: i + 1]): 30.0 if i else 3.0 for i in range(len(marker))}
    config = GenerationConfig(do_sample=True, temperature=1.0, top_p=1.0, top_k=None, sequence_bias=bias,
                              pad_token_id=tokenizer.pad_token_id, eos_token_id=[2])  # fmt: skip
    return TransformersBackend(model, tokenizer, config, [2], reuse_cache=reuse)


def _held_to_choices(text: str) -> bool:
    """Whether every `Action:` in a turn is followed by a continuation (the last may be cut by the budget)."""
    parts = text.split("Action:")[1:]
    whole = all(any(p.startswith(c) for c in CHOICES.continuations) for p in parts[:-1])
    return whole and all(any(p.startswith(c) or c.startswith(p) for c in CHOICES.continuations) for p in parts[-1:])


@pytest.mark.parametrize("reuse", [True, False], ids=["kept-cache", "whole-context"])
def test_generation_after_the_marker_is_a_tool_name(tiny_model_dir, tokenizer, reuse):
    backend = _biased_backend(tiny_model_dir, tokenizer, reuse)
    contexts = [tokenizer(f"Question {i}: what is {i} + 2?\n")["input_ids"] for i in range(4)]

    def turns(choices):
        torch.manual_seed(0)
        generations = backend.generate(contexts, [], 60, **({"choices": choices} if choices else {}))
        return [tokenizer.decode(g.token_ids) for g in generations]

    free = turns(None)
    assert sum(t.count("Action:") for t in free) >= 4 and not all(map(_held_to_choices, free))  # the control
    held = turns(CHOICES)
    assert sum(t.count("Action:") for t in held) >= 4
    assert all(map(_held_to_choices, held)), held
    assert sum(t.count("Action Input:") for t in held) >= 2  # names written whole, not only begun


def test_react_builds_the_slot_from_its_tools():
    schemas = Toolbox.tool_schemas()
    assert load_format("react", schemas).action_choices is None  # off unless asked
    choices = load_format("react", schemas, constrain_actions=True, action_temperature=1.5).action_choices
    names = [s["function"]["name"] for s in schemas]
    assert choices.continuations == tuple(f" {n}\nAction Input:" for n in names)
    assert choices.marker == "Action:" and choices.temperature == 1.5
    with pytest.raises(ValueError, match="action_temperature"):
        load_format("react", schemas, constrain_actions=True, action_temperature=0)


def test_vllm_backend_refuses_a_constrained_slot():
    # No GPU here, so no vLLM engine: the refusal comes before the engine is touched.
    trainer = SimpleNamespace(vllm_generation=object(), processing_class=None, eos_token_ids=[2])
    with pytest.raises(ValueError, match="constrain_actions"):
        VLLMBackend(trainer).generate([[1, 2]], [], 8, choices=CHOICES)


def test_a_vllm_recipe_with_a_constrained_slot_is_refused_before_a_model_loads(tmp_path):
    from agentic_grpo.train import prepare

    argv = ["--config", "recipes/ci_tiny.yaml", "--output_dir", str(tmp_path / "out"), "--use_vllm", "true",
            "--format_kwargs", '{"constrain_actions": true}']  # fmt: skip
    with pytest.raises(ValueError, match="constrain_actions"):
        prepare(argv)
