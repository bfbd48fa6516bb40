"""Keeping each trajectory's keys and values across turns samples the same tokens as reading contexts whole.

Real tiny Llama, real calculator environment and ReAct format, real multi-turn rollouts (the random model's
turns are malformed, so each is answered with an error observation and the trajectory goes on). Several
token ids count as end-of-turn so that turns end at different lengths and some trajectories end early
(a turn cut by its budget ends the trajectory) while others go on.
"""

from __future__ import annotations

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, GenerationConfig, MistralConfig, MistralForCausalLM

from agentic_grpo.backends import TransformersBackend
from agentic_grpo.formats import load_format
from agentic_grpo.kv_reuse import ContextCache, _Entry, why_not_reusable
from agentic_grpo.rollout import RolloutLimits, RolloutManager
from agentic_grpo.tools.calculator import Calculator

QUESTIONS = ["What is 12 * 34?", "Multiply 120 by 7.", "A shop sells 214 boxes of 37 pens. How many pens?"]
G = 3


def tiny(tiny_model_dir: str, lora: bool):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    if lora:  # a random (non-zero) adapter: generation runs through PEFT's wrapped layers
        torch.manual_seed(1)
        model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    return model.eval()


EOS_IDS = [2, *range(100, 130)]  # <|im_end|> and 30 more: about 1 token in 20 ends a turn


def backend_for(model, tokenizer, reuse: bool, shrink: bool = True) -> TransformersBackend:
    config = GenerationConfig(do_sample=True, temperature=1.0, top_p=1.0, top_k=None,
                              pad_token_id=tokenizer.pad_token_id, eos_token_id=EOS_IDS)  # fmt: skip
    return TransformersBackend(model, tokenizer, config, EOS_IDS, reuse_cache=reuse, shrink_batch=shrink)


def rollout(model, tokenizer, reuse: bool, seed: int = 0, backend=None, shrink: bool = True):
    """One seeded multi-turn rollout; returns each trajectory's segments and the number of tokens the model read."""
    backend = backend or backend_for(model, tokenizer, reuse, shrink)
    trajectory_format = load_format("react", Calculator.tool_schemas())
    manager = RolloutManager(Calculator, trajectory_format, tokenizer,
                             RolloutLimits(max_turns=4, max_tokens_per_turn=24, max_completion_tokens=200))  # fmt: skip
    read = []  # tokens through the embedding layer: every forward pass, under PEFT's wrapping or not
    hook = model.get_input_embeddings().register_forward_hook(lambda _m, args, _o: read.append(args[0].numel()))
    prompts = [trajectory_format.prompt_messages(q) for q in QUESTIONS for _ in range(G)]
    torch.manual_seed(seed)
    try:
        trajectories, _ = manager.rollout(prompts, [{}] * len(prompts), backend)
    finally:
        manager.close()
        hook.remove()
    return trajectories, sum(read)


@pytest.mark.parametrize("shrink", [False, True], ids=["full-batch", "shrinking-batch"])
@pytest.mark.parametrize("lora", [False, True], ids=["plain", "lora"])
def test_kept_keys_and_values_sample_the_same_tokens(tiny_model_dir, tokenizer, lora, shrink):
    model = tiny(tiny_model_dir, lora)
    before, read_before = rollout(model, tokenizer, reuse=False)
    after, read_after = rollout(model, tokenizer, reuse=True, shrink=shrink)

    def segments(trajectories):
        return [[(s.role, s.token_ids) for s in t.segments] for t in trajectories]

    assert segments(after) == segments(before)
    assert [t.finish_reason for t in after] == [t.finish_reason for t in before]
    turns = [t.turns for t in before]
    assert max(turns) >= 3 and min(turns) < max(turns), "multi-turn, with trajectories that end early"
    assert any(s.role == "tool" for t in before for s in t.segments)
    assert read_after < read_before / 2, "the second path reads each context once"


def test_nothing_is_kept_from_one_rollout_to_the_next(tiny_model_dir, tokenizer):
    """The weights change between rollouts (an optimizer step): a second rollout on the same backend must
    sample what a fresh backend samples, not extend keys and values the old weights computed."""
    model = tiny(tiny_model_dir, lora=False)
    backend = backend_for(model, tokenizer, reuse=True)
    rollout(model, tokenizer, reuse=True, backend=backend)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))
    again, _ = rollout(model, tokenizer, reuse=True, seed=1, backend=backend)
    fresh, _ = rollout(model, tokenizer, reuse=False, seed=1)
    assert [[s.token_ids for s in t.segments] for t in again] == [[s.token_ids for s in t.segments] for t in fresh]


