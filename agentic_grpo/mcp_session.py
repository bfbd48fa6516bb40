"""An MCP server as a recipe names it (`MCPServerSpec`) and a session with it that threads can use (`MCPSession`).

The MCP SDK is asyncio; the rollout calls tools from worker threads. Every session of the process lives on one
event loop on a daemon thread, held open by a task of its own (anyio wants the task that entered a transport to
leave it), and threads reach it through `asyncio.run_coroutine_threadsafe`. Closing a session ends a stdio
server's process: the SDK closes its stdin and, if the server has not exited a moment later, sends SIGTERM, then
SIGKILL, to the server's process group (the server is started in a session of its own).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import math
import os
import shlex
import sys
import tempfile
import threading
from dataclasses import dataclass
from typing import Any

from agentic_grpo.plugins import PluginError, check_options

logger = logging.getLogger(__name__)

STOP_S = 10.0
"""The most closing a session waits for it to end (the SDK's own escalation to SIGKILL takes about 6 s)."""
MAX_TOOL_PAGES = 100


@dataclass(frozen=True)
class MCPServerSpec:
    """One MCP server of a recipe's `environment: {mcp: ...}`.

    command: stdio: the command that starts the server (a list, or one string split as a shell would); `python`
        as its first word is the trainer's own interpreter.
    url: streamable HTTP: the endpoint of a server already running. One of `command` and `url`.
    env: stdio: variables for the server, added to the minimal set the SDK passes (HOME, PATH, USER, ...); `$NAME`
        in a value is the trainer's variable.
    headers: streamable HTTP: headers sent with every request, e.g. `{Authorization: "Bearer $MY_TOKEN"}`; `$NAME`
        in a value is the trainer's variable (a secret stays out of the recipe).
    cwd: stdio: the server's working directory (default: the trainer's).
    tools: only these of its tools (default: all).
    name: what messages call it (default: its command line or URL).
    startup_timeout: seconds a session may take to start and answer.
    """

    command: tuple[str, ...] | None = None
    url: str | None = None
    env: dict[str, str] | None = None
    headers: dict[str, str] | None = None
    cwd: str | None = None
    tools: tuple[str, ...] | None = None
    name: str | None = None
    startup_timeout: float = 30.0

    @classmethod
    def from_recipe(cls, value: Any, where: str) -> MCPServerSpec:
        """A server entry of a recipe, checked; raises PluginError (a ValueError) naming what is wrong."""
        if not isinstance(value, dict):
            raise PluginError(f"{where}: a server is a mapping with `command` or `url`, got {value!r}")
        check_options(cls, value, where)
        spec = dict(value)
        if (spec.get("command") is None) == (spec.get("url") is None):
            raise PluginError(f"{where}: give one of `command` (a stdio server) or `url` (streamable HTTP)")
        command = spec.get("command")
        if isinstance(command, str):
            command = shlex.split(command)
        if command is not None:
            if not command or not all(isinstance(word, str) for word in command):
                raise PluginError(f"{where}: `command` must be a non-empty list of strings, got {value['command']!r}")
            spec["command"] = tuple(command)
        elif spec.get("env") or spec.get("cwd"):
            raise PluginError(f"{where}: `env` and `cwd` are for a server started by `command`, not one at a `url`")
        if spec.get("headers") is not None:
            if command is not None:
                raise PluginError(f"{where}: `headers` are for a server at a `url`; a `command` server takes `env`")
            headers = spec["headers"]
            if not isinstance(headers, dict) or not all(isinstance(v, str) for v in headers.values()):
                raise PluginError(f"{where}: `headers` must map header names to strings, got {headers!r:.120}")
        if spec.get("tools") is not None:
            if not isinstance(spec["tools"], list):
                raise PluginError(f"{where}: `tools` must be a list of tool names, got {spec['tools']!r}")
            spec["tools"] = tuple(spec["tools"])
        timeout = spec.get("startup_timeout", 1.0)
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
            raise PluginError(f"{where}: `startup_timeout` must be a number of seconds > 0, got {timeout!r}")
        return cls(**spec)

    @property
    def label(self) -> str:
        """The server as messages name it: its `name`, else its command line or URL."""
        return self.name or (shlex.join(self.command) if self.command else str(self.url))

    def transport(self, stderr: Any) -> Any:
        """A fresh MCP transport to this server (an async context manager); a stdio server writes to `stderr`."""
        if self.url:
            from mcp.client.streamable_http import streamable_http_client

            if not self.headers:
                return streamable_http_client(self.url)
            return _with_headers(self.url, {k: os.path.expandvars(v) for k, v in self.headers.items()})
        from mcp.client.stdio import StdioServerParameters, stdio_client

        # `python` is the trainer's interpreter, not whichever one PATH finds first: the server then sees the
        # trainer's packages (the MCP SDK, this project) wherever the trainer was started from.
        program = sys.executable if self.command[0] in ("python", "python3") else self.command[0]
        env = {key: os.path.expandvars(str(value)) for key, value in (self.env or {}).items()}
        parameters = StdioServerParameters(command=program, args=list(self.command[1:]), env=env, cwd=self.cwd)
        return stdio_client(parameters, errlog=stderr)


@contextlib.asynccontextmanager
async def _with_headers(url: str, headers: dict[str, str]) -> Any:
    """The streamable HTTP transport to `url` on a client that sends `headers` (with the SDK's own timeouts: 30 s,
    and 300 s to read, as a server may hold a stream open)."""
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0, read=300.0)) as client:
        async with streamable_http_client(url, http_client=client) as streams:
            yield streams


