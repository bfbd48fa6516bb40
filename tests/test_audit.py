"""`agentic-grpo audit-rewards` on every shipped recipe (CI), and on a reward with a known hole.

Recipes whose data is not shipped (the 7B recipes read data/*.jsonl) are audited on
tests/data/audit_rows.jsonl; their 7B tokenizer is replaced by a stand-in when it is not
on this machine (rule rewards read text). A recipe's LLM judge is audited against the
real llama.cpp server the judge tests start.
"""

# Fixtures come from tests/judge_fixtures.py (conftest.py is shared): importing them reads as a redefinition.
# ruff: noqa: F401, F811

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from agentic_grpo.audit.run import audit_recipe
from agentic_grpo.cli import main as cli
from agentic_grpo.resources import find_shipped, shipped_names
from tests.judge_fixtures import llama_server, llama_server_process

ROWS = str(Path(__file__).parent / "data" / "audit_rows.jsonl")


def recipe_settings(name: str) -> dict:
    return yaml.safe_load(find_shipped(name, "recipes", ".yaml").read_text())


def is_judged(name: str) -> bool:
    """The recipe has an LLM judge, audited against the llama.cpp server (a process of its own)."""
    return any("endpoint" in spec for spec in recipe_settings(name)["rewards"])


RECIPES = [
    pytest.param(name, marks=pytest.mark.integration) if is_judged(name) else name
    for name in shipped_names("recipes", ".yaml")
]


@pytest.mark.parametrize("name", RECIPES)
def test_every_shipped_recipe_passes_the_audit(name, request):
    settings = recipe_settings(name)
    data_files = (
        (settings.get("dataset") or {}).get("data_files") if isinstance(settings.get("dataset"), dict) else None
    )
    data = ROWS if data_files and not Path(data_files).exists() else None
    judged = is_judged(name)
    endpoint = request.getfixturevalue("llama_server") if judged else None
    limit = 1 if judged else 2  # a 135M judge reads 13 probes per row in ~30 s on 2 cores
    report = audit_recipe(name, data=data, limit=limit, judge_endpoint=endpoint, judge_model="judge", progress=False)
    assert report.passed, report.failures
    assert not report.skipped
    assert report.totals["honest"] > max(t for p, t in report.totals.items() if p != "honest")
    if judged:
        [judge] = [n for n in report.rewards if n == "judge"]
        assert report.payouts["judge_reply_mangled"][judge] is None  # a mangled reply is no score
        assert "steer_judge_instruction" in report.payouts


def test_the_audit_catches_math_verify_paying_for_the_echoed_expression(tmp_path):
    recipe = recipe_settings("ci_tiny")
    recipe["rewards"] = [{"type": "tests.legacy_rewards:MathVerifyCorrectness", "weight": 1.0}]
    recipe["max_tokens_per_turn"] = 96  # room for every probe's text with the tiny tokenizer
    path = tmp_path / "legacy.yaml"
    path.write_text(yaml.safe_dump(recipe))
    output = tmp_path / "audit.json"
    code = cli(["audit-rewards", "--recipe", str(path), "--data", ROWS, "--output", str(output)])
    report = json.loads(output.read_text())
    assert code == 1 and not report["passed"]
    assert report["payouts"]["echo_expression"]["correctness"] == 1.0
    assert any(f.startswith("probe `echo_expression`") for f in report["failures"])
    assert not any("several_answers" in f for f in report["failures"])  # only the hole it has


def test_a_judge_whose_endpoint_does_not_answer_is_reported_skipped_never_silently(capsys):
    report = audit_recipe("function_calling_qwen7b", data=ROWS, limit=1, progress=False)
    assert "judge" in report.skipped and "does not answer" in report.skipped["judge"]
    assert "--judge-endpoint" in report.skipped["judge"]
    assert report.passed and "judge" not in report.rewards


def test_a_recipe_without_loadable_data_names_the_fix(capsys):
    assert cli(["audit-rewards", "--recipe", "artist_math_qwen7b"]) == 2
    assert "Pass --data rows.jsonl" in capsys.readouterr().err


def test_probes_the_recipe_would_cut_are_audited_with_room_and_named():
    # ci_tiny allows 24 tokens per turn: before, every longer probe was cut and earned nothing, unexamined.
    report = audit_recipe("ci_tiny", data=ROWS, limit=1, progress=False)
    assert report.passed, report.failures
    cut = [n for n in report.notes if "not fit this recipe's" in n]
    assert len(cut) == len({n.split("fit this recipe's ")[1] for n in cut})  # one note per budget, not per probe
    assert any("buried_in_long_text" in n and "max_tokens_per_turn=24" in n for n in cut), cut
    assert len(report.examples["buried_in_long_text"]) == 400  # played whole (the example keeps 400 characters)


def ci_tiny_with(second_reward: str, path: Path) -> Path:
    """ci_tiny's recipe with Correctness and `second_reward` (weight 0.1), written to `path`."""
    recipe = recipe_settings("ci_tiny")
    recipe["rewards"] = [{"type": "agentic_grpo.rewards.rules:Correctness", "weight": 1.0},
                         {"type": second_reward, "weight": 0.1}]  # fmt: skip
    path.write_text(yaml.safe_dump(recipe))
    return path


def test_a_reward_preferring_a_gaming_probe_is_reported_and_strict_fails_on_it(tmp_path, capsys):
    path = ci_tiny_with("tests.legacy_rewards:longer_is_better", tmp_path / "prefers.yaml")
    output = tmp_path / "audit.json"
    assert cli(["audit-rewards", "--recipe", str(path), "--data", ROWS, "--limit", "1", "--output", str(output)]) == 0
    report = json.loads(output.read_text())
    assert report["passed"] and any("reward `longer_is_better` pays probe `buried_in_long_text`" in p
                                    for p in report["preferences"])  # fmt: skip
    assert cli(["audit-rewards", "--recipe", str(path), "--data", ROWS, "--limit", "1", "--output", str(output),
                "--strict"]) == 1  # fmt: skip
    assert not json.loads(output.read_text())["passed"]


def test_a_reward_that_never_scores_is_skipped_and_one_that_raises_is_named(tmp_path, capsys):
    path = ci_tiny_with("tests.varied_rewards:never_scores", tmp_path / "silent.yaml")
    assert cli(["audit-rewards", "--recipe", str(path), "--data", ROWS, "--limit", "1"]) == 0
    out = capsys.readouterr().out
    assert "skipped reward `never_scores`: gave None on all" in out and "were not audited" in out
    ci_tiny_with("tests.varied_rewards:raising", path)
    assert cli(["audit-rewards", "--recipe", str(path), "--data", ROWS, "--limit", "1"]) == 2
    assert "error: a reward raised while scoring the probes of" in capsys.readouterr().err
