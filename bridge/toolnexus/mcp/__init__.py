"""MCP (SPEC §12): an MCP server's elicitation becomes a :class:`~toolnexus.Request`.

:func:`load_mcp` connects an agent to MCP servers whose elicitations wait on the
broker; :func:`elicitation_callback` and :func:`fastmcp_elicitation_handler` plug the
same into the MCP frameworks; :func:`elicitation_to_request` and
:func:`answer_to_elicit_result` are the translation both use. Names are imported on
first use: the MCP SDK takes seconds to import. ``load_mcp`` and its types need the
2.x SDK; the callbacks run on 1.x too.
"""

import importlib
import typing as _typing

if _typing.TYPE_CHECKING:
    from ._callback import ElicitationCallback, elicitation_callback, fastmcp_elicitation_handler
    from ._client import McpTool, McpTools, ServerSpec, load_mcp
    from ._config import McpToolset
    from ._errors import McpError, UrlElicitationRequired
    from ._source import answer_to_elicit_result, elicitation_to_request
    from ._tasks import TaskCancelled

_LAZY = {
    "ElicitationCallback": "_callback",
    "McpError": "_errors",
    "McpTool": "_client",
    "McpTools": "_client",
    "McpToolset": "_config",
    "ServerSpec": "_client",
    "TaskCancelled": "_tasks",
    "UrlElicitationRequired": "_errors",
    "answer_to_elicit_result": "_source",
    "elicitation_callback": "_callback",
    "elicitation_to_request": "_source",
    "fastmcp_elicitation_handler": "_callback",
    "load_mcp": "_client",
}
"""Where each name lives; imported on first use."""

_NEEDS_MCP2 = frozenset({"_client", "_config", "_errors", "_tasks"})
"""The modules built on the 2.x SDK's client (``load_mcp``); the callbacks run on 1.x too."""


def __getattr__(name: str) -> _typing.Any:
    if name in _LAZY:
        if _LAZY[name] in _NEEDS_MCP2:
            from ._sdk import require_mcp2

            require_mcp2(f"toolnexus.{name}")
        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "ElicitationCallback",
    "McpError",
    "McpTool",
    "McpTools",
    "McpToolset",
    "ServerSpec",
    "TaskCancelled",
    "UrlElicitationRequired",
    "answer_to_elicit_result",
    "elicitation_callback",
    "elicitation_to_request",
    "fastmcp_elicitation_handler",
    "load_mcp",
]
