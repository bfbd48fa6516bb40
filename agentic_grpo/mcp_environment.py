"""MCP servers as tool environments: a recipe's `environment: {mcp: ...}` (docs/mcp.md).

```yaml
environment:
  mcp:                                   # one server, or a list of them
    command: [python, -m, agentic_grpo.tools.mcp_calculator]    # stdio; or `url: http://host:8000/mcp`
  class: my_tools:Tools                  # optional: a Python environment whose tools come beside the servers'
```

At start-up each server is started once and asked for its tools: one that does not start or answer is refused,
naming its command (with the end of its stderr) or its URL. Its tools, with their JSON schemas, become methods of a
`ToolEnvironment` subclass (`with_mcp_servers`), so every format and check sees them as it sees Python tools.
Each trajectory opens its own session with each server when its environment is reset (over stdio: a server
process of its own) and closes it with the environment. A failed call, a server that died, a session that never
started and a call past `tool_timeout` all come back as observations. Sessions: `agentic_grpo.mcp_session`.
"""

from __future__ import annotations

import copy
import difflib
import inspect
import json
import logging
from collections.abc import Callable
from typing import Any, ClassVar

from agentic_grpo.environment import RESERVED, ToolEnvironment
from agentic_grpo.mcp_session import MCPServerSpec, MCPSession, reason
from agentic_grpo.plugins import PluginError
from agentic_grpo.trajectory import ToolResult

logger = logging.getLogger(__name__)

ENVIRONMENT_KEYS = ("mcp", "class")
REQUEST_TIMEOUT = -32001  # the JSON-RPC error code of the SDK's read timeout (mcp_types.REQUEST_TIMEOUT)
# Names an environment instance sets on itself: a tool of that name would be shadowed by the attribute.
INSTANCE_NAMES = {"workspace", "sandbox", "inner", "reset_observation"}


def environment_parts(value: dict[str, Any]) -> tuple[str | None, list[MCPServerSpec]]:
    """A recipe's `environment` mapping as (the Python environment's import path or None, the MCP servers)."""
    for key in value:
        if key not in ENVIRONMENT_KEYS:
            close = difflib.get_close_matches(str(key), ENVIRONMENT_KEYS, n=1)
            hint = f"did you mean `{close[0]}`?" if close else "it takes `mcp` (servers) and `class` (Python tools)"
            raise PluginError(f"recipe field `environment`: key `{key}` is not known; {hint}")
    servers = value.get("mcp")
    if not servers:
        raise PluginError("recipe field `environment`: a mapping names MCP servers under `mcp` (one server, or a "
                          "list); a Python environment alone is its import path, `environment: module:Class`")  # fmt: skip
    entries = servers if isinstance(servers, list) else [servers]
    where = "recipe field `environment`, MCP server"
    numbered = [f"{where} {i + 1}" for i in range(len(entries))] if len(entries) > 1 else [where]
    return value.get("class"), [MCPServerSpec.from_recipe(e, w) for e, w in zip(entries, numbered, strict=True)]


def server_tools(spec: MCPServerSpec) -> list[Any]:
    """The tools the server offers, asked at start-up; PluginError naming the server when it does not answer."""
    session = MCPSession(spec)
    try:
        return session.list_tools()
    except Exception as exc:  # noqa: BLE001 - re-raised as one line naming the server
        what = f"MCP server `{spec.label}` " + ("did not start" if spec.command else "did not answer")
        tail = session.stderr_tail()
        raise PluginError(f"{what}: {reason(exc)}" + (f"; its stderr ends: {tail}" if tail else "")) from None
    finally:
        session.close()


def tool_schema(tool: Any) -> dict[str, Any]:
    """An MCP `Tool` as the JSON schema the formats read: `{type: function, function: {name, description,
    parameters}}` (pydantic's `title` entries dropped: they repeat the names)."""
    parameters = copy.deepcopy(tool.input_schema or {})
    parameters.pop("title", None)
    parameters.setdefault("type", "object")
    properties = parameters.setdefault("properties", {})
    for prop in properties.values():
        if isinstance(prop, dict):
            prop.pop("title", None)
    description = inspect.cleandoc(tool.description or getattr(tool, "title", None) or tool.name)
    return {"type": "function", "function": {"name": tool.name, "description": description, "parameters": parameters}}


def observation(result: Any) -> ToolResult:
    """A `CallToolResult` as what the model reads: text content joined, other content named; an error result is
    an error observation."""
    parts = []
    for block in result.content or []:
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(block.text)
        elif kind in ("image", "audio"):
            parts.append(f"[{kind}: {block.mime_type}]")
        elif kind == "resource":
            parts.append(getattr(block.resource, "text", None) or f"[resource: {block.resource.uri}]")
        elif kind == "resource_link":
            parts.append(f"[resource link: {block.uri}]")
        else:
            parts.append(f"[{kind or type(block).__name__}]")
    text = "\n".join(parts)
    if not text and result.structured_content is not None:
        text = json.dumps(result.structured_content)
    if result.is_error:
        text = text or "the tool failed"
        message = text if text.lower().startswith("error") else f"Error: {text}"
        return ToolResult(output=message, error=message)
    return ToolResult(output=text)


# --- the environment -----------------------------------------------------------------------------------------


