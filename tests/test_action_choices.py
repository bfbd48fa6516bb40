"""Constrained action slots: after `Action:` the model may only write a tool's name and `Action Input:`.

Real tiny Llama and BPE tokenizer, real `generate` through `TransformersBackend` (kept caches with a shrinking
batch, and whole contexts). A random model never writes `Action:` on its own, so the generation config's
`sequence_bias` pushes it to; what follows each marker is then the model's own sampling, held or not.
"""

from __future__ import annotations

import random
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM, GenerationConfig

from agentic_grpo.action_choices import ActionChoiceMask, ActionChoiceProcessor, choice_mask
from agentic_grpo.backends import TransformersBackend
from agentic_grpo.experimental.action_slot import TunedActionChoiceMask, TunedActionChoices
from agentic_grpo.experimental.spread import spread_over_groups
from agentic_grpo.formats import ActionChoices, load_format
from agentic_grpo.rollout import RolloutLimits, RolloutManager
from agentic_grpo.tools.calculator import Calculator
from agentic_grpo.tools.facts import ElementTable
from agentic_grpo.tools.toolbox import Toolbox
from agentic_grpo.tools.units import UnitConverter
from agentic_grpo.vllm_backend import VLLMBackend

CHOICES = ActionChoices("Action:", (" calculator\nAction Input:", " lookup\nAction Input:", " python\nAction Input:"))


def test_remainders_follow_what_was_written():
    assert CHOICES.remainders(" calc") == ["ulator\nAction Input:"]
    assert sorted(CHOICES.remainders("")) == sorted(CHOICES.continuations)
    assert CHOICES.remainders(" calculator\nAction Input:") == []  # written whole: the slot is closed
    assert CHOICES.remainders(" search") == []  # left every continuation: not held


def _random_walk(mask: ActionChoiceMask, rng: random.Random) -> str:
    """What a slot spells when each next token is drawn at random from the allowed ones, until it closes."""
    written = ""
    while (allowed := mask.allowed(written)) is not None:
        written += mask.tokenizer.decode([rng.choice(allowed.tolist())])
    return written


def test_any_walk_through_allowed_tokens_spells_one_continuation(tokenizer):
    mask = ActionChoiceMask(tokenizer, CHOICES)
    rng = random.Random(0)
    spelled = set()
    for _ in range(60):
        written = _random_walk(mask, rng)
        assert written in CHOICES.continuations
        spelled.add(written)
    assert spelled == set(CHOICES.continuations)  # every tool stays reachable


def test_a_canonical_slot_follows_each_continuations_own_tokens(tokenizer):
    canonical = TunedActionChoices(CHOICES.marker, CHOICES.continuations, canonical=True)
    mask = choice_mask(tokenizer, canonical)
    assert isinstance(mask, TunedActionChoiceMask)  # the slot brings its own mask
    own = {c: tokenizer.encode(c, add_special_tokens=False) for c in CHOICES.continuations}
    assert sorted(mask.allowed("").tolist()) == sorted({ids[0] for ids in own.values()})  # one token per tool
    rng = random.Random(0)
    for _ in range(20):  # every walk is one continuation's own tokens, token for token
        written, walked = "", []
        while (allowed := mask.allowed(written)) is not None:
            walked.append(rng.choice(allowed.tolist()))
            written = tokenizer.decode(walked)
        assert walked == own[written]
    # the free slot lets a fragment carry the choice; the canonical one does not
    firsts = {ids[0] for ids in own.values()}
    fragment = next(t for t in ActionChoiceMask(tokenizer, CHOICES).allowed("").tolist() if t not in firsts)
    assert fragment not in mask.allowed("").tolist()
    # a slot that began inside a token (written text on no token boundary of a continuation) spells freely
    first = tokenizer.decode(own[" calculator\nAction Input:"][:1])
    assert len(first) > 2 and mask.allowed(first[:2]) is not None
    assert not getattr(ActionChoices("A:", ("x",)), "canonical", False)  # free unless asked


def test_processor_masks_only_rows_inside_a_slot(tokenizer):
    hotter = TunedActionChoices(CHOICES.marker, CHOICES.continuations, temperature=2.0)
    processor = ActionChoiceProcessor(choice_mask(tokenizer, hotter))
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
    with pytest.raises(ValueError, match="canonical_actions"):  # an experiment, not a format option
        load_format("react", schemas, constrain_actions=True, canonical_actions=True)
    choices = load_format("react", schemas, constrain_actions=True).action_choices
    names = [s["function"]["name"] for s in schemas]
    assert choices.continuations == tuple(f" {n}\nAction Input:" for n in names)
    assert choices.marker == "Action:" and choices.names == tuple(names)