def test_a_repetition_penalty_falls_back_to_reading_whole_contexts(tiny_model_dir, tokenizer):
    model = tiny(tiny_model_dir, lora=False)
    config = GenerationConfig(do_sample=False, repetition_penalty=1.3, pad_token_id=tokenizer.pad_token_id,
                              eos_token_id=[tokenizer.eos_token_id])  # fmt: skip
    assert "repetition_penalty" in why_not_reusable(model, config)
    assert why_not_reusable(model, GenerationConfig(do_sample=False)) is None
    sliding = MistralForCausalLM(MistralConfig(vocab_size=100, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                               num_attention_heads=2, num_key_value_heads=1, sliding_window=8))  # fmt: skip
    assert "DynamicSlidingWindowLayer" in why_not_reusable(sliding, GenerationConfig(do_sample=False))
    reusing = TransformersBackend(model, tokenizer, config, [tokenizer.eos_token_id])
    plain = TransformersBackend(model, tokenizer, config, [tokenizer.eos_token_id], reuse_cache=False)
    batch = [tokenizer("What is 12 * 34?")["input_ids"], tokenizer("hi")["input_ids"]]
    assert [g.token_ids for g in reusing.generate(batch, [], 8)] == [g.token_ids for g in plain.generate(batch, [], 8)]


def test_a_shrinking_batch_stops_feeding_rows_that_have_stopped(tiny_model_dir, tokenizer):
    """Same tokens as the full batch (the test above), and fewer tokens through the model: rows that stopped
    early in a turn are no longer fed padding while the longest row goes on."""
    model = tiny(tiny_model_dir, lora=False)
    full, read_full = rollout(model, tokenizer, reuse=True, shrink=False)
    shrunk, read_shrunk = rollout(model, tokenizer, reuse=True, shrink=True)
    assert [[s.token_ids for s in t.segments] for t in shrunk] == [[s.token_ids for s in t.segments] for t in full]
    assert read_shrunk < read_full
    after_full, after_shrunk = torch.random.get_rng_state(), None
    rollout(model, tokenizer, reuse=True, shrink=False, seed=3)
    after_full = torch.random.get_rng_state()
    rollout(model, tokenizer, reuse=True, shrink=True, seed=3)
    after_shrunk = torch.random.get_rng_state()
    assert torch.equal(after_full, after_shrunk), "the generator is left where `generate` leaves it"


def test_a_shrinking_batch_samples_greedily_and_stops_on_strings(tiny_model_dir, tokenizer):
    """Greedy, with a stop string that ends one row after one token and another after two (the random model
    repeats a token; the string spans the end of the context): the same rows as `generate`'s, padded after."""
    model = tiny(tiny_model_dir, lora=False)
    config = GenerationConfig(do_sample=False, pad_token_id=tokenizer.pad_token_id, eos_token_id=EOS_IDS)
    batch = [tokenizer(text)["input_ids"] for text in ["What is 12 * 34?", "hi", "Observation: 3"]]
    results = {}
    for shrink in (False, True):
        backend = TransformersBackend(model, tokenizer, config, EOS_IDS, shrink_batch=shrink)
        results[shrink] = [g.token_ids for g in backend.generate(batch, ["??", " 3 3 3"], 16)]
    assert results[True] == results[False]
    ended = [ids.index(tokenizer.pad_token_id) if tokenizer.pad_token_id in ids else len(ids) for ids in results[True]]
    assert ended == [1, 16, 2]


def test_a_shrinking_batch_without_padding_samples_what_generate_samples(tiny_model_dir, tokenizer):
    """Rows of one length (the G copies of a prompt, on the first turn): `generate` passes no attention mask."""
    model = tiny(tiny_model_dir, lora=False)
    batch = [tokenizer("What is 12 * 34?")["input_ids"]] * 3
    results = {}
    for shrink in (False, True):
        torch.manual_seed(0)
        results[shrink] = [g.token_ids for g in backend_for(model, tokenizer, True, shrink).generate(batch, [], 12)]
    assert results[True] == results[False]
    assert len({tuple(ids) for ids in results[True]}) > 1, "sampled: the copies differ"


def test_each_row_is_matched_to_the_entry_sharing_its_longest_prefix():
    def entry(ids: list[int]) -> _Entry:
        return _Entry(ids, [], [])

    store = ContextCache([entry([1, 2, 3, 4]), entry([1, 2, 9]), entry([1, 2, 3, 4, 5, 6]), entry([1, 2, 3, 4])])
    rows = [[1, 2, 3, 4, 5, 6, 7], [1, 2, 3, 4, 5], [1, 2, 9, 9], [1, 2, 3, 4], [7, 1, 2], [1]]
    position = {id(e): i for i, e in enumerate(store.entries)}  # by identity: entries 0 and 3 are equal in value
    found = [(position[id(e)] if e is not None else None, n) for e, n in store.match(rows)]
    # the longest shared prefix wins, the first entry on a tie; at most len(row) - 1 tokens (one left to read)
    assert found == [(2, 6), (0, 4), (1, 3), (0, 3), (None, 0), (None, 0)]
    assert ContextCache().match(rows[:2]) == [(None, 0), (None, 0)]
