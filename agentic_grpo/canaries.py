"""Canaries: checks, on by default, that stop a run which would otherwise train silently wrong.

Every RL framework has lost weeks to failures that raise nothing: an adapter that was never active in the
sampler, a wrong temperature, dropout on while sampling, a chat template that tokenizes one way in rollouts
and another in training, a resume that restored the wrong state. Each of these makes the sampler and the
trainer disagree about the trajectories, and GRPO's ratio starts at 1 whatever they disagree about. Three
checks make them loud:

- **Sampler-trainer agreement, every training step** (`logprob_agreement`): each sampled token's log-prob as
  the sampler computed it against the trainer's for the same token (both at their temperatures, and under vLLM
  after the same top-k/top-p/min-p; dropout off), on a few rows the trainer reads for it (`rows_to_read`) or on all where TRL read them anyway. Logged
  as `canary/logprob_diff/{mean,max,share_over_0.5}`; a mean over the limit stops the run, naming the likely
  causes. The limit is `canary_logprob_limit` where a recipe sets it, else calibrated by precision
  (`canary_limit`): where sampler and trainer both compute in fp32 an honest gap is rounding, and dropout left on
  while sampling, the adapter off in the sampler or a temperature off by 0.1 reads several to thousands of times
  more (RESULTS.md); in bf16 or fp16 the honest gap alone reaches a few hundredths.
- **Token round-trip, at start-up** (`agentic_grpo.token_round_trip`).
- **Resume, at the first step of a resumed run** (`agentic_grpo.canaries`).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agentic_grpo.backends import dropout_off
from agentic_grpo.checkpoints import resolved_checkpoint
from agentic_grpo.run_files import write_run_status
from agentic_grpo.shrinking_batch import filters_of, processed_read
from agentic_grpo.trainer_checks import check_resume_between_cycles

TOKEN_LIMIT = 0.5
"""Nats: a token whose sampler and trainer log-probs differ by more counts in `share_over_0.5`."""

FULL_PRECISION_LIMIT = 1e-4
ACCELERATOR_FULL_PRECISION_LIMIT = 1e-3
HALF_PRECISION_LIMIT = 0.1
"""Nats per token: the default limits where sampler and trainer both compute in fp32 on CPU, in fp32 on a GPU (or
another accelerator), and where either computes in bf16 or fp16. Calibrated from honest runs and planted bugs
(RESULTS.md, Canaries)."""


def canary_limit(trainer: Any) -> float:
    """The sampler-trainer limit: `canary_logprob_limit` where set (0: off), else, where the policy's weights and
    the vLLM engine (if any) are all fp32 and no mixed precision (`bf16`, `fp16`) computes in half precision,
    `FULL_PRECISION_LIMIT` on CPU and `ACCELERATOR_FULL_PRECISION_LIMIT` where any weight lives elsewhere; else
    `HALF_PRECISION_LIMIT`. A vLLM server's dtype is not known here:
    counted as half precision."""
    if trainer.args.canary_logprob_limit is not None:
        return trainer.args.canary_logprob_limit
    cached = getattr(trainer, "_calibrated_canary_limit", None)
    if cached is not None:
        return cached
    dtypes = {parameter.dtype for parameter in trainer.model.parameters()}
    on_cpu = all(parameter.device.type == "cpu" for parameter in trainer.model.parameters())
    if getattr(trainer, "use_vllm", False):
        engine = getattr(getattr(getattr(trainer, "vllm_generation", None), "llm", None), "llm_engine", None)
        dtypes.add(engine.model_config.dtype if engine is not None else torch.bfloat16)
    mixed_precision = bool(getattr(trainer.args, "bf16", False) or getattr(trainer.args, "fp16", False))
    if dtypes <= {torch.float32, torch.float64} and not mixed_precision:
        limit = FULL_PRECISION_LIMIT if on_cpu else ACCELERATOR_FULL_PRECISION_LIMIT
    else:
        limit = HALF_PRECISION_LIMIT
    trainer._calibrated_canary_limit = limit
    return limit


LIKELY_CAUSES = (
    "dropout on while sampling or scoring (a module left in train mode)",
    "a different temperature for sampling and for training (a sub-agent's own `temperature`)",
    "a different adapter active in the sampler than in the trainer",
    "position ids numbered differently (absolute-position models and left padding)",
    "kept keys and values that do not match the context (`agentic_grpo.kv_reuse`)",
    "vLLM weights that were not synced after the last optimizer step",
)


ROWS_READ = 4
"""The most rows the canary reads itself per step (one per distinct prompt, the first of its group): a sample, so
the check costs a fraction of a step; where TRL read the rows anyway (`old_per_token_logps`), all are compared."""


def rows_to_read(prompt_ids: torch.Tensor) -> torch.Tensor:
    """The index of the first row of each distinct prompt, in order, at most `ROWS_READ` of them."""
    _, inverse = torch.unique(prompt_ids, dim=0, return_inverse=True)
    first: dict[int, int] = {}
    for row, prompt in enumerate(inverse.tolist()):
        first.setdefault(prompt, row)
    return torch.tensor(sorted(first.values())[:ROWS_READ], device=prompt_ids.device)


def token_differences(
    sampled: torch.Tensor, scored: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """|sampler - trainer| per token (0 where not compared), and which tokens are compared: those `mask` marks
    that have a sampling log-prob (vLLM gives NaN for a token it could not score)."""
    valid = mask.bool() & ~torch.isnan(sampled)
    return (sampled.float() - scored.float()).abs().masked_fill(~valid, 0.0), valid


def logprob_agreement(
    sampled: torch.Tensor,
    scored: torch.Tensor,
    mask: torch.Tensor,
    gather: Callable[[torch.Tensor], torch.Tensor],
) -> dict[str, float]:
    """Per-token |sampler - trainer| log-prob over the tokens `mask` marks (sampled tokens, not tool output),
    over every process (`gather` is collective: every process calls it). Empty when no token was compared."""
    differences, valid = token_differences(sampled, scored, mask)
    diff = differences[valid]
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
    diff, valid = token_differences(sampled, scored, mask)
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
        f"{metrics['canary/logprob_diff/mean']:.2g} nats per token on average (limit {limit:g}), "
        f"{metrics['canary/logprob_diff/max']:.3f} at most, "
        f"{metrics[f'canary/logprob_diff/share_over_{TOKEN_LIMIT}']:.1%} of tokens over {TOKEN_LIMIT}. "
        "Training on these trajectories would follow the gradient of some other policy."
        + (f"\nFound:{named}" if found else "")
        + f"\nCauses to look for:{causes}{where}\nIf the difference is expected (bf16 on a sharp model, a sampler in "
        "another precision), set `canary_logprob_limit` above it; 0 turns the check off."
    )


def check_sampler_agreement(trainer: Any, output: dict[str, Any], trajectories: Any) -> None:
    """The sampler-trainer check of one training generation (`output`: TRL's batch): the trainer's log-probs of the
    sampled tokens, dropout off as when sampling, against the sampler's; logged as `canary/logprob_diff/*` and
    `time/canary`; past `canary_limit(trainer)` it raises `CanaryError` (`trajectories`: where the step's are)."""
    limit, sampled = canary_limit(trainer), output.get("sampling_per_token_logps")
    if not limit or sampled is None:
        return
    start = time.perf_counter()
    tokens = output["completion_mask"] * output.get("tool_mask", 1)
    padded = output["prompt_mask"][:, 0] == 0
    # vLLM reports log-probs after top-k/top-p/min-p (`agentic_grpo.shrinking_batch`); the trainer's own
    # read does not filter, so under those filters the canary reads the rows itself and filters as the sampler did.
    filters = filters_of(trainer)
    processed = trainer.use_vllm and filters.active
    scored = None if processed else output.get("old_per_token_logps")  # TRL's read, when it made one (dropout off)
    if scored is None:  # a few rows, read as TRL's loss reads them (same padding), dropout off
        rows = rows_to_read(output["prompt_ids"])
        ids = torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1)[rows]
        mask = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)[rows]
        width = output["completion_ids"].size(1)
        # One forward for the few rows on every process: sharded engines (ZeRO-3, FSDP) need the same count.
        with torch.no_grad(), dropout_off(trainer.model):
            if processed:
                scored = processed_read(trainer.model, ids, mask, width, filters)
            else:
                scored = trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, width, len(rows))[0]
        sampled, tokens, padded = sampled[rows], tokens[rows], padded[rows]
    metrics = logprob_agreement(sampled, scored, tokens, trainer.accelerator.gather)
    trainer.log_metrics({**metrics, "time/canary": time.perf_counter() - start})
    backend = trainer.generation_backend
    dropout, backend.dropout_while_sampling = getattr(backend, "dropout_while_sampling", 0), 0
    if metrics and metrics["canary/logprob_diff/mean"] > limit:
        found = likely_causes(
            sampled, scored, tokens, padded, dropout,
            getattr(getattr(backend, "generation_config", None), "temperature", None), trainer.temperature,
        )  # fmt: skip
        step, where = trainer.state.global_step + 1, str(trajectories) if trajectories else None
        raise CanaryError(sampler_disagreement(metrics, limit, step, where, found))


