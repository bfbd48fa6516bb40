"""What a new user runs into in their first hour: nested-setting typos, rewards that need columns or raise,
re-running into an output directory, and the `show` / `eval` / `--help` commands."""

from __future__ import annotations

import http.server
import importlib.util
import json
import threading
from pathlib import Path

import pytest

from agentic_grpo.cli import main as cli_main
from agentic_grpo.formats import load_format
from agentic_grpo.plugins import PluginError
from agentic_grpo.reward_setup import build_rewards, check_reward_columns
from agentic_grpo.tools.calculator import Calculator
from tests.helpers import run_cli, run_python, train, write_recipe
from tests.varied_rewards import needs_difficulty

SCHEMAS = Calculator.tool_schemas()


# --- nested settings: "did you mean", and the shapes of few-shot examples --------------------


def test_misspelled_reward_option_is_named_with_a_suggestion():
    with pytest.raises(PluginError, match=r"option `wieght` is not known; did you mean `weight`\?"):
        build_rewards([{"type": "agentic_grpo.rewards.rules:FormatAdherence", "wieght": 0.2}])
    with pytest.raises(PluginError, match=r"option `math_verfy` is not known; did you mean `math_verify`\?"):
        build_rewards([{"type": "agentic_grpo.rewards.rules:Correctness", "math_verfy": False}])


def test_misspelled_format_option_is_named_with_a_suggestion():
    with pytest.raises(PluginError, match=r"format `react` .*option `exampel_turns` is not known; did you mean "
                       r"`example_turns`\?"):  # fmt: skip
        load_format("react", SCHEMAS, exampel_turns=[])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"examples": [{"question": "q", "response": "r"}]}, "`examples` must be a list of strings"),
        ({"examples": "Question: q"}, "`examples` must be a list of strings"),
        ({"example_turns": ["Question: q\nFinal Answer: a"]}, "`example_turns` must be a list of mappings"),
    ],
)
def test_wrong_shape_of_examples_explains_both_forms(kwargs, message):
    with pytest.raises(ValueError, match=message) as caught:
        load_format("react", SCHEMAS, **kwargs)
    assert "`examples`, a list of plain-text strings" in str(caught.value)
    assert "`example_turns`, a list of `{question: ..., response: ...}`" in str(caught.value)


