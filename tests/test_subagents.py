"""Sub-agents as tools: batching, the child records under their parent, failures as observations, the recipe block.

The parent's text is scripted (`ScriptedBackend`: exact tool calls on demand, which no sampled model gives);
the sub-agents generate for real on a tiny model of their own (`model: <dir>`, a frozen model).
"""

from __future__ import annotations

import json
import threading

import pytest

from agentic_grpo.cli import main as cli_main
from agentic_grpo.config import AgenticGRPOConfig
from agentic_grpo.plugins import PluginError
from agentic_grpo.run_parts import build_rollout_parts
from agentic_grpo.trajectory import Delegation, Segment, Trajectory
from tests import envs
from tests.scripted import ScriptedBackend, case_prompt
from tests.subagent_support import RecordingGenerate

ASK = 'Thought: delegate.\nAction: helper\nAction Input: {"task": "What is 12 * 34?"}\nObservation:'
DONE = "Final Answer: 408<|im_end|>"


def recipe(tmp_path, *subagents, **fields):
    return AgenticGRPOConfig(output_dir=str(tmp_path), report_to=[], environment="agentic_grpo.tools.calculator:Calculator",
                             max_completion_length=600, max_tokens_per_turn=64, subagents=list(subagents), **fields)  # fmt: skip


def helper(model_dir, **entry):
    """A frozen-model sub-agent that answers in one turn with what it writes (unless `entry` says otherwise)."""
    return {"name": "helper", "description": "Answers a sub-task.", "model": model_dir,
            "format": "tests.subagent_support:CallingFormat", "format_kwargs": {"tool": None},
            "max_turns": 1, "max_tokens_per_turn": 12, **entry}  # fmt: skip


def rollout(parts, tokenizer, scripts, cases, rows=None):
    manager = parts.rollout_manager(tokenizer)
    backend = ScriptedBackend(tokenizer, scripts)
    try:
        rows = rows or [{"case": c} for c in cases]
        trajectories, _ = manager.rollout([case_prompt(c) for c in cases], rows, backend)
    finally:
        manager.close()
    return trajectories


def test_calls_of_a_turn_run_as_one_nested_rollout_generating_once_per_child_turn(tmp_path, tiny_model_dir, tokenizer):
    # Sampled (`temperature`): a greedy sub-agent would answer the four identical tasks once (the next test).
    echo = helper(tiny_model_dir, environment="tests.subagent_support:Echo", max_turns=3, temperature=1.0,
                  format_kwargs={"tool": "echo", "argument": "text"})  # fmt: skip
    parts = build_rollout_parts(recipe(tmp_path, echo))
    model, _ = parts.agents[0].source.load()
    spy = RecordingGenerate(model)
    scripts = {"once": [ASK, DONE], "twice": [ASK, ASK, DONE]}
    trajectories = rollout(parts, tokenizer, scripts, ["once", "once", "twice", "twice"])

    children = [c for t in trajectories for c in t.children]
    assert len(children) == 6 and all(t.finish_reason == "final_answer" for t in trajectories)
    expected = []  # one generate per child turn, over the children of that parent turn still running
    for parent_turn in (0, 1):
        batch = [c for c in children if c.delegation.parent_turn == parent_turn]
        expected += [sum(c.turns > k for c in batch) for k in range(max(c.turns for c in batch))]
    assert spy.rows == expected and spy.rows[0] == 4  # the first parent turn's four calls: one batch of four


def test_a_greedy_frozen_sub_agent_answers_each_distinct_task_of_a_batch_once(tmp_path, tiny_model_dir, tokenizer):
    parts = build_rollout_parts(recipe(tmp_path, helper(tiny_model_dir)))
    model, _ = parts.agents[0].source.load()
    spy = RecordingGenerate(model)
    other = ASK.replace("12 * 34", "5 + 6")
    trajectories = rollout(parts, tokenizer, {"same": [ASK, DONE], "other": [other, DONE]},
                           ["same", "other", "same", "same"])  # fmt: skip

    children = [t.children[0] for t in trajectories]
    assert spy.rows[0] == 2  # two distinct tasks, one child each, for four calls
    assert len({id(c) for c in children}) == 4  # yet every call keeps a child of its own
    same = [children[k] for k in (0, 2, 3)]
    assert all(c.to_dict() | {"delegation": None} == same[0].to_dict() | {"delegation": None} for c in same)
    assert [c.delegation.row["question"] for c in children] == ["What is 12 * 34?", "What is 5 + 6?",
                                                               "What is 12 * 34?", "What is 12 * 34?"]  # fmt: skip
    assert all(c.final_answer for c in children)
    assert [t.tool_calls[0][1].output for t in trajectories] == [c.final_answer for c in children]
    # The answer is shared, the record is not: a copy's change stays its own.
    children[2].notes["mine"] = True
    assert "mine" not in children[0].notes and "mine" not in children[3].notes


