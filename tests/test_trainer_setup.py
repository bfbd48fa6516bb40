"""The trainer refuses set-ups that would train on wrong numbers, samples without dropout, and outlives `train()`."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from datasets import Dataset

from agentic_grpo.trainer import AgenticGRPOTrainer
from agentic_grpo.trainer_checks import check_trainer_setup
from agentic_grpo.trainer_layers import trainer_class
from tests.scripted import ScriptedBackend, case_prompt
from tests.trainer_support import SCRIPTS, config, exact


class RecordingBackend(ScriptedBackend):
    """Scripted text, and whether the policy (and any dropout module) was in train mode at each generate."""

    def __init__(self, trainer, scripts):
        super().__init__(trainer.processing_class, scripts)
        self.trainer = trainer
        self.training_at_generate: list[bool] = []

    def generate(self, batch, stop, max_new_tokens, choices=None, assigned=None):
        modules = list(self.trainer.model.modules())[1:]  # the root's flag only tells TRL train from eval
        self.training_at_generate.append(any(m.training for m in modules))
        return super().generate(batch, stop, max_new_tokens, choices, assigned)


@pytest.fixture
def trainer(tiny_model_dir, tmp_path):
    rows = [{"prompt": case_prompt(name), "question": name, "answer": "42"} for name in SCRIPTS]
    trainer = AgenticGRPOTrainer(
        model=tiny_model_dir, reward_funcs=[exact], args=config(tmp_path), train_dataset=Dataset.from_list(rows)
    )
    trainer.generation_backend = RecordingBackend(trainer, SCRIPTS)
    return trainer, rows


def test_rollouts_sample_and_score_with_dropout_off_and_training_resumes_in_train_mode(tiny_model_dir, tmp_path):
    rows = [{"prompt": case_prompt(name), "question": name, "answer": "42"} for name in SCRIPTS]
    # Two iterations per generation: TRL then scores the sampled tokens (old log-probs) with the policy itself.
    args = config(tmp_path, num_iterations=2)
    trainer = AgenticGRPOTrainer(model=tiny_model_dir, reward_funcs=[exact], args=args,
                                 train_dataset=Dataset.from_list(rows))  # fmt: skip
    trainer.generation_backend = RecordingBackend(trainer, SCRIPTS)
    scoring_in_train_mode: list[bool] = []
    score = trainer._get_per_token_logps_and_entropies

    def recording_score(model, *args, **kwargs):
        scoring_in_train_mode.append(any(m.training for m in list(model.modules())[1:]))
        return score(model, *args, **kwargs)

    trainer._get_per_token_logps_and_entropies = recording_score
    trainer.model.train()
    output = trainer.generate_and_score(rows * 2)
    assert trainer.generation_backend.training_at_generate and not any(trainer.generation_backend.training_at_generate)
    assert output.get("old_per_token_logps") is not None and scoring_in_train_mode == [False]
    assert all(m.training for m in trainer.model.modules())
    assert trainer._metrics["train"]["tools/call_rate"]  # still booked as a training step, not an evaluation


def test_trainer_evaluates_and_trains_again_after_train(trainer, tmp_path):
    trainer, rows = trainer
    trainer.eval_dataset = Dataset.from_list(rows * 2)
    trainer.train()
    # The tool threads and the sandbox pool were closed for good by train() before: evaluate() and a second
    # train() raised "cannot schedule new futures after shutdown".
    metrics = trainer.evaluate()
    assert "eval_reward" in metrics
    trainer.args.max_steps = 2
    trainer.train()
    assert trainer.state.global_step == 2
    assert trainer.sandbox_pool.live_slots == 0
    # A silent fallback to a weaker sandbox layer, or no cgroup, shows in the run's own metrics.
    logged = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    flags = [row["sandbox/downgraded"] for row in logged if "sandbox/downgraded" in row]
    assert len(flags) >= 2 and set(flags) == {0.0}  # every training step (and the evaluation) reports it


def test_on_reward_error_none_holds_for_a_trainer_built_directly(tiny_model_dir, tmp_path):
    def broken(prompts, completions, **_):
        raise KeyError("difficulty")

    rows = [{"prompt": case_prompt(name), "question": name, "answer": "42"} for name in SCRIPTS]
    trainer = AgenticGRPOTrainer(model=tiny_model_dir, reward_funcs=[exact, broken],
                                 args=config(tmp_path, on_reward_error="none"), train_dataset=Dataset.from_list(rows))  # fmt: skip
    trainer.generation_backend = ScriptedBackend(trainer.processing_class, SCRIPTS)
    trajectories = keep_trajectories(trainer)
    trainer.generate_and_score(rows * 2)
    assert [t.rewards["broken"] for t in trajectories] == [None] * 4
    assert sorted(t.rewards["exact"] for t in trajectories) == [0.0, 0.0, 1.0, 1.0]


class LogprobBackend(ScriptedBackend):
    """Scripted text with a made-up sampling log-prob per token, as the vLLM backend reports them."""

    def generate(self, batch, stop, max_new_tokens, choices=None, assigned=None):
        generations = super().generate(batch, stop, max_new_tokens, choices, assigned)
        for generation in generations:
            generation.logprobs = [-0.5 - 0.01 * k for k in range(len(generation.token_ids))]
        return generations


def keep_trajectories(trainer) -> list:
    """The trajectories of the next rollout, as TRL's `rollout_func` returns them."""
    kept: list = []
    rollout = trainer.rollout_func

    def keeping(prompts, trl_trainer):
        output = rollout(prompts, trl_trainer)
        kept.extend(output["trajectory"])
        return output

    trainer.rollout_func = keeping
    return kept


