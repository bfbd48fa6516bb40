"""Generation backends: one batched call per turn over every live trajectory.

The rollout manager hands a backend the full token ids of each live trajectory and
gets back only the new tokens, cut at EOS or at the format's stop string, with why it
stopped. Token ids in, token ids out: nothing is re-rendered through a chat template.

`TrainerBackend` runs HF `generate` on the policy being trained, unwrapped with TRL's
`unwrap_model_for_generation` so it stays right under DeepSpeed ZeRO-3 and FSDP;
`TransformersBackend` does the same for a model held directly (evaluation).
Both keep each trajectory's keys and values across the turns of one rollout (`session`) and read only
the new tokens (`agentic_grpo.kv_reuse`), falling back to reading whole contexts where that cannot be done.
A vLLM backend plugs in at the same seam (`GenerationBackend`).
"""

from __future__ import annotations

import contextlib
import copy
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import torch
from transformers import LogitsProcessorList

from agentic_grpo.action_choices import ActionChoiceProcessor, choice_mask
from agentic_grpo.formats import ActionChoices
from agentic_grpo.kv_reuse import ContextCache, generate_reusing, why_not_reusable
from agentic_grpo.shrinking_batch import live_on_any_process, needs_lockstep

logger = logging.getLogger(__name__)

StopReason = Literal["eos", "stop", "length"]


@dataclass
class Generation:
    """New tokens for one sequence and why generation ended."""

    token_ids: list[int]
    stop_reason: StopReason
    logprobs: list[float] | None = None


class GenerationBackend(Protocol):
    def generate(
        self,
        batch: list[list[int]],
        stop: list[str],
        max_new_tokens: int,
        choices: ActionChoices | None = None,
        assigned: Sequence[str | None] | None = None,
    ) -> list[Generation]:
        """Continue each token-id list; return new tokens up to and including EOS or the stop string.

        `choices`, when a format constrains its action slot, holds decoding to them there (a backend that cannot
        constrain refuses a value). `assigned[i]`, when not None, holds row `i`'s first slot of this turn to that
        continuation."""