def test_only_a_frozen_greedy_sub_agent_answers_identical_tasks_once(tmp_path, tiny_model_dir):
    rows = [{"question": "a"}, {"question": "b"}, {"question": "a"}]
    greedy = build_rollout_parts(recipe(tmp_path, helper(tiny_model_dir))).agents[0]
    assert greedy.distinct_tasks(rows) == ([{"question": "a"}, {"question": "b"}], [0, 1, 0])
    sampled = build_rollout_parts(recipe(tmp_path, helper(tiny_model_dir, temperature=0.7))).agents[0]
    assert sampled.distinct_tasks(rows) == (rows, [0, 1, 2])
    greedy.train = True  # a co-trained sub-agent's children are its training samples: each is its own
    assert greedy.distinct_tasks(rows) == (rows, [0, 1, 2])


def test_the_childs_answer_is_the_observation_and_the_child_is_kept_under_its_parent(tmp_path, tiny_model_dir,
                                                                                      tokenizer):  # fmt: skip
    parts = build_rollout_parts(recipe(tmp_path, helper(tiny_model_dir, row_columns=["city"])))
    [parent] = rollout(parts, tokenizer, {"ask": ["Thought: first.\nAction: calculator\nAction Input: "
                       '{"expression": "1+1"}\nObservation:', ASK, DONE]}, ["ask"], rows=[{"case": "ask", "city": "Lyon",
                       "answer": "408"}])  # fmt: skip

    [child] = parent.children
    (_, first), (call, result) = parent.tool_calls
    assert first.output == "2" and call.name == "helper"
    assert child.finish_reason == "final_answer" and result.output == child.final_answer and result.ok
    assert child.delegation.row == {"city": "Lyon", "question": "What is 12 * 34?"}  # never the parent's answer
    assert (child.delegation.parent_turn, child.delegation.call_index) == (1, 1)
    assert child.delegation.agent == "helper" and child.delegation.policy == f"model:{tiny_model_dir}"
    observation = parent.segments[4]
    assert observation.role == "tool" and child.final_answer.strip() in observation.text
    # The child's tokens are its own: none of them is a segment of the parent.
    assert len(parent.completion_ids) == sum(len(s.token_ids) for s in parent.segments[1:])
    assert child.segments[1].token_ids and child.loss_mask == [1] * len(child.segments[1].token_ids)

    record = json.loads(json.dumps(parent.to_dict()))
    [saved] = record["children"]
    assert saved["delegation"]["row"]["question"] == "What is 12 * 34?"
    assert saved["segments"][1]["token_ids"] == child.segments[1].token_ids
    assert saved["final_answer"] == child.final_answer


def test_a_task_column_gives_the_child_the_rows_question_whatever_the_parent_writes(tmp_path, tiny_model_dir,
                                                                                       tokenizer):  # fmt: skip
    parts = build_rollout_parts(recipe(tmp_path, helper(tiny_model_dir, task_column="question")))
    assert "- helper: Answers a sub-task. Arguments: {}" in parts.trajectory_format.system_prompt()
    bare = "Action: helper\nAction Input: {}\nObservation:"
    rows = [{"case": "bare", "question": "How many days from 2024-01-05 to 2024-03-01?"},
            {"case": "ask", "question": "What is 7 * 6?"}]  # fmt: skip
    bare_parent, asking_parent = rollout(parts, tokenizer, {"bare": [bare, DONE], "ask": [ASK, DONE]},
                                         ["bare", "ask"], rows=rows)  # fmt: skip
    # The parent's own wording of the task (ASK's "What is 12 * 34?") never reaches the child.
    assert [p.children[0].delegation.row for p in (bare_parent, asking_parent)] == [
        {"question": "How many days from 2024-01-05 to 2024-03-01?"},
        {"question": "What is 7 * 6?"},
    ]
    assert all(p.tool_calls[0][1].ok for p in (bare_parent, asking_parent))


def test_a_task_column_the_rows_lack_stops_the_rollout_naming_it(tmp_path, tiny_model_dir, tokenizer):
    parts = build_rollout_parts(recipe(tmp_path, helper(tiny_model_dir, task_column="prompt_text")))
    with pytest.raises(KeyError, match="`task_column` `prompt_text` is not a column"):
        rollout(parts, tokenizer, {"ask": [ASK, DONE]}, ["ask"])


