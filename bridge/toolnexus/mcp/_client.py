"""``load_mcp``: an MCP server's tools for an agent, each question the server asks answered
through one ``wait_for`` (SPEC §2).

Every way an MCP server asks goes ``elicitation_to_request`` → ``wait_for`` →
``answer_to_elicit_result`` (through :class:`~toolnexus.mcp.ElicitationCallback`,
the same code as the public :func:`~toolnexus.elicitation_callback`):

- ``elicitation/create`` (protocol ≤ 2025-11-25), form and URL mode: the SDK's
  elicitation callback.
- ``InputRequiredResult`` input requests (2026-07-28): the SDK's multi-round-trip
  driver hands every embedded elicitation to that same callback at once (each request
  carries its key and the call's group in ``meta``), then retries the call.
- A task (``resultType: "task"``, the Tasks extension declared on every 2026-07-28
  request): driven to the tool's result by :class:`~toolnexus.mcp._tasks.Tasks`.
- The ``-32042`` URL-elicitation-required error: each listed URL elicitation becomes
  an ``authorization`` request; once all are accepted the call is sent again (at most
  :data:`MAX_URL_ROUNDS` times). If one is declined or cancelled, the others are
  withdrawn and :class:`~toolnexus.mcp.UrlElicitationRequired` is raised.
- ``notifications/elicitation/complete`` (≤ 2025-11-25): ``on_complete(request_id)``
  for the authorization request that carried that elicitation id; unknown, declined
  and already completed ids are ignored.

Protocol: with no ``mode``, over HTTP the session starts with ``server/discover`` (2026-07-28
if the server offers it), over stdio and in process with the initialize handshake (on which
servers ask with server-initiated ``elicitation/create``: fastmcp's and the SDK's
``ctx.elicit``); a server that refuses the handshake in any way is connected at 2026-07-28,
where it asks with ``InputRequiredResult``. A tool that asks the other era's way is called
once more on a second connection in that era (opened on first need). ``mode="auto"``
prefers 2026-07-28 (the SDK's default).

Which call asks: a question made while a tool call runs names that tool and uses that
call's deadline. On 2026-07-28 the question is part of the call's own result; on
streamable HTTP a server-initiated request travels on the call's response stream, so
the SDK delivers it in the call's context. Over stdio nothing tells concurrent calls
apart: with one call in flight it is that call; with several, the request names no
tool, takes the session's deadline, and stops the clocks of all of them.

Time: a read timeout (``read_timeout_s``) measures the server only. The SDK's own
clock keeps running while a person answers, so ``tools/call`` is sent without one
and timed here by a clock that stops while any elicitation of the call is waiting
on a person. That wait is bounded by the request's own deadline (``timeout_s``,
per ``load_mcp`` and per call; the broker's default when ``None``). When a tool call
ends — returned, cancelled, timed out — or the session closes, the elicitations
still waiting for it are cancelled, which withdraws their requests.
"""

from __future__ import annotations

import logging
import math
import os
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import Any, TypeAlias, overload

import anyio
import anyio.abc
import httpx2
import msgspec
import pydantic
from mcp import Client
from mcp.client import ClientRequestContext, IncomingMessage
from mcp.shared.exceptions import MCPError, UrlElicitationRequiredError
from mcp_types import (
    REQUEST_TIMEOUT,
    URL_ELICITATION_REQUIRED,
    CallToolResult,
    ElicitCompleteNotification,
    ElicitRequestParams,
    ElicitRequestURLParams,
    ElicitResult,
    ErrorData,
    TextContent,
    Tool,
)
from mcp_types.version import (
    LATEST_MODERN_VERSION,
    MODERN_PROTOCOL_VERSIONS,
)

from .._broker import Broker
from ..errors import ConfigurationError, NotResolved
from ..models import WITHDRAWN, Answer, Request, WaitFor
from ._callback import ElicitationCallback, check_options
from ._calls import Call, Clock, Wait, current_call
from ._config import McpConfig, McpToolset, ServerEntry, load_config
from ._errors import UrlElicitationRequired, alone, translated
from ._source import input_request_meta
from ._tasks import Shape, Tasks
from ._transport import ServerSpec, Target, target

log = logging.getLogger(__name__)

__all__ = ["McpTool", "McpTools", "McpToolset", "ServerSpec", "load_mcp"]

