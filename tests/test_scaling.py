"""Scaling out: accelerate configs, two real processes over gloo, LoRA, and launch set-ups refused at start-up."""

from __future__ import annotations

import importlib.util
import json
import os

import pytest

from tests.helpers import ROOT, accelerate_launch, run_cli, train, write_recipe

CONFIGS = ROOT / "accelerate_configs"
SMALL = ["--max_turns", "2", "--max_tokens_per_turn", "12", "--max_completion_length", "48"]


def launch(*args: str):
    """`accelerate launch --config_file accelerate_configs/cpu_2proc.yaml train.py ARGS`, as a user types it."""
    return accelerate_launch(ROOT / "train.py", *args)


# --- accelerate configs --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "distributed_type"),
    [
        ("single_gpu", "NO"), ("multi_gpu", "MULTI_GPU"), ("deepspeed_zero2", "DEEPSPEED"),
        ("deepspeed_zero3", "DEEPSPEED"), ("fsdp", "FSDP"), ("multi_node", "MULTI_GPU"), ("cpu_2proc", "MULTI_GPU"),
    ],
)  # fmt: skip
def test_accelerate_config_loads_and_is_named_in_the_readme(name, distributed_type):
    from accelerate.commands.config.config_args import load_config_from_file

    path = CONFIGS / f"{name}.yaml"
    config = load_config_from_file(str(path))
    assert str(config.distributed_type).split(".")[-1] == distributed_type
    assert path.read_text().startswith("#")  # every config says what it is for
    assert f"accelerate_configs/{name}.yaml" in (ROOT / "README.md").read_text()


def test_sharded_configs_carry_what_generation_and_saving_need():
    from accelerate.commands.config.config_args import load_config_from_file

    zero3 = load_config_from_file(str(CONFIGS / "deepspeed_zero3.yaml")).deepspeed_config
    assert zero3["zero_stage"] == 3 and zero3["zero3_init_flag"] and zero3["zero3_save_16bit_model"]
    assert load_config_from_file(str(CONFIGS / "deepspeed_zero2.yaml")).deepspeed_config["zero_stage"] == 2
    fsdp = load_config_from_file(str(CONFIGS / "fsdp.yaml")).fsdp_config
    assert fsdp["fsdp_version"] == 2 and fsdp["fsdp_state_dict_type"] == "FULL_STATE_DICT"
    node = load_config_from_file(str(CONFIGS / "multi_node.yaml"))
    assert node.num_machines == 2 and node.main_process_ip


# --- two processes -------------------------------------------------------------------------


@pytest.mark.integration
def test_two_processes_each_roll_out_their_own_questions_and_metrics_are_gathered(tmp_path):
    """Also a local LLM judge and a reward that never scores: their counts (per step and in the end summary) are both
    processes' trajectories."""
    import yaml

    rewards = yaml.safe_load((ROOT / "recipes" / "ci_tiny.yaml").read_text())["rewards"]
    judge = {"name": "judge", "type": "agentic_grpo.rewards.judge:LLMJudge", "weight": 0.1, "backend": "local",
             "model": "tiny-random-llama", "max_tokens": 4}  # fmt: skip
    silent = {"type": "tests.varied_rewards:never_scores", "weight": 0.1}
    recipe = write_recipe(tmp_path, rewards=[*rewards, judge, silent])
    out = tmp_path / "out"
    result = launch("--config", str(recipe), "--output_dir", str(out), "--max_steps", "1", *SMALL)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "judge `judge`: scored " in result.stdout and " of 8 trajectories" in result.stdout, result.stdout[-2000:]
    assert "reward `never_scores` never scored: it returned None for all 8 completions" in result.stdout

    files = sorted(p.name for p in (out / "trajectories").iterdir())
    assert files == ["step_000001.rank0.jsonl", "step_000001.rank1.jsonl"]
    ranks = [[json.loads(line) for line in (out / "trajectories" / f).read_text().splitlines()] for f in files]
    assert [len(r) for r in ranks] == [4, 4]  # each rank: one question x G=4
    questions = [{t["row"]["question"] for t in r} for r in ranks]
    assert len(questions[0]) == len(questions[1]) == 1 and questions[0] != questions[1]

    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "loss" in r]
    assert [r["step"] for r in steps] == [1]  # written once (rank 0), not once per process
    tokens = [sum(len(s["token_ids"]) for t in r for s in t["segments"]) for r in ranks]
    assert steps[0]["num_tokens"] == sum(tokens)  # both ranks' tokens, gathered
    # One rank judges 4 trajectories (fewer calls where two are the same text): more than 4 is both ranks' calls.
    assert 4 < steps[0]["judge/calls"] + steps[0]["judge/cache_hits"] <= 8, steps[0]
    assert {"rng_state_0.pth", "rng_state_1.pth"} <= {p.name for p in (out / "checkpoint-1").iterdir()}


