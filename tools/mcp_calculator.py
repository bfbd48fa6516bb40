"""The calculator as an MCP server over stdio: `python -m agentic_grpo.tools.mcp_calculator`.

The same exact arithmetic as `agentic_grpo.tools.calculator:Calculator`, served by the `mcp` SDK's `MCPServer`,
so a recipe can train against it as against any MCP server (recipes/cpu_mcp.yaml, docs/mcp.md).
"""

from __future__ import annotations

from typing import Annotated

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field

from agentic_grpo.tools.calculator import evaluate

server = MCPServer("calculator")


@server.tool(description="Evaluate an arithmetic expression exactly.")
def calculator(
    expression: Annotated[str, Field(description='Numbers with + - * / // % ** and parentheses, e.g. "123 * 456".')],
) -> str:
    try:
        value = evaluate(expression)
    except ValueError as exc:
        # ToolError: the message reaches the model (the SDK hides other exceptions' text from the client)
        raise ToolError(str(exc)) from None
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        value = int(value)
    return str(value)


if __name__ == "__main__":
    server.run()
