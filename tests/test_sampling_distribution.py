"""The sampler's processed distribution (temperature, then min-p, top-k, top-p) that the canary compares vLLM's
log-probs with, and the start-up refusal of filters under TRL's sequence-level importance sampling."""

from __future__ import annotations

import math

import pytest
import torch

from agentic_grpo.config import AgenticGRPOConfig
from agentic_grpo.shrinking_batch import SamplingFilters, processed_log_softmax, processed_token_logprobs
from agentic_grpo.trainer_checks import check_trainer_setup
from tests.helpers import require_vllm


def test_temperature_alone_is_log_softmax_of_the_scaled_logits():
    logits = torch.tensor([[1.0, 2.0, 3.0, 0.5]])
    got = processed_log_softmax(logits, SamplingFilters(temperature=0.7))
    assert torch.allclose(got, torch.log_softmax(logits / 0.7, dim=-1))


def test_top_k_renormalizes_over_the_k_largest():
    logits = torch.tensor([[1.0, 2.0, 3.0, 0.5]])
    got = processed_log_softmax(logits, SamplingFilters(temperature=1.0, top_k=2))
    expected = torch.log_softmax(torch.tensor([2.0, 3.0]), dim=-1)
    assert torch.allclose(got[0, 1:3], expected)
    assert got[0, 0] == -math.inf and got[0, 3] == -math.inf


def test_top_p_keeps_the_smallest_head_over_p_and_always_the_most_likely():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    logits = probs.log()
    got = processed_log_softmax(logits, SamplingFilters(temperature=1.0, top_p=0.75)).exp()
    assert torch.allclose(got, torch.tensor([[0.5 / 0.8, 0.3 / 0.8, 0.0, 0.0]]))
    only_top = processed_log_softmax(logits, SamplingFilters(temperature=1.0, top_p=0.01)).exp()
    assert torch.allclose(only_top, torch.tensor([[1.0, 0.0, 0.0, 0.0]]))


def test_min_p_drops_tokens_below_a_share_of_the_most_likely():
    probs = torch.tensor([[0.6, 0.3, 0.07, 0.03]])
    got = processed_log_softmax(probs.log(), SamplingFilters(temperature=1.0, min_p=0.1)).exp()
    assert torch.allclose(got, torch.tensor([[0.6 / 0.97, 0.3 / 0.97, 0.07 / 0.97, 0.0]]))


def test_token_logprobs_pick_each_target_row_by_row():
    logits = torch.randn(3, 5, 11)
    tokens = torch.randint(0, 11, (3, 5))
    filters = SamplingFilters(temperature=0.9, top_k=6)
    got = processed_token_logprobs(logits, tokens, filters)
    whole = processed_log_softmax(logits, filters).gather(-1, tokens[..., None]).squeeze(-1)
    assert torch.equal(got, whole)


@pytest.mark.vllm
@pytest.mark.parametrize(("top_k", "top_p"), [(20, 1.0), (0, 0.9), (10, 0.8)])
def test_the_same_processing_as_vllms_sampler(top_k, top_p):
    require_vllm()  # compares with vLLM's own sampler
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p

    torch.manual_seed(0)
    logits = torch.randn(6, 300) * 3
    theirs = apply_top_k_top_p(
        logits / 0.7, torch.full((6,), top_k) if top_k else None, torch.full((6,), top_p) if top_p < 1 else None
    ).log_softmax(-1)
    ours = processed_log_softmax(logits, SamplingFilters(temperature=0.7, top_k=top_k, top_p=top_p))
    assert torch.equal(torch.isinf(ours), torch.isinf(theirs))
    kept = ~torch.isinf(ours)
    assert torch.allclose(ours[kept], theirs[kept], atol=1e-5)


def config(**fields) -> AgenticGRPOConfig:
    return AgenticGRPOConfig(output_dir="unused", num_generations=4, per_device_train_batch_size=4, report_to=[],
                             **fields)  # fmt: skip


@pytest.mark.parametrize("filters", [{"top_k": 20}, {"top_p": 0.9}, {"min_p": 0.05}])
def test_filters_under_sequence_level_importance_sampling_are_refused(filters):
    with pytest.raises(ValueError, match="every factor is below 1, the product is near 0"):
        check_trainer_setup(config(use_vllm=True, **filters), [])
    check_trainer_setup(config(use_vllm=True, vllm_importance_sampling_mode="token_truncate", **filters), [])
    check_trainer_setup(config(use_vllm=True, vllm_importance_sampling_correction=False, **filters), [])
    check_trainer_setup(config(use_vllm=False, **filters), [])
    check_trainer_setup(config(use_vllm=True), [])