@pytest.mark.integration
def test_a_refusal_under_a_launch_ends_in_its_one_line_not_a_launcher_traceback(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "run.json").write_text(json.dumps({"status": "completed"}))  # an earlier run the launch must not touch
    result = run_cli("train", "--accelerate_config", "cpu_2proc", "--config", "ci_tiny", "--output_dir", str(out),
                     "--max_steps", "1", timeout=300)  # fmt: skip
    assert result.returncode == 2, result.stderr[-3000:]
    assert f"error: output_dir `{out}` already holds a run" in result.stderr
    assert "Traceback" not in result.stderr and "ChildFailedError" not in result.stderr


@pytest.mark.integration
def test_two_processes_reading_each_prompt_once_step_as_reading_it_per_row(tmp_path):
    """DDP over gloo, LoRA: each rank's group is scored with its prompt read once, two forward calls before
    one backward; the synchronised step (loss, gradient norm) is the one of whole-row reads."""
    import yaml

    recipe = yaml.safe_load((ROOT / "recipes" / "ci_tiny_lora.yaml").read_text())
    recipe["rewards"] = [{"type": "tests.varied_rewards:distinct_characters"}]  # non-zero advantages
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    steps = {}
    for once in ("false", "true"):
        out = tmp_path / once
        result = launch("--config", str(tmp_path / "recipe.yaml"), "--output_dir", str(out), "--max_steps", "1",
                        "--read_prompt_once", once, *SMALL)  # fmt: skip
        assert result.returncode == 0, result.stderr[-3000:]
        steps[once] = next(r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "loss" in r)
    assert steps["true"]["grad_norm"] > 0
    assert steps["true"]["grad_norm"] == pytest.approx(steps["false"]["grad_norm"], rel=1e-3)
    assert steps["true"]["loss"] == pytest.approx(steps["false"]["loss"], rel=1e-3, abs=1e-6)


@pytest.mark.integration
def test_more_processes_than_questions_per_step_is_refused(tmp_path):
    out = tmp_path / "out"
    result = launch("--config", "recipes/ci_tiny.yaml", "--output_dir", str(out), "--per_device_train_batch_size", "2")
    assert result.returncode != 0
    assert "2 processes but only 1 question(s) per generation step" in result.stderr
    assert not out.exists()


# --- LoRA ----------------------------------------------------------------------------------


