"""MCP servers as tool environments (`agentic_grpo.mcp_environment`), against the real server in tests/mcp_server.py
started over stdio and over streamable HTTP: tools and schemas in every format, calls, failures as observations,
refusals at start-up, no server left behind, and GRPO steps trained against the server."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from agentic_grpo.backends import cut_generation
from agentic_grpo.formats import load_format
from agentic_grpo.mcp_environment import observation
from agentic_grpo.plugins import PluginError
from agentic_grpo.rollout_parts import load_environment
from agentic_grpo.trajectory import ToolCall
from tests.helpers import ROOT, build_trainer, run_cli
from tests.scripted import case_prompt

SERVER = [sys.executable, str(ROOT / "tests" / "mcp_server.py")]
TOOLS = ["multiply", "remember", "recall", "fail", "hang", "pid", "variable", "header"]


def stdio(**extra) -> dict:
    return {"mcp": {"command": SERVER, **extra}}


def running(pids: list[int]) -> list[int]:
    """Those of the processes that still exist, zombies included (a zombie keeps its /proc entry until reaped)."""
    return [pid for pid in pids if Path(f"/proc/{pid}").exists()]


@pytest.fixture(scope="module")
def server_class():
    return load_environment(stdio())


@pytest.fixture
def opened(server_class):
    """Environments of the stdio server, reset as the rollout resets them; closed at the end of the test."""
    environments = []

    def open_one(cls=server_class):
        environment = cls()
        environment.reset({"question": "q"})
        environments.append(environment)
        return environment

    yield open_one
    for environment in environments:
        environment.close()


def test_the_servers_tools_and_schemas_are_the_environments_in_every_format(server_class):
    assert list(server_class.tools()) == TOOLS
    schemas = {s["function"]["name"]: s["function"] for s in server_class.tool_schemas()}
    assert schemas["multiply"] == {
        "name": "multiply",
        "description": "Multiply two numbers exactly.",
        "parameters": {
            "type": "object",
            "properties": {
                "a": {"type": "integer", "description": "The first factor."},
                "b": {"type": "integer", "description": "The second."},
            },
            "required": ["a", "b"],
        },
    }
    assert schemas["recall"]["parameters"] == {"type": "object", "properties": {}}
    react = load_format("react", server_class.tool_schemas()).system_prompt()
    assert '- multiply: Multiply two numbers exactly. Arguments: {"a": integer, "b": integer}' in react
    assert "    a: The first factor." in react
    tool_call = load_format("tool_call", server_class.tool_schemas())
    assert "Keep a note for later in this session." in tool_call.system_prompt()
    artist = load_format("artist", server_class.tool_schemas(), tool="remember")
    assert (artist.tool, artist.argument) == ("remember", "note")


def test_an_allow_list_keeps_some_tools_and_a_tool_the_server_lacks_is_refused():
    assert list(load_environment(stdio(tools=["multiply", "pid"])).tools()) == ["multiply", "pid"]
    with pytest.raises(
        PluginError, match=r"has no tool divide \(its key `tools`\); it has: fail, hang, header, multiply"
    ):
        load_environment(stdio(tools=["multiply", "divide"]))


def test_a_call_reaches_the_server_and_each_trajectory_has_a_server_of_its_own(opened):
    first, second = opened(), opened()
    result = first.execute(ToolCall("multiply", {"a": 12, "b": 34}), timeout=10)
    assert result.ok and result.output == "408"
    assert first.execute(ToolCall("remember", {"note": "first's note"}), timeout=10).output == "1 note(s) kept"
    assert first.execute(ToolCall("recall", {}), timeout=10).output == "first's note"
    assert second.execute(ToolCall("recall", {}), timeout=10).output == "no notes"
    pids = {environment.execute(ToolCall("pid", {}), timeout=10).output for environment in (first, second)}
    assert len(pids) == 2 and str(os.getpid()) not in pids


def test_a_server_printing_to_stdout_gets_one_line_naming_the_fix_not_tracebacks(caplog):
    with caplog.at_level("WARNING"):
        noisy = load_environment(stdio(env={"MCP_TEST_NOISY": "1"}))  # a first server, asked for its tools
        environments = [noisy() for _ in range(3)]
        for environment in environments:
            environment.reset({"question": "q"})
            assert environment.execute(ToolCall("multiply", {"a": 2, "b": 3}), timeout=10).output == "6"
    for environment in environments:
        environment.close()
    said = [r for r in caplog.records if r.name == "mcp.client.stdio"]
    assert len(said) == 1 and said[0].exc_info is None  # once, without the SDK's traceback
    assert "printed a line to stdout" in said[0].getMessage() and "stderr" in said[0].getMessage()


def test_failures_come_back_as_observations(opened):
    environment = opened()
    raised = environment.execute(ToolCall("fail", {"reason": "no luck"}), timeout=10)
    assert raised.error and raised.output.startswith("Error") and "failed on purpose: no luck" in raised.output
    unknown = environment.execute(ToolCall("multiplication", {"a": 1, "b": 2}), timeout=10)
    assert unknown.error and "unknown tool `multiplication`. Did you mean `multiply`?" in unknown.output
    bad = environment.execute(ToolCall("multiply", {"a": "twelve", "b": 2}), timeout=10)
    assert bad.error and "bad arguments for `multiply`: `a` should be integer, got str" in bad.output
    missing = environment.execute(ToolCall("multiply", {"a": 1}), timeout=10)
    assert missing.error and "missing b" in missing.output
    slow = environment.execute(ToolCall("hang", {}), timeout=1)
    assert slow.timed_out and "timed out after 1 s" in slow.output


def test_a_servers_start_does_not_count_against_the_calls_timeout(opened):
    slow_start = ["python", "-c", "import runpy, sys, time; time.sleep(2); sys.argv = sys.argv[1:]; "
                  "runpy.run_path(sys.argv[0], run_name='__main__')", SERVER[1]]  # fmt: skip
    environment = opened(load_environment({"mcp": {"command": slow_start, "tools": ["multiply"]}}))
    result = environment.execute(ToolCall("multiply", {"a": 12, "b": 34}), timeout=1)  # the server is still starting
    assert result.ok and result.output == "408"


def test_a_server_killed_mid_trajectory_gives_observations_not_a_crash(opened):
    environment = opened()
    pid = int(environment.execute(ToolCall("pid", {}), timeout=10).output)
    os.kill(pid, 9)
    for _ in range(2):  # and again: the trajectory goes on, every call answered
        result = environment.execute(ToolCall("multiply", {"a": 2, "b": 3}), timeout=10)
        assert result.error and result.output.startswith("Error: MCP server `") and "failed" in result.output
        assert "tests/mcp_server.py" in result.output  # the server named
    environment.close()


def test_closing_stops_each_trajectorys_server(server_class):
    environments = [server_class() for _ in range(3)]
    for environment in environments:
        environment.reset({})
    pids = [int(e.execute(ToolCall("pid", {}), timeout=10).output) for e in environments]
    hung = environments[0].execute(ToolCall("hang", {}), timeout=1)  # its server is stuck in the tool: killed
    assert hung.timed_out
    assert running(pids) == pids
    for environment in environments:
        environment.close()
    assert running(pids) == []  # `close` returns once its server has exited and been reaped


def test_a_stdio_server_gets_the_variables_it_is_given_and_not_the_trainers_others(monkeypatch):
    monkeypatch.setenv("TRAINER_SECRET", "do not pass")
    monkeypatch.setenv("REGION", "north")
    cls = load_environment(stdio(env={"AREA": "the $REGION side"}, tools=["variable"]))
    environment = cls()
    environment.reset({})
    try:
        assert environment.execute(ToolCall("variable", {"name": "AREA"}), timeout=10).output == "the north side"
        assert environment.execute(ToolCall("variable", {"name": "TRAINER_SECRET"}), timeout=10).output == "(unset)"
    finally:
        environment.close()


def test_content_that_is_not_text_is_named_and_structured_content_is_json():
    from mcp_types import (
        CallToolResult,
        EmbeddedResource,
        ImageContent,
        ResourceLink,
        TextContent,
        TextResourceContents,
    )

    blocks = [
        TextContent(type="text", text="a chart:"),
        ImageContent(type="image", data="aGk=", mime_type="image/png"),
        EmbeddedResource(type="resource", resource=TextResourceContents(uri="file:///a.txt", text="inside a.txt")),
        ResourceLink(type="resource_link", name="b", uri="file:///b.csv"),
    ]
    result = observation(CallToolResult(content=blocks))
    assert result.ok and result.output == "a chart:\n[image: image/png]\ninside a.txt\n[resource link: file:///b.csv]"
    assert observation(CallToolResult(content=[], structured_content={"sum": 3})).output == '{"sum": 3}'
    failed = observation(CallToolResult(content=[TextContent(type="text", text="no such row")], is_error=True))
    assert failed.error == failed.output == "Error: no such row"


def test_a_server_that_does_not_start_is_refused_naming_its_command_and_stderr():
    crash = ["python", "-c", "import sys; sys.stderr.write('boom: no config file\\n'); sys.exit(3)"]
    with pytest.raises(PluginError) as caught:
        load_environment({"mcp": {"command": crash}})
    message = str(caught.value)
    assert message.startswith("MCP server `python -c ") and "did not start" in message
    assert message.endswith("its stderr ends: boom: no config file") and "\n" not in message


def test_a_server_that_never_answers_is_refused_and_stopped(tmp_path):
    pid_file = tmp_path / "pid"
    silent = ["python", "-c", f"import os, sys, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); "
              "print('listening on nothing', file=sys.stderr, flush=True); time.sleep(600)"]  # fmt: skip
    with pytest.raises(PluginError, match=r"did not start: TimeoutError: no answer within 2 s; its stderr ends: "
                       "listening on nothing"):  # fmt: skip
        load_environment({"mcp": {"command": silent, "startup_timeout": 2}})
    assert running([int(pid_file.read_text())]) == []


def test_a_session_that_cannot_start_mid_run_is_an_observation(tmp_path):
    cls = load_environment(stdio(cwd=str(tmp_path)))  # the server starts at start-up ...
    environment = cls()
    tmp_path.rmdir()  # ... but no longer can: its working directory is gone
    environment.reset({})
    result = environment.execute(ToolCall("multiply", {"a": 2, "b": 3}), timeout=10)
    environment.close()
    assert result.error and result.output.startswith("Error: MCP server `") and "failed" in result.output


def test_recipe_mistakes_are_refused_in_one_line():
    cases = [
        (stdio(comand=["x"]), "option `comand` is not known; did you mean `command`?"),
        ({"mcp": {"command": SERVER}, "clas": "x:Y"}, "key `clas` is not known; did you mean `class`?"),
        ({"mcp": {"command": SERVER, "url": "http://localhost:1/mcp"}}, "give one of `command`"),
        ({"mcp": {"url": "http://localhost:1/mcp", "env": {"A": "1"}}}, "`env` and `cwd` are for a server started"),
        ({"mcp": {"command": SERVER, "headers": {"A": "1"}}}, "`headers` are for a server at a `url`"),
        (
            {"mcp": {"url": "http://localhost:1/mcp", "headers": {"A": 1}}},
            "`headers` must map header names to strings",
        ),
        ({"class": "agentic_grpo.tools.calculator:Calculator"}, "a mapping names MCP servers under `mcp`"),
        ({"mcp": [{"command": SERVER}, "python server.py"]}, "MCP server 2: a server is a mapping"),
    ]
    for environment, message in cases:
        with pytest.raises(PluginError, match=message.replace("(", r"\(").replace("?", r"\?")):
            load_environment(environment)


def test_python_tools_and_a_servers_tools_side_by_side(opened):
    cls = load_environment({"class": "agentic_grpo.tools.calculator:Calculator", "mcp": stdio(tools=["remember",
                            "recall"])["mcp"]})  # fmt: skip
    assert list(cls.tools()) == ["calculator", "remember", "recall"]
    assert [s["function"]["name"] for s in cls.tool_schemas()] == ["calculator", "remember", "recall"]
    environment = opened(cls)
    assert environment.execute(ToolCall("calculator", {"expression": "6 * 7"}), timeout=10).output == "42"
    assert environment.execute(ToolCall("remember", {"note": "42"}), timeout=10).ok
    assert environment.execute(ToolCall("recall", {}), timeout=10).output == "42"
    clash = {"class": "agentic_grpo.tools.calculator:Calculator",
             "mcp": {"command": ["python", "-m", "agentic_grpo.tools.mcp_calculator"]}}  # fmt: skip
    with pytest.raises(PluginError, match=r"`calculator` is offered by `Calculator` and by MCP server `python -m"):
        load_environment(clash)


def test_a_trl_environment_and_a_servers_tools_side_by_side():
    cls = load_environment({"class": "tests.trl_style_env:CounterEnv", "mcp": stdio(tools=["multiply"])["mcp"]})
    assert list(cls.tools()) == ["increment", "peek", "multiply"]
    environment = cls()
    environment.reset({"target": 3})
    try:
        assert environment.reset_observation == "\nThe counter is at 0; reach 3."
        assert environment.execute(ToolCall("increment", {"step": 3}), timeout=10).output == "counter: 3"
        assert environment.execute(ToolCall("multiply", {"a": 3, "b": 3}), timeout=10).output == "9"
        assert environment.final_reward() == 1.0
    finally:
        environment.close()


# --- streamable HTTP ------------------------------------------------------------------------------------------


@pytest.fixture
def http_server():
    """The test server over streamable HTTP on a free port: (its URL, its process)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen([*SERVER, "--http", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(300):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                assert process.poll() is None, "the HTTP server exited"
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/mcp", process
    finally:
        process.kill()
        process.wait()


def test_a_server_over_streamable_http(http_server):
    url, process = http_server
    cls = load_environment({"mcp": {"url": url, "tools": ["multiply", "fail", "pid"]}})
    assert list(cls.tools()) == ["multiply", "fail", "pid"]
    environment = cls()
    environment.reset({})
    try:
        assert environment.execute(ToolCall("multiply", {"a": 21, "b": 2}), timeout=10).output == "42"
        assert environment.execute(ToolCall("pid", {}), timeout=10).output == str(process.pid)
        failed = environment.execute(ToolCall("fail", {"reason": "over HTTP"}), timeout=10)
        assert failed.error and "the tool failed on purpose: over HTTP" in failed.output
        process.kill()
        process.wait()
        down = environment.execute(ToolCall("multiply", {"a": 1, "b": 2}), timeout=10)
        assert down.error and down.output.startswith(f"Error: MCP server `{url}` failed")
    finally:
        environment.close()
    with pytest.raises(PluginError, match=f"MCP server `{url}` did not answer: "):
        load_environment({"mcp": {"url": url, "startup_timeout": 5}})


def test_headers_reach_an_http_server_with_the_trainers_variables_expanded(http_server, monkeypatch):
    url, _ = http_server
    monkeypatch.setenv("MCP_TEST_TOKEN", "s3cret")
    cls = load_environment({"mcp": {"url": url, "headers": {"Authorization": "Bearer $MCP_TEST_TOKEN"},
                                    "tools": ["header"]}})  # fmt: skip
    environment = cls()
    environment.reset({})
    try:
        assert environment.execute(ToolCall("header", {"name": "Authorization"}), timeout=10).output == "Bearer s3cret"
    finally:
        environment.close()
    plain = load_environment({"mcp": {"url": url, "tools": ["header"]}})()
    plain.reset({})
    try:
        assert plain.execute(ToolCall("header", {"name": "Authorization"}), timeout=10).output == "(none)"
    finally:
        plain.close()


# --- training ---------------------------------------------------------------------------------------------


def call(name: str, arguments: dict) -> str:
    return f"Thought: use the tool.\nAction: {name}\nAction Input: {json.dumps(arguments)}\nObservation:"


class TwoWays:
    """A scripted policy: the even trajectories of a batch multiply on the server and answer the product, the odd
    call the failing tool and answer 0. A group's rewards then differ, so its advantages are not zero."""

    def __init__(self, tokenizer):
        self.tokenizer, self.eos_ids = tokenizer, [tokenizer.eos_token_id]

    def generate(self, batch, stop, max_new_tokens, choices=None, assigned=None):
        out = []
        for position, ids in enumerate(batch):
            context = self.tokenizer.decode(ids)
            asked = context[context.rfind("[case:") :]
            if "Observation:" not in asked:
                text = call("multiply", {"a": 12, "b": 34}) if position % 2 == 0 else call("fail", {"reason": "odd"})
            else:
                text = f"Final Answer: {'408' if 'Observation: 408' in asked else '0'}<|im_end|>"
            new_ids = self.tokenizer(text, add_special_tokens=False)["input_ids"][:max_new_tokens]
            out.append(cut_generation(new_ids, self.eos_ids, stop, self.tokenizer))
        return out


def product(completions, trajectory, **_):
    return [float(t.final_answer == "408") for t in trajectory]


@pytest.mark.integration  # trains for two steps
def test_two_grpo_steps_against_the_server(tiny_model_dir, tmp_path):
    pid_dir = tmp_path / "servers"
    pid_dir.mkdir()
    rows = [{"prompt": case_prompt("mcp"), "question": "What is 12 * 34?"} for _ in range(8)]
    trainer = build_trainer(
        tiny_model_dir, tmp_path / "out", [product], rows, stepped_by_hand=False,
        environment={"mcp": {"command": SERVER, "env": {"MCP_TEST_PID_DIR": str(pid_dir)}}},
        max_steps=2, max_turns=3, max_tokens_per_turn=80, max_completion_length=200, learning_rate=1e-2,
        save_trajectories_steps=1, logging_steps=1,
    )  # fmt: skip
    trainer.generation_backend = TwoWays(trainer.processing_class)
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    trainer.train()

    steps = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert len(steps) == 2 and all(entry["tools/calls_per_trajectory"] == 1.0 for entry in steps)
    assert all(entry["tools/error_rate"] == 0.5 for entry in steps)  # the failing tool's half, as observations
    files = [tmp_path / "out" / "trajectories" / f"step_{step:06d}.jsonl" for step in (1, 2)]
    records = [json.loads(line) for file in files for line in file.read_text().splitlines()]
    outputs = sorted(record["tool_calls"][0]["result"]["output"] for record in records)
    assert outputs[: len(records) // 2] == ["408"] * (len(records) // 2)
    assert all("the tool failed on purpose: odd" in output for output in outputs[len(records) // 2 :])
    assert {record["rewards"]["product"] for record in records} == {0.0, 1.0}
    after = dict(trainer.model.named_parameters())
    assert any(not torch.equal(before[name], after[name]) for name in before), "the steps changed the weights"
    # A server per trajectory (and the one asked for its tools at start-up), none left running.
    pids = [int(path.name) for path in pid_dir.iterdir()]
    assert len(pids) == len(records) + 1
    assert running(pids) == []


@pytest.mark.integration  # runs the CLI in a process of its own
def test_the_shipped_mcp_recipe_trains_from_the_cli(tmp_path):
    out = tmp_path / "cpu_mcp"
    tiny = ["--model_name_or_path", "tiny-random-llama", "--max_steps", "1", "--num_generations", "2",
            "--per_device_train_batch_size", "2", "--gradient_accumulation_steps", "1", "--max_tokens_per_turn", "16",
            "--max_completion_length", "64", "--eval_before_after", "false", "--save_strategy", "no",
            "--lora_target_modules", "q_proj", "v_proj"]  # fmt: skip
    result = run_cli("train", "--config", "cpu_mcp", "--output_dir", str(out), *tiny)
    assert result.returncode == 0, result.stderr[-3000:]
    record = json.loads((out / "trajectories" / "step_000001.jsonl").read_text().splitlines()[0])
    assert "- calculator: Evaluate an arithmetic expression exactly." in record["prompt"][0]["content"]
    assert json.loads((out / "run.json").read_text())["status"] == "completed"


def test_arguments_a_schema_leaves_open_are_passed_and_closed_ones_refused():
    from agentic_grpo.environment import check_arguments

    def schema(**extra) -> dict:
        parameters = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"], **extra}
        return {"type": "function", "function": {"name": "t", "description": "t", "parameters": parameters}}

    assert "unknown b" in check_arguments(schema(), {"a": 1, "b": 2})  # a Python tool's schema: closed
    assert check_arguments(schema(additionalProperties=True), {"a": 1, "b": 2}) is None  # an MCP server's may be open
    assert check_arguments(schema(additionalProperties={"type": "string"}), {"a": 1, "b": "x"}) is None
    assert "`a` should be integer" in check_arguments(schema(additionalProperties=True), {"a": "1", "b": 2})
    assert "missing a" in check_arguments(schema(additionalProperties=True), {"b": 2})