def test_sampling_logprobs_reach_trl_aligned_with_the_completion_and_zero_on_tool_tokens(trainer):
    trainer, rows = trainer
    trainer.generation_backend = LogprobBackend(trainer.processing_class, SCRIPTS)
    trajectories = keep_trajectories(trainer)
    output = trainer.generate_and_score(rows * 2)
    sampled = output["sampling_per_token_logps"]  # TRL's padded (B, T) tensor, built from our `logprobs`
    assert any(s.role == "tool" for t in trajectories for s in t.segments)  # the code case ran its tool
    for row, trajectory in enumerate(trajectories):
        expected = []
        for segment in trajectory.completion_segments:
            n = len(segment.token_ids)
            expected += [-0.5 - 0.01 * k for k in range(n)] if segment.role == "model" else [0.0] * n
        assert sampled[row, : len(expected)].tolist() == pytest.approx(expected)


def test_importance_sampling_without_sampling_logprobs_stops_with_a_clear_error(trainer):
    trainer, rows = trainer
    trajectories = keep_trajectories(trainer)
    trainer.generate_and_score(rows * 2)  # HF generate: no sampling log-probs, TRL recomputes
    assert trainer._sampling_logprobs(trajectories) is None
    # vLLM cannot run on this CPU machine, so the two flags the vLLM path would set are set by hand.
    trainer.use_vllm, trainer.vllm_importance_sampling_correction = True, True
    with pytest.raises(RuntimeError, match="needs the sampling log-prob of every generated token"):
        trainer._sampling_logprobs(trajectories)


def test_vllm_tensor_parallel_over_processes_is_refused_and_server_mode_is_not():
    # Tensor parallelism with several processes: TRL would slice another process's completions. Server mode sends
    # each process's own trajectories (agentic_grpo.vllm_server; run for real in tests/test_vllm_server.py).
    layout = dict(per_device_train_batch_size=8, steps_per_generation=1, num_generations=4, world_size=2,
                  use_vllm=True, vllm_mode="colocate", vllm_tensor_parallel_size=2)  # fmt: skip
    with pytest.raises(ValueError, match="tensor_parallel_size 2 across 2 processes would hand some process"):
        check_trainer_setup(SimpleNamespace(**layout), [exact])
    server = SimpleNamespace(**{**layout, "vllm_mode": "server", "vllm_tensor_parallel_size": 1})
    check_trainer_setup(server, [exact], peft=True)
    check_trainer_setup(SimpleNamespace(**{**layout, "vllm_tensor_parallel_size": 1}), [exact])
    check_trainer_setup(SimpleNamespace(**{**layout, "world_size": 1}), [exact])


