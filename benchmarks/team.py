"""A router over trained specialists, against the untrained router, an oracle and a generalist; prints JSON.

The specialists are trained and measured first, each on its own kind, by `bench learning` (docs/team.md):

    agentic-grpo bench learning --recipe team_units --seeds 0 --output-dir outputs/team      # and the others

Then, per seed, over that seed's specialists (`<--specialists-prefix>-<recipe>-seedN`, put where the router's
sub-agent `adapter_path` named the specialist recipe's `output_dir`):
- **untrained**: the router recipe with the base model as the orchestrator;
- **oracle**: each of the router's held-out questions given whole, as the router's example gives it, to the
  specialist its row names (`expected_tools`), that specialist's final answer scored: the ceiling of routing;
- **trained**: the router trained by its recipe (the shipped one makes one call and is paid for the answer alone);
- **two_calls**: the router allowed a second turn (`max_turns: 2`): after a wrong first call it may ask again, so
  a wrong call costs nothing when the second one is right;
- **untrained_two_calls**: the `two_calls` recipe with the base model as the orchestrator, its baseline;
- **tool_choice**: the `two_calls` router also paid for asking the specialist its row names (`ToolChoice`, weight
  0.5): a reward that reads the rows' labels;
- **generalist**: one adapter trained by `--generalist` (the router's question mixture, every specialist's
  tool) for as many sampled trajectories as the specialists and the router together;
- **cotrained**: the router trained together with the specialist `--cotrain` names, which starts untrained (a
  new adapter, `train: true`), the other specialists frozen as in `trained`, for as many sampled trajectories as
  that specialist's training and the router's together: against `trained`, where the two learn one after the
  other.

Every arm is scored strictly on the router's held-out questions (`benchmarks/learning.py`: the final answer is
the reference itself). Each evaluation's trajectories are kept beside its result. Finished arms are kept
(`<prefix>-seedN-<arm>.json`) and reused for the same recipes, specialists' weights and code, so a long comparison
can be run an arm at a time (`--arms`).

    agentic-grpo bench team --seeds 0 1 2                          # every arm, three seeds
    agentic-grpo bench team --seeds 0 --arms untrained oracle       # two of the arms that train nothing
    agentic-grpo bench team --seeds 0 --arms trained cotrained      # one after the other, against together
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from agentic_grpo.benchmarks._stored import adapter_digest, cached
from agentic_grpo.benchmarks.learning import held_out, pinned_training_rows, strictly_correct, train
from agentic_grpo.subagents.spec import SubAgentConfig

ARMS = ("untrained", "oracle", "trained", "untrained_two_calls", "two_calls", "tool_choice", "generalist", "cotrained")
TOOL_CHOICE = "agentic_grpo.rewards.selection:ToolChoice"
SPECIALISTS = ("team_arithmetic", "team_units", "team_dates")


def trajectories_per_run(recipe: dict[str, Any], where: str) -> int:
    """Trajectories a one-process run of `recipe` samples: steps x completions per optimizer step."""
    missing = [
        k for k in ("max_steps", "per_device_train_batch_size", "gradient_accumulation_steps") if k not in recipe
    ]
    if missing:
        raise ValueError(f"{where}: the benchmark counts sampled trajectories from {missing}: set them in the recipe")
    return recipe["max_steps"] * recipe["per_device_train_batch_size"] * recipe["gradient_accumulation_steps"]


def steps_for(trajectories: int, recipe: dict[str, Any], where: str) -> int:
    """Optimizer steps a one-process run of `recipe` takes to sample at least `trajectories`."""
    return math.ceil(trajectories / trajectories_per_run({**recipe, "max_steps": 1}, where))


SUBAGENT_SETTINGS = ("environment", "format", "format_kwargs", "max_turns", "max_tokens_per_turn",
                     "max_completion_length", "max_tool_output_tokens")  # fmt: skip
SUBAGENT_DEFAULTS = {f.name: f.default for f in dataclasses.fields(SubAgentConfig)}


def settings_differ(specialist: dict[str, Any], entry: dict[str, Any], router: dict[str, Any]) -> list[str]:
    """The settings in which a specialist's recipe trains it otherwise than the router's sub-agent `entry` runs it:
    its adapter would answer other prompts than it learned. An unset field of the entry is `SubAgentConfig`'s
    default, an unset budget the router's own, as the sub-agent is built."""
    differ = []
    for name in SUBAGENT_SETTINGS:
        runs = entry.get(name, SUBAGENT_DEFAULTS[name])
        if runs is None and name.startswith("max_"):
            runs = router.get(name)
        trains = specialist.get(name, SUBAGENT_DEFAULTS[name])
        if name == "format_kwargs":  # unset and empty are the same: no arguments
            runs, trains = runs or {}, trains or {}
        if runs != trains:
            differ.append(name)
    return differ


