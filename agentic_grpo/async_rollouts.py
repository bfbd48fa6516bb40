"""Asynchronous rollouts, a layer over the policy's trainer: while step `s` trains, a sampler thread rolls out
the trajectories of steps `s+1 ... s+max_staleness` (`agentic_grpo.async_sampler`).

One step of an asynchronous run, in order (`AsyncRolloutsLayer`):

1. The Trainer fetches step `s`'s rows; `get_batch_samples` also reads the next `max_staleness` steps' rows from
   the same data loader (the order is the data loader's: nothing is drawn twice or skipped).
2. `_sample`: the steps not yet handed to the sampler are, each with a snapshot of the trainable weights as they
   are now (version `s`, the optimizer steps taken). Pacing is by construction: a job for step `t` is handed over
   at step `t - max_staleness` at the earliest, so no trajectory trains more than `max_staleness` steps after its
   weights; the sampler never runs further ahead, and every trajectory it makes is trained on once. Then step
   `s`'s batch is taken (the trainer waits, at most the setting's `timeout`) and checked: its rows are this step's, its
   staleness is within the bound, and the weights the sampler held are the snapshot of the version it claims.
3. TRL scores the batch and computes group advantages as for any batch; the sampler-trainer canary's figures
   are the sampler's own (its tokens read by its own weights: the trainer's weights have moved since).
4. The importance weight (`importance_weights`): each model token's probability under the trainer's weights
   now (the proximal policy) over its probability under the weights that sampled it (the behaviour policy),
   both after temperature, top-k and top-p, truncated at `importance_weight_cap`. It multiplies the token's
   advantage, which for GRPO's clipped surrogate (and bnpo, dr_grpo, dapo) equals TRL's own weighting of a
   token's policy-gradient term; GRPO's clip against the proximal policy and the KL against the frozen
   reference stay TRL's.
5. A checkpoint waits for the jobs in flight and stores their batches (`async_rollouts.pt`); a resumed run takes
   them instead of sampling them again, and samples each later step with the weights and noise the interrupted
   run would have used.
"""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Any

import torch

from agentic_grpo.async_sampler import AsyncSampler, Batch, Job, snapshot
from agentic_grpo.backends import dropout_off
from agentic_grpo.canaries import (
    CanaryError,
    canary_limit,
    rows_fingerprint,
    sampler_disagreement,
    tensors_fingerprint,
)
from agentic_grpo.checkpoints import resolved_checkpoint
from agentic_grpo.kv_reuse import why_not_reusable
from agentic_grpo.shrinking_batch import filters_of, processed_read
from agentic_grpo.trajectory import with_rows

PENDING_FILE = "async_rollouts.pt"
LINEAR_LOSSES = ("grpo", "bnpo", "dr_grpo", "dapo")
"""Losses linear in each token's advantage, where weighting the advantage weights the token's term."""


def check_async_config(args: Any) -> None:
    """Refuse, before a model loads, what asynchronous rollouts do not run with."""
    if not getattr(args, "async_rollouts", None):
        return
    reasons = []
    if args.use_vllm:
        reasons.append("the sampler is HF generation in a thread of its own: set `use_vllm: false`")
    sampling = []
    if args.experimental:  # per-turn credit only reweighs advantages, which the importance weight multiplies
        from agentic_grpo.experimental import TURN_CREDIT_OPTIONS

        sampling = sorted(set(args.experimental) - set(TURN_CREDIT_OPTIONS))
    if args.subagents or sampling:
        reasons.append("sub-agents and the `experimental:` action-slot options sample with the trainer's own weights")
    if args.num_iterations != 1 or (args.steps_per_generation or args.gradient_accumulation_steps) != (
        args.gradient_accumulation_steps
    ):
        reasons.append(
            "one generation per optimizer step: `num_iterations: 1` and `steps_per_generation` equal to "
            "`gradient_accumulation_steps` (or unset)"
        )
    if args.loss_type not in LINEAR_LOSSES:
        reasons.append(
            f"`loss_type` {args.loss_type!r}: the importance weight needs one of {', '.join(LINEAR_LOSSES)}"
        )
    if reasons:
        raise ValueError("async_rollouts: " + "; ".join(reasons))


def importance_weights(
    proximal: torch.Tensor, behaviour: torch.Tensor, mask: torch.Tensor, cap: float
) -> tuple[torch.Tensor, dict[str, float]]:
    """Per-token weights min(p_proximal / p_behaviour, `cap`) on the tokens `mask` marks (1 elsewhere), from the
    two policies' log-probs of the sampled tokens; and the ratio's mean, max and share over `cap` there."""
    marked = mask.bool() & torch.isfinite(behaviour) & torch.isfinite(proximal)
    ratio = torch.exp((proximal.float() - behaviour.float()).masked_fill(~marked, 0.0))
    weights = torch.where(marked, ratio.clamp(max=cap), torch.ones_like(ratio))
    read = ratio[marked]
    if not read.numel():
        return weights, {}
    return weights, {
        "async/importance_weight/mean": float(read.mean()),
        "async/importance_weight/max": float(read.max()),
        "async/importance_weight/clipped_share": float((read > cap).float().mean()),
    }


