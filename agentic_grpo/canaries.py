"""Canaries: checks, on by default, that stop a run which would otherwise train silently wrong.

Every RL framework has lost weeks to failures that raise nothing: an adapter that was never active in the
sampler, a wrong temperature, dropout on while sampling, a chat template that tokenizes one way in rollouts
and another in training, a resume that restored the wrong state. Each of these makes the sampler and the
trainer disagree about the trajectories, and GRPO's ratio starts at 1 whatever they disagree about. Three
checks make them loud:

- **Sampler-trainer agreement, every training step** (`logprob_agreement`): each sampled token's log-prob as
  the sampler computed it against the trainer's for the same token (both at their temperatures, dropout
  off). Logged as `canary/logprob_diff/{mean,max,share_over_0.5}`; a mean over `canary_logprob_limit` stops
  the run, naming the likely causes.
- **Token round-trip, at start-up** (`agentic_grpo.token_round_trip`).
- **Resume, at the first step of a resumed run** (`agentic_grpo.resume_canary`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

TOKEN_LIMIT = 0.5
"""Nats: a token whose sampler and trainer log-probs differ by more counts in `share_over_0.5`."""

LIKELY_CAUSES = (
    "dropout on while sampling or scoring (a module left in train mode)",
    "a different temperature for sampling and for training (a sub-agent's own `temperature`)",
    "a different adapter active in the sampler than in the trainer",
    "position ids numbered differently (absolute-position models and left padding)",
    "kept keys and values that do not match the context (`agentic_grpo.kv_reuse`)",
    "vLLM weights that were not synced after the last optimizer step",
)


def logprob_agreement(
    sampled: torch.Tensor,
    scored: torch.Tensor,
    mask: torch.Tensor,
    gather: Callable[[torch.Tensor], torch.Tensor],
) -> dict[str, float]:
    """Per-token |sampler - trainer| log-prob over the tokens `mask` marks (sampled tokens, not tool output),
    over every process (`gather` is collective: every process calls it). Empty when no token was compared."""
    valid = mask.bool() & ~torch.isnan(sampled)
    diff = (sampled.float() - scored.float()).abs()[valid]
    local = torch.stack(
        [
            diff.sum(),
            torch.tensor(float(diff.numel()), device=diff.device),
            (diff > TOKEN_LIMIT).sum().float(),
            diff.max() if diff.numel() else torch.tensor(0.0, device=diff.device),
        ]
    )
    every = gather(local.reshape(1, 4)).reshape(-1, 4)
    count = float(every[:, 1].sum())
    if count == 0:
        return {}
    return {
        "canary/logprob_diff/mean": float(every[:, 0].sum()) / count,
        "canary/logprob_diff/max": float(every[:, 3].max()),
        f"canary/logprob_diff/share_over_{TOKEN_LIMIT}": float(every[:, 2].sum()) / count,
    }


def likely_causes(
    sampled: torch.Tensor,
    scored: torch.Tensor,
    mask: torch.Tensor,
    padded: torch.Tensor,
    dropout_modules: int,
    sampler_temperature: float | None,
    trainer_temperature: float,
) -> list[str]:
    """What this process can tell about a disagreement: dropout that was on while sampling, temperatures that
    differ, or a disagreement confined to the left-padded rows (positions numbered differently)."""
    found = []
    if dropout_modules:
        found.append(f"dropout was on while sampling ({dropout_modules} dropout modules in train mode)")
    if sampler_temperature is not None and abs(sampler_temperature - trainer_temperature) > 1e-6:
        found.append(f"the sampler sampled at temperature {sampler_temperature} and the trainer scores at "
                     f"{trainer_temperature}")  # fmt: skip
    valid = mask.bool() & ~torch.isnan(sampled)
    diff = (sampled.float() - scored.float()).abs().masked_fill(~valid, 0.0)
    per_row = diff.sum(-1) / valid.sum(-1).clamp(min=1)
    rows = valid.any(-1)
    padded = padded.bool().to(rows.device)
    if (rows & padded).any() and (rows & ~padded).any():
        on_padded, on_whole = per_row[rows & padded].mean(), per_row[rows & ~padded].mean()
        if on_padded > 10 * max(float(on_whole), 1e-3):
            found.append(
                f"the left-padded rows disagree ({float(on_padded):.3f} nats per token) and the others do not "
                f"({float(on_whole):.4f}): the sampler and the trainer number positions differently"
            )
    return found


class CanaryError(RuntimeError):
    """A canary found the run would train on something other than what it believes: the run stops."""


def sampler_disagreement(
    metrics: dict[str, float], limit: float, step: int, trajectories: str | None, found: list[str], who: str = ""
) -> str:
    """The message that stops a run whose sampler and trainer disagree by more than `limit` nats per token;
    `found`: what `likely_causes` found, named first; `who`: whose tokens (a co-trained sub-agent's)."""
    named = "".join(f"\n  - {cause}" for cause in found)
    causes = "".join(f"\n  - {cause}" for cause in LIKELY_CAUSES)
    where = f"\nThe step's trajectories are in {trajectories}." if trajectories else ""
    return (
        f"canary: at step {step} the sampler and the trainer score the same sampled tokens{who} differently: "
        f"{metrics['canary/logprob_diff/mean']:.4f} nats per token on average (limit {limit}), "
        f"{metrics['canary/logprob_diff/max']:.3f} at most, "
        f"{metrics[f'canary/logprob_diff/share_over_{TOKEN_LIMIT}']:.1%} of tokens over {TOKEN_LIMIT}. "
        "Training on these trajectories would follow the gradient of some other policy."
        + (f"\nFound:{named}" if found else "")
        + f"\nCauses to look for:{causes}{where}\nIf the difference is expected (bf16 on a sharp model, vLLM in "
        "another precision), raise `canary_logprob_limit`; 0 turns the check off."
    )