def router_over(router: dict[str, Any], specialists: dict[str, str]) -> dict[str, Any]:
    """The router recipe with each sub-agent whose `adapter_path` a specialist trains pointed at `specialists`
    (shipped output_dir -> this seed's run directory); raises ValueError for a specialist no sub-agent loads."""
    entries = [dict(entry) for entry in router.get("subagents") or []]
    for shipped, trained in specialists.items():
        found = [e for e in entries if e.get("adapter_path") == shipped]
        if not found:
            paths = [e.get("adapter_path") for e in entries]
            raise ValueError(f"no router sub-agent loads `{shipped}` (the specialist's output_dir); theirs: {paths}")
        for entry in found:
            entry["adapter_path"] = trained
    return {**router, "subagents": entries}


def two_calls_router(router: dict[str, Any]) -> dict[str, Any]:
    """The router recipe with a second turn: a router whose first call got a wrong answer back may ask again."""
    return {**router, "max_turns": 2}


def tool_choice_router(router: dict[str, Any]) -> dict[str, Any]:
    """`two_calls_router`, also paid (weight 0.5) for asking the specialist the row's label names (`ToolChoice`)."""
    rewards = [r for r in router.get("rewards") or [] if r.get("type") != TOOL_CHOICE]
    return {**two_calls_router(router), "rewards": [*rewards, {"type": TOOL_CHOICE, "weight": 0.5}]}


def cotrained_router(router: dict[str, Any], specialist: str, steps: int, learning_rate: float) -> dict[str, Any]:
    """The router recipe with the sub-agent that loads `specialist` (its shipped output_dir) turned into a new
    adapter trained with the router (`train: true`, at the specialist recipe's `learning_rate`; the experiment
    `cotrain_subagents` on), for `steps`."""
    entries = [dict(entry) for entry in router.get("subagents") or []]
    found = [e for e in entries if e.get("adapter_path") == specialist]
    if len(found) != 1:
        raise ValueError(f"co-training needs one router sub-agent that loads `{specialist}`; {len(found)} do")
    found[0].pop("adapter_path")
    found[0].pop("temperature", None)  # a trained sub-agent samples at the run's temperature, as its loss reads it
    found[0].update(train=True, learning_rate=learning_rate)
    experimental = {**(router.get("experimental") or {}), "cotrain_subagents": True}
    return {**router, "subagents": entries, "max_steps": steps, "experimental": experimental}


