"""What a user sees of the configuration: few fields of our own, in sections, `--config` first in `--help`,
experiments out of it, and evaluation that reads correctness from the reward it names."""

from __future__ import annotations

from dataclasses import fields

import pytest
from trl import GRPOConfig

from agentic_grpo.config import SECTIONS, AgenticGRPOConfig
from agentic_grpo.evaluate import correctness_reward_name, evaluate
from agentic_grpo.run_parts import build_recipe

EXPERIMENTS = ("spread_first_action", "choice_gradient_weight", "canonical_actions", "action_temperature")


def test_the_config_shows_at_most_25_fields_of_its_own_each_in_a_section():
    trl = {f.name for f in fields(GRPOConfig)}
    own = [f.name for f in fields(AgenticGRPOConfig) if f.name not in trl]
    assert len(set(own) - {"experimental"}) <= 25, own  # `experimental` is one key, kept out of `--help`
    sectioned = [name for names in SECTIONS.values() for name in names]
    assert sorted(set(own) - {"experimental"}) == sorted(n for n in sectioned if n not in trl)
    assert len(sectioned) == len(set(sectioned))  # each field in one section


def test_help_starts_with_a_description_lists_config_first_and_shows_no_experiment(capsys):
    from agentic_grpo.train import main

    assert main(["--help"], prog="agentic-grpo train") == 0
    text = capsys.readouterr().out
    assert text.startswith("usage: agentic-grpo train [--config RECIPE]")
    assert "Train an LLM agent with GRPO" in text.split("\n\n")[1]
    positions = [text.index(f"\n{title}:\n") for title in ["Recipe", "Data and rewards", *SECTIONS]]
    assert positions == sorted(positions)  # the recipe, then data, then our sections in order
    assert text.index("--config RECIPE") < text.index("--dataset") < text.index("--environment")
    assert positions[-1] < text.index("TRL's GRPOConfig and ModelConfig")  # TRL's fields come last
    for name in (*EXPERIMENTS, "--experimental"):
        assert name not in text


def _named(name: str, value: float):
    def reward(completions, **_):
        return [value] * len(completions)

    reward.__name__ = name
    return reward


def test_the_correctness_reward_is_named_not_the_first_one():
    first, correctness = _named("format", 1.0), _named("correctness", 0.0)
    assert correctness_reward_name([first, correctness]) == "correctness"
    assert correctness_reward_name([first, correctness], "format") == "format"
    with pytest.raises(ValueError, match=r"no reward is named `correctness` among the recipe's rewards \['format'\]"):
        correctness_reward_name([first])
    with pytest.raises(ValueError, match="`correctness_reward` `exact` is not among"):
        correctness_reward_name([first, correctness], "exact")


def test_eval_counts_what_the_correctness_reward_pays_and_names_metrics_as_training_does(tiny_model_dir, tmp_path):
    """A format reward that pays everything comes first: accuracy must follow the correctness reward (0 here)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    built = build_recipe(["--config", "recipes/ci_tiny.yaml", "--output_dir", str(tmp_path)])
    rewards = [_named("format", 1.0), _named("correctness", 0.0)]
    rows = list(built.test)[:2]
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    metrics, records = evaluate(
        model, AutoTokenizer.from_pretrained(tiny_model_dir), built.rollout_parts, rewards, rows, progress=False
    )
    assert metrics["accuracy"] == 0.0 and not any(r["correct"] for r in records)
    assert metrics["correctness_reward"] == "correctness"
    training_names = {"tools/call_rate", "tools/calls_per_trajectory", "tools/error_rate", "trajectories/turns_mean",
                      "trajectories/invalid_rate", "tokens/trainable_ratio", "time/generation", "time/tools"}  # fmt: skip
    assert training_names <= set(metrics)
    assert not {"tool_call_rate", "turns_mean", "invalid_rate"} & set(metrics)  # no second vocabulary