# --- resume canary --------------------------------------------------------------------------------
# The resume canary: a resumed run's first step must be the step the interrupted run took after the checkpoint.
#
# Each checkpoint gets, per process, `canary.rank<K>.json`: the fingerprint of the trainable weights when it was
# saved and, once the run takes its next step, the fingerprints of what that step began with: its rows (the
# data position) and the random-number generators' state (torch, CUDA, NumPy, Python). A run resumed from the
# checkpoint computes the same three at its first generation and stops when one differs (an adapter that was
# not loaded, a data loader that skipped the wrong number of batches, a generator that was not restored). It
# records the outcome in `run.json` under `resume_canary`. A checkpoint whose next step was never taken (the
# run was stopped right after saving it) is checked for its weights only, and says so.
#
# Each checkpoint also carries the run's data spec (`run.json`: `dataset`, with the training seed drawn for the run),
# so that a resume from it draws the same rows wherever its output goes.


def tensors_fingerprint(tensors: dict[str, torch.Tensor]) -> str:
    """A digest of named tensors' values (each name and its values' bytes, in the mapping's order)."""
    digest = hashlib.sha256()
    for name, tensor in tensors.items():
        digest.update(name.encode())
        digest.update(tensor.detach().float().cpu().numpy().tobytes())
    return digest.hexdigest()[:16]