def test_full_weight_server_mode_without_cuda_is_refused():
    # TRL's full-weight sync to a server is NCCL; a LoRA adapter goes by file and needs none.
    layout = dict(per_device_train_batch_size=8, steps_per_generation=1, num_generations=4, world_size=2,
                  use_vllm=True, vllm_mode="server", vllm_tensor_parallel_size=1)  # fmt: skip
    with pytest.raises(ValueError, match="over NCCL, which needs CUDA"):
        check_trainer_setup(SimpleNamespace(**layout), [exact])
    check_trainer_setup(SimpleNamespace(**layout), [exact], peft=True)


def test_co_training_with_several_processes_is_refused():
    layout = SimpleNamespace(per_device_train_batch_size=8, steps_per_generation=1, num_generations=4, world_size=2,
                             use_vllm=False, vllm_mode="colocate", vllm_tensor_parallel_size=1,
                             experimental={"cotrain_subagents": True})  # fmt: skip
    trained, frozen = SimpleNamespace(name="helper", train=True), SimpleNamespace(name="other", train=False)
    with pytest.raises(ValueError, match=r"co-trained sub-agents \(\['helper'\].*this launch has 2"):
        check_trainer_setup(layout, [exact], [frozen, trained])
    check_trainer_setup(layout, [exact], [frozen])  # frozen sub-agents run in any number of processes
    check_trainer_setup(SimpleNamespace(**{**vars(layout), "world_size": 1}), [exact], [trained])


def test_sub_agents_on_a_sharded_policy_and_vllm_lora_under_fsdp_are_refused(monkeypatch):
    from agentic_grpo.subagents.sources import ModelSource, PolicySource

    layout = SimpleNamespace(per_device_train_batch_size=8, steps_per_generation=1, num_generations=4, world_size=2,
                             use_vllm=False, vllm_mode="colocate", vllm_tensor_parallel_size=1)  # fmt: skip
    from agentic_grpo.subagents.agent import SubAgent

    # What the check reads of a sub-agent: whether the policy's own model generates its turns.
    assert SubAgent.on_policy_model.fget(SimpleNamespace(source=object.__new__(PolicySource))) is True
    assert SubAgent.on_policy_model.fget(SimpleNamespace(source=object.__new__(ModelSource))) is False
    on_policy = SimpleNamespace(name="helper", train=False, on_policy_model=True)
    own_model = SimpleNamespace(name="other", train=False, on_policy_model=False)
    check_trainer_setup(layout, [exact], [on_policy])  # DDP: every process holds the whole policy
    zero3 = SimpleNamespace(**{**vars(layout), "deepspeed": {"zero_optimization": {"stage": 3}}})
    with pytest.raises(ValueError, match=r"\['helper'\].*under DeepSpeed ZeRO-3 every forward pass needs all 2"):
        check_trainer_setup(zero3, [exact], [own_model, on_policy])
    check_trainer_setup(zero3, [exact], [own_model])  # a frozen model of its own is not sharded
    check_trainer_setup(SimpleNamespace(**{**vars(zero3), "world_size": 1}), [exact], [on_policy])
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")  # as `accelerate launch` with an FSDP config sets it
    with pytest.raises(ValueError, match="under FSDP"):
        check_trainer_setup(layout, [exact], [on_policy])
    vllm = SimpleNamespace(**{**vars(layout), "use_vllm": True})
    with pytest.raises(ValueError, match="vLLM with a LoRA policy under FSDP"):
        check_trainer_setup(vllm, [exact], peft=True)
    check_trainer_setup(vllm, [exact])  # full fine-tuning: TRL's sync reads the weights, it merges nothing