OnComplete: TypeAlias = Callable[[str], Awaitable[None]]
"""Called with a request id when the server says its authorization step is done."""

MAX_URL_ROUNDS = 3
"""How many times one tool call is sent again after ``-32042`` errors whose URLs were accepted."""

MAX_URL_CONSENTS = 3
"""How many times one call asks for the same URL on 2026-07-28 (the first consent, then
"not completed yet" with retry or cancel); past that the server gets ``cancel``."""

NOT_COMPLETED = "Not completed yet"
"""What a 2026-07-28 URL request asked again starts with (``meta["not_completed"]`` counts)."""

MODES = ("legacy", "auto", "2026-07-28")
"""``mode`` values besides the default (None): see :func:`load_mcp`."""

_HANDSHAKE_ONLY = ("unavailable on 2026-07-28", "no back-channel for server-initiated requests")
"""What fastmcp's (in a tool's error result) and the SDK's (as an error) ``ctx.elicit`` say
on a 2026-07-28 connection."""
_MODERN_ONLY = "only exists at MCP 2026-07-28"
"""What fastmcp says when a tool returns an ``InputRequiredResult`` on a handshake connection."""
_NEWER_VERSION = "Unsupported protocol version from the server"
"""What the SDK raises when ``initialize`` is answered with a 2026-07-28 ``protocolVersion``."""
_REMEMBERED_AUTHORIZATIONS = 1024
_MAX_TOOL_PAGES = 100


