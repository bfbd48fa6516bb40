"""Checkpoints written atomically: `checkpoint-N` appears only once every process has finished writing it.

The Trainer writes straight into `checkpoint-N`: a crash mid-save would leave a newest checkpoint
that cannot be resumed, and checkpoint rotation may already have deleted the previous good one.
`transformers` has no option for this, so a trainer mixes `AtomicCheckpoints` in before the Trainer.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from typing import Any

from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, rotate_checkpoints

# Checkpoints are written here first and renamed to `checkpoint-N` once complete (no `checkpoint-` prefix,
# so the Trainer's `get_last_checkpoint` and checkpoint rotation never see a half-written one).
STAGING_DIR = "partial-checkpoints"


def resolved_checkpoint(resume_from_checkpoint: str | bool | None, output_dir: str) -> str | None:
    """The checkpoint `Trainer.train(resume_from_checkpoint=...)` resumes from: `True` is the last in `output_dir`."""
    if resume_from_checkpoint is True:
        from transformers.trainer_utils import get_last_checkpoint

        return get_last_checkpoint(output_dir)
    return resume_from_checkpoint or None


class AtomicCheckpoints:
    """Mix-in for a `transformers.Trainer` subclass (listed before it): checkpoints staged, then renamed."""

    _staging_checkpoint = False

    def _get_output_dir(self, trial: Any) -> str:
        run_dir = super()._get_output_dir(trial)
        return os.path.join(run_dir, STAGING_DIR) if self._staging_checkpoint else run_dir

    def _write_checkpoint_extras(self, directory: str) -> None:
        """A layer's own files of a checkpoint, written into `directory` before it becomes `checkpoint-N`."""

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        """The Trainer's checkpoint (model or adapter, optimizer, scheduler, RNG per process, state),
        written to a staging directory and renamed to `checkpoint-N` only when every process is done.

        The Trainer writes straight into `checkpoint-N`: a crash mid-save would leave a newest
        checkpoint that cannot be resumed, and checkpoint rotation may already have deleted the
        previous good one. Here a failed save leaves the previous checkpoints as they were.
        """
        if trial is not None or self.hp_search_backend is not None:
            return super()._save_checkpoint(model, trial)
        name = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        staging = os.path.join(self.args.output_dir, STAGING_DIR, name)
        final = os.path.join(self.args.output_dir, name)
        if self.args.should_save:
            shutil.rmtree(staging, ignore_errors=True)  # leftovers of an earlier crashed save
        self.accelerator.wait_for_everyone()
        self._staging_checkpoint = True
        try:
            super()._save_checkpoint(model, trial)
        finally:
            self._staging_checkpoint = False
        self._write_checkpoint_extras(staging)
        self.accelerator.wait_for_everyone()  # every process has written its RNG state / shards
        if self.args.should_save:
            if os.path.exists(final):  # re-saving a step (a rerun in the same output_dir)
                old = staging + ".old"
                os.replace(final, old)
                os.replace(staging, final)
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.replace(staging, final)
            with contextlib.suppress(OSError):  # the staging directory goes once empty
                os.rmdir(os.path.dirname(staging))
            best = self.state.best_model_checkpoint  # the Trainer looked for the best one under the staging dir
            if best and os.path.dirname(best) == os.path.dirname(staging):
                self.state.best_model_checkpoint = os.path.join(self.args.output_dir, os.path.basename(best))
            rotate_checkpoints(
                output_dir=self.args.output_dir,
                save_total_limit=self.args.save_total_limit,
                best_model_checkpoint=self.state.best_model_checkpoint,
                use_mtime=True,
            )
        self.accelerator.wait_for_everyone()