class GroupJudge:
    """Stands for any reward that scores a query's samples together (LLMJudge in group mode)."""

    __name__ = "group_judge"
    needs_whole_groups = True


def test_group_scoring_rewards_refuse_groups_split_across_processes():
    # The layout of a 2-process launch (world_size is read from the launcher, so it is spelled out here).
    split = SimpleNamespace(per_device_train_batch_size=6, steps_per_generation=1, num_generations=4, world_size=2,
                            use_vllm=False, vllm_mode="colocate", vllm_tensor_parallel_size=1)  # fmt: skip
    with pytest.raises(ValueError, match=r"\['group_judge'\] score each query's 4 samples together.*holds 6 samples"):
        check_trainer_setup(split, [GroupJudge()])
    check_trainer_setup(SimpleNamespace(**{**vars(split), "per_device_train_batch_size": 8}), [GroupJudge()])
    check_trainer_setup(split, [exact])  # per-trajectory rewards do not care


def test_group_scoring_rewards_refuse_evaluation_groups_split_across_processes():
    layout = SimpleNamespace(per_device_train_batch_size=8, steps_per_generation=1, num_generations=4, world_size=2,
                             use_vllm=False, vllm_mode="colocate", vllm_tensor_parallel_size=1, eval_strategy="steps",
                             per_device_eval_batch_size=6, num_generations_eval=None)  # fmt: skip
    with pytest.raises(ValueError, match=r"in evaluation each of the 2 processes holds 6 samples"):
        check_trainer_setup(layout, [GroupJudge()])
    check_trainer_setup(SimpleNamespace(**{**vars(layout), "num_generations_eval": 2}), [GroupJudge()])
    check_trainer_setup(SimpleNamespace(**{**vars(layout), "eval_strategy": "no"}), [GroupJudge()])


def test_vllm_with_trls_default_importance_sampling_runs_on_the_sampling_logprobs(trainer):
    """A trainer built directly with vLLM keeps TRL's default `vllm_importance_sampling_correction=True`; before,
    the rollout returned no sampling log-probs and TRL crashed on `old_per_token_logps - None`."""
    trainer, rows = trainer
    assert trainer.args.vllm_importance_sampling_correction  # TRL's default, left on
    # vLLM cannot run on this CPU machine: its backend is replaced by one that reports per-token log-probs as
    # vLLM does, and the weight sync (a vLLM engine call) is marked done for this step.
    trainer.generation_backend = LogprobBackend(trainer.processing_class, SCRIPTS)
    trainer.use_vllm, trainer.vllm_importance_sampling_correction = True, True
    trainer._last_loaded_step = trainer.state.global_step
    trainer.args.canary_logprob_limit = 0  # the fake's log-probs are made up: the canary would stop the step
    trainer.model.train()  # a training step's generation
    output = trainer.generate_and_score(rows * 2)
    ratio = output["importance_sampling_ratio"]
    assert ratio.shape[0] == output["completion_ids"].shape[0] and bool(ratio.isfinite().all())
    assert trainer._metrics["train"]["sampling/sampling_logp_difference/mean"]


class AsyncGroupJudge:
    """Like LLMJudge: an async callable whose `needs_whole_groups` is a property of its class."""

    __name__ = "group_judge"

    @property
    def needs_whole_groups(self) -> bool:
        return True

    async def __call__(self, prompts, completions, **_):
        return [0.0] * len(completions)


@pytest.mark.parametrize("judge", [GroupJudge, AsyncGroupJudge])
def test_group_scoring_rewards_are_still_refused_when_guarded_by_on_reward_error_none(judge):
    """`on_reward_error: none` wraps each reward; the wrapper hid `needs_whole_groups` (a property of LLMJudge),
    so the CLI's check, which sees the wrapped rewards, accepted a layout that splits the judge's groups."""
    from agentic_grpo.reward_setup import guard_rewards

    split = SimpleNamespace(per_device_train_batch_size=6, steps_per_generation=1, num_generations=4, world_size=2,
                            use_vllm=False, vllm_mode="colocate", vllm_tensor_parallel_size=1)  # fmt: skip
    with pytest.raises(ValueError, match=r"\['group_judge'\] score each query's 4 samples together"):
        check_trainer_setup(split, guard_rewards([judge()], "none"))