class _Session:
    """The elicitation side of one ``load_mcp`` session."""

    def __init__(
        self,
        *,
        asker: ElicitationCallback | None,
        timeout_s: float | None,
        read_timeout_s: float | None,
        on_complete: OnComplete | None,
        label: str | None,
    ) -> None:
        self.asker = asker
        self.timeout_s = timeout_s
        self.read_timeout_s = read_timeout_s
        self.on_complete = on_complete
        self.server_name = label
        self.client: Client | None = None
        self.tasks: Tasks | None = None
        self.other: Callable[[], Awaitable[Client | None]] | None = None
        """With the default mode: the server's connection in the other era, opened the first
        time a tool asks in a way only that era carries (None if the server refuses it)."""
        self._inflight: set[Call] = set()
        self._consents: dict[Call, dict[str, int]] = {}  # 2026-07-28 URL consents per call
        self._authorizations: OrderedDict[str, str] = OrderedDict()

    # -- tool calls -------------------------------------------------------------------

    async def call_tool(
        self,
        name: str,
        arguments: dict[str, Any],
        timeout_s: float | None,
        read_timeout_s: float | None,
        durable: str | None = None,
    ) -> CallToolResult:
        call = Call(name, timeout_s if timeout_s is not None else self.timeout_s)
        call.durable = durable
        call.arguments = arguments
        read_timeout = read_timeout_s if read_timeout_s is not None else self.read_timeout_s
        token = current_call.set(call)
        self._inflight.add(call)
        try:
            with translated(self.server_name):
                with anyio.CancelScope() as scope:
                    if read_timeout is not None:
                        call.clock = Clock(read_timeout, scope)
                    return await self._send(call, arguments)
                raise MCPError(code=REQUEST_TIMEOUT, message="Request 'tools/call' timed out")
        finally:
            self._inflight.discard(call)
            self._consents.pop(call, None)
            call.end()
            current_call.reset(token)

    async def _send(self, call: Call, arguments: dict[str, Any]) -> CallToolResult:
        assert self.client is not None and self.tasks is not None
        resumed = await self.tasks.resume(self.client.session, call)
        if resumed is not None:
            return resumed
        rounds = 0
        while True:
            try:
                # An infinite SDK read timeout: this call is timed by its own _Clock.
                try:
                    result = await self.client.call_tool(
                        call.name, arguments, read_timeout_seconds=math.inf
                    )
                except MCPError as exc:
                    if self.other is None or not _other_era(exc.message):
                        raise
                    other = await self.other()
                    if other is None:
                        raise
                    return await other.call_tool(
                        call.name, arguments, read_timeout_seconds=math.inf
                    )
                if self.other is None or not _asks_by_handshake(result):
                    return result
                # The tool asks with ctx.elicit, which only the handshake carries: once more
                # there (it stopped at the question, which it could not ask).
                other = await self.other()
                if other is None:
                    return result
                return await other.call_tool(call.name, arguments, read_timeout_seconds=math.inf)
            except MCPError as exc:
                if exc.code != URL_ELICITATION_REQUIRED or self.asker is None:
                    raise
                error = _url_elicitation_required(exc)
                rounds += 1
                if error is None or rounds > MAX_URL_ROUNDS:
                    raise
                if not await self._authorize(call, error.elicitations):
                    raise UrlElicitationRequired(
                        error.elicitations, error.message, server=self.server_name
                    ) from exc

    async def _authorize(self, call: Call, elicitations: list[ElicitRequestURLParams]) -> bool:
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
        """The SDK's elicitation callback: legacy requests and 2026-07-28 input requests
        (whose ``request_id`` is the key in their ``InputRequiredResult``: the requests of
        one call carry its group and their key, see :func:`input_request_meta`)."""
        call = current_call.get()
        key = context.request_id
        client = self.client
        modern = client is not None and client.protocol_version in MODERN_PROTOCOL_VERSIONS
        if call is not None and modern and isinstance(key, str):
            return await self.answer(params, call, _Grouped(input_request_meta(call.group, key)))
        return await self.answer(params, call)

    async def answer(
        self, params: Any, hint: Call | None, shape: Shape | None = None
    ) -> ElicitResult | ErrorData:
        """Ask for one elicitation made during ``hint`` (or an unknown call) through the
        session's :class:`~toolnexus.mcp.ElicitationCallback`; ``shape`` adjusts
        its request and sees its answer (a task's input request)."""
        assert self.asker is not None
        if hint is not None and not hint.active:
            return ElicitResult(action="cancel")
        calls = {hint} if hint is not None else set(self._inflight)
        only = next(iter(calls)) if len(calls) == 1 else None
        again = self._consented(params, only)
        if again is None:
            return ElicitResult(action="cancel")
        if again:
            params = params.model_copy(
                update={
                    "message": f"{NOT_COMPLETED} ({again} of {MAX_URL_CONSENTS - 1}): "
                    f"{params.message} Finish there, then accept to retry now, "
                    "or decline to cancel."
                }
            )

        async def wait(request: Request) -> Answer:
            if again:
                request = msgspec.structs.replace(
                    request, meta={**request.meta, "not_completed": again}
                )
            if shape is None:
                return await self._wait(request, calls)
            shaped = shape.request(request)
            answer = await self._wait(shaped, calls)
            shape.answered(shaped, answer)
            # checked against the request as asked for: under the id the shape may change
            return msgspec.structs.replace(answer, id=request.id)

        return await self.asker.ask(
            params,
            server=self.server_name,
            tool=only.name if only is not None else None,
            timeout_s=only.timeout_s if only is not None else None,
            wait=wait,
        )

    def _consented(self, params: Any, call: Call | None) -> int | None:
        """How many times ``call`` got consent for this 2026-07-28 URL elicitation (which has
        no ``elicitationId``: the server asking again means not completed yet); 0 for any
        other; None past :data:`MAX_URL_CONSENTS`."""
        if call is None or not isinstance(params, ElicitRequestURLParams):
            return 0
        if params.elicitation_id:  # 2025-11-25: completion is notified
            return 0
        asked = self._consents.setdefault(call, {})
        times = asked.get(params.url, 0)
        if times >= MAX_URL_CONSENTS:
            log.warning(
                "%s asked for %s %d times: the server gets cancel", call.name, params.url, times
            )
            return None
        asked[params.url] = times + 1
        return times

    async def _wait(self, request: Request, calls: set[Call]) -> Answer:
        """``wait_for(request)`` with the calls' clocks stopped; withdrawn if the calls all
        ended first. A URL elicitation's id is remembered for its completion notice."""
        assert self.asker is not None
        elicitation_id = request.meta.get("elicitation_id")
        if request.kind != "authorization" or not isinstance(elicitation_id, str):
            elicitation_id = None
        if elicitation_id is not None:
            self._remember(elicitation_id, request.id)
        answer = Answer(id=request.id, ok=False, reason=WITHDRAWN)
        with anyio.CancelScope() as scope:
            wait = Wait(scope, set(calls))
            for call in calls:
                call.attach(wait)
            try:
                answer = await self.asker.wait_for(request)
            finally:
                for call in calls:
                    call.detach(wait)
        if elicitation_id is not None and not answer.ok:
            self._authorizations.pop(elicitation_id, None)
        return answer

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