def weights_fingerprint(model: torch.nn.Module) -> str:
    """A digest of the trained parameters' values: every LoRA adapter's of a PEFT model (whichever is trainable
    at the moment), else those that require grad; this process's shard under ZeRO-3 or FSDP."""
    peft = hasattr(model, "peft_config") or hasattr(getattr(model, "module", None), "peft_config")
    return tensors_fingerprint({
        name: parameter for name, parameter in model.named_parameters()
        if (("lora_" in name) if peft else parameter.requires_grad)
    })  # fmt: skip


def rng_fingerprint() -> str:
    """A digest of the torch (CPU and CUDA), NumPy and Python random-number generators' states."""
    digest = hashlib.sha256(torch.get_rng_state().numpy().tobytes())
    if torch.cuda.is_available():
        for state in torch.cuda.get_rng_state_all():
            digest.update(state.numpy().tobytes())
    digest.update(repr(np.random.get_state()).encode())
    digest.update(repr(random.getstate()).encode())
    return digest.hexdigest()[:16]


def rows_fingerprint(inputs: list[dict[str, Any]]) -> str:
    """A digest of a generation's rows (their prompts and columns)."""
    return hashlib.sha256(json.dumps(inputs, sort_keys=True, default=str).encode()).hexdigest()[:16]


