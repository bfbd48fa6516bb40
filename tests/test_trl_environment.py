"""Environments written for TRL's `environment_factory` run here unchanged (`agentic_grpo.trl_environment`):
their tools and schemas, `reset(**row)` and the observation it returns, async tools, and `get_reward()` paid as a
reward of weight 1 named after the class, through the trainer's real rollout and TRL's reward step."""

from __future__ import annotations

import pytest

from agentic_grpo.plugins import PluginError
from agentic_grpo.rollout_parts import load_environment
from agentic_grpo.trajectory import ToolCall
from agentic_grpo.trl_environment import TRLEnvironment, is_trl_environment, tool_environment_factory
from tests.helpers import build_trainer
from tests.scripted import case_prompt
from tests.trl_style_env import CounterEnv, GuessEnv, SilentEnv


def call(name: str, arguments: str) -> str:
    return f"Thought: go.\nAction: {name}\nAction Input: {arguments}\nObservation:"


SCRIPTS = {
    "reach": [
        call("increment", '{"step": 2}'),
        call("increment", '{"step": 1}'),
        call("peek", "{}"),
        "Final Answer: 3<|im_end|>",
    ],  # fmt: skip
    "overshoot": [call("increment", '{"step": 5}'), "Final Answer: 5<|im_end|>"],
}


def test_a_trl_environment_class_runs_under_this_contract_with_its_own_tools():
    assert is_trl_environment(CounterEnv) and not is_trl_environment(
        load_environment("agentic_grpo.tools.calculator:Calculator")
    )
    cls = load_environment("tests.trl_style_env:CounterEnv")
    assert issubclass(cls, TRLEnvironment) and cls.__name__ == "CounterEnv"
    assert sorted(cls.tools()) == ["increment", "peek"], "reset and get_reward are not tools"
    schema = {s["function"]["name"]: s["function"] for s in cls.tool_schemas()}
    assert schema["increment"]["parameters"]["properties"] == {
        "step": {"type": "integer", "description": "How much to add."}
    }
    environment = cls()
    environment.reset({"target": 3, "question": "count"})
    assert environment.reset_observation == "\nThe counter is at 0; reach 3."
    assert environment.execute(ToolCall("increment", {"step": 2}), timeout=5).output == "counter: 2"
    assert environment.execute(ToolCall("peek", {}), timeout=5).output == "counter: 2", "an async tool, awaited"
    assert environment.execute(ToolCall("increment", {"step": "two"}), timeout=5).error, "arguments are checked"
    assert environment.final_reward() == 0.0
    environment.execute(ToolCall("increment", {"step": 1}), timeout=5)
    assert environment.final_reward() == 1.0
    silent = load_environment("tests.trl_style_env:SilentEnv")()
    silent.reset({})
    assert silent.reset_observation is None and silent.final_reward() is None


def test_a_factory_of_trl_environments_is_probed_once_and_wrapped():
    built = []

    def factory():
        built.append(SilentEnv())
        return built[-1]

    make = tool_environment_factory(factory)
    first, second = make(), make()
    assert isinstance(first, TRLEnvironment) and first.inner is built[0], "the probe is the first instance"
    assert second.inner is built[1] and len(built) == 2


SCORED: list = []  # the trajectories TRL handed the reward, in the batch's order


def exact(completions, trajectory, target, **_):
    SCORED[:] = trajectory
    return [float(t.final_answer == str(goal)) for t, goal in zip(trajectory, target, strict=True)]


@pytest.mark.parametrize("through", ["recipe", "environment_factory"])
def test_training_with_a_trl_environment_shows_its_observation_and_pays_its_reward(tiny_model_dir, tmp_path, through):
    rows = [{"prompt": case_prompt(name), "question": name, "target": 3} for name in SCRIPTS for _ in range(2)]
    settings = {"environment": "tests.trl_style_env:CounterEnv"} if through == "recipe" else {
        "environment": "tests.trl_style_env:CounterEnv", "environment_factory": CounterEnv}  # fmt: skip
    factory = settings.pop("environment_factory", None)
    trainer = build_trainer(tiny_model_dir, tmp_path, [exact], rows, scripts=SCRIPTS, num_generations=2,
                            max_completion_length=200, max_tokens_per_turn=60, max_turns=5,
                            environment_factory=factory, **settings)  # fmt: skip
    assert trainer.reward_func_names == ["exact", "CounterEnv"]
    trainer.generate_and_score(rows)
    prompts = [t.segments[0].text for t in SCORED]
    assert len(SCORED) == 4 and all("reach 3." in text for text in prompts), "the reset observation is in the prompt"
    by_case = {text.split("[case:")[1].split("]")[0]: t for text, t in zip(prompts, SCORED, strict=True)}
    assert by_case["reach"].rewards == {"exact": 1.0, "CounterEnv": 1.0}
    assert by_case["overshoot"].rewards == {"exact": 0.0, "CounterEnv": 0.0}
    assert "counter: 3" in by_case["reach"].completion_text, "the async peek ran"


ROW_SCRIPTS = {
    "count": [call("increment", '{"step": 3}'), "Final Answer: 3<|im_end|>"],
    "echo": [call("ping", '{"text": "hello"}'), "Final Answer: hello<|im_end|>"],
    "stray": [call("increment", '{"step": 1}'), "Final Answer: 1<|im_end|>"],  # the counter's tool, from a ping row
    "guess": [call("guess", '{"number": 3}'), "Final Answer: 3<|im_end|>"],
}
ROW_CASES = {"count": "counter", "echo": "silent", "stray": "silent", "guess": "guess"}