def oracle(router_recipe: str, questions: int, report: Path) -> dict[str, Any]:
    """Each held-out question of the router's, given to the specialist its row names, that specialist's answer
    scored strictly. Each specialist runs as the router's sub-agent does (its own prompt, tools, budgets and
    adapter, greedy), on the whole question as its task."""
    from agentic_grpo.evaluate import correctness_reward_name, evaluate, load_policy, write_report
    from agentic_grpo.run_parts import build_recipe

    built = build_recipe(["--config", router_recipe, "--output_dir", str(Path(tempfile.gettempdir()) / "team-oracle")])
    rows = list(built.test)[:questions]
    name = correctness_reward_name(built.rewards, built.config.correctness_reward)
    correctness = [r for r in built.rewards if getattr(r, "__name__", None) == name]
    records: list[dict[str, Any]] = []
    per_specialist = {}
    for agent in built.rollout_parts.agents:
        mine = [row for row in rows if agent.name in row["expected_tools"]]
        if not mine:
            continue
        adapter_path = getattr(agent.source, "adapter_path", None)
        if adapter_path is None:  # a `model:` or `endpoint:` sub-agent, or a new adapter: nothing saved to load
            raise SystemExit(f"error: the oracle runs each specialist from its saved adapter; `{agent.name}` "
                             "has no `adapter_path`")  # fmt: skip
        model, tokenizer = load_policy(adapter_path, merge=False)
        _, answered = evaluate(model, tokenizer, agent.parts, correctness, mine, progress=False, correctness=name)
        right = [strictly_correct(r["final_answer"], r["row"]["answer"]) for r in answered]
        per_specialist[agent.name] = {"questions": len(mine), "strict_accuracy": sum(right) / len(mine)}
        records += [{**r, "specialist": agent.name, "strict": ok} for r, ok in zip(answered, right, strict=True)]
    unrouted = len(rows) - len(records)  # rows that name no specialist of the router: the oracle cannot answer
    write_report(report, {"per_specialist": per_specialist, "unrouted": unrouted}, records)
    return {
        "strict_accuracy": sum(r["strict"] for r in records) / max(1, len(rows)),
        "per_specialist": per_specialist,
        "unrouted": unrouted,
    }


def trained_run(recipe: str, seed: int, output_dir: str, max_steps: int | None, questions: int) -> dict[str, Any]:
    """Train one run, then its strict held-out accuracy on `recipe`'s test split (trajectories kept beside it)."""
    minutes, peak_mb = train(recipe, seed, output_dir, max_steps)
    after = held_out(output_dir, recipe, questions, 1, Path(output_dir) / "held_out.json")
    return {**after, "train_minutes": round(minutes, 1), "train_peak_memory_mb": peak_mb, "output_dir": output_dir}


def trained_with(stem: str) -> dict[str, Any]:
    """The recipe a specialist's run `<stem>` was trained with, as `bench learning` stored it beside the run
    (`<stem>.json`); stops if there is none, or if it trained for other steps than its recipe says."""
    stored = Path(f"{stem}.json")
    if not stored.exists():
        raise SystemExit(f"error: {stored} does not say what {stem} was trained with: train the specialist with "
                         "`agentic-grpo bench learning`, which writes it")  # fmt: skip
    key = json.loads(stored.read_text())["key"]
    if key.get("max_steps") is not None:
        raise SystemExit(f"error: {stem} was trained for --max-steps {key['max_steps']}, not its recipe's "
                         "max_steps: the team's sampled trajectories would be miscounted")  # fmt: skip
    return yaml.safe_load(key["recipe"])


def specialist_runs(
    args: argparse.Namespace, recipes: dict[str, dict[str, Any]], seed: int, fresh: str | None = None
) -> dict[str, Path]:
    """Each specialist's shipped `output_dir` -> its run directory of `seed`, trained by `bench learning`; stops
    when a specialist is missing, or was trained with other settings than the router runs it with (what the run
    was trained with, not the recipe as shipped today, which may have changed since). The `fresh` specialist
    is trained anew by the arm that asks for it, so its run is neither needed nor checked."""
    runs = {}
    router = recipes["router"]
    for name in args.specialists:
        directory = Path(f"{args.specialists_prefix}-{name}-seed{seed}")
        if name == fresh:
            runs[recipes[name]["output_dir"]] = directory
            continue
        if not (directory / "adapter_config.json").exists():
            raise SystemExit(f"error: no trained adapter in {directory}: train the specialist first with `agentic-grpo "
                             f"bench learning --recipe {name} --seeds {seed} --output-dir {args.specialists_prefix}`")  # fmt: skip
        spec = trained_with(str(directory))
        for entry in router.get("subagents") or []:
            differ = settings_differ(spec, entry, router) if entry.get("adapter_path") == spec["output_dir"] else []
            if differ:
                raise SystemExit(f"error: {directory} was trained with other {differ} than the router's "
                                 f"`{entry['name']}` runs it with: the adapter the router asks is not the one "
                                 f"trained; retrain it with `agentic-grpo bench learning --recipe {name}`")  # fmt: skip
        runs[recipes[name]["output_dir"]] = directory
    return runs


