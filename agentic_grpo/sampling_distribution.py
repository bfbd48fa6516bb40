"""The distribution a sampler draws from: the model's logits at the sampling temperature, then min-p, top-k and
top-p, renormalized over what is left.

vLLM reports each sampled token's log-prob under that processed distribution (TRL starts it with
`logprobs_mode="processed_logprobs"`, so that its importance-sampling correction divides by the probability the
token was really drawn with). The trainer scores log_softmax(logits / T), with no filter. With top-k, top-p or
min-p set, the two differ by the log of the mass the filters removed before any bug, so the sampler-trainer
canary compares the sampler's log-probs with the trainer's under the same processing. HF `generate` (`agentic_grpo.shrinking_batch`)
records log_softmax(logits / T), which needs none.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class SamplingFilters:
    """The filters applied after the temperature (the neutral value of each: top_k 0, top_p 1, min_p 0)."""

    temperature: float
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0

    def named(self) -> list[str]:
        """The filters that are on, as `name: value`."""
        values = (("top_k", self.top_k, 0), ("top_p", self.top_p, 1.0), ("min_p", self.min_p, 0.0))
        return [f"{name}: {value}" for name, value, neutral in values if value != neutral]

    @property
    def active(self) -> bool:
        return bool(self.named())


def filters_of(sampler: Any) -> SamplingFilters:
    """The sampling filters of a `GRPOTrainer` or its config (temperature, top_k, top_p, min_p; a field it lacks is
    neutral)."""
    top_p = getattr(sampler, "top_p", None)
    return SamplingFilters(
        temperature=float(getattr(sampler, "temperature", 1.0)),
        top_k=int(getattr(sampler, "top_k", 0) or 0),
        top_p=1.0 if top_p is None else float(top_p),
        min_p=float(getattr(sampler, "min_p", 0.0) or 0.0),
    )


def processed_log_softmax(logits: torch.Tensor, filters: SamplingFilters) -> torch.Tensor:
    """Log-probs over the vocabulary (last dimension) after temperature, min-p, top-k and top-p, in vLLM's order
    and with its tie rules (a token tied with the k-th logit is kept; top-p keeps the most likely token always).
    Filtered-out tokens get -inf."""
    logits = logits.float() / filters.temperature
    if filters.min_p > 0:
        probs = logits.softmax(-1)
        floor = probs.amax(-1, keepdim=True) * filters.min_p
        logits = logits.masked_fill(probs < floor, float("-inf"))
    if filters.top_k > 0 or filters.top_p < 1.0:
        ordered, order = logits.sort(dim=-1, descending=False)
        if filters.top_k > 0:
            k = min(filters.top_k, ordered.size(-1))
            kth = ordered[..., ordered.size(-1) - k].unsqueeze(-1)
            ordered = ordered.masked_fill(ordered < kth, float("-inf"))
        if filters.top_p < 1.0:
            cumulative = ordered.softmax(-1).cumsum(-1)
            dropped = cumulative <= 1 - filters.top_p
            dropped[..., -1] = False
            ordered = ordered.masked_fill(dropped, float("-inf"))
        logits = torch.empty_like(ordered).scatter_(-1, order, ordered)
    return logits.log_softmax(-1)


def processed_token_logprobs(
    logits: torch.Tensor, tokens: torch.Tensor, filters: SamplingFilters, rows_at_once: int = 1
) -> torch.Tensor:
    """Each token's log-prob under the processed distribution of the logits that predicted it
    (`logits`: [rows, positions, vocab], `tokens`: [rows, positions]); a few rows at a time, so that the sort
    holds one row's logits twice at most."""
    out = []
    for start in range(0, logits.size(0), rows_at_once):
        block = processed_log_softmax(logits[start : start + rows_at_once], filters)
        out.append(block.gather(-1, tokens[start : start + rows_at_once, :, None]).squeeze(-1))
    return torch.cat(out)
