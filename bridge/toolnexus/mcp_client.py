"""``load_mcp``: an MCP server's tools for an agent, each question the server asks answered
through one ``wait_for`` (SPEC §2).

Every way an MCP server asks goes ``elicitation_to_request`` → ``wait_for`` →
``answer_to_elicit_result``:

- ``elicitation/create`` (protocol ≤ 2025-11-25), form and URL mode: the SDK's
  elicitation callback.
- ``InputRequiredResult`` input requests (2026-07-28): the SDK's multi-round-trip
  driver hands each embedded elicitation to that same callback, then retries the call.
- The ``-32042`` URL-elicitation-required error: each listed URL elicitation becomes
  an ``authorization`` request; once all are accepted the call is sent again (at most
  :data:`MAX_URL_ROUNDS` times). If one is declined or cancelled, the others are
  withdrawn and the error is raised as the SDK's ``UrlElicitationRequiredError`` (an
  ``MCPError`` with code ``-32042``), exactly what the SDK alone would have raised.
- ``notifications/elicitation/complete`` (≤ 2025-11-25): ``on_complete(request_id)``
  for the authorization request that carried that elicitation id; unknown, declined
  and already completed ids are ignored.

Time: a read timeout (``read_timeout_s``) measures the server only. The SDK's own
clock keeps running while a person answers, so ``tools/call`` is sent without one
and timed here by a clock that stops while any elicitation of the call is waiting
on a person. That wait is bounded by the request's own deadline (``timeout_s``,
per ``load_mcp`` and per call; the broker's default when ``None``). When a tool call
ends — returned, cancelled, timed out — or the session closes, the elicitations
still waiting for it are cancelled, which withdraws their requests.
"""

from __future__ import annotations

import contextvars
import logging
import math
import os
import shlex
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, TypeAlias
from urllib.parse import urlsplit

import anyio
import anyio.abc
import httpx2
import pydantic
from mcp import Client
from mcp.client import ClientRequestContext, IncomingMessage, Transport
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.server import Server
from mcp.server.mcpserver import MCPServer
from mcp.shared.exceptions import MCPError, UrlElicitationRequiredError
from mcp_types import (
    INVALID_PARAMS,
    REQUEST_TIMEOUT,
    URL_ELICITATION_REQUIRED,
    CallToolResult,
    ElicitCompleteNotification,
    ElicitRequestParams,
    ElicitRequestURLParams,
    ElicitResult,
    ErrorData,
    Tool,
)

from .broker import Broker
from .errors import ConfigurationError, InvalidAnswer, InvalidRequest, NotResolved
from .mcp_source import answer_to_elicit_result, elicitation_to_request
from .models import Answer, Request, Source, WaitFor
from .schema import check_answer

log = logging.getLogger(__name__)

ServerSpec: TypeAlias = (
    "str | Sequence[str] | StdioServerParameters | Server[Any] | MCPServer | Transport"
)
"""What ``load_mcp`` connects to: a stdio command line (string or argv list), the SDK's
``StdioServerParameters``, an ``http(s)://`` streamable-HTTP URL, an in-process
``MCPServer`` or low-level ``Server``, or any SDK ``Transport``."""

OnComplete: TypeAlias = Callable[[str], Awaitable[None]]
"""Called with a request id when the server says its authorization step is done."""

MAX_URL_ROUNDS = 3
"""How many times one tool call is sent again after ``-32042`` errors whose URLs were accepted."""

HTTP_TIMEOUT_S = 30.0
"""Connect, write and pool timeout of the streamable-HTTP client (reads wait: see above)."""

_REMEMBERED_AUTHORIZATIONS = 1024
_MAX_TOOL_PAGES = 100

_current_call: contextvars.ContextVar[_Call | None] = contextvars.ContextVar(
    "toolnexus_mcp_call", default=None
)


class _Clock:
    """A read timeout spent only while no person is being asked: the budget left moves
    the deadline of the call's cancel scope, and is frozen while paused."""

    def __init__(self, timeout_s: float, scope: anyio.CancelScope) -> None:
        self._budget = timeout_s
        self._scope = scope
        self._pauses = 0
        scope.deadline = anyio.current_time() + timeout_s

    def pause(self) -> None:
        if not self._pauses:
            self._budget = max(0.0, self._scope.deadline - anyio.current_time())
            self._scope.deadline = math.inf
        self._pauses += 1

    def resume(self) -> None:
        self._pauses -= 1
        if not self._pauses:
            self._scope.deadline = anyio.current_time() + self._budget