class AsyncRolloutsLayer:
    """`async_rollouts: true` over `AgenticGRPOTrainer` (a mixin placed before it; see the module)."""

    layer = "async"

    @staticmethod
    def check_layer_setup(args: Any, rollout_parts: Any) -> None:
        check_async_config(args)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.accelerator.num_processes > 1:
            raise ValueError("async_rollouts runs in one process: launch without several processes")
        reason = why_not_reusable(self.accelerator.unwrap_model(self.model), self.generation_config)
        if reason is not None:
            raise ValueError(
                f"async_rollouts samples with the project's decoding loop, which cannot run here: {reason}"
            )
        self.sampler: AsyncSampler | None = None
        self._peek_iterator: Any = None
        self._peeked: list[tuple[list, Any]] = []  # the next steps' batches from the data loader
        self._expected: dict[int, str] = {}  # version -> digest of its trainable weights
        self._restored: dict[int, Batch] = {}
        self._batch: Batch | None = None  # the batch of the step in progress

    # --- rows ahead -----------------------------------------------------------------------------

    def get_batch_samples(self, epoch_iterator: Any, num_batches: int, device: Any) -> tuple[list, Any]:
        """The Trainer's batches of this optimizer step; the next `max_staleness` steps' are read ahead from the
        same iterator (within its epoch) and handed out in turn."""
        if epoch_iterator is not self._peek_iterator:  # a new epoch, or a resumed run's first
            self._peek_iterator, self._peeked = epoch_iterator, []
        current = (
            self._peeked.pop(0) if self._peeked else super().get_batch_samples(epoch_iterator, num_batches, device)
        )
        while len(self._peeked) < self.args.async_rollouts.max_staleness:
            ahead = super().get_batch_samples(epoch_iterator, num_batches, device)
            if not ahead[0]:
                break
            self._peeked.append(ahead)
        return current

    # --- sampling -------------------------------------------------------------------------------

    def _sample(self, prompts: list[Any], rows: list[dict[str, Any]]) -> Any:
        if not self.model.training:
            return super()._sample(prompts, rows)
        step = self.state.global_step
        if self.sampler is None:
            self.sampler = self._start_sampler()
        self._hand_over(step, prompts, rows)
        waited = time.perf_counter()
        batch = self.sampler.take(step)
        queue_wait = time.perf_counter() - waited
        self._check_batch(batch, step, rows)
        idle, self.sampler.idle_seconds = self.sampler.idle_seconds, 0.0
        staleness = float(step - batch.version)
        self.log_metrics({
            "async/staleness/mean": staleness, "async/staleness/max": staleness,
            "async/queue_wait": queue_wait, "async/sampler_idle": idle, "async/sampler_seconds": batch.seconds,
        })  # fmt: skip
        self._batch = batch
        return batch.trajectories, batch.stats

    def _hand_over(self, step: int, prompts: list[Any], rows: list[dict[str, Any]]) -> None:
        """Hand the sampler every step from `step` to `step + max_staleness` it has not had, with the weights of
        version `step`."""
        given = self.sampler.submitted()
        wanted = [(step, prompts, rows)] if step not in given else []
        for offset, (batches, _) in enumerate(self._peeked[: self.args.async_rollouts.max_staleness], start=1):
            later = step + offset
            if later < self.state.max_steps and later not in given:
                inputs, columns = with_rows(batches[0])  # a generation batch: the step's first micro-batch
                wanted.append((later, [row["prompt"] for row in inputs], columns))
        if not wanted:
            return
        weights = snapshot(self.accelerator.unwrap_model(self.model), self.sampler.names)
        self._expected[step] = tensors_fingerprint(weights)
        for later, later_prompts, later_rows in wanted:
            self.sampler.submit(Job(later, later_prompts, later_rows, step, weights))

    def _check_batch(self, batch: Batch, step: int, rows: list[dict[str, Any]]) -> None:
        """Refuse a batch that is not this step's, is staler than the bound, or was not sampled by the weights of
        the version it claims."""
        if batch.rows_digest != rows_fingerprint(rows):
            raise RuntimeError(
                f"async rollouts: the trajectories made for step {step + 1} are of other rows than the data loader "
                "gave this step"
            )
        if not 0 <= step - batch.version <= self.args.async_rollouts.max_staleness:
            raise RuntimeError(
                f"async rollouts: step {step + 1}'s trajectories were sampled with the weights of version "
                f"{batch.version}, {step - batch.version} steps old; `max_staleness` is {self.args.async_rollouts.max_staleness}"
            )
        expected = self._expected.get(batch.version)
        if expected != batch.weights_digest:
            raise RuntimeError(
                f"async rollouts: step {step + 1}'s trajectories say they were sampled with the weights of version "
                f"{batch.version}, but the sampler held other weights (digest {batch.weights_digest}, version "
                f"{batch.version}'s is {expected}): its weights were not synced"
            )
        for old in [version for version in self._expected if version < step - self.args.async_rollouts.max_staleness]:
            del self._expected[old]

    def _start_sampler(self) -> AsyncSampler:
        policy = self.accelerator.unwrap_model(self.model)
        tokenizer = copy.deepcopy(self.processing_class)  # a fast tokenizer is not shared between threads
        sampler = AsyncSampler(
            policy, tokenizer, self.generation_config, self.eos_token_ids,
            self.rollout_parts.rollout_manager(tokenizer, self.sandbox_pool), filters_of(self), self.args.seed,
            self.args.async_rollouts.timeout, rows_fingerprint, self.accelerator.autocast,
        )  # fmt: skip
        if self._restored:
            sampler.restore(self._restored)
            self._restored = {}
        return sampler

    def _check_sampler_agreement(self, output: dict[str, Any], saved: Any) -> None:
        """The canary's figures from the sampler, which read its tokens with the weights that sampled them."""
        if not self.model.training or self._batch is None:
            return super()._check_sampler_agreement(output, saved)
        metrics, limit = self._batch.canary, canary_limit(self)
        if metrics:
            self.log_metrics(metrics)
        if limit and metrics and metrics["canary/logprob_diff/mean"] > limit:
            where = str(saved) if saved else None
            raise CanaryError(sampler_disagreement(metrics, limit, self.state.global_step + 1, where, []))

    # --- the importance weight ------------------------------------------------------------------

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        output = super()._generate_and_score_completions(inputs)
        if not self.model.training:
            return output
        behaviour = output.get("sampling_per_token_logps")
        if behaviour is None:
            raise RuntimeError("async rollouts: the batch carries no sampling log-probs to weigh its tokens with")
        mask = output["completion_mask"] * output.get("tool_mask", 1)
        weights, metrics = importance_weights(
            self._proximal_logprobs(output), behaviour, mask, self.args.async_rollouts.importance_weight_cap
        )
        advantages = output["advantages"]
        if advantages.dim() == 1:
            advantages = advantages[:, None].expand_as(weights)
        output["advantages"] = advantages * weights.to(advantages.dtype)
        self.log_metrics(metrics)
        self._batch = None
        return output

    def _proximal_logprobs(self, output: dict[str, Any]) -> torch.Tensor:
        """The trainer's log-probs of the sampled tokens now, under the sampling filters, dropout off."""
        ids = torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1)
        mask = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
        width = output["completion_ids"].size(1)
        filters = filters_of(self)
        with torch.no_grad(), dropout_off(self.model):
            if not filters.active:
                size = self.args.per_device_train_batch_size
                return self._get_per_token_logps_and_entropies(self.model, ids, mask, width, size)[0]
            rows = [
                slice(row, row + 1) for row in range(ids.size(0))
            ]  # one at a time: the filters sort the vocabulary
            return torch.cat([processed_read(self.model, ids[row], mask[row], width, filters) for row in rows])

    # --- checkpoints and the run's end ----------------------------------------------------------

    def _write_checkpoint_extras(self, directory: str) -> None:
        """The batches in flight, made and stored with the checkpoint (their versions' digests with them)."""
        super()._write_checkpoint_extras(directory)
        if self.sampler is None:
            return
        pending = self.sampler.drain()
        expected = {batch.version: self._expected[batch.version] for batch in pending.values()}
        torch.save({"batches": pending, "expected": expected}, Path(directory) / PENDING_FILE)

    def train(self, resume_from_checkpoint: str | bool | None = None, *args: Any, **kwargs: Any) -> Any:
        checkpoint = resolved_checkpoint(resume_from_checkpoint, self.args.output_dir)
        if checkpoint and (Path(checkpoint) / PENDING_FILE).is_file():
            stored = torch.load(Path(checkpoint) / PENDING_FILE, weights_only=False)
            self._restored, self._expected = stored["batches"], dict(stored["expected"])
        try:
            return super().train(resume_from_checkpoint, *args, **kwargs)
        finally:
            if self.sampler is not None:
                self.sampler.close()
                self.sampler = None