class MCPTools(ToolEnvironment):
    """The MCP side of an environment built by `with_mcp_servers`: a session per server per trajectory, opened by
    `reset` (the servers start while the model writes its first turn) and closed by `close`."""

    mcp_servers: ClassVar[tuple[MCPServerSpec, ...]] = ()
    mcp_tool_servers: ClassVar[dict[str, int]] = {}
    """Each server tool's name, and the index of its server in `mcp_servers`."""

    @classmethod
    def tools(cls) -> dict[str, Callable]:
        # A TRL environment's `tools()` lists its wrapped class's methods only: the servers' are added here.
        return {**super().tools(), **{name: getattr(cls, name) for name in cls.mcp_tool_servers}}

    def reset(self, row: dict[str, Any]) -> None:
        self._close_sessions()
        self._mcp_sessions = [MCPSession(spec) for spec in self.mcp_servers]
        super().reset(row)

    def execute(self, call: Any, timeout: float) -> ToolResult:
        self._mcp_timeout = timeout  # what the server's call may take; one call at a time per trajectory
        server = self.mcp_tool_servers.get(call.name)
        if server is not None and getattr(self, "_mcp_sessions", None):
            # The server's start is not the call's: `timeout` then bounds the call alone.
            self._mcp_sessions[server].wait_started()
        return super().execute(call, timeout)

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._close_sessions()

    def _close_sessions(self) -> None:
        sessions, self._mcp_sessions = getattr(self, "_mcp_sessions", []), []
        for session in sessions:  # all asked first, then waited for: the servers stop side by side
            session.stop()
        for session in sessions:
            session.close()

    def _call_mcp(self, server: int, tool: str, arguments: dict[str, Any]) -> ToolResult:
        sessions = getattr(self, "_mcp_sessions", None)
        if not sessions:
            raise RuntimeError("the environment has no MCP session: `reset` opens them")
        session, spec = sessions[server], self.mcp_servers[server]
        timeout = getattr(self, "_mcp_timeout", 30.0)
        try:
            return observation(session.call(tool, arguments, timeout))
        except Exception as exc:  # noqa: BLE001 - a server's failure is an observation, like any tool error
            late = isinstance(exc, TimeoutError) or getattr(exc, "code", None) == REQUEST_TIMEOUT
            if late and session.started:  # the call's own time ran out (a session slow to start failed instead)
                message = f"Error: `{tool}` timed out after {timeout:g} s."
                return ToolResult(output=message, error="timeout", timed_out=True)
            if not session.warned:
                session.warned = True
                tail = session.stderr_tail()
                logger.warning("MCP server `%s` failed on `%s`: %s%s", spec.label, tool, reason(exc),
                               f"; its stderr ends: {tail}" if tail else "")  # fmt: skip
            message = f"Error: MCP server `{spec.label}` failed: {reason(exc)}"
            return ToolResult(output=message, error=message)


def _tool_method(server: int, name: str, schema: dict[str, Any]) -> Callable:
    """A method that calls tool `name` of server number `server`; it carries its schema (`tool_schema`)."""

    def tool(self: MCPTools, **arguments: Any) -> ToolResult:
        return self._call_mcp(server, name, arguments)

    tool.__name__ = tool.__qualname__ = name
    tool.__doc__ = schema["function"]["description"]
    tool.tool_schema = schema
    return tool


def with_mcp_servers(base: type[ToolEnvironment], servers: list[MCPServerSpec]) -> type[ToolEnvironment]:
    """A subclass of `base` whose tools are `base`'s and the servers' (each server is started and asked for its
    tools now); raises PluginError on a server that does not answer, a tool it lacks, or a clash of names."""
    owners = {name: f"`{base.__name__}`" for name in base.tools()}
    methods: dict[str, Callable] = {}
    routes: dict[str, int] = {}
    for index, spec in enumerate(servers):
        offered = {tool.name: tool for tool in server_tools(spec)}
        chosen = list(offered) if spec.tools is None else spec.tools
        missing = [name for name in chosen if name not in offered]
        if missing:
            raise PluginError(f"MCP server `{spec.label}` has no tool {', '.join(missing)} (its key `tools`); it has: "
                              f"{', '.join(sorted(offered)) or 'none'}")  # fmt: skip
        for name in chosen:
            if name in owners:
                raise PluginError(f"tool `{name}` is offered by {owners[name]} and by MCP server `{spec.label}`: keep "
                                  "one with the server's key `tools`")  # fmt: skip
            if name.startswith("_") or name in RESERVED or name in INSTANCE_NAMES or hasattr(base, name):
                raise PluginError(f"MCP server `{spec.label}`: tool `{name}` has a name this project's environments "
                                  "keep for themselves; leave it out with the server's key `tools`")  # fmt: skip
            owners[name] = f"MCP server `{spec.label}`"
            methods[name] = _tool_method(index, name, tool_schema(offered[name]))
            routes[name] = index
    alone = base is ToolEnvironment
    namespace = {"mcp_servers": tuple(servers), "mcp_tool_servers": routes, **methods,
                 "__module__": __name__ if alone else base.__module__,
                 "__doc__": MCPTools.__doc__ if alone else base.__doc__}  # fmt: skip
    return type("MCPTools" if alone else base.__name__, (MCPTools, base), namespace)