@dataclass(eq=False)
class _Wait:
    """One elicitation waiting for a person, on behalf of the calls still in ``calls``."""

    scope: anyio.CancelScope
    calls: set[_Call]


@dataclass(eq=False)
class _Call:
    """One ``tools/call`` in flight."""

    name: str
    timeout_s: float | None
    clock: _Clock | None = None
    active: bool = True
    waits: set[_Wait] = field(default_factory=set)

    def attach(self, wait: _Wait) -> None:
        self.waits.add(wait)
        if self.clock is not None:
            self.clock.pause()

    def detach(self, wait: _Wait) -> None:
        self.waits.discard(wait)
        if self.active and self.clock is not None:
            self.clock.resume()

    def end(self) -> None:
        """The call is over: cancel the waits that no other call still needs."""
        self.active = False
        for wait in self.waits:
            wait.calls.discard(self)
            if not wait.calls:
                wait.scope.cancel()


class _Session:
    """The elicitation side of one ``load_mcp`` session."""

    def __init__(
        self,
        *,
        wait_for: WaitFor | None,
        timeout_s: float | None,
        read_timeout_s: float | None,
        agent: str | None,
        on_complete: OnComplete | None,
        label: str | None,
    ) -> None:
        self.wait_for = wait_for
        self.timeout_s = timeout_s
        self.read_timeout_s = read_timeout_s
        self.agent = agent
        self.on_complete = on_complete
        self.server_name = label
        self.client: Client | None = None
        self._inflight: set[_Call] = set()
        self._authorizations: OrderedDict[str, str] = OrderedDict()

    # -- tool calls -------------------------------------------------------------------

    async def call_tool(
        self,
        name: str,
        arguments: dict[str, Any],
        timeout_s: float | None,
        read_timeout_s: float | None,
    ) -> CallToolResult:
        call = _Call(name, timeout_s if timeout_s is not None else self.timeout_s)
        read_timeout = read_timeout_s if read_timeout_s is not None else self.read_timeout_s
        token = _current_call.set(call)
        self._inflight.add(call)
        try:
            with anyio.CancelScope() as scope:
                if read_timeout is not None:
                    call.clock = _Clock(read_timeout, scope)
                return await self._send(call, arguments)
            raise MCPError(code=REQUEST_TIMEOUT, message="Request 'tools/call' timed out")
        finally:
            self._inflight.discard(call)
            call.end()
            _current_call.reset(token)

    async def _send(self, call: _Call, arguments: dict[str, Any]) -> CallToolResult:
        assert self.client is not None
        rounds = 0
        while True:
            try:
                # An infinite SDK read timeout: this call is timed by its own _Clock.
                return await self.client.call_tool(
                    call.name, arguments, read_timeout_seconds=math.inf
                )
            except MCPError as exc:
                if exc.code != URL_ELICITATION_REQUIRED or self.wait_for is None:
                    raise
                error = _url_elicitation_required(exc)
                rounds += 1
                if error is None or rounds > MAX_URL_ROUNDS:
                    raise
                if not await self._authorize(call, error.elicitations):
                    if error is exc:
                        raise
                    raise error from exc

    async def _authorize(self, call: _Call, elicitations: list[ElicitRequestURLParams]) -> bool:
        """Ask for every URL elicitation at once; True if all are accepted (the first
        refusal withdraws the others)."""
        accepted: list[bool] = []

        async def ask(params: ElicitRequestURLParams, group: anyio.abc.TaskGroup) -> None:
            result = await self.answer(params, call)
            if isinstance(result, ElicitResult) and result.action == "accept":
                accepted.append(True)
            else:
                group.cancel_scope.cancel()

        async with anyio.create_task_group() as group:
            for params in elicitations:
                group.start_soon(ask, params, group)
        return len(accepted) == len(elicitations)

    # -- elicitations -------------------------------------------------------------------

    async def elicitation_callback(
        self, context: ClientRequestContext, params: ElicitRequestParams
    ) -> ElicitResult | ErrorData:
        """The SDK's elicitation callback: legacy requests and 2026-07-28 input requests."""
        return await self.answer(params, _current_call.get())

    async def answer(self, params: Any, hint: _Call | None) -> ElicitResult | ErrorData:
        """Ask ``wait_for`` for one elicitation made during ``hint`` (or an unknown call)."""
        assert self.wait_for is not None
        if hint is not None and not hint.active:
            return ElicitResult(action="cancel")
        calls = {hint} if hint is not None else set(self._inflight)
        only = next(iter(calls)) if len(calls) == 1 else None
        timeout_s = only.timeout_s if only is not None else self.timeout_s
        source = Source(
            server=self.server_name, tool=only.name if only is not None else None, agent=self.agent
        )
        try:
            request = elicitation_to_request(params, source=source, timeout_s=timeout_s)
        except InvalidRequest as exc:
            return ErrorData(code=INVALID_PARAMS, message=str(exc))
        url_mode = request.kind == "authorization"
        elicitation_id = request.meta.get("elicitation_id")
        if url_mode and isinstance(elicitation_id, str):
            self._remember(elicitation_id, request.id)
        answer = await self._wait(request, calls)
        if url_mode and isinstance(elicitation_id, str) and not (answer and answer.ok):
            self._authorizations.pop(elicitation_id, None)
        if answer is None:
            return ElicitResult(action="cancel")
        try:
            return answer_to_elicit_result(check_answer(request, answer, None), url_mode=url_mode)
        except InvalidAnswer as exc:
            log.warning(
                "answer to %s breaks its form (%s): the server gets cancel", request.id, exc
            )
            return ElicitResult(action="cancel")

    async def _wait(self, request: Request, calls: set[_Call]) -> Answer | None:
        """``wait_for(request)`` with the calls' clocks stopped; None if the calls all ended."""
        assert self.wait_for is not None
        with anyio.CancelScope() as scope:
            wait = _Wait(scope, set(calls))
            for call in calls:
                call.attach(wait)
            try:
                return await self.wait_for(request)
            finally:
                for call in calls:
                    call.detach(wait)
        return None

    # -- completion ---------------------------------------------------------------------

    def _remember(self, elicitation_id: str, request_id: str) -> None:
        self._authorizations[elicitation_id] = request_id
        self._authorizations.move_to_end(elicitation_id)
        while len(self._authorizations) > _REMEMBERED_AUTHORIZATIONS:
            self._authorizations.popitem(last=False)

    async def message_handler(self, message: IncomingMessage) -> None:
        """The SDK's message handler: completion notifications go to ``on_complete``."""
        if not isinstance(message, ElicitCompleteNotification):
            return
        request_id = self._authorizations.pop(message.params.elicitation_id, None)
        if request_id is None or self.on_complete is None:
            return
        try:
            await self.on_complete(request_id)
        except NotResolved as exc:
            log.debug("completion of %s ignored: %s", request_id, exc)


