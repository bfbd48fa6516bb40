"""Adaptive KL coefficient: keep the measured KL to the reference near a target.

A fixed `beta` is right for one phase of a run at most: early on the policy barely moves
and the penalty only slows learning; once tool use takes off, KL can run away and the
policy forgets how to write. The controller raises `beta` by `factor` when the measured
KL exceeds 1.5x the target and lowers it when KL is below 0.5x, clamped to
[`kl_min`, `kl_max`] (the proportional band keeps it from chattering around the target).

TRL's loss reads `trainer.beta` on every step, so the callback only has to change that
attribute. The coefficient is logged as `kl_coef` and saved in checkpoints, so a resumed
run continues with the coefficient it had.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from transformers import TrainerCallback
from transformers.trainer_callback import ExportableState


@dataclass(frozen=True)
class KLSchedule:
    """Target KL (nats per token), multiplicative step, and bounds of the coefficient."""

    target: float
    factor: float
    min: float
    max: float


# Named presets of `kl_control: {preset: NAME}`; any of `target`, `factor`, `min`, `max` overrides a preset's value.
KL_PRESETS: dict[str, KLSchedule] = {
    # Learning a tool protocol moves the policy a lot at first; allow it, but rein in drift.
    "tool_use": KLSchedule(target=0.05, factor=1.5, min=0.005, max=0.5),
    # Loose leash: search for new behaviours, only stop a collapse.
    "exploration": KLSchedule(target=0.2, factor=1.2, min=0.001, max=0.1),
    # Fine-tuning a model that already works: stay close, react firmly.
    "stable": KLSchedule(target=0.02, factor=2.0, min=0.01, max=1.0),
}


def resolve_schedule(
    preset: str | None,
    target: float | None = None,
    factor: float | None = None,
    kl_min: float | None = None,
    kl_max: float | None = None,
) -> KLSchedule | None:
    """The schedule a recipe asks for, or None for a fixed `beta`; raises ValueError on bad values."""
    if preset is None and target is None:
        if any(v is not None for v in (factor, kl_min, kl_max)):
            raise ValueError("kl_control's factor/min/max need a `target` or a `preset` (the adaptive KL controller)")
        return None
    if preset is not None and preset not in KL_PRESETS:
        raise ValueError(f"kl_control preset `{preset}` is not known; choose one of {sorted(KL_PRESETS)}")
    base = KL_PRESETS[preset] if preset else KLSchedule(target=0.05, factor=1.5, min=0.001, max=1.0)
    schedule = KLSchedule(
        target=base.target if target is None else target,
        factor=base.factor if factor is None else factor,
        min=base.min if kl_min is None else kl_min,
        max=base.max if kl_max is None else kl_max,
    )
    if schedule.target <= 0 or schedule.factor <= 1 or not 0 < schedule.min <= schedule.max:
        raise ValueError(f"kl_control needs target > 0, factor > 1 and 0 < min <= max; got {schedule}")
    return schedule


def schedule_for(config: Any) -> KLSchedule | None:
    """The schedule an `AgenticGRPOConfig`'s `kl_control` asks for, checked against its `beta` (the value the
    controller scales)."""
    options = dict(config.kl_control or {})
    unknown = sorted(set(options) - {"preset", "target", "factor", "min", "max"})
    if unknown:
        raise ValueError(f"kl_control: {unknown} not known; the keys are preset, target, factor, min, max")
    schedule = resolve_schedule(
        options.get("preset"), options.get("target"), options.get("factor"), options.get("min"), options.get("max")
    )
    if schedule is not None and config.beta == 0:
        raise ValueError("the adaptive KL controller (kl_control) needs beta > 0: it scales beta")
    return schedule


def next_beta(beta: float, measured_kl: float, schedule: KLSchedule) -> float:
    """The coefficient for the next step given this step's measured KL."""
    if measured_kl > 1.5 * schedule.target:
        beta *= schedule.factor
    elif measured_kl < 0.5 * schedule.target:
        beta /= schedule.factor
    return min(schedule.max, max(schedule.min, beta))


class AdaptiveKLCallback(TrainerCallback, ExportableState):
    """Updates `trainer.beta` after every optimizer step from the KL TRL measured in that step."""

    def __init__(self, trainer: Any, schedule: KLSchedule) -> None:
        self.trainer = trainer
        self.schedule = schedule
        self._seen = 0
        self._restored = False

    def state(self) -> dict:
        return {"args": {}, "attributes": {"beta": self.trainer.beta}}

    def on_step_begin(self, args, state, control, **kwargs):
        if not self._restored:  # on resume: the coefficient the checkpoint was trained with
            self._restored = True
            saved = (state.stateful_callbacks or {}).get(type(self).__name__)
            if isinstance(saved, dict) and "beta" in saved.get("attributes", {}) and state.global_step > 0:
                self.trainer.beta = float(saved["attributes"]["beta"])
        self._seen = len(self.trainer.logged_values("kl"))

    def on_step_end(self, args, state, control, **kwargs):
        values = self.trainer.logged_values("kl")[self._seen :]  # one per micro-batch, averaged over processes
        self.trainer.log_metrics({"kl_coef": self.trainer.beta}, mode="train")  # what this step trained with
        if values:
            measured = sum(float(v) for v in values) / len(values)
            self.trainer.beta = next_beta(self.trainer.beta, measured, self.schedule)
