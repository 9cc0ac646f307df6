"""Errors of MCP requests, raised as toolnexus errors that are also the SDK's ``MCPError``.

Everything ``load_mcp`` and its tools raise is a :class:`~toolnexus.ToolnexusError`.
What the MCP SDK raises is translated at the boundary (``raise ... from exc``):

- a JSON-RPC error from the server (or the SDK's stand-in: a read timeout is
  ``-32001``, a closed connection ``-32000``) → :class:`McpError` with the same
  ``code``, ``message`` and ``data``;
- ``-32042`` (URL elicitation required) → :class:`UrlElicitationRequired`;
- a reply that does not conform to the negotiated protocol (the SDK's pydantic
  validation) or a server that keeps asking past the SDK's round limit →
  :class:`McpError` with code ``-32603`` and a message naming what was wrong;
- a server that cannot be started or reached → :class:`~toolnexus.ServerUnavailable`.

Both classes derive from ``mcp.shared.exceptions.MCPError`` too, so code written for
the SDK's errors (``except MCPError``, ``exc.code``) keeps working.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import anyio
import httpx2
import pydantic
from mcp.client import InputRequiredRoundsExceededError
from mcp.shared.exceptions import MCPError, UrlElicitationRequiredError
from mcp_types import INTERNAL_ERROR, ElicitRequestURLParams

from ..errors import ServerUnavailable, ToolnexusError


class McpError(ToolnexusError, MCPError):
    """An MCP request failed: ``code``, ``message`` and ``data`` as in the JSON-RPC error;
    ``server`` names the server (the message is the server's own)."""

    def __init__(self, code: int, message: str, data: Any = None, *, server: str | None = None):
        MCPError.__init__(self, code, message, data)
        self.server = server

    def __str__(self) -> str:
        if self.server is None:
            return self.message
        return f"MCP server {self.server!r}: {self.message}"


class UrlElicitationRequired(McpError, UrlElicitationRequiredError):
    """``-32042``: the server needs URL elicitations (``elicitations``) that were not
    accepted (or there was no ``wait_for`` to ask)."""

    def __init__(
        self,
        elicitations: list[ElicitRequestURLParams],
        message: str | None = None,
        *,
        server: str | None = None,
    ) -> None:
        UrlElicitationRequiredError.__init__(self, elicitations, message)
        self.server = server


def translate(exc: BaseException, server: str | None) -> ToolnexusError | None:
    """The toolnexus error for ``exc`` (or the first such leaf of an exception group),
    or None if it is not one the MCP SDK raises for a failed request."""
    if isinstance(exc, BaseExceptionGroup):
        if exc.subgroup(lambda leaf: isinstance(leaf, anyio.get_cancelled_exc_class())):
            return None  # a cancellation is never turned into an error
        for leaf in exc.exceptions:
            found = translate(leaf, server)
            if found is not None:
                return found
        return None
    if isinstance(exc, ToolnexusError):
        return exc
    if isinstance(exc, UrlElicitationRequiredError):
        return UrlElicitationRequired(exc.elicitations, exc.message, server=server)
    if isinstance(exc, MCPError):
        return McpError(exc.code, exc.message, exc.data, server=server)
    if isinstance(exc, pydantic.ValidationError):
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "the result"
        return McpError(
            INTERNAL_ERROR,
            f"the server's reply does not conform to the MCP protocol: {where}: {first['msg']}",
            server=server,
        )
    if isinstance(exc, InputRequiredRoundsExceededError):
        return McpError(INTERNAL_ERROR, str(exc), server=server)
    if isinstance(exc, OSError | httpx2.TransportError):
        return ServerUnavailable(server, f"{type(exc).__name__}: {exc}")
    return None


def alone(group: BaseExceptionGroup[Any], raised: BaseException | None) -> BaseException | None:
    """``raised`` if ``group`` holds it and nothing else, else None.

    A task group wraps whatever leaves the block it encloses: the exception the body of
    ``async with load_mcp(...)`` raised (a :class:`~toolnexus.mcp.TaskCancelled` among them)
    left it as an ``ExceptionGroup`` for each of the session's task groups, which
    ``except TaskCancelled`` does not catch (issue #43). Raise what this returns instead.
    """
    if raised is None:
        return None
    _, rest = group.split(lambda leaf: leaf is raised)
    return raised if rest is None else None


@contextmanager
def translated(server: str | None) -> Iterator[None]:
    """Raise what the MCP SDK raises inside as toolnexus errors (see :func:`translate`)."""
    try:
        yield
    except BaseException as exc:
        error = translate(exc, server)
        if error is None or error is exc:
            raise
        raise error from exc