class _Grouped:
    """The shape of one input request of an ``InputRequiredResult``: its group and key."""

    def __init__(self, meta: dict[str, str]) -> None:
        self._meta = meta

    def request(self, request: Request) -> Request:
        return msgspec.structs.replace(request, meta={**request.meta, **self._meta})

    def answered(self, request: Request, answer: Answer) -> None:
        pass


def _asks_by_handshake(result: CallToolResult) -> bool:
    """Whether a 2026-07-28 tool result is the error of a ``ctx.elicit`` that cannot ask there."""
    return bool(result.is_error) and any(
        isinstance(block, TextContent) and _other_era(block.text) for block in result.content
    )


def _other_era(message: str) -> bool:
    """Whether a tool call failed only because the tool asks in the other era's way: ``ctx.elicit``
    on 2026-07-28, or an ``InputRequiredResult`` on a handshake connection."""
    return _MODERN_ONLY in message or any(text in message for text in _HANDSHAKE_ONLY)


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
        durable: str | None = None,
    ) -> CallToolResult:
        """Call the tool; ``timeout_s`` bounds each person's answer and ``read_timeout_s`` the
        server's own time, for this call only (``load_mcp``'s values when ``None``).

        ``durable`` names a task-backed call that outlives this process: its task and
        questions are kept in the broker (see :mod:`toolnexus.mcp._tasks`); calling again
        with the same ``durable`` id from any process of the same agent goes on with it.

        Raises:
            McpError: a protocol error (also an ``mcp.shared.exceptions.MCPError``),
                including ``-32001`` when the read timeout passes, ``-32603`` for a reply
                that does not conform to the protocol, :class:`UrlElicitationRequired`
                (``-32042``) when a required URL elicitation was not accepted, and
                :class:`~toolnexus.mcp.TaskCancelled` for a task that was cancelled.
            ConfigurationError: ``durable`` is not a non-empty string, or ``wait_for`` is
                not a broker's.
        """
        assert self._session.tasks is not None
        self._session.tasks.check_durable(durable)
        return await self._session.call_tool(
            self.name, dict(arguments or {}), timeout_s, read_timeout_s, durable
        )

    @property
    def server_name(self) -> str | None:
        """The name of the server the tool belongs to."""
        return self._session.server_name

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
        """The server's name: ``load_mcp``'s ``name``, else its ``serverInfo``, else the host
        or command it was reached by."""
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


@overload
def load_mcp(
    server: McpConfig,
    *,
    wait_for: WaitFor | None = None,
    timeout_s: float | None = None,
    read_timeout_s: float | None = None,
    agent: str | None = None,
    on_complete: OnComplete | None = None,
    mode: str | None = None,
    headers: Mapping[str, str] | None = None,
    allow: Sequence[str] | None = None,
    tool_name: str = "{server}.{tool}",
    require_all: bool = False,
) -> AbstractAsyncContextManager[McpToolset]: ...


@overload
def load_mcp(
    server: ServerSpec,
    *,
    wait_for: WaitFor | None = None,
    timeout_s: float | None = None,
    read_timeout_s: float | None = None,
    agent: str | None = None,
    on_complete: OnComplete | None = None,
    mode: str | None = None,
    headers: Mapping[str, str] | None = None,
    allow: Sequence[str] | None = None,
    name: str | None = None,
    auth: httpx2.Auth | None = None,
) -> AbstractAsyncContextManager[McpTools]: ...