def test_a_handoff_ends_the_caller_with_the_sub_agents_answer(tmp_path, tiny_model_dir, tokenizer):
    parts = build_rollout_parts(recipe(tmp_path, helper(tiny_model_dir, handoff=True)))
    # The script's second turn would answer 408: a handoff leaves the caller no second turn.
    [parent] = rollout(parts, tokenizer, {"ask": [ASK, DONE]}, ["ask"])
    [child] = parent.children
    assert child.finish_reason == "final_answer" and child.final_answer is not None
    assert parent.finish_reason == "final_answer" and parent.final_answer == child.final_answer
    assert parent.turns == 1 and [s.role for s in parent.segments] == ["prompt", "model", "tool"]


def test_a_handoff_the_sub_agent_does_not_answer_leaves_the_caller_to_go_on(tmp_path, tiny_model_dir, tokenizer):
    broken = helper(tiny_model_dir, environment="tests.subagent_support:BrokenReset", handoff=True)
    parts = build_rollout_parts(recipe(tmp_path, broken))
    [parent] = rollout(parts, tokenizer, {"ask": [ASK, DONE]}, ["ask"])
    [(_, result)] = parent.tool_calls
    assert not result.ok and parent.children[0].finish_reason == "error"
    assert parent.turns == 2 and parent.final_answer == "408"  # its own answer, after the error observation


def test_bad_arguments_to_a_subagent_are_an_observation_and_start_no_child(tmp_path, tiny_model_dir, tokenizer):
    parts = build_rollout_parts(recipe(tmp_path, helper(tiny_model_dir)))
    bad = 'Action: helper\nAction Input: {"question": "12 * 34"}\nObservation:'
    [parent] = rollout(parts, tokenizer, {"bad": [bad, DONE]}, ["bad"])
    [(_, result)] = parent.tool_calls
    assert not result.ok and "bad arguments for `helper`: missing task" in result.output
    assert parent.children == []


def test_a_subagent_whose_rollout_breaks_is_an_observation_not_a_crash(tmp_path, tiny_model_dir, tokenizer):
    broken = helper(tiny_model_dir, environment="tests.subagent_support:BrokenReset")
    parts = build_rollout_parts(recipe(tmp_path, broken))
    [parent] = rollout(parts, tokenizer, {"ask": [ASK, DONE]}, ["ask"])
    [(_, result)] = parent.tool_calls
    [child] = parent.children
    assert child.finish_reason == "error" and "RuntimeError: no such city" in child.notes["error"]
    assert not result.ok and "sub-agent `helper` gave no answer (RuntimeError: no such city)" in result.output
    assert parent.finish_reason == "final_answer"


def test_different_subagents_called_in_one_turn_run_at_the_same_time(tmp_path, tiny_model_dir, tokenizer):
    # Each child's one tool call waits at a barrier of two: one sub-agent after the other, the first would time out.
    envs.BARRIER["barrier"] = threading.Barrier(2)
    meet = {"environment": "tests.envs:MisbehavingTools", "format_kwargs": {"tool": "meet", "argument": "name"},
            "tool_timeout": 10}  # fmt: skip
    parts = build_rollout_parts(recipe(tmp_path, helper(tiny_model_dir, **meet),
                                       helper(tiny_model_dir, **meet, name="second")))  # fmt: skip
    ask_second = ASK.replace("helper", "second")
    trajectories = rollout(parts, tokenizer, {"a": [ASK, DONE], "b": [ask_second, DONE]}, ["a", "b"])
    outputs = [c.tool_calls[0][1].output for t in trajectories for c in t.children]
    assert len(outputs) == 2 and all(o.endswith("met everyone") for o in outputs)


# --- the recipe block ---------------------------------------------------------------------


def test_a_recipe_block_makes_a_tool_the_policy_reads_about(tmp_path, tiny_model_dir):
    block = f"[{{name: helper, description: Answers a sub-task., model: {tiny_model_dir}, max_turns: 2}}]"
    config = AgenticGRPOConfig(output_dir=str(tmp_path), report_to=[], max_tokens_per_turn=64,
                               subagents=block)  # as the command line gives it: YAML text  # fmt: skip
    parts = build_rollout_parts(config)
    [agent] = parts.agents
    assert '- helper: Answers a sub-task. Arguments: {"task": string}' in parts.trajectory_format.system_prompt()
    assert "helper" in parts.trajectory_format.system_prompt().split("one of [")[1]
    assert agent.parts.limits.max_turns == 2 and agent.parts.limits.max_tokens_per_turn == 64  # unset: the recipe's


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"max_turn": 2}, r"option `max_turn` is not known; did you mean `max_turns`\?"),
        ({"name": "calculator"}, r"\['calculator'\] are also tools of"),
        ({"name": "ask expert"}, "a name is a tool name"),
        ({"endpoint": "http://127.0.0.1:1/v1", "adapter": "x"}, "give `endpoint` or a local `model`/`adapter`"),
        ({"endpoint": "http://127.0.0.1:1/v1", "model": "policy"}, "`endpoint` needs `endpoint_model`"),
        ({"adapter_path": "/tmp/a"}, "`adapter_path` needs `adapter`"),
        ({"endpoint": "http://127.0.0.1:1/v1", "endpoint_model": "m", "format_kwargs": {"constrain_actions": True}},
         "`constrain_actions` masks a local model's logits"),
        ({"environment": "agentic_grpo.tools.python:PythonInterpreter", "tool_timeout": 3},
         "leave the sub-agent's `tool_timeout` unset"),
    ],
)  # fmt: skip
def test_a_wrong_recipe_block_is_refused_naming_the_fix(tmp_path, entry, message):
    block = {"name": "helper", "description": "Helps.", "model": "policy", **entry}
    with pytest.raises(PluginError, match=message):
        build_rollout_parts(recipe(tmp_path, block))