def test_help_names_the_command_and_lists_every_format(capsys):
    assert cli_main(["train", "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: agentic-grpo train")
    assert "`react`" in out and "`artist`" in out and "`tool_call`" in out
    assert "example_turns" in out


class NoHints(Calculator):
    def shout(self, text):
        """Upper-case a text."""
        return str(text).upper()


class ResetByColumns(Calculator):
    def reset(self, question, answer):
        self.answer = answer


def test_environment_mistakes_are_refused_in_one_line_naming_the_fix():
    from agentic_grpo.rollout_parts import load_environment

    with pytest.raises(PluginError, match=r"tool `NoHints.shout` needs type hints on every argument") as caught:
        load_environment(NoHints)
    assert caught.value.__cause__ is None and caught.value.__suppress_context__  # no chained traceback
    with pytest.raises(PluginError, match=r"reset\(self, question, answer\)` cannot be called as `reset\(row\)`.*"
                       r"def reset\(self, row: dict\)"):  # fmt: skip
        load_environment(ResetByColumns)
    load_environment(Calculator)  # the base's `reset(self, row)`: accepted


# --- rewards: columns checked at start-up, errors that leave the trajectories behind ---------


def test_reward_parameter_without_a_column_is_named_at_start_up():
    with pytest.raises(ValueError, match=r"reward `needs_difficulty` needs column\(s\) \['difficulty'\]"):
        check_reward_columns([needs_difficulty], ["question", "answer", "prompt"], "training data")
    check_reward_columns([needs_difficulty], ["question", "difficulty"], "training data")  # present: accepted


@pytest.mark.integration
def test_custom_reward_missing_a_column_stops_before_the_model_loads(tmp_path):
    recipe = write_recipe(tmp_path, rewards=[{"type": "tests.varied_rewards:needs_difficulty"}],
                          model_name_or_path="./no/such/model")  # fmt: skip
    result = train("--config", str(recipe), timeout=120)
    assert result.returncode == 2
    assert "reward `needs_difficulty` needs column(s) ['difficulty']" in result.stderr  # not the model error
    assert not (tmp_path / "out").exists()


@pytest.mark.integration
def test_reward_that_raises_stops_the_run_after_writing_the_steps_trajectories(tmp_path):
    recipe = write_recipe(tmp_path, rewards=[{"type": "tests.varied_rewards:raising"}], max_steps=1)
    result = train("--config", str(recipe), timeout=600)
    assert result.returncode != 0 and "the reward broke" in result.stderr
    assert "set `on_reward_error: none`" in result.stdout  # the way to go on is named
    records = [json.loads(line) for line in (tmp_path / "out" / "trajectories" / "step_000001.jsonl").open()]
    assert len(records) == 4 and all("RuntimeError: the reward broke" in r["error"] for r in records)
    assert all(r["segments"][1]["role"] == "model" for r in records)
    assert json.loads((tmp_path / "out" / "run.json").read_text())["status"] == "failed"


@pytest.mark.integration
def test_reward_returning_text_stops_with_one_line_naming_it(tmp_path):
    recipe = write_recipe(tmp_path, rewards=[{"type": "tests.varied_rewards:verdict_text"}], max_steps=1)
    result = train("--config", str(recipe), timeout=600)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr and "on_reward_error" not in result.stdout  # that advice cannot help
    assert result.stderr.strip().splitlines()[-1].startswith("error: reward `verdict_text` returned '1.0'")
    assert (tmp_path / "out" / "trajectories" / "step_000001.jsonl").is_file()  # the step is kept to debug it


def test_rewards_given_on_the_command_line_as_yaml(tmp_path):
    from agentic_grpo.train import prepare

    recipe = write_recipe(tmp_path)
    prepared = prepare(["--config", str(recipe), "--rewards", "[{type: agentic_grpo.rewards.rules:Correctness}]"])
    assert [f.__name__ for f in prepared.rewards] == ["correctness"]
    with pytest.raises(ValueError, match=r"must be a list of .*got \{'type'"):
        prepare(["--config", str(recipe), "--rewards", "{type: agentic_grpo.rewards.rules:Correctness}"])


def test_fields_without_a_recipe_apply_to_the_demo(capsys):
    from agentic_grpo.train import main

    assert main(["--max_steps", "2", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "running the offline CPU demo" in out and "Dry run of recipe cpu_demo" in out


@pytest.mark.integration
def test_on_reward_error_none_turns_a_failing_reward_into_no_reward(tmp_path):
    rewards = [{"type": "tests.varied_rewards:raising"}, {"type": "agentic_grpo.rewards.rules:FormatAdherence"}]
    recipe = write_recipe(tmp_path, rewards=rewards, max_steps=1, on_reward_error="none", logging_steps=10)
    result = train("--config", str(recipe), timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").open()]
    assert [m["step"] for m in metrics] == [1] and "loss" in metrics[0]  # the last step is logged, once
    assert "reward `raising` raised RuntimeError: the reward broke" in result.stderr
    records = [json.loads(line) for line in (tmp_path / "out" / "trajectories" / "step_000001.jsonl").open()]
    assert all(r["rewards"]["raising"] is None and r["rewards"]["format"] is not None for r in records)
    assert "reward `raising` raised in 1 batch(es), which got no `raising` reward" in result.stdout  # the summary


# --- output_dir: never two runs in one directory -------------------------------------------


def fake_run(folder: Path) -> None:
    (folder / "trajectories").mkdir(parents=True)
    (folder / "checkpoint-2").mkdir()
    (folder / "checkpoint-2" / "trainer_state.json").write_text(json.dumps({"global_step": 2}))
    (folder / "run.json").write_text(json.dumps({"status": "completed"}))
    (folder / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": 0.1}) + "\n" for s in (1, 2, 3)))
    (folder / "notes.txt").write_text("the user's own file")


@pytest.mark.integration
def test_rerun_into_a_finished_run_is_refused_and_leaves_it_untouched(tmp_path):
    out = tmp_path / "out"
    fake_run(out)
    before = (out / "metrics.jsonl").read_text()
    result = train("--config", "recipes/ci_tiny.yaml", "--output_dir", str(out), timeout=120)
    assert result.returncode == 2
    assert "already holds a run (status completed" in result.stderr
    assert "--resume_from_checkpoint last" in result.stderr and "--overwrite_output_dir true" in result.stderr
    assert (out / "metrics.jsonl").read_text() == before


def test_overwrite_deletes_the_run_files_and_its_model_and_nothing_else(tmp_path):
    from agentic_grpo.run_files import clear_previous_run, previous_run

    fake_run(tmp_path)
    for saved in ("adapter_model.safetensors", "adapter_config.json", "tokenizer.json", "training_args.bin"):
        (tmp_path / saved).write_text("the earlier run's model")
    clear_previous_run(tmp_path)
    assert previous_run(tmp_path) is None
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


@pytest.mark.integration
def test_overwrite_deletes_nothing_when_another_check_fails(tmp_path):
    out = tmp_path / "out"
    fake_run(out)
    result = train("--config", "recipes/ci_tiny.yaml", "--output_dir", str(out), "--overwrite_output_dir", "true",
                   "--model_name_or_path", "./no/such/model", timeout=120)  # fmt: skip
    assert result.returncode == 2 and "no/such/model" in result.stderr
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint-2", "metrics.jsonl", "notes.txt", "run.json",
                                                     "trajectories"]  # fmt: skip


def test_resume_drops_metrics_logged_after_the_checkpoint(tmp_path):
    from agentic_grpo.run_files import trim_metrics_after

    fake_run(tmp_path)
    assert trim_metrics_after(tmp_path, 2) == 1
    assert [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").open()] == [1, 2]


# --- eval and show ------------------------------------------------------------------------


@pytest.mark.integration
def test_eval_reports_each_reward_and_show_reads_its_trajectories(tmp_path):
    report = tmp_path / "eval.json"
    result = run_cli("eval", "--model", "tiny-random-llama", "--recipe", "ci_tiny", "--limit", "2",
                     "--output", str(report))  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads(report.read_text())
    assert "rewards/correctness/mean" in metrics and "rewards/format/mean" in metrics
    shown = run_cli("show", str(report.with_suffix(".trajectories.jsonl")), timeout=120, COLUMNS="60")
    assert shown.returncode == 0, shown.stderr
    first_question = json.loads(report.with_suffix(".trajectories.jsonl").open().readline())["row"]["question"]
    assert first_question.split()[0] in shown.stdout and "gold='" in shown.stdout
    assert "correctness=" in shown.stdout and "format=" in shown.stdout  # not cut at the panel's width


def test_show_refuses_a_file_that_is_not_trajectories(tmp_path, capsys):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n')
    assert cli_main(["show", str(path)]) == 2
    assert "is not a trajectory file" in capsys.readouterr().err


@pytest.mark.integration
def test_eval_imports_the_users_plug_ins_from_the_working_directory(tmp_path):
    (tmp_path / "usertrial.py").write_text(
        "from agentic_grpo import ToolEnvironment\n\n\nclass Echo(ToolEnvironment):\n"
        '    def echo(self, text: str) -> str:\n        """Echo.\n\n        Args:\n            text: The text.\n'
        '        """\n        return text\n\n\ndef exact(prompts, completions, trajectory, answer, **_):\n'
        "    return [float(t.final_answer == a) for t, a in zip(trajectory, answer)]\n"
    )
    recipe = write_recipe(tmp_path, environment="usertrial:Echo", rewards=[{"type": "usertrial:exact"}],
                          correctness_reward="exact")  # fmt: skip
    result = run_cli("eval", "--model", "tiny-random-llama", "--recipe", str(recipe), "--limit", "2",
                     "--output", str(tmp_path / "eval.json"), cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "rewards/exact/mean" in json.loads((tmp_path / "eval.json").read_text())


@pytest.mark.integration
def test_eval_names_a_missing_reward_column_before_the_model_loads(tmp_path):
    recipe = write_recipe(tmp_path, rewards=[{"type": "tests.varied_rewards:needs_difficulty"}])
    result = run_cli("eval", "--model", "./no/such/model", "--recipe", str(recipe), "--limit", "2", cwd=tmp_path)
    assert result.returncode == 2
    assert "reward `needs_difficulty` needs column(s) ['difficulty']" in result.stderr  # not the model error


@pytest.mark.integration
def test_eval_with_a_raising_reward_keeps_the_trajectories(tmp_path):
    recipe = write_recipe(tmp_path, rewards=[{"type": "tests.varied_rewards:raising"}], correctness_reward="raising")
    report = tmp_path / "eval.json"
    result = run_cli("eval", "--model", "tiny-random-llama", "--recipe", str(recipe), "--limit", "2",
                     "--output", str(report), cwd=tmp_path)  # fmt: skip
    assert result.returncode == 1 and "the reward broke" in result.stderr
    records = [json.loads(line) for line in report.with_suffix(".trajectories.jsonl").open()]
    assert len(records) == 2 and all(r["segments"][1]["role"] == "model" for r in records)
    assert "the reward broke" in json.loads(report.read_text())["error"]


@pytest.mark.integration
def test_misspelled_environment_option_is_named_with_a_suggestion(tmp_path):
    recipe = write_recipe(tmp_path, environment="agentic_grpo.tools.stepwise:StepwiseCalculator",
                          environment_kwargs={"value_rewrd": 0.5})  # fmt: skip
    result = train("--config", str(recipe), timeout=120)
    assert result.returncode == 2
    assert "option `value_rewrd` is not known; did you mean `value_reward`?" in result.stderr


@pytest.mark.integration
@pytest.mark.parametrize("accelerate_config", ["multi_gpu", "deepspeed_zero3"])
def test_a_gpu_accelerate_config_on_a_machine_without_one_is_refused_in_one_line(tmp_path, accelerate_config):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the config would launch")
    out = tmp_path / "never-written"
    result = train("--accelerate_config", accelerate_config, "--config", "ci_tiny", "--output_dir", str(out),
                   timeout=120)  # fmt: skip
    assert result.returncode == 2, result.stderr[-2000:]
    assert f"accelerate config `{accelerate_config}` runs on GPUs" in result.stderr
    assert "use `--accelerate_config cpu_2proc`" in result.stderr and "Launching" not in result.stdout
    assert "Traceback" not in result.stderr and not out.exists()


@pytest.mark.integration
def test_a_gpu_recipe_on_a_machine_without_one_names_bf16_and_its_fix(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the recipe's bf16 is what it runs")
    out = tmp_path / "never-written"
    result = train("--config", "artist_math_qwen7b", "--output_dir", str(out), timeout=120)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "sets `bf16: true` (mixed precision on a GPU) and this machine has no CUDA GPU" in result.stderr
    assert "set `--bf16 false`" in result.stderr and "use_cpu" not in result.stderr and not out.exists()


@pytest.mark.integration
def test_a_bad_sandbox_value_is_one_line_naming_the_field_and_writes_nothing(tmp_path):
    out = tmp_path / "never-written"
    recipe = write_recipe(tmp_path, environment="agentic_grpo.tools.python:PythonInterpreter")
    result = train("--config", str(recipe), "--sandbox", "{memory_mb: lots}", "--output_dir", str(out), timeout=120)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "sandbox `memory_mb` must be a whole number, got 'lots'" in result.stderr
    assert "Traceback" not in result.stderr and not out.exists()


@pytest.mark.integration
def test_misspelled_dataset_option_is_named_with_a_suggestion(tmp_path):
    dataset = {"generator": "agentic_grpo.tasks:multiplication_word_problems", "num_trian": 8, "num_test": 2}
    result = train("--config", str(write_recipe(tmp_path, dataset=dataset)), timeout=120)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "option `num_trian` is not known; did you mean `num_train`?" in result.stderr
    files = {"path": "json", "data_file": str(tmp_path / "rows.jsonl")}
    result = train("--config", str(write_recipe(tmp_path, dataset=files)), timeout=120)
    assert result.returncode == 2 and "did you mean `data_files`?" in result.stderr


def test_an_empty_or_malformed_data_file_is_named_with_its_line(tmp_path):
    from agentic_grpo.data import load_task_data

    empty, broken = tmp_path / "empty.jsonl", tmp_path / "broken.jsonl"
    empty.write_text("\n")
    broken.write_text('{"question": "a", "answer": "1"}\n\n{"question": "b", "answer": 2,}\n')
    with pytest.raises(ValueError, match=r"data file `.*empty.jsonl` is empty: it needs one JSON object per line"):
        load_task_data({"path": "json", "data_files": str(empty)})
    with pytest.raises(ValueError, match=r"`.*broken.jsonl` line 3 is not JSON \(.*column 31\)"):
        load_task_data({"path": "json", "data_files": {"train": [str(broken)]}})


@pytest.mark.parametrize(
    ("content", "message"), [("", "is empty"), ('{"question": "a"}\n[1, 2]\n', "line 2 is a JSON")]
)
def test_eval_names_what_is_wrong_with_its_data_file_in_one_line(tmp_path, capsys, content, message):
    data = tmp_path / "rows.jsonl"
    data.write_text(content)
    code = cli_main(["eval", "--model", "tiny-random-llama", "--recipe", "ci_tiny", "--data", str(data)])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err


def test_an_unknown_accelerate_config_is_refused_naming_the_shipped_ones(capsys):
    assert cli_main(["train", "--accelerate_config", "zero9", "--config", "ci_tiny"]) == 2
    err = capsys.readouterr().err
    assert "accelerate_config `zero9` is neither a file" in err and "cpu_2proc, deepspeed_zero2" in err


def test_a_run_capped_far_below_its_recipe_skips_the_held_out_evaluation_and_says_so(tmp_path, capsys):
    from agentic_grpo.train import prepare

    base = ["--config", "cpu_demo", "--model_name_or_path", "tiny-random-llama", "--overwrite_output_dir", "true"]
    short = prepare([*base, "--max_steps", "2", "--output_dir", str(tmp_path / "a")])
    assert not short.config.eval_before_after
    assert "--max_steps 2 caps the recipe's 20 steps" in capsys.readouterr().out
    asked = prepare([*base, "--max_steps", "2", "--eval_before_after", "true", "--output_dir", str(tmp_path / "b")])
    assert asked.config.eval_before_after  # the command line asked for it
    whole = prepare([*base, "--max_steps", "12", "--output_dir", str(tmp_path / "c")])
    assert whole.config.eval_before_after  # not a try-out


class _Hub(http.server.BaseHTTPRequestHandler):
    """A hub that knows no model: what huggingface.co answers a mistyped id."""

    def do_HEAD(self):  # noqa: N802 - http.server's name
        self.send_response(404)
        self.send_header("X-Error-Code", "RepoNotFound")
        self.end_headers()

    do_GET = do_HEAD  # noqa: N815

    def log_message(self, *args):
        pass


@pytest.fixture
def hub_without_models():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_a_mistyped_hub_id_is_named_in_one_line_whether_the_hub_answers_or_not(tmp_path, hub_without_models):
    recipe = write_recipe(tmp_path, model_name_or_path="HuggingFaceTB/SmolLM2-135M-Instruc")
    cases = {
        "the hub has no such model": {"HF_ENDPOINT": hub_without_models},
        "the hub did not answer (ConnectError)": {"HF_ENDPOINT": "http://127.0.0.1:9"},  # nothing listens on port 9
        "HF_HUB_OFFLINE is set": {"HF_HUB_OFFLINE": "1"},
    }
    for reason, env in cases.items():
        result = run_cli("train", "--config", str(recipe), timeout=300, **{"HF_HUB_OFFLINE": "0", **env})
        assert result.returncode != 0
        assert "SmolLM2-135M-Instruc` is neither a local directory nor in the Hugging Face cache" in result.stderr
        assert reason in result.stderr and "local directory with config.json" in result.stderr
        assert "Traceback" not in result.stderr and "Retrying" not in result.stderr


def test_eval_on_the_recipes_training_rows_names_split_train(tmp_path, capsys):
    from agentic_grpo.data import load_task_data
    from agentic_grpo.run_parts import build_recipe

    recipe = build_recipe(["--config", "recipes/ci_tiny.yaml", "--output_dir", str(tmp_path / "out")], load_data=False)
    train_rows, _ = load_task_data(recipe.recipe.dataset)
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in list(train_rows)[:3]))
    code = cli_main(["eval", "--model", "tiny-random-llama", "--recipe", "ci_tiny", "--data", str(data)])
    err = capsys.readouterr().err
    assert code == 2 and "--split train" in err and "Traceback" not in err


def test_the_warnings_every_start_printed_are_silenced():
    """TRL warns five times at import that the pinned, tested vLLM is newer than it knows; with vLLM installed (as
    CI installs it) every start showed them."""
    probe = "import trl.generation.vllm_generation, trl.generation.vllm_client"
    quiet = run_python("-W", "default", "-c", f"from agentic_grpo.train import quiet_known_warnings; "
                       f"quiet_known_warnings(); {probe}", timeout=300)  # fmt: skip
    assert quiet.returncode == 0, quiet.stderr[-2000:]
    assert "TRL currently supports vLLM versions" not in quiet.stderr
    loud = run_python("-W", "default", "-c", probe, timeout=300)
    if importlib.util.find_spec("vllm") is not None:  # the control: without the filter, they are there
        assert "TRL currently supports vLLM versions" in loud.stderr