def load_mcp(
    server: ServerSpec | McpConfig,
    *,
    wait_for: WaitFor | None = None,
    timeout_s: float | None = None,
    read_timeout_s: float | None = None,
    agent: str | None = None,
    on_complete: OnComplete | None = None,
    mode: str | None = None,
    headers: Mapping[str, str] | None = None,
    allow: Sequence[str] | None = None,
    name: str | None = None,
    tool_name: str | None = None,
    require_all: bool | None = None,
    auth: httpx2.Auth | None = None,
) -> AbstractAsyncContextManager[McpTools] | AbstractAsyncContextManager[McpToolset]:
    """Connect to ``server`` and yield its tools; with ``wait_for``, elicitation is advertised.

    ``server`` is one server (:data:`ServerSpec`), or an MCP host config: a dict
    ``{"mcpServers": {name: {"command", "args", "env", "cwd"} | {"url", "headers"}}}`` or
    an ``os.PathLike`` path to such a JSON file. A config yields one
    :class:`McpToolset` of every server's tools, named by ``tool_name`` (a format with
    ``{server}`` and ``{tool}``); its servers are connected concurrently, each request
    names its server, and a server that fails is logged and listed in
    ``toolset.failures`` while the others work (with ``require_all``, it fails the load).

    ``timeout_s`` is how long a person has to answer each elicitation; ``read_timeout_s``
    bounds each request to the server, not counting time spent waiting on a person.
    ``agent`` names this agent in every request's ``source``, ``name`` the server (default:
    the name it gives itself). ``on_complete`` receives the request id of an authorization
    the server reports complete; by default, when ``wait_for`` is a broker's bound
    ``wait_for``, it is that broker's ``complete``. ``allow`` lists the responders that may
    answer (``Request.allow``). ``headers`` go with HTTP requests; ``auth`` (an ``httpx2.Auth``,
    such as the SDK's ``mcp.client.auth.OAuthClientProvider``) authenticates them, for one
    ``http(s)://`` server.

    ``mode`` picks the protocol. ``None`` (the default): over HTTP ``server/discover``
    first, then 2026-07-28 if the server offers it, else the initialize handshake; over
    stdio and in process the handshake; 2026-07-28 whenever the server refuses the
    handshake. A tool that asks the other era's way (``ctx.elicit`` on 2026-07-28, an
    ``InputRequiredResult`` on the handshake) is called again on a second connection in
    that era. ``"auto"``: 2026-07-28 whenever the server offers it (fastmcp's and the SDK's
    ``ctx.elicit`` cannot ask there), else the handshake. ``"legacy"``: the handshake only.
    ``"2026-07-28"``: that version, without asking the server.

    Raises:
        ConfigurationError: an empty command line, an unknown ``mode``, a bad config, or
            options that do not fit ``server``.
        ServerUnavailable: the server cannot be started or reached.
        McpError: the server refused the handshake or the listing.
    """
    if mode is not None and mode not in MODES:
        raise ConfigurationError(f"mode must be None or one of {list(MODES)}, got {mode!r}")
    check_options(timeout_s, allow)
    options = _Options(wait_for, timeout_s, read_timeout_s, agent, on_complete, mode, allow)
    if isinstance(server, Mapping | os.PathLike):
        if name is not None or auth is not None:
            raise ConfigurationError(
                "name= and auth= are one server's; a config names its servers (and headers)"
            )
        shared = dict(headers or {})

        def open_one(entry_name: str, entry: ServerEntry) -> AbstractAsyncContextManager[McpTools]:
            return _load_one(entry.spec, options, {**shared, **entry.headers}, entry_name)

        return McpToolset.open(
            load_config(server),
            open_one,
            tool_name="{server}.{tool}" if tool_name is None else tool_name,
            require_all=bool(require_all),
        )
    if tool_name is not None or require_all is not None:
        raise ConfigurationError("tool_name= and require_all= apply to an MCP config only")
    if isinstance(server, str) and server.lower().endswith(".json"):
        raise ConfigurationError(
            f"{server!r} looks like an MCP config file: pass it as pathlib.Path({server!r})"
        )
    return _load_one(server, options, headers, name, auth)


@dataclass(frozen=True)
class _Options:
    """``load_mcp``'s options that every server of a config shares."""

    wait_for: WaitFor | None
    timeout_s: float | None
    read_timeout_s: float | None
    agent: str | None
    on_complete: OnComplete | None
    mode: str | None
    allow: Sequence[str] | None


