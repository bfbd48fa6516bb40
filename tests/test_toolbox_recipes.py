"""The toolbox and routing recipes: they build, and one real GRPO step of each runs on a tiny model, logging
the selection and routing metrics, drawing them, and `agentic-grpo eval` reports them."""

from __future__ import annotations

import json

import pytest

from agentic_grpo.run_parts import build_recipe
from tests.helpers import train

TINY = ["--model_name_or_path", "tiny-random-llama", "--max_steps", "1", "--num_generations", "2",
        "--per_device_train_batch_size", "2", "--gradient_accumulation_steps", "1", "--max_tokens_per_turn", "16",
        "--max_completion_length", "64", "--eval_before_after", "false", "--save_strategy", "no",
        "--lora_target_modules", "q_proj", "v_proj"]  # fmt: skip
# The toolbox's experiments without the choice gradient: the tiny model's 600-token BPE begins five of the eight
# tool names with the same token (" "), and the term needs one token per tool (tests/test_choice_gradient.py runs
# it on two tools). A command-line `--experimental` replaces the recipe's whole mapping.
TOOLBOX_WITHOUT_CHOICE_GRADIENT = ["--experimental", "{canonical_actions: true, action_temperature: 2.0}"]


def test_the_toolbox_recipe_builds_eight_tools_and_rows_naming_theirs(tmp_path):
    built = build_recipe(["--config", "cpu_toolbox", "--output_dir", str(tmp_path)])
    assert len(built.rollout_parts.environment.tools()) == 8 and built.rollout_parts.sandbox is not None
    assert {tuple(row["expected_tools"]) for row in built.test} == {
        ("calculator",),
        ("convert_units",),
        ("date_calculator",),
        ("lookup",),
        ("string_tool",),
        ("python",),
    }
    assert not {r["question"] for r in built.test} & {r["question"] for r in built.train}


def test_the_routing_recipe_builds_three_specialists_the_rows_name(tmp_path):
    built = build_recipe(["--config", "cpu_routing", "--output_dir", str(tmp_path)])
    agents = [agent.name for agent in built.rollout_parts.agents]
    assert agents == ["ask_arithmetic", "ask_units", "ask_dates"]
    assert built.rollout_parts.environment.tools() == {}  # the orchestrator's only tools are its specialists
    assert all(agent.adapter == "__base__" for agent in built.rollout_parts.agents)  # the base, frozen
    assert {row["expected_tools"][0] for row in built.test} == set(agents)
    prompt = built.rollout_parts.trajectory_format.system_prompt()
    assert all(f"- {name}: A specialist" in prompt for name in agents)


@pytest.mark.parametrize(
    ("recipe", "metrics"),
    [
        ("cpu_toolbox", ["tools/selection_accuracy", "tools/wrong_tool_rate", "tools/no_tool_rate",
                         "tools/calls/convert_units", "tools/calls/python", "tools/calls/_unknown"]),
        ("cpu_routing", ["routing/accuracy", "tools/selection_accuracy", "tools/calls/ask_units",
                         "subagents/tokens_per_trajectory"]),
    ],
)  # fmt: skip
@pytest.mark.integration
def test_one_training_step_logs_and_draws_the_selection_metrics(tmp_path, recipe, metrics):
    out = tmp_path / recipe
    extra = TOOLBOX_WITHOUT_CHOICE_GRADIENT if recipe == "cpu_toolbox" else []
    result = train("--config", recipe, "--output_dir", str(out), *TINY, *extra)
    assert result.returncode == 0, result.stderr[-3000:]
    logged = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()][0]  # the step's line
    for name in metrics:
        assert 0.0 <= logged[name] <= (1.0 if "/calls/" not in name and "tokens" not in name else 1e6), name
    rates = ("tools/selection_accuracy", "tools/wrong_tool_rate", "tools/no_tool_rate")
    assert sum(logged[name] for name in rates) == pytest.approx(1.0)
    assert (out / "plots" / "tool_selection.png").is_file() and (out / "plots" / "tool_calls.png").is_file()


@pytest.mark.integration
def test_specialists_on_the_base_need_a_lora_policy(tmp_path):
    result = train("--config", "cpu_routing", "--output_dir", str(tmp_path / "out"), *TINY, "--use_peft", "false")
    assert result.returncode != 0
    assert "run on the policy's base model (`adapter: __base__`), which needs a LoRA policy" in result.stderr


def test_eval_reports_selection_metrics(tmp_path, tiny_model_dir, capsys):
    from agentic_grpo.cli import main as cli_main

    output = tmp_path / "eval.json"
    code = cli_main(["eval", "--model", tiny_model_dir, "--recipe", "cpu_toolbox", "--limit", "2",
                     "--output", str(output)])  # fmt: skip
    assert code == 0
    report = json.loads(output.read_text())
    assert report["questions"] == 2
    assert report["tools/selection_accuracy"] + report["tools/wrong_tool_rate"] + report["tools/no_tool_rate"] == 1
    assert "tools/calls/lookup" in report
    kinds = [key.split("/")[1] for key in report if key.startswith("kinds/") and key.endswith("/trajectories")]
    assert sum(report[f"kinds/{kind}/trajectories"] for kind in kinds) == 2  # each question counted under its kind
    assert 0.0 <= report["answer_lost_rate"] <= 1.0