class ResumeCanary:
    """Mix-in for the trainer (listed before the Trainer): writes the checkpoints' canary files and checks a
    resumed run's first generation against them."""

    _resumed_from: str | None = None
    _to_record: str | None = None  # a checkpoint saved by this run whose next step is not recorded yet

    def _canary_file(self, checkpoint: str) -> Path:
        return Path(checkpoint) / f"canary.rank{self.accelerator.process_index}.json"

    def _write_checkpoint_extras(self, directory: str) -> None:
        """The canary file (and the run's data spec) written into the checkpoint before it takes its name, so that a
        run killed right after a save never leaves a checkpoint without them."""
        super()._write_checkpoint_extras(directory)
        record = {"step": self.state.global_step, "weights": weights_fingerprint(self.model)}
        self._canary_file(directory).write_text(json.dumps(record, indent=2))
        self._to_record = os.path.join(self.args.output_dir, f"checkpoint-{self.state.global_step}")
        run = Path(self.args.output_dir) / "run.json"
        if self.accelerator.is_main_process and run.is_file():
            # The data the run trained on (its training seed) travels with the checkpoint: a resume into
            # another output_dir reads it here (`agentic_grpo.data.with_training_seed`).
            dataset = json.loads(run.read_text()).get("dataset")
            (Path(directory) / "run.json").write_text(json.dumps({"dataset": dataset}, indent=2))

    def train(self, resume_from_checkpoint: str | bool | None = None, *args: Any, **kwargs: Any) -> Any:
        resume_from_checkpoint = resolved_checkpoint(resume_from_checkpoint, self.args.output_dir)
        if resume_from_checkpoint:
            check_resume_between_cycles(self.args, resume_from_checkpoint)
        self._resumed_from = resume_from_checkpoint
        return super().train(resume_from_checkpoint, *args, **kwargs)

    def check_resume(self, inputs: list[dict[str, Any]]) -> None:
        """At a training generation: the first after a resume is checked; the first after a save is recorded."""
        if not self.model.training or (self._resumed_from is None and self._to_record is None):
            return
        seen = {"rows": rows_fingerprint(inputs), "rng": rng_fingerprint()}
        if self._to_record is not None:
            path = self._canary_file(self._to_record)
            if path.is_file():
                record = json.loads(path.read_text())
                path.write_text(json.dumps({**record, "next_step": seen}, indent=2))
            self._to_record = None
        if self._resumed_from is None:
            return
        checkpoint, self._resumed_from = self._resumed_from, None
        outcome, differ = self._compare(checkpoint, {**seen, "weights": weights_fingerprint(self.model)})
        flags = self.accelerator.gather(torch.tensor([float(bool(differ))], device=self.accelerator.device))
        if self.accelerator.is_main_process:
            write_run_status(self.args.output_dir, None, resume_canary={"checkpoint": checkpoint, **outcome})
        if bool(flags.sum() > 0):
            what = ", ".join(differ) or "another process's state"
            raise CanaryError(
                f"canary: resumed from {checkpoint}, but its first step does not start where the interrupted run "
                f"went on; what differs: {what} ({outcome}). Check that the checkpoint belongs to this run and recipe "
                "(the same data, seed and processes) and holds every file the Trainer saved (rng_state*.pth, the "
                "adapter or model, trainer_state.json)."
            )

    def _compare(self, checkpoint: str, now: dict[str, str]) -> tuple[dict[str, str], list[str]]:
        path = self._canary_file(checkpoint)
        if not path.is_file():
            return {"weights": "not recorded", "rows": "not recorded", "rng": "not recorded"}, []
        saved = json.loads(path.read_text())
        expected = {"weights": saved.get("weights"), **saved.get("next_step", {})}
        outcome, differ = {}, []
        for key, what in (("weights", "the trainable weights"), ("rows", "the rows"), ("rng", "the random state")):
            if expected.get(key) is None:
                outcome[key] = "not recorded (the interrupted run stopped before its next step)"
            elif expected[key] == now[key]:
                outcome[key] = "as the interrupted run"
            else:
                outcome[key] = f"differ: {now[key]} here, {expected[key]} in the interrupted run"
                differ.append(what)
        return outcome, differ