class _StdoutNoise(logging.Filter):
    """The SDK logs a whole traceback for each line a stdio server prints that is not an MCP message (a server's
    own `print`): one line instead, naming the fix, once per process."""

    said = False

    def filter(self, record: logging.LogRecord) -> bool:
        if record.getMessage() != "Failed to parse JSONRPC message from server":
            return True
        if self.said:
            return False
        self.said = True
        record.msg, record.args, record.exc_info, record.exc_text = (
            "an MCP server printed a line to stdout that is not an MCP message; the line is skipped. Over stdio, "
            "stdout carries the protocol: a server writes its own output to stderr (`print(..., file=sys.stderr)`, "
            "or logging)", None, None, None,
        )  # fmt: skip
        return True


logging.getLogger("mcp.client.stdio").addFilter(_StdoutNoise())

_LOOP: tuple[int, asyncio.AbstractEventLoop] | None = None
_LOOP_LOCK = threading.Lock()


def _event_loop() -> asyncio.AbstractEventLoop:
    """The event loop every MCP session of this process runs on, started on first use (again in a forked child)."""
    global _LOOP
    with _LOOP_LOCK:
        if _LOOP is None or _LOOP[0] != os.getpid():
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="mcp-sessions", daemon=True).start()
            _LOOP = (os.getpid(), loop)
        return _LOOP[1]