def test_constrained_arguments_open_each_tools_json_with_its_first_key(tokenizer):
    schemas = Toolbox.tool_schemas()
    fmt = load_format("react", schemas, constrain_actions=True, constrain_arguments=True)
    continuations = dict(zip([s["function"]["name"] for s in schemas], fmt.action_choices.continuations, strict=True))
    assert continuations["lookup"] == ' lookup\nAction Input: {"query": "'
    assert continuations["calculator"] == ' calculator\nAction Input: {"expression": "'
    assert continuations["string_tool"] == ' string_tool\nAction Input: {"operation": "'  # the first required key
    number = {"type": "function", "function": {"name": "double", "description": "Double.",
              "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}}}  # fmt: skip
    bare = {"type": "function", "function": {"name": "now", "description": "The time.", "parameters": {}}}
    openings = load_format("react", [number, bare], constrain_actions=True, constrain_arguments=True)
    assert openings.action_choices.continuations == (' double\nAction Input: {"n": ', " now\nAction Input: {}")
    # A walk through the allowed tokens spells a whole opening, and what the model writes after it is a call.
    mask = ActionChoiceMask(tokenizer, fmt.action_choices)
    rng = random.Random(0)
    for _ in range(20):
        written = _random_walk(mask, rng)
        assert written in fmt.action_choices.continuations
        name = written.split("\n")[0].strip()
        call = fmt.parse("Thought: t.\nAction:" + written + 'x"}')
        assert call.name == name and list(call.arguments) == [written.split('"')[1]], call
    with pytest.raises(ValueError, match="constrain_actions"):
        load_format("react", schemas, constrain_arguments=True)


def test_vllm_backend_refuses_a_constrained_slot():
    # The refusal comes before the engine is asked for anything: a bare object stands in for it.
    trainer = SimpleNamespace(vllm_generation=object(), processing_class=None, eos_token_ids=[2])
    with pytest.raises(ValueError, match="constrain_actions"):
        VLLMBackend(trainer).generate([[1, 2]], [], 8, choices=CHOICES)


def test_a_vllm_recipe_with_a_constrained_slot_is_refused_before_a_model_loads(tmp_path):
    from agentic_grpo.train import prepare

    argv = ["--config", "recipes/ci_tiny.yaml", "--output_dir", str(tmp_path / "out"), "--use_vllm", "true",
            "--format_kwargs", '{"constrain_actions": true}']  # fmt: skip
    with pytest.raises(ValueError, match="constrain_actions"):
        prepare(argv)


def _first_choice(text: str, choices: ActionChoices = CHOICES) -> str | None:
    """The continuation written after a turn's first `Action:` (or the part of one the budget left)."""
    if "Action:" not in text:
        return None
    after = text.split("Action:")[1]
    return next((c for c in choices.continuations if after.startswith(c) or c.startswith(after)), after)


def test_spread_gives_each_group_every_choice_in_turn():
    groups = ["a"] * 8 + ["b"] * 3 + ["c"]
    assigned = spread_over_groups(groups, CHOICES.continuations, torch.Generator().manual_seed(0))
    first, second = assigned[:8], assigned[8:11]
    assert sorted(first.count(c) for c in CHOICES.continuations) == [2, 3, 3]  # 8 rows over 3 choices
    assert first[:3] == first[3:6] and sorted(first[:3]) == sorted(CHOICES.continuations)  # each once, then again
    assert sorted(second) == sorted(CHOICES.continuations)
    assert assigned[11] is None  # alone in its group: nothing to compare it with, so it chooses for itself


@pytest.mark.parametrize("reuse", [True, False], ids=["kept-cache", "whole-context"])
def test_assigned_rows_take_their_choice_as_the_batch_shrinks(tiny_model_dir, tokenizer, reuse):
    backend = _biased_backend(tiny_model_dir, tokenizer, reuse)
    contexts = [tokenizer(f"Question {i}: what is {i} + 2?\n")["input_ids"] for i in range(8)]
    assigned = [CHOICES.continuations[i % 3] if i != 5 else None for i in range(8)]
    stop = ["Input:"]  # a row stops once it has written its choice: rows leave the batch at different steps
    torch.manual_seed(1)
    free = [tokenizer.decode(g.token_ids) for g in backend.generate(contexts, stop, 40, choices=CHOICES)]
    torch.manual_seed(1)
    generations = backend.generate(contexts, stop, 40, choices=CHOICES, assigned=assigned)
    held = [tokenizer.decode(g.token_ids) for g in generations]
    assert len({len(g.token_ids) for g in generations}) > 2
    acting = [i for i, text in enumerate(held) if "Action:" in text and i != 5]
    assert len(acting) >= 5
    assert all(_first_choice(held[i]) == assigned[i] for i in acting), [(assigned[i], held[i]) for i in acting]
    assert any(_first_choice(free[i]) not in (None, assigned[i]) for i in range(8))  # the control: unheld differs


class ThreeTools(Calculator, ElementTable, UnitConverter):
    """Three in-process tools: no sandbox needed."""


def test_rollout_spreads_the_first_action_over_each_group(tiny_model_dir, tokenizer):
    fmt = load_format("react", ThreeTools.tool_schemas(), constrain_actions=True)
    manager = RolloutManager(ThreeTools, fmt, tokenizer, RolloutLimits(max_turns=1, max_tokens_per_turn=24))
    backend = _biased_backend(tiny_model_dir, tokenizer, reuse=True)
    questions = ["What is 12 * 34?"] * 3 + ["Convert 3 miles to km."] * 3
    torch.manual_seed(0)
    first_actions = spread_over_groups(questions, fmt.action_choices.continuations)
    try:
        trajectories, _ = manager.rollout(
            [fmt.prompt_messages(q) for q in questions], [{}] * 6, backend, first_actions
        )
    finally:
        manager.close()
    firsts = [_first_choice(t.segments[1].text, fmt.action_choices) for t in trajectories]
    for group in (firsts[:3], firsts[3:]):
        assert sorted(group) == sorted(fmt.action_choices.continuations), firsts  # every tool once per group
    with pytest.raises(ValueError, match="constrains none"):
        RolloutManager(ThreeTools, load_format("react", ThreeTools.tool_schemas()), tokenizer,
                       RolloutLimits()).rollout([questions[0]], [{}], backend, first_actions[:1])  # fmt: skip


def test_a_recipe_spreading_first_actions_without_a_constrained_slot_is_refused(tmp_path):
    from agentic_grpo.train import prepare

    argv = ["--config", "recipes/ci_tiny.yaml", "--output_dir", str(tmp_path / "out"),
            "--experimental", "{spread_first_action: true}"]  # fmt: skip
    with pytest.raises(ValueError, match="constrain_actions"):
        prepare(argv)


def test_experimental_options_live_under_their_own_key(tmp_path):
    from agentic_grpo.config import AgenticGRPOConfig
    from agentic_grpo.train import prepare

    base = ["--config", "recipes/ci_tiny.yaml", "--output_dir", str(tmp_path / "out")]
    with pytest.raises(ValueError, match=r"\['canonical_actions'\] are experimental options: set them under"):
        prepare([*base, "--format_kwargs", "{constrain_actions: true, canonical_actions: true}"])
    with pytest.raises(ValueError, match="need a constrained action slot: set format_kwargs `constrain_actions"):
        prepare([*base, "--experimental", "{canonical_actions: true}"])
    with pytest.raises(ValueError, match="action_temperature` must be above 0"):
        prepare([*base, "--format_kwargs", "{constrain_actions: true}", "--experimental", "{action_temperature: 0}"])
    with pytest.raises(
        ValueError, match="`spread_first_action` is an experimental option: set it under `experimental"
    ):
        prepare([*base, "--spread_first_action", "true"])  # not a top-level field
    recipe = tmp_path / "credit.yaml"
    recipe.write_text(Path("recipes/ci_tiny.yaml").read_text() + "advantage: turn\n")
    with pytest.raises(ValueError, match="`advantage` is an experimental option: set it under `experimental:`"):
        prepare(["--config", str(recipe), "--output_dir", str(tmp_path / "out")])
    with pytest.raises(ValueError, match="experimental `turn_gamma` must be in \\(0, 1\\]"):
        AgenticGRPOConfig(output_dir="unused", experimental={"advantage": "turn", "turn_gamma": 0.0})
    with pytest.raises(ValueError, match="experimental `advantage` must be `outcome`, `turn` or `anchor`"):
        AgenticGRPOConfig(output_dir="unused", experimental={"advantage": "turns"})
    with pytest.raises(ValueError, match="option `canonical_action` is not known; did you mean `canonical_actions`"):
        AgenticGRPOConfig(output_dir="unused", experimental={"canonical_action": True})
    prepared = prepare([*base, "--format_kwargs", "{constrain_actions: true}",
                        "--experimental", "{canonical_actions: true, action_temperature: 2.0}"])  # fmt: skip
    slot = prepared.rollout_parts.trajectory_format.action_choices
    assert isinstance(slot, TunedActionChoices) and slot.canonical and slot.temperature == 2.0
    untuned = prepare([*base, "--format_kwargs", "{constrain_actions: true}"]).rollout_parts.trajectory_format
    assert type(untuned.action_choices) is ActionChoices  # the core slot, untouched without experiments
    assert slot.continuations == untuned.action_choices.continuations


@pytest.mark.integration
def test_training_with_spread_first_actions_runs_a_step(tmp_path):
    """Through train.py: the trainer hands `spread_first_action` to the rollout manager (a misnamed keyword fails
    here, not in a user's first run)."""
    from tests.helpers import train

    out = tmp_path / "out"
    result = train("--config", "recipes/ci_tiny.yaml", "--output_dir", str(out), "--max_steps", "1",
                   "--format_kwargs", '{"constrain_actions": true}',
                   "--experimental", "{spread_first_action: true}")  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert (out / "trajectories" / "step_000001.jsonl").exists()
