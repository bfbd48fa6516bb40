"""A small MCP server for the tests, on the `mcp` SDK's `MCPServer`: stdio by default, streamable HTTP with
`--http PORT`.

Its tools: `multiply` (a calculator), `remember`/`recall` (state that lives as long as the session's server),
`fail` (raises), `hang` (sleeps past any timeout), `pid` (the serving process, for the tests that kill it or
look for orphans), `variable` (what the server's environment holds), `header` (a request's HTTP header). With `MCP_TEST_NOISY` set, it prints
to stdout (where the protocol runs) before serving, as a server whose author meant a console would. With `MCP_TEST_PID_DIR` set, the process writes an empty file named after its pid there on
start, so a test can find every server a run started.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Annotated

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field

server = MCPServer("test-tools")
NOTES: list[str] = []


@server.tool(description="Multiply two numbers exactly.")
def multiply(
    a: Annotated[int, Field(description="The first factor.")], b: Annotated[int, Field(description="The second.")]
) -> str:
    return str(a * b)


@server.tool(description="Keep a note for later in this session.")
def remember(note: str) -> str:
    NOTES.append(note)
    return f"{len(NOTES)} note(s) kept"


@server.tool(description="The notes kept so far in this session.")
def recall() -> str:
    return "; ".join(NOTES) or "no notes"


@server.tool(description="Always fails.")
def fail(reason: str) -> str:
    raise ToolError(f"the tool failed on purpose: {reason}")


@server.tool(description="Sleeps for a long time.")
def hang() -> str:
    time.sleep(3600)
    return "woke up"


@server.tool(description="The id of the serving process.")
def pid() -> str:
    return str(os.getpid())


@server.tool(description="The value of one of the server's environment variables.")
def variable(name: str) -> str:
    return os.environ.get(name, "(unset)")


@server.tool(description="The value of one of the request's HTTP headers.")
def header(name: str, ctx: Context) -> str:
    return (ctx.headers or {}).get(name.lower(), "(none)")


if __name__ == "__main__":
    if os.environ.get("MCP_TEST_NOISY"):
        print("debug: starting the test tools", flush=True)
    if os.environ.get("MCP_TEST_PID_DIR"):
        (Path(os.environ["MCP_TEST_PID_DIR"]) / str(os.getpid())).touch()
    if len(sys.argv) == 3 and sys.argv[1] == "--http":
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run()