class MCPSession:
    """One session with one MCP server, opened on creation and held by a task on the shared loop until `close`.

    `call` and `list_tools` may be called from any thread; they wait for the session to start (at most the
    server's `startup_timeout`) and raise on a session that did not start or has ended.
    """

    def __init__(self, spec: MCPServerSpec) -> None:
        self.spec = spec
        self.stderr = tempfile.TemporaryFile() if spec.command else None  # a stdio server's stderr, for messages
        self._client: Any = None
        self._ready: concurrent.futures.Future = concurrent.futures.Future()
        self._ended = threading.Event()
        self._closing = False
        self._stop: asyncio.Event | None = None
        self._scope: Any = None
        self._lost: BaseException | None = None
        self.warned = False  # a failure of this session is logged once
        self._loop = _event_loop()
        asyncio.run_coroutine_threadsafe(self._hold(), self._loop)

    async def _hold(self) -> None:
        import anyio
        from mcp import Client

        try:
            self._stop = asyncio.Event()
            # One task enters and leaves the transport's task groups, as anyio requires; the deadline bounds the
            # start only (lifted once the handshake is done), and cancelling it stops a start still under way.
            with anyio.CancelScope(deadline=anyio.current_time() + self.spec.startup_timeout) as self._scope:
                if not self._closing:
                    async with Client(self.spec.transport(self.stderr)) as client:
                        self._scope.deadline = math.inf
                        self._client = client
                        self._ready.set_result(None)
                        await self._stop.wait()
            if not self._ready.done():
                late = f"no answer within {self.spec.startup_timeout:g} s"
                self._ready.set_exception(TimeoutError("closed before it started" if self._closing else late))
        except Exception as exc:  # noqa: BLE001 - kept for the callers, who turn it into a message
            if not self._ready.done():
                self._ready.set_exception(exc)
            else:
                self._lost = exc
        finally:
            self._client = None
            self._ended.set()

    def _wait_started(self) -> Any:
        self.wait_started()
        if not self._ready.done():
            raise TimeoutError(f"no answer within {self.spec.startup_timeout:g} s")
        self._ready.result()  # raises what stopped the start
        client = self._client
        if client is None:
            raise ConnectionError(f"the session has ended ({reason(self._lost)})" if self._lost else
                                  "the session has ended")  # fmt: skip
        return client

    def wait_started(self) -> None:
        """Wait until the session has started or failed to (at most its `startup_timeout`); raises nothing."""
        concurrent.futures.wait([self._ready], self.spec.startup_timeout + STOP_S)

    @property
    def started(self) -> bool:
        """Whether the session started (it may have ended since)."""
        return self._ready.done() and self._ready.exception() is None

    def _run(self, coroutine: Any, timeout: float) -> Any:
        future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:  # the builtin TimeoutError too, on Python 3.11 and later
            if future.done():
                raise  # the request's own failure
            future.cancel()
            raise TimeoutError(f"no answer within {timeout:g} s") from None

    def list_tools(self) -> list[Any]:
        """Every tool the server offers (its `Tool` records), across pages."""
        client = self._wait_started()

        async def listing() -> list[Any]:
            tools, cursor = [], None
            for _ in range(MAX_TOOL_PAGES):
                page = await client.list_tools(cursor=cursor)
                tools += page.tools
                cursor = page.next_cursor
                if not cursor:
                    break
            return tools

        return self._run(listing(), self.spec.startup_timeout)

    def call(self, tool: str, arguments: dict[str, Any], timeout: float) -> Any:
        """The server's `CallToolResult` for one call, waited for at most `timeout` seconds."""
        client = self._wait_started()
        return self._run(client.call_tool(tool, arguments, read_timeout_seconds=timeout), timeout + 1.0)

    def stop(self) -> None:
        """Ask the session to end (returns at once; `close` waits for it)."""
        self._loop.call_soon_threadsafe(self._shut)

    def _shut(self) -> None:
        self._closing = True
        if self._stop is not None:
            self._stop.set()
        if self._scope is not None and not self._ready.done():
            self._scope.cancel()

    def close(self) -> None:
        """End the session, and a stdio server's process with it; returns once it has ended (or after `STOP_S`)."""
        self.stop()
        if not self._ended.wait(STOP_S):
            logger.warning("MCP server `%s`: its session did not end within %g s", self.spec.label, STOP_S)
        if self.stderr is not None:
            self.stderr.close()

    def stderr_tail(self, limit: int = 600) -> str:
        """The end of what a stdio server wrote to stderr, on one line ("" for none or an HTTP server)."""
        if self.stderr is None or self.stderr.closed:
            return ""
        fd = self.stderr.fileno()
        size = os.fstat(fd).st_size
        data = os.pread(fd, min(size, 8 * limit), max(0, size - 8 * limit))  # the server shares the file offset
        lines = [line.strip() for line in data.decode(errors="replace").splitlines() if line.strip()]
        return " | ".join(lines)[-limit:]


def reason(exc: BaseException | None) -> str:
    """An exception as one line, the first one inside an exception group (anyio's task groups raise those)."""
    while exc is not None and getattr(exc, "exceptions", None):
        exc = exc.exceptions[0]
    text = str(exc).strip().replace("\n", " ")
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
