"""`AgenticGRPOTrainer`: TRL's `GRPOTrainer` with multi-turn tool-use rollouts.

TRL does the algorithm: group advantages, the clipped GRPO loss under the `env_mask` we return (tool tokens
count for nothing), the KL term against the frozen reference, DeepSpeed/FSDP/PEFT, vLLM and logging. One
training step, in order:

1. `_generate_and_score_completions` (TRL's, wrapped): each prompt carries its dataset row to `_rollout`
   (`agentic_grpo.trajectory.with_row`), and the policy samples with dropout off.
2. `_rollout` (TRL's public `rollout_func` seam): the rollout manager runs the turn loop (tools, sandbox) and
   returns prompt/completion ids, the loss mask (`env_mask`) and the `Trajectory` records.
3. `_calculate_rewards` (TRL's, wrapped): the rewards score each trajectory; a missing reward (`None`) is
   filled with its group's mean, and each trajectory records what it was paid.
4. Advantages (`_advantages`): TRL's group advantage of the outcome, exactly 0 in a group whose outcomes are
   equal (`agentic_grpo.advantages.flat_groups`).
5. `compute_loss`: TRL's loss, read in pieces recomputed in backward (`agentic_grpo.chunked_logps`). Every read
   of the trajectories numbers positions from the attention mask, as the sampler does
   (`_get_per_token_logps_and_entropies`, `agentic_grpo.shrinking_batch`).

This trainer is the policy's alone. Sub-agents (`agentic_grpo.subagents.layer`), experiments
(`agentic_grpo.experimental.layer`) and asynchronous rollouts (`agentic_grpo.async_rollouts`) are layers:
subclasses that extend these steps, composed for a recipe by `agentic_grpo.trainer_layers.trainer_class`. This
module imports none of them.

Metrics enter TRL's logs in one place, `log_metrics`. The private TRL/transformers methods this trainer
overrides or calls are listed in `agentic_grpo.trl_seams`; a test checks them against the installed TRL.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
from accelerate.utils import gather_object
from trl import GRPOTrainer

from agentic_grpo.advantages import (
    RewardValueError,
    assign_outcome_credit,
    fill_missing_with_group_mean,
    raw_reward_means,
)
from agentic_grpo.backends import GenerationBackend, TrainerBackend, dropout_off
from agentic_grpo.canaries import ResumeCanary, check_sampler_agreement
from agentic_grpo.checkpoints import AtomicCheckpoints
from agentic_grpo.chunked_logps import ChunkedLogps, release_freed_memory
from agentic_grpo.config import AgenticGRPOConfig
from agentic_grpo.epoch_order import ResumableOrder
from agentic_grpo.formats import TrajectoryFormat
from agentic_grpo.kl_control import AdaptiveKLCallback, schedule_for
from agentic_grpo.reward_setup import guard_rewards
from agentic_grpo.rollout_metrics import batch_selection_metrics, clipped_metrics, rollout_metrics
from agentic_grpo.rollout_parts import RolloutParts
from agentic_grpo.run_files import RunFilesCallback, log_trajectory_table, trajectory_records, wandb_reporting
from agentic_grpo.run_parts import build_rollout_parts
from agentic_grpo.shrinking_batch import positions_from_mask
from agentic_grpo.token_round_trip import check_token_round_trip
from agentic_grpo.trainer_checks import check_setup
from agentic_grpo.trajectory import Trajectory, masked_loss_mask, with_rows
from agentic_grpo.trl_environment import tool_environment_factory, with_environment_reward
from agentic_grpo.vllm_backend import VLLMBackend, engine_as_the_policy
from agentic_grpo.vllm_server import install_server_generation, trl_without_weight_transfer

# We use `rollout_func` on purpose; TRL's "experimental" banner would only alarm users.
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


def nan_if_none(value: float | None) -> float:
    return math.nan if value is None else value


class AgenticGRPOTrainer(ResumeCanary, ResumableOrder, AtomicCheckpoints, ChunkedLogps, GRPOTrainer):
    """GRPO on multi-turn tool-use trajectories. A recipe with sub-agents or experiments needs the trainer class
    with their layers: `agentic_grpo.trainer_layers.trainer_class(args, rollout_parts)`.

    Args:
        model: model id/path or a loaded model (as for TRL's `GRPOTrainer`).
        reward_funcs: TRL reward functions; each also receives `trajectory=[Trajectory, ...]`.
        args: the run's `AgenticGRPOConfig`.
        train_dataset: rows with a conversational `prompt` (see `agentic_grpo.data.add_prompts`).
        rollout_parts: the recipe's environment, format, budgets and sandbox, built once
            (`agentic_grpo.run_parts.build_rollout_parts`); default: built from `args`.
        environment_factory: builds one tool environment per trajectory, instead of the parts' environment: a
            `ToolEnvironment`, or an environment written for TRL's `environment_factory` (`reset(**kwargs)`), or,
            as TRL's, a mapping `{name: factory}` whose names each row's `environment` column chooses among.
        trajectory_format: instead of the parts' format.
        generation_backend: default: HF `generate` on the policy.
        setup_checked: `agentic_grpo.trainer_checks.check_setup` already ran on these arguments (as
            `agentic_grpo.train.prepare` runs it, before the model loads); otherwise the trainer runs it.
        **kwargs: passed to `GRPOTrainer` (eval_dataset, processing_class, peft_config, callbacks, ...).
    """

    def __init__(
        self,
        model: Any,
        reward_funcs: list[Callable],
        args: AgenticGRPOConfig,
        train_dataset: Any,
        rollout_parts: RolloutParts | None = None,
        environment_factory: Callable[[], Any] | dict[str, Callable[[], Any]] | None = None,
        trajectory_format: TrajectoryFormat | None = None,
        generation_backend: GenerationBackend | None = None,
        setup_checked: bool = False,
        **kwargs: Any,
    ) -> None:
        if environment_factory is not None:  # either contract, or a mapping of them (`agentic_grpo.trl_environment`)
            environment_factory = tool_environment_factory(environment_factory)
        factory_class = getattr(environment_factory, "environment_class", None)
        parts = rollout_parts or build_rollout_parts(args, environment=factory_class)
        environment_class = factory_class or parts.environment
        reward_funcs = with_environment_reward(environment_class, reward_funcs, args)
        lora = kwargs.get("peft_config") is not None or hasattr(model, "peft_config")
        if environment_factory is not None or trajectory_format is not None:
            parts = dataclasses.replace(
                parts,
                environment_factory=environment_factory or parts.environment_factory,
                trajectory_format=trajectory_format or parts.trajectory_format,
            )
        if not setup_checked:
            check_setup(type(self), args, reward_funcs, parts, peft=lora)
        reward_funcs = guard_rewards(reward_funcs, args.on_reward_error)
        self.rollout_parts = parts
        self.trajectory_format = parts.trajectory_format
        # vLLM: the colocated engine in the policy's dtype; in server mode with LoRA, no NCCL weight transfer.
        with engine_as_the_policy(args, model), trl_without_weight_transfer(args, lora):
            super().__init__(
                model=model, reward_funcs=reward_funcs, args=args, train_dataset=train_dataset,
                rollout_func=self._rollout, **kwargs,
            )  # fmt: skip
        install_server_generation(self, lora)
        # TRL's `mask_truncated_completions` tests the last token (not EOS = cut), which mislabels
        # trajectories ending on a stop string or out of turns; we mask by finish reason in `env_mask`.
        self.mask_truncated_by_finish_reason = self.mask_truncated_completions
        self.mask_truncated_completions = False
        self.sandbox_pool = parts.sandbox_pool(self.accelerator.process_index)
        if self.sandbox_pool is not None:  # slots and workspaces go with the trainer, or at exit
            weakref.finalize(self, self.sandbox_pool.close)
        self.rollout_manager = parts.rollout_manager(self.processing_class, self.sandbox_pool)
        check_token_round_trip(self.rollout_manager, self.processing_class, self.eos_token_ids)  # a canary
        # One backend for the trainer's life: HF `generate` on the policy, or TRL's vLLM engine.
        self.generation_backend = generation_backend or (VLLMBackend(self) if self.use_vllm else TrainerBackend(self))
        self._last_trajectory_step: int | None = None  # the step whose trajectory file was written last
        self.add_callback(RunFilesCallback(self))
        schedule = schedule_for(args)
        if schedule is not None:
            self.add_callback(AdaptiveKLCallback(self, schedule))

    # --- one generation: rows in, trajectories out -------------------------------------

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        """TRL's generation and scoring of one batch of rows. The records of the step travel with `inputs`:
        TRL merges each row's `trajectory` into it, and `_calculate_rewards` writes the scores onto that."""
        self.check_resume(inputs)  # the resume canary: before the rollout draws random numbers
        # One dict per row (TRL writes each row's trajectory into it); TRL hands `rollout_func` the prompts alone.
        inputs, rows = with_rows(inputs)
        try:
            # Sample and score with dropout off: TRL leaves the policy in train mode here, and LoRA or attention
            # dropout would otherwise draw random masks for the sampled tokens and for the old and reference
            # log-probs computed from them. The loss itself runs later, in the mode the Trainer sets.
            with dropout_off(self.model):
                output = super()._generate_and_score_completions(inputs)
        except Exception as exc:
            # A reward that raises ends the run; the step's trajectories are what its author needs to debug it.
            if self.model.training:
                path = self._save_trajectories(inputs, None, error=f"{type(exc).__name__}: {exc}")
                if path is not None:
                    advice = "" if isinstance(exc, RewardValueError) else (
                        " To go on when a reward raises, set `on_reward_error: none`: that reward then gives None "
                        "for the batch.")  # fmt: skip
                    print(f"The step's trajectories are in {path}.{advice}", flush=True)
            raise
        trajectories = [row["trajectory"] for row in inputs]
        # TRL counted a completion cut when its last token is not EOS; a trajectory is cut when a budget cut it.
        gather = lambda tensor: self.accelerator.gather(tensor.to(self.accelerator.device))  # noqa: E731
        self.log_metrics(clipped_metrics(trajectories, gather), replace=True)
        outcome_advantages = output.get("advantages")
        self._advantages(inputs, rows, output)
        self._log_raw_reward_means(inputs)
        if self.model.training:
            saved = self._save_trajectories(inputs, outcome_advantages)
            self._check_sampler_agreement(output, saved)
        return output

    def _check_sampler_agreement(self, output: dict[str, Any], saved: Any) -> None:
        """The sampler-trainer canary of a training generation (`saved`: where its trajectories were written)."""
        check_sampler_agreement(self, output, saved)

    def generate_and_score(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        """One generation of a training step, outside the training loop: `rows` (with a conversational `prompt`)
        rolled out, scored and given advantages, as the batch the loss receives (for scripts, benchmarks and
        tests; the policy's mode decides training or evaluation, as in TRL)."""
        return self._generate_and_score_completions(rows)

    def _advantages(self, inputs: list[dict[str, Any]], rows: list[dict[str, Any]], output: dict[str, Any]) -> None:
        """The one advantage step: TRL's group advantage of each trajectory's outcome (already in
        `output["advantages"]`), exactly 0 in a group without signal (`assign_outcome_credit`). Layers add theirs
        after (`rows`: each row's dataset columns)."""
        mode = "train" if self.model.training else "eval"
        metrics = assign_outcome_credit(
            [row["trajectory"] for row in inputs],
            output["advantages"],
            dict(zip(self.reward_func_names, self.reward_weights.tolist(), strict=True)),
            group_size=self.num_generations if mode == "train" else self.num_generations_eval,
            gather=gather_object,
            process_index=self.accelerator.process_index,
            max_turns=self.args.max_turns,
        )
        self.log_metrics({"frac_reward_zero_std": metrics.pop("frac_reward_zero_std")}, mode, replace=True)
        self.log_metrics(metrics)

    def log_metrics(self, values: dict[str, float], mode: str | None = None, replace: bool = False) -> None:
        """The one place this trainer's metrics enter TRL's logs (`mode`: default from the model's mode), where
        TRL averages each over the logging step. `replace` overwrites the value TRL logged last under that name
        (none is added where TRL logged none)."""
        metrics = self._metrics[mode or ("train" if self.model.training else "eval")]
        for name, value in values.items():
            if not replace:
                metrics[name].append(value)
            elif metrics.get(name):
                metrics[name][-1] = value

    def logged_values(self, name: str, mode: str = "train") -> list[float]:
        """The values logged under `name` since TRL last wrote its logs (it averages them there)."""
        return list(self._metrics[mode].get(name, ()))

    @contextlib.contextmanager
    def metrics_under(self, prefix: str, mode: str) -> Iterator[None]:
        """Values logged in `mode` inside the block (TRL's loss included) go under `prefix` + their name, not the
        policy's."""
        metrics = self._metrics[mode]
        before = {name: len(values) for name, values in metrics.items()}
        try:
            yield
        finally:
            for name in list(metrics):
                new = metrics[name][before.get(name, 0) :]
                if new:
                    del metrics[name][before.get(name, 0) :]
                    metrics[prefix + name].extend(new)
                if name not in before and not metrics[name]:
                    del metrics[name]  # TRL averages every name it holds: an empty one would divide by zero

    def _rollout(self, prompts: list[Any], trainer: GRPOTrainer) -> dict[str, Any]:
        rows = [getattr(prompt, "row", None) for prompt in prompts]
        if any(row is None for row in rows):
            raise RuntimeError("rollout_func got prompts without their dataset rows: roll out through the trainer "
                               "(`train()`, `generate_and_score`)")  # fmt: skip
        # Freed host memory back to the system before the rollout (the last step's backward) and after it (its
        # key/value caches), so that each phase starts from what the process holds (`agentic_grpo.chunked_logps`).
        release_freed_memory(self.accelerator.device)
        trajectories, stats = self._sample(prompts, rows)
        release_freed_memory(self.accelerator.device)
        self.log_metrics(self._rollout_metrics(trajectories, stats, rows))
        return {
            "prompt_ids": [t.prompt_ids for t in trajectories],
            "completion_ids": [t.completion_ids for t in trajectories],
            "logprobs": self._sampling_logprobs(trajectories),
            "env_mask": [masked_loss_mask(t, self.mask_truncated_by_finish_reason) for t in trajectories],
            "trajectory": trajectories,
        }

    def _sample(self, prompts: list[Any], rows: list[dict[str, Any]]) -> tuple[list[Trajectory], Any]:
        """The rollout manager's trajectories for `prompts` (each with its dataset row) and its statistics."""
        return self.rollout_manager.rollout(prompts, rows, self.generation_backend)

    def _rollout_metrics(self, trajectories: list[Trajectory], stats: Any, rows: list[dict[str, Any]]) -> dict:
        """The rollout's metrics, summed over processes (collective: every process calls it)."""
        metrics = rollout_metrics(trajectories, stats, self._sum_over_processes)
        metrics.update(batch_selection_metrics(trajectories, rows, self.rollout_parts, self._sum_over_processes))
        if self.sandbox_pool is not None:  # sandbox/downgraded, sandbox/cgroup: a silent fallback shows in the logs
            metrics.update(self.sandbox_pool.metrics())
        return metrics

    def _sum_over_processes(self, counts: list[float]) -> list[float]:
        """Counts summed element-wise over every process (collective: every process calls it)."""
        local = torch.tensor(counts, dtype=torch.float64, device=self.accelerator.device)
        return self.accelerator.gather(local).view(-1, local.numel()).sum(0).tolist()

    def _sampling_logprobs(self, trajectories: list[Trajectory]) -> list[list[float]] | None:
        """Each completion's sampling log-probs (vLLM), or None (HF generate: TRL recomputes them when needed)."""
        logprobs = [t.completion_logprobs for t in trajectories]
        if all(lp is not None for lp in logprobs):
            return logprobs
        if self.use_vllm and self.vllm_importance_sampling_correction:
            raise RuntimeError(
                "`vllm_importance_sampling_correction` needs the sampling log-prob of every generated token, and the "
                "generation backend returned none for some turns: set `vllm_importance_sampling_correction: false`"
            )
        return None

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        mode = "train" if self.model.training else "eval"
        start = time.perf_counter()
        rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self.log_metrics({"time/reward": time.perf_counter() - start})
        filled = fill_missing_with_group_mean(
            rewards, self.num_generations if mode == "train" else self.num_generations_eval
        )
        weights = self.reward_weights.to(rewards.device)
        first = self.accelerator.process_index * len(inputs)  # `rewards` holds every process's rows
        local = slice(first, first + len(inputs))
        totals = (filled[local] * weights).nansum(dim=1)
        # A row no reward could score (all missing, even after the fill) has no reward: not a made-up 0.
        trained = [None if unscorable else total for total, unscorable in
                   zip(totals.tolist(), filled[local].isnan().all(dim=1).tolist(), strict=True)]  # fmt: skip
        for row, scores, reward in zip(inputs, rewards[local].tolist(), trained, strict=True):
            trajectory = row["trajectory"]
            trajectory.rewards = {  # as the rewards gave them: None stays None in the trajectory files
                name: None if math.isnan(score) else score
                for name, score in zip(self.reward_func_names, scores, strict=True)
            }
            trajectory.reward = reward  # what the advantage was computed from (a None counted as its group's mean)
        return filled

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """TRL's loss, its read of the rows in pieces recomputed in backward (`agentic_grpo.chunked_logps`)."""
        with self.loss_read():
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

    def _get_per_token_logps_and_entropies(self, model, *args, **kwargs):
        """TRL's read of the trajectories (policy, old policy, reference, co-trained roles), with position ids
        numbered from the attention mask, as generation numbers them."""
        with positions_from_mask(model):
            return super()._get_per_token_logps_and_entropies(model, *args, **kwargs)

    def _log_raw_reward_means(self, inputs: list[dict[str, Any]]) -> None:
        """`rewards/<name>/mean` and `/std` over the trajectories each reward really scored (not the filled values)."""
        scored = gather_object([row["trajectory"].rewards for row in inputs if "trajectory" in row])
        if not scored:
            return
        names = self.reward_func_names
        raw = torch.tensor([[nan_if_none(r.get(n)) for n in names] for r in scored], dtype=torch.float32)
        values = {}
        for name, mean, std in zip(names, *raw_reward_means(raw), strict=True):
            values[f"rewards/{name}/mean"], values[f"rewards/{name}/std"] = mean, std
        self.log_metrics(values, replace=True)

    # --- files ----------------------------------------------------------------------

    def _save_trajectories(
        self, inputs: list[dict[str, Any]], advantages: torch.Tensor | None, error: str | None = None
    ) -> Any:
        """Write this step's trajectories (with rewards and advantages, or with the `error` that stopped scoring)."""
        every = self.args.save_trajectories_steps
        step = self.state.global_step + 1  # the optimizer step these trajectories train
        if error is None and (not every or step % every):
            return None
        records = trajectory_records(inputs, advantages, error)
        if records is None:
            return None
        # An optimizer step that generates more than once (gradient accumulation with a smaller
        # steps_per_generation) adds each generation's trajectories to its file rather than replacing them.
        path = RunFilesCallback.write_trajectories(
            self.args.output_dir, step, records, self.accelerator, append=step == self._last_trajectory_step
        )
        self._last_trajectory_step = step
        if error is None and wandb_reporting(self.args):
            log_trajectory_table(step, records, self.accelerator)
        return path

    def train(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().train(*args, **kwargs)
        finally:
            # The tool threads go; the rollout manager starts new ones if this trainer rolls out again
            # (`evaluate()`, a second `train()`). The sandbox pool lives as long as the trainer.
            self.rollout_manager.close()

    def _load_callback_state(self) -> None:
        """The Trainer rebuilds restorable callbacks from their saved `args` alone, which cannot carry this
        trainer; the adaptive-KL callback restores its coefficient itself (`AdaptiveKLCallback.on_step_begin`)."""
        saved = self.state.stateful_callbacks
        own = saved.pop(AdaptiveKLCallback.__name__, None)
        try:
            super()._load_callback_state()
        finally:
            if own is not None:
                saved[AdaptiveKLCallback.__name__] = own