def test_checkpoints_inside_a_generation_cycle_are_refused_at_start_up_and_at_resume(tmp_path):
    """A cycle of 2 optimizer steps (one generation trained on over 4 micro-steps, 2 to a step): a checkpoint
    after step 3 would hold half a cycle whose generated batch TRL does not save."""
    from agentic_grpo.trainer_checks import check_resume_between_cycles, generation_cycle

    cycle = dict(gradient_accumulation_steps=2, steps_per_generation=4, num_iterations=1, max_steps=10)
    layout = dict(per_device_train_batch_size=8, num_generations=4, world_size=1, use_vllm=False, **cycle)
    assert generation_cycle(SimpleNamespace(**layout)) == 2
    assert generation_cycle(SimpleNamespace(**{**layout, "steps_per_generation": 3})) == 3  # 6 micro-steps: lcm
    assert generation_cycle(SimpleNamespace(**{**layout, "steps_per_generation": 2, "num_iterations": 2})) == 2
    with pytest.raises(ValueError, match="`save_steps` 3 puts checkpoints inside generation cycles.*multiple of 2"):
        check_trainer_setup(SimpleNamespace(**layout, save_strategy="steps", save_steps=3), [exact])
    with pytest.raises(ValueError, match="`save_steps` 0.1 puts checkpoints"):  # a ratio: every 1 of 10 steps
        check_trainer_setup(SimpleNamespace(**layout, save_strategy="steps", save_steps=0.1), [exact])
    check_trainer_setup(SimpleNamespace(**layout, save_strategy="steps", save_steps=4), [exact])
    check_trainer_setup(SimpleNamespace(**layout, save_strategy="epoch", save_steps=3), [exact])  # epochs end cycles
    real = config(tmp_path, save_strategy="steps", save_steps=3, gradient_accumulation_steps=1, steps_per_generation=2)
    with pytest.raises(ValueError, match="puts checkpoints inside generation cycles"):  # the TrainingArguments enum
        check_trainer_setup(real, [exact])
    for step in (3, 4):
        (tmp_path / f"checkpoint-{step}").mkdir()
        (tmp_path / f"checkpoint-{step}" / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    with pytest.raises(ValueError, match="saved at step 3, inside a generation cycle of 2 optimizer steps"):
        check_resume_between_cycles(SimpleNamespace(**layout), tmp_path / "checkpoint-3")
    check_resume_between_cycles(SimpleNamespace(**layout), tmp_path / "checkpoint-4")


def test_a_cli_run_checks_its_setup_once_and_user_code_gets_the_same_checks(tmp_path, monkeypatch):
    """`prepare` runs every set-up check before the model loads and the trainer it builds does not run them again;
    a trainer built by user code runs them itself (here: a refusal `prepare` would have given)."""
    from agentic_grpo import trainer_checks
    from agentic_grpo.train import build_trainer, prepare

    calls = []
    real = trainer_checks.check_trainer_setup
    monkeypatch.setattr(trainer_checks, "check_trainer_setup", lambda *a, **k: calls.append(1) or real(*a, **k))
    prepared = prepare(["--config", "ci_tiny", "--output_dir", str(tmp_path / "out"), "--max_steps", "1"])
    assert len(calls) == 1
    build_trainer(prepared)
    assert len(calls) == 1
    anchor = config(tmp_path / "anchor", experimental={"advantage": "anchor"})  # the interpreter has no state_hash
    with pytest.raises(ValueError, match="defines no `state_hash"):
        trainer_class(anchor)(
            model=prepared.model_path, reward_funcs=[exact], args=anchor, train_dataset=prepared.train
        )
    assert len(calls) == 2