def _url_elicitation_required(exc: MCPError) -> UrlElicitationRequiredError | None:
    """The typed ``-32042`` error (``exc`` itself if it is one); None if it lists no URL."""
    error = exc
    if not isinstance(error, UrlElicitationRequiredError):
        try:
            error = UrlElicitationRequiredError.from_error(exc.error)
        except (pydantic.ValidationError, AttributeError, TypeError):
            log.warning("malformed -32042 error data: %r", exc.data)
            return None
    return error if error.elicitations else None


class McpTool:
    """One tool of an MCP server: ``name``, ``description``, ``input_schema``, and the SDK's
    full ``definition``. ``await tool(**arguments)`` calls it and returns the SDK's
    ``CallToolResult`` (a tool's own failure is a result with ``is_error=True``)."""

    __slots__ = ("_session", "definition")

    def __init__(self, definition: Tool, session: _Session) -> None:
        self.definition = definition
        self._session = session

    @property
    def name(self) -> str:
        """The tool's name."""
        return self.definition.name

    @property
    def description(self) -> str | None:
        """What the tool does, for the model."""
        return self.definition.description

    @property
    def input_schema(self) -> dict[str, Any]:
        """The JSON Schema of the tool's arguments."""
        return self.definition.input_schema

    async def __call__(self, /, **arguments: Any) -> CallToolResult:
        """Call the tool with ``arguments`` (see :meth:`call`)."""
        return await self.call(arguments)

    async def call(
        self,
        arguments: Mapping[str, Any] | None = None,
        *,
        timeout_s: float | None = None,
        read_timeout_s: float | None = None,
    ) -> CallToolResult:
        """Call the tool; ``timeout_s`` bounds each person's answer and ``read_timeout_s`` the
        server's own time, for this call only (``load_mcp``'s values when ``None``).

        Raises:
            mcp.shared.exceptions.MCPError: a protocol error, including ``-32001`` when the
                read timeout passes and ``UrlElicitationRequiredError`` (``-32042``) when a
                required URL elicitation was not accepted.
        """
        return await self._session.call_tool(
            self.name, dict(arguments or {}), timeout_s, read_timeout_s
        )

    def __repr__(self) -> str:
        return f"<McpTool {self.name!r} of {self._session.server_name!r}>"


