"""In bf16, the log-probs the sampler records through kept keys and values agree with a whole read, to a tolerance.

`tests/test_kv_reuse.py` checks, in fp32, that keeping each trajectory's keys and values across turns samples
token for token what reading each context whole samples. In bf16 that cannot hold: a context read through a
`DynamicCache` (in pieces, left-padded, a row at a time as the batch shrinks) rounds differently from one read
whole, so logits differ in their last bits, which sometimes changes a sampled token (plain HF behaviour, not a
bias of the reuse). What must still hold is that each token was sampled from the right distribution: here a
real multi-turn rollout (tiny Llama, calculator environment, ReAct format, cache reuse and a shrinking batch)
records each sampled token's log-prob, and a whole-row forward of the same model (no cache, no padding, one
trajectory at a time) scores the same tokens. The two agree to rounding: within a few hundredths of a nat in
bf16, to about 1e-6 in fp32. Keys and values that belong to another trajectory break that by tenths of a nat
on average and by nats at worst (the planted bug below), far outside the bf16 tolerance.

A random tiny Llama barely reads its context: attention is near uniform and adds little to the residual, so
a token's distribution hangs on the token before it and corrupted keys and values would hardly show. Its
attention is sharpened and strengthened (query/key and value/output weights scaled) and its output sharpened
(lm_head scaled, untied from the embeddings), the same in both precisions; the prompts are bare questions,
without the format's long system prompt, so that the turns a bug could corrupt are most of each context.
"""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, GenerationConfig

from agentic_grpo.backends import TransformersBackend
from agentic_grpo.formats import load_format
from agentic_grpo.kv_reuse import ContextCache
from agentic_grpo.rollout import RolloutLimits, RolloutManager
from agentic_grpo.tools.calculator import Calculator

QUESTIONS = ["What is 12 * 34?", "Multiply 120 by 7.", "A shop sells 214 boxes of 37 pens. How many pens?"]
G = 3
EOS_IDS = [2, *range(100, 130)]  # <|im_end|> and 30 more: turns end at different lengths, some trajectories early
TEMPERATURE = 0.7  # not 1: the recorded log-probs must be taken at the sampling temperature
SEEDS = (0, 1, 2)

# |sampler - whole read| per model token, over the rollouts of SEEDS together (about 800 tokens; measured on CPU):
#   bf16:                                   mean 8.8e-4, max 0.022
#   bf16 sampler against an fp32 read:      mean 6.6e-3, max 0.031  (bf16 rounding at every op: the scale of what
#                                           two bf16 reads of one context may differ by on other kernels)
#   bf16, rows served another's entry:      mean 0.27,   max 4.1    (the planted bug below)
#   fp32:                                   mean 2.7e-7, max 1.4e-6
BF16_MEAN_TOLERANCE = 0.02  # 3x the fp32-read gap, 20x the bf16 one measured; the planted bug's is 13x this
BF16_MAX_TOLERANCE = 0.1  # 3x the fp32-read gap, 4.5x the bf16 one measured; the planted bug's is 40x this
FP32_MAX_TOLERANCE = 1e-4