@pytest.mark.integration
def test_lora_run_saves_an_adapter_and_its_reference_is_the_base_with_adapters_off(tmp_path):
    import torch
    import yaml
    from peft import PeftModel
    from transformers import AutoModelForCausalLM
    from trl.trainer.utils import use_adapter

    from agentic_grpo.models import resolve_model

    recipe = yaml.safe_load((ROOT / "recipes" / "ci_tiny_lora.yaml").read_text())
    recipe["rewards"] = [{"type": "tests.varied_rewards:distinct_characters"}]  # non-zero advantages: B moves off 0
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    out = tmp_path / "out"
    result = train("--config", str(tmp_path / "recipe.yaml"), "--output_dir", str(out), "--max_steps", "1",
                   "--save_steps", "1", "--learning_rate", "0.05")  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert (out / "adapter_config.json").exists() and (out / "checkpoint-1" / "adapter_config.json").exists()
    assert not (out / "model.safetensors").exists()  # the adapter only, not a copy of the base model

    os.environ.setdefault("AGENTIC_GRPO_CACHE", str(ROOT / ".model-cache"))
    base = AutoModelForCausalLM.from_pretrained(resolve_model("tiny-random-llama"))
    policy = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base.name_or_path), out)
    ids = torch.tensor([[1, 2, 3, 4, 5, 6]])
    with torch.no_grad():
        expected = base(ids).logits
        assert not torch.allclose(policy(ids).logits, expected)  # the adapter trained
        with use_adapter(policy, adapter_name=None):  # how TRL computes reference log-probs under PEFT
            assert torch.allclose(policy(ids).logits, expected)


def test_lora_trainer_keeps_no_reference_model(tmp_path, monkeypatch):
    monkeypatch.setenv("AGENTIC_GRPO_CACHE", str(ROOT / ".model-cache"))
    from agentic_grpo.train import prepare
    from agentic_grpo.trainer import AgenticGRPOTrainer

    run = prepare(["--config", "recipes/ci_tiny_lora.yaml", "--output_dir", str(tmp_path / "out")])
    trainer = AgenticGRPOTrainer(model=run.model_path, reward_funcs=run.rewards, args=run.config,
                                 train_dataset=run.train, rollout_parts=run.rollout_parts,
                                 peft_config=run.peft_config)  # fmt: skip
    assert trainer.beta > 0 and trainer.ref_model is None
    assert "default" in trainer.model.peft_config


# --- refused at start-up -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("override", "env", "message"),
    [
        (["--use_vllm", "true"], {}, "vllm is not installed"),
        ([], {"ACCELERATE_USE_DEEPSPEED": "true"}, "DeepSpeed needs CUDA GPUs"),
        (["--deepspeed", "DS_JSON"], {}, "DeepSpeed needs CUDA GPUs"),
        (["--resume_from_checkpoint", "NOT_A_CHECKPOINT"], {}, "is not a checkpoint (it has no trainer_state.json)"),
        (["--resume_from_checkpoint", "./no/such/checkpoint-3"], {}, "is not a checkpoint (it does not exist)"),
        (["--kl_control", "{preset: calm}"], {}, "kl_control preset `calm` is not known"),
        (["--kl_control", "{target: 0.1}", "--beta", "0"], {}, "needs beta > 0"),
        (["--report_to", "wandb", "--wandb_mode", "sometimes"], {}, "wandb_mode must be"),
    ],
)
def test_bad_launch_setup_stops_before_any_output(tmp_path, monkeypatch, capsys, override, env, message):
    # In-process `train.main` (the refusals all happen before a model is loaded): a subprocess each
    # would cost seconds of imports for nothing. The two-process refusal above is a real launch.
    from agentic_grpo.train import main

    if "vllm" in message:  # CI installs vLLM (its lane), so its absence is what this test plays
        find_spec = importlib.util.find_spec
        monkeypatch.setattr(
            importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else find_spec(name, *a)
        )
    monkeypatch.setenv("AGENTIC_GRPO_CACHE", str(ROOT / ".model-cache"))
    monkeypatch.chdir(ROOT)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    (tmp_path / "ds.json").write_text('{"zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": "auto"}')
    (tmp_path / "not_a_checkpoint").mkdir()
    replace = {"DS_JSON": str(tmp_path / "ds.json"), "NOT_A_CHECKPOINT": str(tmp_path / "not_a_checkpoint")}
    override = [replace.get(a, a) for a in override]
    out = tmp_path / "out"
    assert main(["--config", "recipes/ci_tiny.yaml", "--output_dir", str(out), *override]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()
