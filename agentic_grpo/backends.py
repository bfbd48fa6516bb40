"""Generation backends: one batched call per turn over every live trajectory.

The rollout manager hands a backend the full token ids of each live trajectory and
gets back only the new tokens, cut at EOS or at the format's stop string, with why it
stopped. Token ids in, token ids out: nothing is re-rendered through a chat template.

`TrainerBackend` runs HF `generate` on the policy being trained, unwrapped with TRL's
`unwrap_model_for_generation` so it stays right under DeepSpeed ZeRO-3 and FSDP;
`TransformersBackend` does the same for a model held directly (evaluation).
A vLLM backend plugs in at the same seam (`GenerationBackend`).
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import torch

StopReason = Literal["eos", "stop", "length"]


@dataclass
class Generation:
    """New tokens for one sequence and why generation ended."""

    token_ids: list[int]
    stop_reason: StopReason
    logprobs: list[float] | None = None


class GenerationBackend(Protocol):
    def generate(self, batch: list[list[int]], stop: list[str], max_new_tokens: int) -> list[Generation]:
        """Continue each token-id list; return new tokens up to and including EOS or the stop string."""


class TransformersBackend:
    """HF `generate` on a model held in this process (evaluation, scripts)."""

    def __init__(self, model: Any, tokenizer: Any, generation_config: Any, eos_token_ids: list[int]) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.generation_config = generation_config
        self.eos_token_ids = eos_token_ids

    @contextlib.contextmanager
    def _generating_model(self) -> Iterator[Any]:
        with torch.no_grad():
            yield self.model

    def generate(self, batch: list[list[int]], stop: list[str], max_new_tokens: int) -> list[Generation]:
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
        with self._generating_model() as model:
            output = model.generate(
                input_ids=input_ids.to(model.device),
                attention_mask=attention_mask.to(model.device),
                generation_config=config,
                tokenizer=self.tokenizer,
            )
        new_tokens = output[:, width:].cpu().tolist()
        return [cut_generation(ids, self.eos_token_ids, stop, self.tokenizer) for ids in new_tokens]


class TrainerBackend(TransformersBackend):
    """HF `generate` on the policy a `GRPOTrainer` is training, with the trainer's sampling settings.

    The model is unwrapped with TRL's `unwrap_model_for_generation` (ZeRO-3 parameters
    gathered, FSDP full parameters summoned) so generation is right under every engine.
    """

    def __init__(self, trainer: Any) -> None:
        super().__init__(trainer.model, trainer.processing_class, trainer.generation_config, trainer.eos_token_ids)
        self.trainer = trainer

    @contextlib.contextmanager
    def _generating_model(self) -> Iterator[Any]:
        from trl.models import unwrap_model_for_generation

        trainer = self.trainer
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
        ):
            yield model


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