@pytest.mark.parametrize("through", ["recipe", "environment_factory"])
def test_rows_choose_among_several_trl_environments(tiny_model_dir, tmp_path, through):
    """TRL's mapping of environments: each row's `environment` column picks one; its prompt shows that one's tools
    only, its calls run there alone, and an environment's `get_reward` pays its own rows (None for the others)."""
    from agentic_grpo.data import row_prompt

    named = {"counter": "tests.trl_style_env:CounterEnv", "silent": "tests.trl_style_env:SilentEnv",
             "guess": "tests.trl_style_env:GuessEnv"}  # fmt: skip
    settings = {"environment": {"rows": named}} if through == "recipe" else {}
    factory = (
        {"counter": CounterEnv, "silent": SilentEnv, "guess": GuessEnv} if through == "environment_factory" else None
    )
    rows = [{"question": f"[case:{case}] go", "environment": env, "target": 3} for case, env in ROW_CASES.items()]
    rows = [dict(row) for row in rows for _ in range(2)]
    trainer = build_trainer(tiny_model_dir, tmp_path, [exact], [{**r, "prompt": case_prompt("count")} for r in rows],
                            scripts=ROW_SCRIPTS, num_generations=2, max_completion_length=200,
                            max_tokens_per_turn=60, max_turns=3, environment_factory=factory, **settings)  # fmt: skip
    assert trainer.reward_func_names == ["exact", "CounterEnv", "GuessEnv"]
    for row in rows:
        row["prompt"] = row_prompt(trainer.trajectory_format, row, trainer.rollout_parts.environment)
    trainer.generate_and_score(rows)
    by_case = {}
    for t in SCORED:
        by_case.setdefault(t.segments[0].text.split("[case:")[1].split("]")[0], []).append(t)
    counter, silent = by_case["count"][0].segments[0].text, by_case["echo"][0].segments[0].text
    assert "increment" in counter and "ping" not in counter, "a row's prompt shows its own environment's tools"
    assert "ping" in silent and "increment" not in silent and "calculator" not in silent + counter
    for t in by_case["count"]:
        assert "counter: 3" in t.completion_text and (t.rewards["CounterEnv"], t.rewards["GuessEnv"]) == (1.0, None)
    for t in by_case["guess"]:
        assert "right" in t.completion_text and (t.rewards["CounterEnv"], t.rewards["GuessEnv"]) == (None, 0.5)
    for t in by_case["echo"]:
        assert "hello" in t.completion_text and t.rewards["exact"] == 0.0
        assert t.rewards["CounterEnv"] is None and t.rewards["GuessEnv"] is None, "each pays its own rows only"
    for t in by_case["stray"]:
        assert "unknown tool `increment`" in t.completion_text and "counter:" not in t.completion_text


def test_a_row_naming_no_known_environment_is_refused_before_it_runs():
    from agentic_grpo.data import row_prompt
    from agentic_grpo.formats import load_format
    from agentic_grpo.trl_environment import environment_per_row

    router = environment_per_row({"counter": CounterEnv, "silent": SilentEnv}).environment_class
    fmt = load_format("react", router.tool_schemas())
    with pytest.raises(
        ValueError, match=r"a row's `environment` is 'count'; the environments are \['counter', 'silent'\]"
    ):
        row_prompt(fmt, {"question": "go", "environment": "count"}, router)
    environment = router()
    with pytest.raises(ValueError, match="the environments are"):
        environment.reset({"question": "go"})


def test_two_environments_with_one_tool_name_and_different_arguments_are_refused():
    from agentic_grpo.trl_environment import environment_per_row

    class OtherCounter:
        def reset(self, **kwargs):
            pass

        def increment(self, by: str) -> str:
            """
            Add.

            Args:
                by: How much.
            """
            return by

    with pytest.raises(ValueError, match="both have a tool `increment`"):
        environment_per_row({"counter": CounterEnv, "other": OtherCounter})
    environment_per_row({"counter": CounterEnv, "again": CounterEnv})  # the same tool twice is one tool


def test_a_recipe_whose_rows_choose_their_environment_prepares_each_prompt_with_its_own_tools(tmp_path):
    """`environment: {rows: {...}}` from a recipe, through `prepare`: each training row's prompt lists its own
    environment's tools; `environment_kwargs` (one class's options) are refused for it."""
    import json

    from agentic_grpo.train import prepare
    from tests.helpers import write_recipe

    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"question": f"q{i}", "answer": "3", "target": 3,
                                        "environment": ["counter", "silent"][i % 2]}) + "\n" for i in range(8)))  # fmt: skip
    named = {"counter": "tests.trl_style_env:CounterEnv", "silent": "tests.trl_style_env:SilentEnv"}
    recipe = write_recipe(tmp_path, environment={"rows": named}, dataset={"path": "json", "data_files": str(data)},
                          eval_before_after=False)  # fmt: skip
    prepared = prepare(["--config", str(recipe)])
    for row in prepared.train:
        system = row["prompt"][0]["content"]
        assert ("increment" in system) == (row["environment"] == "counter")
        assert ("ping" in system) == (row["environment"] == "silent")
    refused = write_recipe(tmp_path, environment={"rows": named}, environment_kwargs={"target": 3},
                           dataset={"path": "json", "data_files": str(data)})  # fmt: skip
    with pytest.raises(PluginError, match="environment_kwargs"):
        prepare(["--config", str(refused), "--output_dir", str(tmp_path / "other")])