def test_the_same_name_twice_is_refused(tmp_path):
    block = {"name": "helper", "description": "Helps."}
    with pytest.raises(PluginError, match=r"name\(s\) \['helper'\] used twice"):
        build_rollout_parts(recipe(tmp_path, block, block))


def test_a_code_running_subagent_gets_a_sandbox_even_when_the_policys_tools_do_not(tmp_path):
    coder = {
        "name": "coder",
        "description": "Runs Python.",
        "environment": "agentic_grpo.tools.python:PythonInterpreter",
    }
    parts = build_rollout_parts(recipe(tmp_path, coder))
    assert not parts.environment.needs_sandbox and parts.sandbox is not None


# --- agentic-grpo show ------------------------------------------------------------------------


def test_show_draws_each_child_under_the_call_that_made_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # rich wraps to the terminal; keep lines whole for the asserts
    grandchild = Trajectory(prompt="g", segments=[Segment("prompt", [], "")], finish_reason="error",
                            notes={"error": "APIConnectionError: Connection error."},
                            delegation=Delegation("lookup", "endpoint:http://h/v1#m", {"question": "capital?"}, 0, 0))  # fmt: skip
    child = Trajectory(prompt="c", segments=[Segment("prompt", [1], "P"), Segment("model", [2, 3], "CHILD-THOUGHT")],
                       final_answer="Paris", finish_reason="final_answer", turns=1, children=[grandchild],
                       delegation=Delegation("helper", "adapter:geo", {"question": "Where?"}, 1, 0, adapter="geo"))  # fmt: skip
    parent = Trajectory(prompt="p", segments=[Segment("prompt", [1], "P"), Segment("model", [4], "PARENT-CALL"),
                        Segment("tool", [5], " Paris\n")], final_answer="Paris", finish_reason="final_answer",
                        turns=2, children=[child])  # fmt: skip
    path = tmp_path / "step_000001.jsonl"
    path.write_text(
        json.dumps({**parent.to_dict(), "row": {"question": "Capital of France?", "answer": "Paris"}}) + "\n"
    )

    assert cli_main(["show", str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()

    def line_of(text):
        return next(i for i, line in enumerate(lines) if text in line)

    parent_at, child_at, grandchild_at = (line_of("PARENT-CALL"), line_of("helper  [adapter:geo]  called in turn 2"),
                                          line_of("lookup  [endpoint:http://h/v1#m]  called in turn 1  finish=error"))  # fmt: skip
    assert parent_at < child_at < line_of("CHILD-THOUGHT") < grandchild_at < line_of("APIConnectionError")
    indent = [len(lines[i]) - len(lines[i].lstrip(" │├└─")) for i in (line_of("#0"), child_at, grandchild_at)]
    assert indent[0] < indent[1] < indent[2]  # each generation one level deeper in the tree
    assert "Q: Where?" in lines[child_at + 1] and "sub-agent trajectories" in lines[-1]


def test_the_documented_example_turns_a_users_environment_into_a_subagent(tmp_path, monkeypatch):
    import re

    import yaml

    from tests.helpers import ROOT

    section = (ROOT / "docs" / "subagents.md").read_text()
    code = re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)
    block = yaml.safe_load(re.search(r"```yaml\n(.*?)```", section, re.DOTALL).group(1))
    (tmp_path / "my_tools.py").write_text(code)
    monkeypatch.chdir(tmp_path)  # recipes import a user's modules from the directory they run in
    monkeypatch.syspath_prepend(str(tmp_path))

    parts = build_rollout_parts(AgenticGRPOConfig(output_dir=str(tmp_path), report_to=[], **block))
    [agent] = parts.agents
    assert "ask_weather" in parts.trajectory_format.system_prompt() and set(parts.environment.tools()) == {
        "calculator"
    }
    assert agent.adapter == "weather" and agent.parts.limits.max_turns == 4
    weather = agent.parts.environment_builder()
    assert set(weather.tools()) == {"forecast"} and "forecast" in agent.parts.trajectory_format.system_prompt()
