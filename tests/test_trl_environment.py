"""Environments written for TRL's `environment_factory` run here unchanged (`agentic_grpo.trl_environment`):
their tools and schemas, `reset(**row)` and the observation it returns, async tools, and `get_reward()` paid as a
reward of weight 1 named after the class, through the trainer's real rollout and TRL's reward step."""

from __future__ import annotations

import pytest

from agentic_grpo.rollout_parts import load_environment
from agentic_grpo.trajectory import ToolCall
from agentic_grpo.trl_environment import TRLEnvironment, is_trl_environment, tool_environment_factory
from tests.helpers import build_trainer
from tests.scripted import case_prompt
from tests.trl_style_env import CounterEnv, SilentEnv


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
