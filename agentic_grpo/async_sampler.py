"""The asynchronous sampler: a thread that rolls out later steps' trajectories while the trainer trains.

It holds its own copy of the policy (`sampler_copy`: the trainable weights copied, the frozen ones shared, so a
LoRA run adds only its adapters), its own tokenizer and rollout manager, and the run's sandbox pool. The trainer
hands it jobs (`submit`): a step's rows, with a snapshot of the trainable weights of the version the trajectories
are to be sampled with. It runs them in order, one at a time; the trainer takes each step's batch when the step
begins (`take`), waiting at most `timeout` seconds.

What a batch carries lets the trainer check it without trusting the sampler (`agentic_grpo.async_rollouts`):
- the version its weights claim, and a digest of the weights the sampler really held after sampling;
- a digest of its rows;
- each token's sampling log-prob under the run's sampling filters, and the sampler-trainer canary's figures:
  the same tokens read by a forward pass of the sampler's own weights, as the trainer reads them.

The sampling noise of step `t` comes from a generator seeded by the run's seed and `t`, never torch's global one
(which the training thread draws from): a step's trajectories are the same whenever the sampler runs it, which a
resumed run relies on.
"""

from __future__ import annotations

import contextlib
import copy
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from agentic_grpo.backends import TransformersBackend
from agentic_grpo.canaries import ROWS_READ, logprob_agreement, tensors_fingerprint
from agentic_grpo.shrinking_batch import SamplingFilters, processed_read

CLOSE_WAIT = 60.0
"""The most seconds a run's end waits for the sampler's job in progress."""


class AsyncTimeout(RuntimeError):
    """The sampler or the trainer waited past `async_rollouts`' `timeout` for the other."""


def trainable_names(model: torch.nn.Module) -> list[str]:
    """The names of the parameters an optimizer step changes."""
    return [name for name, parameter in model.named_parameters() if parameter.requires_grad]


def snapshot(model: torch.nn.Module, names: list[str]) -> dict[str, torch.Tensor]:
    """A copy of the named parameters' values, on the CPU (what the sampler loads for one job)."""
    parameters = dict(model.named_parameters())
    return {name: parameters[name].detach().to("cpu", copy=True) for name in names}


