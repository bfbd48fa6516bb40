"""`AgenticGRPOTrainer`: TRL's `GRPOTrainer` with multi-turn tool-use rollouts.

TRL does the algorithm: group advantages, the clipped GRPO loss under the `env_mask`
we return (tool tokens count for nothing), the KL term against the frozen reference,
DeepSpeed/FSDP/PEFT, vLLM and logging. We add, through its public `rollout_func` seam:
the rollout manager (turn loop, tools, sandbox), tool and trajectory metrics, the time
split of a step, and the run files (`metrics.jsonl`, `trajectories/step_N.jsonl`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Callable
from typing import Any

import torch
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, rotate_checkpoints
from trl import GRPOTrainer

from agentic_grpo.backends import GenerationBackend, TrainerBackend
from agentic_grpo.config import AgenticGRPOConfig
from agentic_grpo.environment import ToolEnvironment
from agentic_grpo.formats import TrajectoryFormat, load_format
from agentic_grpo.kl_control import AdaptiveKLCallback, schedule_for
from agentic_grpo.plugins import PluginError, import_object
from agentic_grpo.rollout import RolloutLimits, RolloutManager, RolloutStats
from agentic_grpo.run_files import RunFilesCallback
from agentic_grpo.trajectory import Trajectory
from agentic_grpo.vllm_backend import VLLMBackend
from agentic_grpo.wandb_table import log_trajectory_table, wandb_reporting

# We use `rollout_func` on purpose; TRL's "experimental" banner would only alarm users.
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
# Checkpoints are written here first and renamed to `checkpoint-N` once complete (no `checkpoint-` prefix,
# so the Trainer's `get_last_checkpoint` and checkpoint rotation never see a half-written one).
STAGING_DIR = "partial-checkpoints"


def load_environment(path: str) -> type[ToolEnvironment]:
    """The environment class named by a recipe, checked to be a `ToolEnvironment` with valid tool schemas."""
    cls = import_object(path, what="environment")
    if not (isinstance(cls, type) and issubclass(cls, ToolEnvironment)):
        raise PluginError(f"environment `{path}` is not a subclass of agentic_grpo.ToolEnvironment")
    if not cls.tools():
        raise PluginError(f"environment `{path}` has no tools: add public methods with type hints and docstrings")
    cls.tool_schemas()  # raises, naming the tool, when a docstring or hint is missing
    return cls


def make_sandbox_pool(config: AgenticGRPOConfig, rank: int) -> Any:
    """The sandbox slot pool for code-running tools, as the recipe configures it (one per process)."""
    from agentic_grpo.sandbox import SandboxConfig, SandboxPool

    sandbox = SandboxConfig(
        mode=config.sandbox, timeout_s=config.tool_timeout, memory_mb=config.sandbox_memory_mb,
        workspace_mb=config.sandbox_workspace_mb,
    )  # fmt: skip
    return SandboxPool(sandbox, rank=rank)


class AgenticGRPOTrainer(GRPOTrainer):
    """GRPO on multi-turn tool-use trajectories.

    Args:
        model: model id/path or a loaded model (as for TRL's `GRPOTrainer`).
        reward_funcs: TRL reward functions; each also receives `trajectory=[Trajectory, ...]`.
        args: the run's `AgenticGRPOConfig`.
        train_dataset: rows with a conversational `prompt` (see `agentic_grpo.data.add_prompts`).
        environment_factory: builds one tool environment per trajectory; default: `args.environment`.
        trajectory_format: default: `args.format` built for the environment's tools.
        generation_backend: default: HF `generate` on the policy.
        **kwargs: passed to `GRPOTrainer` (eval_dataset, processing_class, peft_config, callbacks, ...).
    """

    def __init__(
        self,
        model: Any,
        reward_funcs: list[Callable],
        args: AgenticGRPOConfig,
        train_dataset: Any,
        environment_factory: Callable[[], ToolEnvironment] | None = None,
        trajectory_format: TrajectoryFormat | None = None,
        generation_backend: GenerationBackend | None = None,
        **kwargs: Any,
    ) -> None:
        environment_cls = load_environment(args.environment)
        if environment_factory is None:
            env_kwargs = dict(args.environment_kwargs or {})

            def environment_factory() -> ToolEnvironment:
                return environment_cls(**env_kwargs)

        self.trajectory_format = trajectory_format or load_format(
            args.format, environment_cls.tool_schemas(), **(args.format_kwargs or {})
        )
        super().__init__(
            model=model, reward_funcs=reward_funcs, args=args, train_dataset=train_dataset,
            rollout_func=self._rollout, **kwargs,
        )  # fmt: skip
        self.sandbox_pool = (
            make_sandbox_pool(args, self.accelerator.process_index) if environment_cls.needs_sandbox else None
        )
        self.rollout_manager = RolloutManager(
            environment_factory,
            self.trajectory_format,
            self.processing_class,
            RolloutLimits.from_config(args),
            sandbox_pool=self.sandbox_pool,
        )
        self.generation_backend = generation_backend
        self._rows: list[dict[str, Any]] = []
        self._trajectories: list[Trajectory] = []
        self._rewards_per_func: torch.Tensor | None = None
        self.add_callback(RunFilesCallback(self))
        schedule = schedule_for(args)
        if schedule is not None:
            self.add_callback(AdaptiveKLCallback(self, schedule))
        self._staging_checkpoint = False

    # --- one generation: rows in, trajectories out -------------------------------------

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        # `rollout_func` receives only the prompts; the environments need the whole rows.
        self._rows = [{k: v for k, v in row.items() if k != "prompt"} for row in inputs]
        output = super()._generate_and_score_completions(inputs)
        if self.model.training:
            self._save_trajectories(output.get("advantages"))
        return output

    def _rollout(self, prompts: list[Any], trainer: GRPOTrainer) -> dict[str, Any]:
        backend = self.generation_backend or (VLLMBackend(self) if self.use_vllm else TrainerBackend(self))
        trajectories, stats = self.rollout_manager.rollout(prompts, self._rows, backend)
        self._trajectories = trajectories
        self._log_rollout(trajectories, stats)
        return {
            "prompt_ids": [t.prompt_ids for t in trajectories],
            "completion_ids": [t.completion_ids for t in trajectories],
            "logprobs": None,  # HF generate: TRL recomputes log-probs itself when it needs them
            "env_mask": [t.loss_mask for t in trajectories],
            "trajectory": trajectories,
        }

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        start = time.perf_counter()
        rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._metrics["train" if self.model.training else "eval"]["time/reward"].append(time.perf_counter() - start)
        self._rewards_per_func = rewards
        return rewards

    # --- metrics and files --------------------------------------------------------------

    def _log_rollout(self, trajectories: list[Trajectory], stats: RolloutStats) -> None:
        """Tool, trajectory, token and time metrics, summed over all processes before dividing."""
        calls = [r for t in trajectories for _, r in t.tool_calls]
        counts = torch.tensor(
            [
                len(trajectories),
                len(calls),
                sum(not r.ok for r in calls),
                sum(r.timed_out for r in calls),
                sum(r.truncated for r in calls),
                sum(t.invalid for t in trajectories),
                sum(t.turns for t in trajectories),
                sum(sum(t.loss_mask) for t in trajectories),
                sum(len(t.loss_mask) for t in trajectories),
                sum(bool(t.tool_calls) for t in trajectories),
                sum(t.final_answer is not None for t in trajectories),
                stats.generation_seconds,
                stats.tool_seconds,
                1.0,
            ],
            dtype=torch.float64,
            device=self.accelerator.device,
        )
        (n, n_calls, errors, timeouts, truncated, invalid, turns, trainable, tokens, with_call, answered,
         gen_s, tool_s, procs) = self.accelerator.gather(counts).view(-1, counts.numel()).sum(0).tolist()  # fmt: skip
        metrics = self._metrics["train" if self.model.training else "eval"]
        metrics["tools/calls_per_trajectory"].append(n_calls / n)
        metrics["tools/call_rate"].append(with_call / n)
        metrics["tools/error_rate"].append(errors / n_calls if n_calls else 0.0)
        metrics["tools/timeout_rate"].append(timeouts / n_calls if n_calls else 0.0)
        metrics["tools/truncated_rate"].append(truncated / n_calls if n_calls else 0.0)
        metrics["trajectories/invalid_rate"].append(invalid / n)
        metrics["trajectories/answered_rate"].append(answered / n)
        metrics["trajectories/turns_mean"].append(turns / n)
        metrics["tokens/trainable_ratio"].append(trainable / tokens if tokens else 0.0)
        metrics["time/generation"].append(gen_s / procs)
        metrics["time/tools"].append(tool_s / procs)
        if self.sandbox_pool is not None:  # sandbox/downgraded, sandbox/cgroup: a silent fallback shows in the logs
            for name, value in self.sandbox_pool.metrics().items():
                metrics[name].append(value)

    def _save_trajectories(self, advantages: torch.Tensor | None) -> None:
        every = self.args.save_trajectories_steps
        step = self.state.global_step + 1  # the optimizer step these trajectories train
        if not every or step % every or self._rewards_per_func is None:
            return
        n = len(self._trajectories)
        start = self.accelerator.process_index * n
        rewards = self._rewards_per_func[start : start + n].cpu()
        weights = self.reward_weights.cpu()
        names = self.reward_func_names
        records = []
        for i, trajectory in enumerate(self._trajectories):
            record = trajectory.to_dict()
            row = self._rows[i] if i < len(self._rows) else {}
            record["row"] = {k: v for k, v in row.items() if isinstance(v, (str, int, float, bool, type(None)))}
            per_func = {
                name: (None if torch.isnan(r) else float(r)) for name, r in zip(names, rewards[i], strict=False)
            }
            record["rewards"] = per_func
            record["reward"] = float(torch.nansum(rewards[i] * weights))
            if advantages is not None and i < len(advantages):
                record["advantage"] = float(advantages[i])
            records.append(record)
        RunFilesCallback.write_trajectories(self.args.output_dir, step, records, self.accelerator)
        if wandb_reporting(self.args):
            log_trajectory_table(step, records, self.accelerator)

    # --- checkpoints: written atomically ------------------------------------------------

    def _get_output_dir(self, trial: Any) -> str:
        run_dir = super()._get_output_dir(trial)
        return os.path.join(run_dir, STAGING_DIR) if self._staging_checkpoint else run_dir

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

    def train(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().train(*args, **kwargs)
        finally:
            self.rollout_manager.close()
            if self.sandbox_pool is not None:
                self.sandbox_pool.close()