class McpTools(Mapping[str, McpTool]):
    """The tools of one MCP server by name (read-only), with ``server_name``,
    ``protocol_version`` and the SDK ``client`` for anything else."""

    def __init__(self, tools: Sequence[Tool], session: _Session, client: Client) -> None:
        self._tools = {tool.name: McpTool(tool, session) for tool in tools}
        self._session = session
        self.client = client

    @property
    def server_name(self) -> str | None:
        """The server's name (its ``serverInfo``, else the host or command it was reached by)."""
        return self._session.server_name

    @property
    def protocol_version(self) -> str:
        """The MCP protocol version the session negotiated."""
        return self.client.protocol_version

    def __getitem__(self, name: str) -> McpTool:
        return self._tools[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._tools)

    def __len__(self) -> int:
        return len(self._tools)

    def __repr__(self) -> str:
        return f"<McpTools of {self.server_name!r}: {', '.join(self._tools)}>"


@asynccontextmanager
async def load_mcp(
    server: ServerSpec,
    *,
    wait_for: WaitFor | None = None,
    timeout_s: float | None = None,
    read_timeout_s: float | None = None,
    agent: str | None = None,
    on_complete: OnComplete | None = None,
    mode: str = "auto",
    headers: Mapping[str, str] | None = None,
) -> AsyncIterator[McpTools]:
    """Connect to ``server`` and yield its tools; with ``wait_for``, elicitation is advertised.

    ``timeout_s`` is how long a person has to answer each elicitation; ``read_timeout_s``
    bounds each request to the server, not counting time spent waiting on a person.
    ``agent`` names this agent in every request's ``source``. ``on_complete`` receives
    the request id of an authorization the server reports complete; by default, when
    ``wait_for`` is a broker's bound ``wait_for``, it is that broker's ``complete``.
    ``mode`` is the SDK's: ``"auto"`` (negotiate), ``"legacy"`` (2025-11-25 handshake)
    or a protocol version such as ``"2026-07-28"``. ``headers`` go with HTTP requests.

    Raises:
        ConfigurationError: an empty command line.
        mcp.shared.exceptions.MCPError: the server refused the handshake or the listing.
        OSError: a stdio server that cannot be started.
    """
    target, label = _target(server, headers)
    if on_complete is None and wait_for is not None:
        owner = getattr(wait_for, "__self__", None)
        if isinstance(owner, Broker):
            on_complete = owner.complete
    session = _Session(
        wait_for=wait_for,
        timeout_s=timeout_s,
        read_timeout_s=read_timeout_s,
        agent=agent,
        on_complete=on_complete,
        label=label,
    )
    client = Client(
        target,
        mode=mode,
        read_timeout_seconds=read_timeout_s,
        elicitation_callback=session.elicitation_callback if wait_for is not None else None,
        message_handler=session.message_handler,
    )
    async with client:
        session.client = client
        if client.server_info is not None and client.server_info.name:
            session.server_name = client.server_info.name
        yield McpTools(await _list_tools(client), session, client)


async def _list_tools(client: Client) -> list[Tool]:
    tools: list[Tool] = []
    cursor: str | None = None
    for _ in range(_MAX_TOOL_PAGES):
        page = await client.list_tools(cursor=cursor)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if cursor is None:
            break
    return tools


def _target(
    server: ServerSpec, headers: Mapping[str, str] | None
) -> tuple[Server[Any] | MCPServer | Transport | StdioServerParameters, str | None]:
    """What the SDK ``Client`` connects to, and a fallback name for the server."""
    if isinstance(server, str):
        parts = urlsplit(server)
        if parts.scheme in ("http", "https"):
            return _http_transport(server, headers), parts.hostname
        server = shlex.split(server)
    if isinstance(server, StdioServerParameters):
        return server, os.path.basename(server.command)
    if isinstance(server, MCPServer | Server):
        return server, server.name
    if isinstance(server, Sequence):
        argv = [str(arg) for arg in server]
        if not argv:
            raise ConfigurationError("an MCP server command line must not be empty")
        return StdioServerParameters(command=argv[0], args=argv[1:]), os.path.basename(argv[0])
    return server, None


@asynccontextmanager
async def _http_transport(url: str, headers: Mapping[str, str] | None) -> AsyncIterator[Any]:
    """Streamable HTTP with no read timeout: a response stream may idle while a person answers."""
    timeout = httpx2.Timeout(HTTP_TIMEOUT_S, read=None)
    async with (
        httpx2.AsyncClient(headers=dict(headers or {}), timeout=timeout) as http,
        streamable_http_client(url, http_client=http) as streams,
    ):
        yield streams