def router_arms(seed: int, args: argparse.Namespace, runs: Path, recipes: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The arms of one seed that run over its trained specialists: all but `generalist`."""
    router_spec = recipes["router"]
    # Only the co-trained arm asked: the specialist it trains from untrained need not have been trained alone.
    fresh = args.cotrain if set(args.arms) - {"generalist"} == {"cotrained"} else None
    specialists = specialist_runs(args, recipes, seed, fresh)
    copy = runs.with_name(f"{runs.name}-router.yaml")
    copy.write_text(
        yaml.safe_dump(router_over(router_spec, {k: str(v) for k, v in specialists.items()}), sort_keys=False)
    )
    router = pinned_training_rows(copy, copy)
    variants = {"two_calls": two_calls_router, "tool_choice": tool_choice_router}

    def variant_recipe(arm: str) -> Path:
        return runs.with_name(f"{runs.name}-{arm}.yaml")

    for arm, make in variants.items():  # written for the arms that run on them only
        if arm in args.arms or f"untrained_{arm}" in args.arms:
            recipe = make(yaml.safe_load(Path(router).read_text()))
            variant_recipe(arm).write_text(yaml.safe_dump(recipe, sort_keys=False))

    def variant(arm: str) -> dict[str, Any]:
        return trained_run(str(variant_recipe(arm)), seed, str(runs / arm), None, args.questions)

    arms = {
        "untrained": lambda: held_out(
            router_spec["model_name_or_path"], router, args.questions, 1, runs / "untrained_router.json"
        ),  # fmt: skip
        "untrained_two_calls": lambda: held_out(
            router_spec["model_name_or_path"],
            str(variant_recipe("two_calls")),
            args.questions,
            1,
            runs / "untrained_two_calls_router.json",
        ),
        "oracle": lambda: oracle(router, args.questions, runs / "oracle.json"),
        "trained": lambda: trained_run(router, seed, str(runs / "router"), None, args.questions),
        **{arm: functools.partial(variant, arm) for arm in variants},
    }
    read = zip(args.specialists, specialists.values(), strict=True)
    # The co-trained arm's specialist is a new adapter (`cotrained_router`): its own run is neither read nor needed.
    result: dict[str, Any] = {"specialists": {name: str(d) for name, d in read if name != fresh}}
    asked = [a for a in ARMS if a in args.arms and a in arms]
    if asked:  # these arms run over every specialist's trained run
        key = {"questions": args.questions, "seed": seed, "router": Path(router).read_text(),
               "specialists": {str(d): adapter_digest(d) for d in specialists.values()}}  # fmt: skip
        for arm in asked:
            result[arm] = cached(runs.with_name(f"{runs.name}-{arm}.json"), key, arms[arm])
    if "cotrained" in args.arms:
        name = args.cotrain
        if name not in args.specialists:
            raise SystemExit(f"error: --cotrain {name} is not one of the team's --specialists {args.specialists}")
        spec = recipes[name]
        own = specialists[spec["output_dir"]]  # this seed's run of it: the sub-agent entry that loads it trains anew
        routed = trajectories_per_run(router_spec, "router")
        steps = steps_for(routed + trajectories_per_run(spec, name), router_spec, "router")
        cotrain = cotrained_router(yaml.safe_load(Path(router).read_text()), str(own), steps,
                                   spec.get("learning_rate", router_spec.get("learning_rate")))  # fmt: skip
        recipe = runs.with_name(f"{runs.name}-cotrained.yaml")
        recipe.write_text(yaml.safe_dump(cotrain, sort_keys=False))
        frozen = {str(d): adapter_digest(d) for d in specialists.values() if d != own}
        text = {"questions": args.questions, "seed": seed, "recipe": recipe.read_text(), "specialists": frozen}
        measure = functools.partial(trained_run, str(recipe), seed, str(runs / "cotrained"), None, args.questions)
        result["cotrained"] = {
            **cached(runs.with_name(f"{runs.name}-cotrained.json"), text, measure),
            "steps": steps,
            "cotrained_specialist": name,
        }
    return result


def run_seed(
    seed: int, args: argparse.Namespace, shipped: dict[str, Path], recipes: dict[str, dict[str, Any]]
) -> dict[str, Any]:
    """The arms of one seed; `shipped` holds the recipes' files, `recipes` their contents. The generalist loads no
    specialist, so `--arms generalist` alone needs none trained: the team's trajectories are counted from the
    recipes."""
    runs = Path(f"{args.output_dir}-seed{seed}")
    runs.mkdir(parents=True, exist_ok=True)
    routed = trajectories_per_run(recipes["router"], "router")
    sampled = routed + sum(trajectories_per_run(recipes[n], n) for n in args.specialists)
    result: dict[str, Any] = {"seed": seed}
    if set(args.arms) - {"generalist"}:
        result |= router_arms(seed, args, runs, recipes)
    result["team_trajectories"] = sampled
    if "generalist" in args.arms:
        steps = steps_for(sampled, recipes["generalist"], "generalist")
        recipe = pinned_training_rows(shipped["generalist"], runs.with_name(f"{runs.name}-generalist.yaml"))
        measure = functools.partial(trained_run, recipe, seed, str(runs / "generalist"), steps, args.questions)
        text = {"questions": args.questions, "seed": seed, "recipe": Path(recipe).read_text(), "max_steps": steps}
        result["generalist"] = {
            **cached(runs.with_name(f"{runs.name}-generalist.json"), text, measure),
            "steps": steps,
        }
    return result


def main() -> int:
    parser = argparse.ArgumentParser(
        prog="agentic-grpo bench team", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--router", default="team_router", help="the router recipe (default: team_router)")
    parser.add_argument("--specialists", nargs="+", default=list(SPECIALISTS),
                        help="the specialists' recipes, trained first (default: %(default)s)")  # fmt: skip
    parser.add_argument("--generalist", default="team_generalist", help="the generalist's recipe")
    parser.add_argument("--cotrain", default="team_units",
                        help="the specialist the `cotrained` arm trains with the router, from untrained (default: "
                             "%(default)s)")  # fmt: skip
    parser.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS), help="arms to measure (default: all)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="training seeds (default: 0 1 2)")
    parser.add_argument("--questions", type=int, default=48, help="held-out questions to evaluate")
    parser.add_argument(
        "--specialists-prefix",
        default="outputs/team",
        help="where `bench learning` trained the specialists: <prefix>-<recipe>-seedN (default: %(default)s)",
    )
    parser.add_argument("--output-dir", default="outputs/team-bench", help="the arms' run directories' prefix")
    args = parser.parse_args()

    from agentic_grpo.resources import find_shipped

    shipped = {name: find_shipped(name, "recipes", ".yaml") for name in args.specialists}
    shipped |= {"router": find_shipped(args.router, "recipes", ".yaml")}
    shipped |= {"generalist": find_shipped(args.generalist, "recipes", ".yaml")}
    Path(args.output_dir).parent.mkdir(parents=True, exist_ok=True)
    recipes = {name: yaml.safe_load(path.read_text()) for name, path in shipped.items()}
    seeds = [run_seed(seed, args, shipped, recipes) for seed in args.seeds]
    summary = {}
    for arm in args.arms:
        values = [s[arm]["strict_accuracy"] for s in seeds]
        summary[arm] = {"mean": round(statistics.fmean(values), 3),
                        "std": round(statistics.stdev(values), 3) if len(values) > 1 else 0.0}  # fmt: skip
    result = {
        "benchmark": "team",
        "router": shipped["router"].name,
        "scoring": "strict: the final answer is the reference itself, on the router's held-out questions",
        "questions": args.questions,
        "seeds": seeds,
        "strict_accuracy": summary,
        "command": " ".join(["agentic-grpo bench team", *sys.argv[1:]]),
    }
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
