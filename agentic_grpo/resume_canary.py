"""The resume canary: a resumed run's first step must be the step the interrupted run took after the checkpoint.

Each checkpoint gets, per process, `canary.rank<K>.json`: the fingerprint of the trainable weights when it was
saved and, once the run takes its next step, the fingerprints of what that step began with: its rows (the
data position) and the random-number generators' state (torch, CUDA, NumPy, Python). A run resumed from the
checkpoint computes the same three at its first generation and stops when one differs (an adapter that was
not loaded, a data loader that skipped the wrong number of batches, a generator that was not restored). It
records the outcome in `run.json` under `resume_canary`. A checkpoint whose next step was never taken (the
run was stopped right after saving it) is checked for its weights only, and says so.

Each checkpoint also carries the run's data spec (`run.json`: `dataset`, with the training seed drawn for the run),
so that a resume from it draws the same rows wherever its output goes.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agentic_grpo.canaries import CanaryError
from agentic_grpo.run_files import write_run_status
from agentic_grpo.trainer_checks import check_resume_between_cycles


def weights_fingerprint(model: torch.nn.Module) -> str:
    """A digest of the trained parameters' values: every LoRA adapter's of a PEFT model (whichever is trainable
    at the moment), else those that require grad; this process's shard under ZeRO-3 or FSDP."""
    digest = hashlib.sha256()
    peft = hasattr(model, "peft_config") or hasattr(getattr(model, "module", None), "peft_config")
    for name, parameter in model.named_parameters():
        if ("lora_" in name) if peft else parameter.requires_grad:
            digest.update(name.encode())
            digest.update(parameter.detach().float().cpu().numpy().tobytes())
    return digest.hexdigest()[:16]


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

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        super()._save_checkpoint(model, trial)
        checkpoint = os.path.join(self.args.output_dir, f"checkpoint-{self.state.global_step}")
        if trial is None and os.path.isdir(checkpoint):
            record = {"step": self.state.global_step, "weights": weights_fingerprint(self.model)}
            self._canary_file(checkpoint).write_text(json.dumps(record, indent=2))
            self._to_record = checkpoint
            run = Path(self.args.output_dir) / "run.json"
            if self.accelerator.is_main_process and run.is_file():
                # The data the run trained on (its training seed) travels with the checkpoint: a resume into
                # another output_dir reads it here (`agentic_grpo.data.with_training_seed`).
                dataset = json.loads(run.read_text()).get("dataset")
                (Path(checkpoint) / "run.json").write_text(json.dumps({"dataset": dataset}, indent=2))

    def train(self, resume_from_checkpoint: str | bool | None = None, *args: Any, **kwargs: Any) -> Any:
        if resume_from_checkpoint is True:
            from transformers.trainer_utils import get_last_checkpoint

            resume_from_checkpoint = get_last_checkpoint(self.args.output_dir)
        if resume_from_checkpoint:
            check_resume_between_cycles(self.args, resume_from_checkpoint)
        self._resumed_from = resume_from_checkpoint or None
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