class TransformersBackend:
    """HF `generate` on a model held in this process (evaluation, scripts).

    `reuse_cache=False` reads every context whole on every call (the reference `agentic_grpo.kv_reuse`'s
    tests compare against). With it on, a model or config whose cache cannot be reused
    (sliding-window or recurrent layers, a static cache, a repetition penalty) falls back to that, logged once.
    `shrink_batch=False` keeps every row in the batch until the last one stops, as `generate` does (with kept
    keys and values only; `agentic_grpo.shrinking_batch`). With both on (the default), each generation carries
    its tokens' sampling log-probs (`Generation.logprobs`), which the sampler-trainer canary compares with
    the trainer's.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        generation_config: Any,
        eos_token_ids: list[int],
        reuse_cache: bool = True,
        shrink_batch: bool = True,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.generation_config = generation_config
        self.eos_token_ids = eos_token_ids
        self.reuse_cache = reuse_cache
        self.shrink_batch = shrink_batch
        self._contexts = ContextCache()
        self._in_session = False
        self._fallback_logged = False
        self.dropout_while_sampling = 0
        # Where set, the decoding loop draws its noise from `generator` and records log-probs under
        # `logprob_filters` (`agentic_grpo.shrinking_batch.sample_shrinking`): the asynchronous sampler's settings.
        self.generator: torch.Generator | None = None
        self.logprob_filters: Any = None

    @contextlib.contextmanager
    def session(self) -> Iterator[None]:
        """One rollout: keys and values kept from call to call inside it, dropped at its end (the weights change
        between rollouts, and the memory is given back)."""
        self._contexts.clear()
        self._in_session = True
        try:
            yield
        finally:
            self._in_session = False
            self._contexts.clear()

    @property
    def lockstep(self) -> bool:
        """Whether this process must run every turn the others run (`agentic_grpo.shrinking_batch`)."""
        return needs_lockstep(self.model)

    def any_process_live(self, live_here: int) -> bool:
        """Whether any process has a live trajectory this turn (only this one's count, unless in lockstep)."""
        return live_on_any_process(live_here) if self.lockstep else live_here > 0

    def idle_turn(self, max_new_tokens: int) -> None:
        """A turn for a process whose trajectories have all ended while others' have not: a one-row `generate`
        whose output is dropped, so that this process takes part in each forward pass's collectives."""
        token = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.eos_token_ids[0]
        self.generate([[token]], [], max_new_tokens)

    @contextlib.contextmanager
    def _generating_model(self) -> Iterator[Any]:
        with torch.no_grad():
            yield self.model

    def generate(
        self,
        batch: list[list[int]],
        stop: list[str],
        max_new_tokens: int,
        choices: ActionChoices | None = None,
        assigned: Sequence[str | None] | None = None,
    ) -> list[Generation]:
        pad_id = self.tokenizer.pad_token_id
        width = max(len(ids) for ids in batch)
        input_ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, ids in enumerate(batch):  # left padding, as decoder-only generation needs
            input_ids[row, width - len(ids) :] = torch.tensor(ids)
            attention_mask[row, width - len(ids) :] = 1
        config = copy.deepcopy(self.generation_config)
        config.max_new_tokens = max_new_tokens
        config.stop_strings = stop or None
        extra: dict[str, Any] = {}
        if choices is not None:
            extra["logits_processor"] = LogitsProcessorList(
                [ActionChoiceProcessor(choice_mask(self.tokenizer, choices), assigned if config.do_sample else None)]
            )
        logprobs: list[list[float]] = []  # filled where the decoding loop is ours (`sample_shrinking`)
        with self._generating_model() as model:
            # The most modules that drew dropout masks while sampling since the canary last read it (its diagnosis).
            self.dropout_while_sampling = max(self.dropout_while_sampling, dropout_active(model))
            reason = why_not_reusable(model, config) if self.reuse_cache else None
            if self.reuse_cache and reason is None:
                if not self._in_session:
                    self._contexts.clear()
                try:
                    new_tokens = generate_reusing(
                        model, batch, self._contexts, config, self.tokenizer, self.shrink_batch, logprobs,
                        generator=self.generator, logprob_filters=self.logprob_filters, **extra,
                    )  # fmt: skip
                finally:
                    if not self._in_session:
                        self._contexts.clear()
            else:
                if reason is not None and not self._fallback_logged:
                    logger.info("generation reads whole contexts every turn: %s", reason)
                    self._fallback_logged = True
                output = model.generate(
                    input_ids=input_ids.to(model.device),
                    attention_mask=attention_mask.to(model.device),
                    generation_config=config,
                    tokenizer=self.tokenizer,
                    **extra,
                )
                new_tokens = output[:, width:].cpu().tolist()
        generations = [cut_generation(ids, self.eos_token_ids, stop, self.tokenizer) for ids in new_tokens]
        if logprobs:
            for generation, row in zip(generations, logprobs, strict=True):
                generation.logprobs = row[: len(generation.token_ids)]
        return generations


class TrainerBackend(TransformersBackend):
    """HF `generate` on the policy a `GRPOTrainer` is training, with the trainer's sampling settings.

    The model is unwrapped with TRL's `unwrap_model_for_generation` (ZeRO-3 parameters gathered, FSDP full
    parameters summoned) once per rollout (`session`), not once per turn: under ZeRO-3 and FSDP that gather is a
    collective over all processes and costs a full copy of the weights' traffic.
    """

    def __init__(self, trainer: Any, reuse_cache: bool = True) -> None:
        super().__init__(
            trainer.model, trainer.processing_class, trainer.generation_config, trainer.eos_token_ids, reuse_cache
        )
        self.trainer = trainer

    @contextlib.contextmanager
    def session(self) -> Iterator[None]:
        with policy_for_generation(self.trainer), super().session():
            yield

    @contextlib.contextmanager
    def _generating_model(self) -> Iterator[Any]:
        with policy_for_generation(self.trainer) as model, torch.no_grad():
            yield model


@contextlib.contextmanager
def policy_for_generation(trainer: Any) -> Iterator[Any]:
    """The trainer's policy unwrapped for generation; inside an enclosing call (a rollout's session, a sub-agent's
    turn within it, from any thread), the model that call unwrapped, without unwrapping (gathering) again."""
    from trl.models import unwrap_model_for_generation

    held = getattr(trainer, "_policy_for_generation", None)
    if held is not None:  # the outermost call, the rollout's session, outlives every call nested in it
        with trainer.accelerator.autocast():  # autocast is per thread: a nested call may come from another
            yield held
        return
    with (
        unwrap_model_for_generation(
            trainer.model_wrapped,
            trainer.accelerator,
            gather_deepspeed3_params=trainer.args.ds3_gather_for_generation,
            generation_kwargs=trainer.generation_kwargs,
            gradient_checkpointing_kwargs=trainer.args.gradient_checkpointing_kwargs,
        ) as model,
        torch.no_grad(),
        trainer._dist.summon_full_params(trainer.model_wrapped, recurse=False),
        # The training forward runs under the run's mixed precision (Accelerate wraps the prepared model's
        # forward); `generate` on a PEFT model reaches the base model's own forward, outside that wrapper.
        trainer.accelerator.autocast(),
    ):
        trainer._policy_for_generation = model
        try:
            yield model
        finally:
            trainer._policy_for_generation = None


def cut_generation(ids: list[int], eos_ids: list[int], stop: list[str], tokenizer: Any) -> Generation:
    """The prefix of `ids` up to the first EOS (inclusive) or the first completed stop string (inclusive)."""
    eos = set(eos_ids)
    end = next((i for i, t in enumerate(ids) if t in eos), None)
    span = ids if end is None else ids[:end]
    if stop:
        # The stop string can end inside a token: find the first token whose prefix contains it.
        text = tokenizer.decode(span)
        if any(s in text for s in stop):
            for i in range(1, len(span) + 1):
                if any(s in tokenizer.decode(span[:i]) for s in stop):
                    return Generation(span[:i], "stop")
    if end is not None:
        return Generation(ids[: end + 1], "eos")
    return Generation(ids, "length")


# --- dropout --------------------------------------------------------------------------------------
# Dropout off while sampling and scoring, and a count of what would still draw masks.
#
# TRL leaves the policy in train mode while it generates; LoRA or attention dropout would then draw random masks
# for the sampled tokens and for the old and reference log-probs computed from them. The trainer samples and
# scores inside `dropout_off`; the sampler-trainer canary counts `dropout_active` modules at sampling time to
# name dropout as the cause when the two disagree. TRL's `disable_dropout: true` sets every dropout to 0 for the
# whole run, the loss's forward included; `dropout_off` is for a run that keeps dropout in its loss, and is a
# no-op under `disable_dropout`.


@contextlib.contextmanager
def dropout_off(model: torch.nn.Module) -> Iterator[None]:
    """Every module below `model` in eval mode (no dropout, functional attention dropout included) for the block.

    `model.training` itself is left as it is: TRL and the trainer read it to tell a training step from an
    evaluation (which metrics a value goes to, whether trajectories are saved).
    """
    modes = [(module, module.training) for module in model.modules()]
    for module in model.children():
        module.eval()
    try:
        yield
    finally:
        for module, training in modes:
            module.training = training


def dropout_active(model: torch.nn.Module) -> int:
    """How many modules below `model` would draw dropout masks now: `Dropout` layers with p > 0 and attention
    modules with a non-zero `attention_dropout` (HF applies it functionally), in train mode."""
    count = 0
    for module in model.modules():
        if not module.training:
            continue
        if isinstance(module, torch.nn.modules.dropout._DropoutNd) and module.p > 0:
            count += 1
        elif isinstance(getattr(module, "attention_dropout", None), float) and module.attention_dropout > 0:
            count += 1
    return count