@asynccontextmanager
async def _load_one(
    server: ServerSpec,
    options: _Options,
    headers: Mapping[str, str] | None,
    name: str | None,
    auth: httpx2.Auth | None = None,
) -> AsyncIterator[McpTools]:
    """One server's tools (see :func:`load_mcp`)."""
    how = target(server, headers, auth)
    label = name or how.label
    asker = on_complete = None
    if options.wait_for is not None:
        asker = ElicitationCallback(
            options.wait_for,
            agent=options.agent,
            server=label,
            timeout_s=options.timeout_s,
            allow=options.allow,
        )
        owner = getattr(options.wait_for, "__self__", None)
        on_complete = options.on_complete
        if on_complete is None and isinstance(owner, Broker):
            on_complete = owner.complete
    session = _Session(
        asker=asker,
        timeout_s=options.timeout_s,
        read_timeout_s=options.read_timeout_s,
        on_complete=on_complete,
        label=label,
    )
    owner = getattr(options.wait_for, "__self__", None)
    session.tasks = Tasks(
        session, agent=options.agent, broker=owner if isinstance(owner, Broker) else None
    )
    raised: BaseException | None = None  # by the caller's block, raised as itself
    try:
        async with AsyncExitStack() as stack:
            client = await _connect(stack, how, session, options.mode)
            session.client = client
            if name is None and client.server_info is not None and client.server_info.name:
                session.server_name = client.server_info.name
            with translated(session.server_name):
                listed = await _list_tools(client)
            try:
                yield McpTools(listed, session, client)
            except BaseException as exc:
                raised = exc
                raise
    except BaseExceptionGroup as group:
        itself = alone(group, raised)
        if itself is None:
            raise
    else:
        return
    raise itself  # outside the except block: its context stays its own


async def _connect(
    stack: AsyncExitStack, how: Target, session: _Session, mode: str | None
) -> Client:
    """An entered SDK ``Client`` for ``how`` in ``mode`` (see :func:`load_mcp`); with the
    default mode at 2026-07-28, ``session.handshake`` opens a handshake connection."""

    def client(sdk_mode: str) -> Client:
        return Client(
            how.connect(),
            mode=sdk_mode,
            read_timeout_seconds=session.read_timeout_s,
            elicitation_callback=session.elicitation_callback if session.asker else None,
            message_handler=session.message_handler,
            extensions=[session.tasks.extension] if session.tasks is not None else None,
        )

    async def enter(sdk_mode: str) -> Client:
        with translated(session.server_name):
            return await stack.enter_async_context(client(sdk_mode))

    if mode is not None or not how.reusable:
        return await enter(mode or "legacy")
    # Over HTTP, server/discover first (at 2026-07-28, with its headers); the SDK falls back
    # to the handshake when the server does not answer it. Over stdio and in process the
    # handshake first, as before 2026-07-28 (ctx.elicit asks only there).
    first_mode = "auto" if how.http else "legacy"
    try:
        first = await enter(first_mode)
    except Exception as exc:
        if not _refused(exc):
            raise
        # A 2026-07-28-only server that refused the handshake (HTTP 400/404/405 with or
        # without a JSON-RPC error, -32022, a 2026-07-28 protocolVersion, no initialize).
        log.info("%s: connecting at %s instead", exc, LATEST_MODERN_VERSION)
        return await enter(LATEST_MODERN_VERSION)
    modern = first.protocol_version in MODERN_PROTOCOL_VERSIONS
    other = "legacy" if modern else LATEST_MODERN_VERSION
    session.other = await _Later.start(stack, lambda: client(other))
    return first


def _refused(exc: BaseException) -> bool:
    """Whether connecting failed because the server refused the protocol (not unreachable)."""
    if isinstance(exc, BaseExceptionGroup):
        return any(_refused(leaf) for leaf in exc.exceptions)
    if isinstance(exc, MCPError):
        return True
    return isinstance(exc, RuntimeError) and _NEWER_VERSION in str(exc)


class _Later:
    """A second connection, opened on first use in a task of its own (so it may be opened
    from any tool call) and closed with the session; None if the server refuses it."""

    def __init__(self, group: anyio.abc.TaskGroup, make: Callable[[], Client]) -> None:
        self._group = group
        self._make = make
        self._lock = anyio.Lock()
        self._opened = False
        self._client: Client | None = None

    @classmethod
    async def start(cls, stack: AsyncExitStack, make: Callable[[], Client]) -> _Later:
        group = await stack.enter_async_context(anyio.create_task_group())
        stack.callback(group.cancel_scope.cancel)
        return cls(group, make)

    async def __call__(self) -> Client | None:
        async with self._lock:
            if not self._opened:
                self._opened = True
                try:
                    self._client = await self._group.start(self._hold)
                except Exception as exc:
                    if not _refused(exc):
                        raise
                    log.info("no handshake connection: %s", exc)
            return self._client

    async def _hold(self, *, task_status: anyio.abc.TaskStatus[Client]) -> None:
        async with self._make() as client:
            task_status.started(client)
            await anyio.sleep_forever()


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
