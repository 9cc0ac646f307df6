"""What ``load_mcp`` connects to: stdio commands, streamable-HTTP URLs, in-process servers and
SDK transports, each read so that a 2026-07-28 result without ``resultType`` is complete."""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TypeAlias
from urllib.parse import urlsplit

import httpx2
from mcp.client import Transport
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.server import Server
from mcp.server.mcpserver import MCPServer
from mcp.shared.message import SessionMessage
from mcp_types import JSONRPCResponse

from ..errors import ConfigurationError

ServerSpec: TypeAlias = (
    "str | Sequence[str] | StdioServerParameters | Server[Any] | MCPServer | Transport"
)
"""What ``load_mcp`` connects to: a stdio command line (string or argv list), the SDK's
``StdioServerParameters``, an ``http(s)://`` streamable-HTTP URL, an in-process
``MCPServer`` or low-level ``Server``, or any SDK ``Transport``."""

Connectable: TypeAlias = "Server[Any] | MCPServer | Transport"

HTTP_TIMEOUT_S = 30.0
"""Connect, write and pool timeout of the streamable-HTTP client (reads wait for a person)."""


@dataclass(frozen=True)
class Target:
    """How to reach one server: ``connect()`` makes what the SDK ``Client`` takes (a fresh
    one each time when ``reusable``); ``label`` is a fallback name for the server, and
    ``stdio`` the command of a stdio server."""

    connect: Callable[[], Connectable]
    label: str | None
    reusable: bool = True
    stdio: StdioServerParameters | None = None
    http: bool = False


def target(
    server: ServerSpec, headers: Mapping[str, str] | None = None, auth: httpx2.Auth | None = None
) -> Target:
    """The :class:`Target` for ``server``.

    Raises:
        ConfigurationError: an empty command line, or ``auth`` for a server that is not an
            ``http(s)://`` URL.
    """
    if isinstance(server, str):
        parts = urlsplit(server)
        if parts.scheme in ("http", "https"):
            url = server
            return Target(
                lambda: _completing(_http_transport(url, headers, auth)), parts.hostname, http=True
            )
    if auth is not None:
        raise ConfigurationError(
            "auth= authenticates an http(s):// URL's requests; give an SDK transport its own "
            "httpx2 client instead"
        )
    if isinstance(server, str):
        server = shlex.split(server)
    if isinstance(server, StdioServerParameters):
        return _stdio(server)
    if isinstance(server, MCPServer | Server):
        inprocess = server
        return Target(lambda: inprocess, inprocess.name)
    if isinstance(server, Sequence):
        argv = [str(arg) for arg in server]
        if not argv:
            raise ConfigurationError("an MCP server command line must not be empty")
        return _stdio(StdioServerParameters(command=argv[0], args=argv[1:]))
    transport = server
    return Target(lambda: _completing(transport), None, reusable=False)


def _stdio(params: StdioServerParameters) -> Target:
    label = os.path.basename(params.command)
    return Target(lambda: _completing(stdio_client(params)), label, stdio=params)


@asynccontextmanager
async def _http_transport(
    url: str, headers: Mapping[str, str] | None, auth: httpx2.Auth | None
) -> AsyncIterator[Any]:
    """Streamable HTTP with no read timeout: a response stream may idle while a person answers."""
    timeout = httpx2.Timeout(HTTP_TIMEOUT_S, read=None)
    hooks = {"request": [_method_header]}
    client = httpx2.AsyncClient(
        headers=dict(headers or {}), timeout=timeout, event_hooks=hooks, auth=auth
    )
    async with (
        client as http,
        streamable_http_client(url, http_client=http) as streams,
    ):
        yield streams


async def _method_header(request: httpx2.Request) -> None:
    """``Mcp-Method`` on every POST of a JSON-RPC request or notification, as 2026-07-28
    requires; the SDK sets it on 2026-07-28 requests only, and earlier revisions ignore it
    (a 2026-07-28 server that refuses the handshake can then tell what was refused)."""
    if request.method != "POST" or "mcp-method" in request.headers:
        return
    try:
        message = json.loads(request.content)
    except ValueError:
        return
    if isinstance(message, dict) and isinstance(message.get("method"), str):
        request.headers["Mcp-Method"] = message["method"]


@asynccontextmanager
async def _completing(transport: Transport) -> AsyncIterator[Any]:
    """``transport`` with its read side passed through :class:`_CompleteResults`."""
    async with transport as (read, write):
        yield _CompleteResults(read), write


class _CompleteResults:
    """A transport's read stream on which a result without ``resultType`` reads as
    ``"complete"``: the 2026-07-28 spec's default, which the SDK's validation does not
    apply. Earlier revisions have no ``resultType``; the SDK drops it from their results."""

    __slots__ = ("_inner",)

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    @property
    def last_context(self) -> Any:
        """The sender's context of the last message (the SDK's dispatcher runs handlers in it)."""
        return getattr(self._inner, "last_context", None)

    async def receive(self) -> SessionMessage | Exception:
        return _complete(await self._inner.receive())

    def __aiter__(self) -> _CompleteResults:
        return self

    async def __anext__(self) -> SessionMessage | Exception:
        return _complete(await self._inner.__anext__())

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> _CompleteResults:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        await self.aclose()


def _complete(item: SessionMessage | Exception) -> SessionMessage | Exception:
    if isinstance(item, SessionMessage) and isinstance(item.message, JSONRPCResponse):
        result = item.message.result
        if isinstance(result, dict) and "resultType" not in result:
            result["resultType"] = "complete"
    return item
