"""Endpoint sub-agents: a real llama.cpp server (SmolLM2-135M) answers through the `openai` client; a server
that is down or too slow is the parent's observation, never a crash.

The parent's text is scripted (`ScriptedBackend`), so the parent calls the sub-agent for sure; every child
turn is a real request. `FaultProxy` (a real HTTP proxy) records what the child sent, or stalls and fails
on command where a real server cannot be made to.
"""

from __future__ import annotations

import json

import pytest

from agentic_grpo.config import AgenticGRPOConfig
from agentic_grpo.run_parts import build_rollout_parts
from agentic_grpo.subagents import generated_tokens
from tests import judge_fixtures
from tests.judge_fixtures import FaultProxy, free_port
from tests.scripted import ScriptedBackend, case_prompt

# The judge tests' fixtures: the session's llama.cpp server, and a stand-alone fault proxy.
llama_server_process = judge_fixtures.llama_server_process
llama_server = judge_fixtures.llama_server
proxy = judge_fixtures.proxy

DONE = "Final Answer: done<|im_end|>"


def ask(task: str) -> str:
    return f'Thought: delegate.\nAction: helper\nAction Input: {{"task": "{task}"}}\nObservation:'


def endpoint_helper(url: str, **entry) -> dict:
    """A sub-agent on `url` whose every reply, up to its first full stop, is its answer."""
    return {"name": "helper", "description": "Answers questions.", "endpoint": url, "endpoint_model": "judge",
            "format": "tests.subagent_support:CallingFormat", "format_kwargs": {"tool": None, "stop": ["."]},
            "max_turns": 1, "max_tokens_per_turn": 48, "max_concurrency": 1, "timeout": 60, **entry}  # fmt: skip


def run(tmp_path, tokenizer, entry: dict, tasks: list[str]):
    config = AgenticGRPOConfig(output_dir=str(tmp_path), report_to=[], environment="agentic_grpo.tools.calculator:Calculator",
                               max_completion_length=600, max_tokens_per_turn=64, subagents=[entry])  # fmt: skip
    parts = build_rollout_parts(config)
    manager = parts.rollout_manager(tokenizer)
    scripts = {f"t{k}": [ask(task), DONE] for k, task in enumerate(tasks)}
    try:
        trajectories, _ = manager.rollout([case_prompt(c) for c in scripts], [{} for _ in scripts],
                                          ScriptedBackend(tokenizer, scripts))  # fmt: skip
    finally:
        manager.close()
    return trajectories


@pytest.mark.integration
def test_endpoint_subagent_answers_through_a_real_server(tmp_path, tokenizer, llama_server):
    tasks = ["What is the capital of France?", "Name a color of the sky."]
    trajectories = run(tmp_path, tokenizer, endpoint_helper(llama_server), tasks)
    for parent, task in zip(trajectories, tasks, strict=True):
        [child] = parent.children
        [(_, result)] = parent.tool_calls
        reply = child.segments[1].text
        assert child.finish_reason == "final_answer" and reply.strip(), child.notes
        assert result.ok and result.output == child.final_answer == reply.strip()
        assert child.delegation.policy == f"endpoint:{llama_server}#judge" and child.delegation.row["question"] == task
        assert generated_tokens(child) == child.notes["usage"]["completion_tokens"] > 0
        assert result.output in parent.segments[2].text  # the observation the parent reads


@pytest.mark.integration
def test_endpoint_child_runs_its_tools_and_sends_each_observation_back(tmp_path, tokenizer, llama_server):
    recorder = FaultProxy(upstream=llama_server.split("//")[1].split("/")[0])
    try:
        entry = endpoint_helper(recorder.url, environment="tests.subagent_support:Echo", max_turns=2,
                                format_kwargs={"tool": "echo", "argument": "text", "stop": ["."]})  # fmt: skip
        [parent] = run(tmp_path, tokenizer, entry, ["Describe the sea."])
    finally:
        recorder.close()
    [child] = parent.children
    assert child.turns == 2 and child.finish_reason == "max_turns"
    (call, first), _ = child.tool_calls
    assert call.name == "echo" and first.output.startswith("echo ")
    second_request = json.loads(recorder.log[1]["body"])
    assert second_request["messages"][-2]["role"] == "assistant"
    assert first.output in second_request["messages"][-1]["content"]  # the observation, as the next user message
    [(_, result)] = parent.tool_calls
    assert not result.ok and "gave no answer (it used all 2 turns)" in result.output


def test_endpoint_that_is_down_is_an_observation(tmp_path, tokenizer):
    down = f"http://127.0.0.1:{free_port()}/v1"
    [parent] = run(tmp_path, tokenizer, endpoint_helper(down, max_retries=1, timeout=5), ["Anything?"])
    [child] = parent.children
    [(_, result)] = parent.tool_calls
    assert child.finish_reason == "error" and "APIConnectionError" in child.notes["error"]
    assert not result.ok and "sub-agent `helper` gave no answer (APIConnectionError" in result.output
    assert parent.finish_reason == "final_answer"


def test_endpoint_too_slow_times_out_after_its_retries_and_is_an_observation(tmp_path, tokenizer, proxy):
    proxy.script("SLOWTASK", [("delay", 5), ("delay", 5)])
    [parent] = run(tmp_path, tokenizer, endpoint_helper(proxy.url, max_retries=1, timeout=0.5), ["SLOWTASK now"])
    [(_, result)] = parent.tool_calls
    assert proxy.attempts["SLOWTASK"] == 2  # the first attempt and one retry
    assert parent.children[0].finish_reason == "error" and result.timed_out and "APITimeoutError" in result.output


def test_endpoint_error_is_retried_with_backoff_then_answers(tmp_path, tokenizer, proxy):
    proxy.script("FLAKY", [("status", 503, {})])
    proxy.default_reply = "Paris"
    [parent] = run(tmp_path, tokenizer, endpoint_helper(proxy.url, max_retries=2), ["FLAKY question"])
    [(_, result)] = parent.tool_calls
    assert proxy.attempts["FLAKY"] == 2 and result.ok and result.output == "Paris"