def policy(tiny_model_dir: str, dtype: torch.dtype):
    """The tiny Llama in `dtype`, made to read its context (see the module docstring)."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=dtype)
    with torch.no_grad():
        model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight * 8)  # a new tensor: embeddings untouched
        for layer in model.model.layers:
            attention = layer.self_attn
            for projection in (attention.q_proj, attention.k_proj, attention.v_proj, attention.o_proj):
                projection.weight.mul_(4)
    return model.eval()


def rollout(model, tokenizer, seed: int):
    """One seeded multi-turn rollout with kept keys and values and a shrinking batch; returns its trajectories."""
    config = GenerationConfig(do_sample=True, temperature=TEMPERATURE, top_p=1.0, top_k=None,
                              pad_token_id=tokenizer.pad_token_id, eos_token_id=EOS_IDS)  # fmt: skip
    backend = TransformersBackend(model, tokenizer, config, EOS_IDS, reuse_cache=True, shrink_batch=True)
    trajectory_format = load_format("react", Calculator.tool_schemas())
    manager = RolloutManager(Calculator, trajectory_format, tokenizer,
                             RolloutLimits(max_turns=4, max_tokens_per_turn=24, max_completion_tokens=200))  # fmt: skip
    prompts = [[{"role": "user", "content": q}] for q in QUESTIONS for _ in range(G)]
    torch.manual_seed(seed)
    try:
        trajectories, _ = manager.rollout(prompts, [{}] * len(prompts), backend)
    finally:
        manager.close()
    return trajectories


def logprob_gaps(model, trajectories) -> torch.Tensor:
    """|recorded log-prob - log-prob under a whole read of the trajectory| for every token the model sampled."""
    gaps = []
    for trajectory in trajectories:
        ids = torch.tensor([trajectory.prompt_ids + trajectory.completion_ids])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0].float()
        logprobs = torch.log_softmax(logits / TEMPERATURE, dim=-1)
        start = len(trajectory.prompt_ids)  # where the segment's first token is; its logits are one before
        for segment in trajectory.completion_segments:
            if segment.role == "model":
                assert segment.logprobs is not None and len(segment.logprobs) == len(segment.token_ids)
                rows = logprobs[start - 1 : start - 1 + len(segment.token_ids)]
                whole = rows.gather(-1, torch.tensor(segment.token_ids)[:, None]).squeeze(-1)
                gaps.append((torch.tensor(segment.logprobs) - whole).abs())
            start += len(segment.token_ids)
    return torch.cat(gaps)


def gaps_over_seeds(model, tokenizer) -> torch.Tensor:
    """The gaps of one rollout per seed, together."""
    trajectories = [t for seed in SEEDS for t in rollout(model, tokenizer, seed)]
    turns = [t.turns for t in trajectories]
    assert max(turns) >= 3 and min(turns) < max(turns), "multi-turn, with trajectories that end early"
    assert any(s.role == "tool" for t in trajectories for s in t.segments)
    return logprob_gaps(model, trajectories)


def test_bf16_sampling_logprobs_match_a_whole_read_within_rounding(tiny_model_dir, tokenizer):
    gaps = gaps_over_seeds(policy(tiny_model_dir, torch.bfloat16), tokenizer)
    assert gaps.mean() < BF16_MEAN_TOLERANCE, f"mean {gaps.mean():.2e} over {len(gaps)} tokens"
    assert gaps.max() < BF16_MAX_TOLERANCE, f"max {gaps.max():.2e} over {len(gaps)} tokens"


def test_fp32_sampling_logprobs_match_a_whole_read(tiny_model_dir, tokenizer):
    gaps = gaps_over_seeds(policy(tiny_model_dir, torch.float32), tokenizer)
    assert gaps.max() < FP32_MAX_TOLERANCE, f"max {gaps.max():.2e} over {len(gaps)} tokens"


def test_keys_and_values_of_another_trajectory_exceed_the_bf16_tolerance(tiny_model_dir, tokenizer, monkeypatch):
    """The check above catches wrong kept keys and values: the store serves each row the entry matched for the
    next row (as a mix-up of rows when the batch shrinks would), cut to the length its own match held."""
    match = ContextCache.match

    def crossed(self, batch):
        found = match(self, batch)
        served = []
        for row, (entry, n) in enumerate(found):
            other, _ = found[(row + 1) % len(found)]
            served.append((entry, n) if entry is None or other is None else (other, min(n, len(other.ids))))
        return served

    monkeypatch.setattr(ContextCache, "match", crossed)
    gaps = gaps_over_seeds(policy(tiny_model_dir, torch.bfloat16), tokenizer)
    assert gaps.mean() > 4 * BF16_MEAN_TOLERANCE, f"mean {gaps.mean():.2e} over {len(gaps)} tokens"
    assert gaps.max() > 4 * BF16_MAX_TOLERANCE, f"max {gaps.max():.2e} over {len(gaps)} tokens"