def sampler_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of `model` for sampling: its trainable parameters copied, its frozen ones (a LoRA run's base) shared,
    in eval mode, without gradients, each module's forward its class's."""
    shared = {id(parameter): parameter for parameter in model.parameters() if not parameter.requires_grad}
    sampler = copy.deepcopy(model, memo=shared)
    for module in sampler.modules():
        # A forward set on the instance (TRL's fused log-prob head) closes over the original module: the copy
        # would compute with the trainer's weights.
        if "forward" in vars(module):
            del module.forward
    sampler.eval()
    for parameter in sampler.parameters():
        if parameter.requires_grad:
            parameter.requires_grad_(False)
    return sampler


def step_seed(seed: int, step: int) -> int:
    """The seed of step `step`'s sampling noise."""
    return (seed * 1_000_003 + step) % (2**63)


@dataclass
class Job:
    step: int
    prompts: list[Any]
    rows: list[dict[str, Any]]
    version: int
    weights: dict[str, torch.Tensor]


@dataclass
class Batch:
    """One step's rollout, as the sampler made it."""

    step: int
    version: int
    rows_digest: str
    trajectories: list[Any]
    stats: Any
    weights_digest: str
    seconds: float
    canary: dict[str, float] = field(default_factory=dict)


class AsyncSampler:
    """The sampler thread (see the module). `policy`: the trainer's unwrapped model; `rollout_manager`: one of its
    own (the tokenizer it was built with is its own too); `autocast`: the trainer's mixed precision (a context
    manager, entered in the sampler's thread: autocast is per thread)."""

    def __init__(
        self,
        policy: torch.nn.Module,
        tokenizer: Any,
        generation_config: Any,
        eos_token_ids: list[int],
        rollout_manager: Any,
        filters: SamplingFilters,
        seed: int,
        timeout: float,
        rows_digest: Any,
        autocast: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
    ) -> None:
        self.model = sampler_copy(policy)
        self.autocast = autocast
        self.names = trainable_names(policy)
        self.backend = TransformersBackend(self.model, tokenizer, generation_config, eos_token_ids)
        self.backend.logprob_filters = filters
        self.filters = filters
        self.rollout_manager = rollout_manager
        self.seed = seed
        self.timeout = timeout
        self.rows_digest = rows_digest
        self.phase = "waiting for its first job"
        self.idle_seconds = 0.0  # time spent waiting for a job, since the trainer last read it
        self._jobs: list[Job] = []
        self._done: dict[int, Batch] = {}
        self._failed: BaseException | None = None
        self._running: int | None = None
        self._closed = False
        self._condition = threading.Condition()
        self._thread = threading.Thread(target=self._work, name="agentic-grpo-sampler", daemon=True)
        self._thread.start()

    # --- the trainer's side -------------------------------------------------------------------

    def submit(self, job: Job) -> None:
        with self._condition:
            self._jobs.append(job)
            self._condition.notify_all()

    def submitted(self) -> set[int]:
        """The steps submitted and not yet taken."""
        with self._condition:
            return {job.step for job in self._jobs} | set(self._done) | {self._running} - {None}

    def take(self, step: int) -> Batch:
        """Step `step`'s batch, once made; raises what the sampler raised, or `AsyncTimeout`."""
        deadline = time.monotonic() + self.timeout
        with self._condition:
            while step not in self._done and self._failed is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AsyncTimeout(
                        f"async rollouts: the trainer waited {self.timeout:.0f} s (the `timeout` of `async_rollouts`) for the "
                        f"trajectories of step {step + 1}; the sampler is {self.phase}. A tool or judge without a "
                        "timeout, or a generation far longer than the recipe's budgets, holds it"
                    )
                self._condition.wait(min(left, 1.0))
            if self._failed is not None:
                raise RuntimeError("async rollouts: the sampler failed (its error follows)") from self._failed
            return self._done.pop(step)

    def drain(self) -> dict[int, Batch]:
        """Wait until every submitted job is made; the batches not yet taken, by step (for a checkpoint)."""
        deadline = time.monotonic() + self.timeout
        with self._condition:
            while (self._jobs or self._running is not None) and self._failed is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AsyncTimeout(
                        f"async rollouts: a checkpoint waited {self.timeout:.0f} s (the `timeout` of `async_rollouts`) for the "
                        f"sampler's jobs in flight; the sampler is {self.phase}"
                    )
                self._condition.wait(min(left, 1.0))
            if self._failed is not None:
                raise RuntimeError("async rollouts: the sampler failed (its error follows)") from self._failed
            return dict(self._done)

    def restore(self, batches: dict[int, Batch]) -> None:
        """Batches made before a checkpoint, taken as if this sampler had made them."""
        with self._condition:
            self._done.update(batches)
            self._condition.notify_all()

    def close(self) -> None:
        """Stop after the job in progress, if any; the thread is a daemon, so a job that hangs does not hold the
        process (the trainer waits at most `CLOSE_WAIT` seconds for it)."""
        with self._condition:
            self._closed = True
            self._jobs.clear()
            self._condition.notify_all()
        self._thread.join(timeout=min(self.timeout, CLOSE_WAIT))
        if not self._thread.is_alive():
            self.rollout_manager.close()

    # --- the sampler's thread -------------------------------------------------------------------

    def _work(self) -> None:
        while True:
            waited = time.perf_counter()
            with self._condition:
                self.phase = "waiting for a job"
                while not self._jobs and not self._closed:
                    self._condition.wait()
                if self._closed:
                    return
                job = self._jobs.pop(0)
                self._running = job.step
                self.idle_seconds += time.perf_counter() - waited
            try:
                batch = self._make(job)
                if batch is None:  # closed while loading: the run has stopped
                    return
            except BaseException as exc:  # noqa: BLE001 - handed to the trainer, which raises it
                exc.add_note("".join(traceback.format_exception(exc)))
                with self._condition:
                    self._failed, self._running = exc, None
                    self._condition.notify_all()
                return
            with self._condition:
                self._done[job.step] = batch
                self._running = None
                self._condition.notify_all()

    def _make(self, job: Job) -> Batch | None:
        self.phase = f"loading the weights of version {job.version} for step {job.step + 1}"
        self.load(job.weights)
        if self._closed:
            # A load that hung past the timeout and then returned: the trainer has stopped and reset what the
            # rollout would use (its accelerator state, the sandbox), so nothing more runs in this thread.
            return None
        self.phase = f"rolling out step {job.step + 1} (version {job.version})"
        start = time.perf_counter()
        self.backend.generator = torch.Generator(device=self.model.device).manual_seed(step_seed(self.seed, job.step))
        with torch.no_grad(), self.autocast():
            trajectories, stats = self.rollout_manager.rollout(job.prompts, job.rows, self.backend)
        seconds = time.perf_counter() - start
        for trajectory in trajectories:
            for segment in trajectory.segments:
                if segment.trainable:
                    segment.policy_version = job.version
        self.phase = f"reading step {job.step + 1}'s tokens for the sampler-trainer canary"
        canary = self.agreement(trajectories)
        parameters = dict(self.model.named_parameters())
        held = tensors_fingerprint({name: parameters[name] for name in self.names})
        return Batch(job.step, job.version, self.rows_digest(job.rows), trajectories, stats, held, seconds, canary)

    def load(self, weights: dict[str, torch.Tensor]) -> None:
        """The sampler's trainable parameters set to `weights`."""
        parameters = dict(self.model.named_parameters())
        with torch.no_grad():
            for name, value in weights.items():
                parameters[name].copy_(value)

    def agreement(self, trajectories: list[Any]) -> dict[str, float]:
        """The canary's figures for a few trajectories (the first of each distinct prompt): each sampled token's
        recorded log-prob against a forward pass of the sampler's weights over the whole trajectory, under the
        same filters."""
        first: dict[tuple[int, ...], Any] = {}
        for trajectory in trajectories:
            first.setdefault(tuple(trajectory.prompt_ids), trajectory)
        sampled, scored, masks = [], [], []
        for trajectory in list(first.values())[:ROWS_READ]:
            recorded = trajectory.completion_logprobs
            completion = trajectory.completion_ids
            if recorded is None or not completion:
                continue
            ids = torch.tensor([list(trajectory.prompt_ids) + completion], device=self.model.device)
            with torch.no_grad(), self.autocast():
                read = processed_read(self.model, ids, torch.ones_like(ids), len(completion), self.filters)[0]
            sampled.append(torch.tensor(recorded, dtype=torch.float32))
            scored.append(read.float().cpu())
            masks.append(torch.tensor(trajectory.loss_mask))
        if not sampled:
            return {}
        return logprob_agreement(torch.cat(sampled)[None], torch.cat(scored)[None], torch.cat(masks)[None], _same)


def _same(tensor: torch.Tensor) -> torch.Tensor:
    return tensor
