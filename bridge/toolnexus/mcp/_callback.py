"""toolnexus as the elicitation backend of any MCP client: the SDK's callback and fastmcp's handler.

    from mcp import Client
    async with toolnexus.connect(url) as broker, Client(
        server, elicitation_callback=toolnexus.elicitation_callback(broker.wait_for, agent="a-7")
    ) as client:
        await client.call_tool("book_table", {})

Every elicitation goes ``elicitation_to_request`` → ``wait_for`` → ``answer_to_elicit_result``:
the request names the server (the callback's ``server``, else the name the server gave at
the handshake) and the agent; a form answer is checked against the requested schema with
defaults filled in, and an answer that breaks it is asked again (as a fresh request that
says what was wrong, up to :data:`MAX_INVALID_ANSWERS` times, within the first request's
deadline); cancelling the callback (the framework cancelled the call, or the server
cancelled its request) cancels ``wait_for``, which withdraws the request. ``load_mcp``
asks through this same class, adding the tool's name and the call's deadline. A framework
that calls the callback on a thread and loop of its own (strands-agents' ``MCPClient``)
gets ``loop=``: the loop that owns ``wait_for``'s broker, where each wait then runs.

Only this module's names come from ``mcp.types``, which mcp 1.x and 2.x both have.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeAlias

import msgspec
from mcp.types import INVALID_PARAMS, ElicitResult, ErrorData

from .._numeric import check_number
from .._schema import check_answer
from ..errors import BrokerClosed, ConfigurationError, InvalidAnswer, InvalidRequest
from ..models import Answer, Request, Source, WaitFor, new_id
from ._source import answer_to_elicit_result, elicitation_to_request

log = logging.getLogger(__name__)

MAX_INVALID_ANSWERS = 3
"""How many answers that break the form one elicitation asks for before it cancels."""

FastmcpHandler: TypeAlias = Callable[[str, Any, Any, Any], Awaitable[ElicitResult]]
"""fastmcp's ``elicitation_handler``: ``async (message, response_type, params, context)``."""


class ElicitationCallback:
    """An MCP SDK ``elicitation_callback``: ``await callback(context, params)`` asks
    ``wait_for`` and returns the ``ElicitResult`` (or ``ErrorData`` for params that cannot
    be asked). Made by :func:`elicitation_callback`."""

    def __init__(
        self,
        wait_for: WaitFor,
        *,
        agent: str | None = None,
        server: str | None = None,
        timeout_s: float | None = None,
        allow: Sequence[str] | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        check_options(timeout_s, allow)
        self.wait_for = wait_for if loop is None else _on_loop(wait_for, loop)
        self.agent = agent
        self.server = server
        self.timeout_s = timeout_s
        self.allow = None if allow is None else list(allow)

    async def __call__(self, context: Any, params: Any) -> ElicitResult | ErrorData:
        """The SDK's callback shape: one elicitation (legacy or a 2026-07-28 input request)."""
        return await self.ask(params, server=self.server or _server_name(context))

    async def ask(
        self,
        params: Any,
        *,
        server: str | None = None,
        tool: str | None = None,
        timeout_s: float | None = None,
        wait: WaitFor | None = None,
    ) -> ElicitResult | ErrorData:
        """Ask for one elicitation made by ``server`` (this callback's when None) in ``tool``;
        ``timeout_s`` overrides the callback's deadline and ``wait`` its ``wait_for``."""
        source = Source(server=server or self.server, tool=tool, agent=self.agent)
        deadline_s = timeout_s if timeout_s is not None else self.timeout_s
        try:
            request = elicitation_to_request(params, source=source, timeout_s=deadline_s)
        except InvalidRequest as exc:
            return ErrorData(code=INVALID_PARAMS, message=str(exc))
        if self.allow is not None:
            request = msgspec.structs.replace(request, allow=list(self.allow))
        return await self.answer(request, wait or self.wait_for)

    async def answer(self, request: Request, wait: WaitFor) -> ElicitResult:
        """``wait(request)`` until an answer fits its form, mapped to an ``ElicitResult``."""
        url_mode = request.kind == "authorization"
        for _ in range(MAX_INVALID_ANSWERS):
            answer = await wait(request)
            if not answer.ok:  # a decline, or the broker's own end (expired, withdrawn, ...)
                return answer_to_elicit_result(answer, url_mode=url_mode)
            try:
                return answer_to_elicit_result(
                    check_answer(request, answer, None), url_mode=url_mode
                )
            except InvalidAnswer as exc:
                log.warning("answer to %s breaks its form (%s): asking again", request.id, exc)
                request = _again(request, str(exc))
        log.warning("no answer to %r fit its form: the server gets cancel", request.prompt)
        return ElicitResult(action="cancel")


def check_options(timeout_s: float | None, allow: Sequence[str] | None) -> None:
    """Refuse a ``timeout_s`` that is not positive or an ``allow`` that is not a list of names.

    Raises:
        ConfigurationError: naming the bad value.
    """
    if timeout_s is not None:
        check_number("timeout_s", timeout_s)
    if isinstance(allow, str) or (
        allow is not None and not all(isinstance(name, str) and name for name in allow)
    ):
        raise ConfigurationError(
            f"allow must be a list of responder names (non-empty strings), got {allow!r}"
        )


def _again(request: Request, problem: str) -> Request:
    """The same question as a fresh request (same deadline), saying what was wrong."""
    meta = {**request.meta, "invalid_answer": problem, "asked_before": request.id}
    return msgspec.structs.replace(request, id=new_id("elc"), meta=meta, reply_to=None)


def _on_loop(wait_for: WaitFor, loop: asyncio.AbstractEventLoop) -> WaitFor:
    """``wait_for`` run on ``loop`` whichever loop awaits it; cancelling the awaiting task
    cancels the wait there (which withdraws the request).

    Raises:
        BrokerClosed: ``loop`` is closed (its broker with it).
    """

    async def there(request: Request) -> Answer:
        return await wait_for(request)

    async def wait(request: Request) -> Answer:
        if asyncio.get_running_loop() is loop:
            return await wait_for(request)
        if loop.is_closed():
            raise BrokerClosed("the event loop of the broker behind this callback is closed")
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(there(request), loop))

    return wait


def _server_name(context: Any) -> str | None:
    """The name the server gave at the handshake, from the SDK's request context."""
    info = getattr(getattr(context, "session", None), "server_info", None)
    name = getattr(info, "name", None)
    return name if isinstance(name, str) and name else None


def elicitation_callback(
    wait_for: WaitFor,
    *,
    agent: str | None = None,
    server: str | None = None,
    timeout_s: float | None = None,
    allow: Sequence[str] | None = None,
    loop: asyncio.AbstractEventLoop | None = None,
) -> ElicitationCallback:
    """An ``elicitation_callback`` for the MCP SDK's ``Client``/``ClientSession`` (and the
    frameworks that take one) that asks every elicitation through ``wait_for``.

    ``agent`` and ``server`` name who asks in each request (``server`` defaults to the
    server's own name on mcp 2.x; a 1.x session keeps none, so pass it there);
    ``timeout_s`` is how long a person has (the broker's default when None); ``allow``
    lists the responders that may answer (``Request.allow``). ``loop`` is the event loop
    that owns ``wait_for``'s broker, for a framework that calls the callback on a loop of
    its own (strands-agents): each wait runs there, and cancelling the callback cancels it.

    Raises:
        ConfigurationError: a ``timeout_s`` that is not positive, or an ``allow`` that is
            not a list of names.
    """
    return ElicitationCallback(
        wait_for, agent=agent, server=server, timeout_s=timeout_s, allow=allow, loop=loop
    )


def fastmcp_elicitation_handler(
    wait_for: WaitFor,
    *,
    agent: str | None = None,
    server: str | None = None,
    timeout_s: float | None = None,
    allow: Sequence[str] | None = None,
    loop: asyncio.AbstractEventLoop | None = None,
) -> FastmcpHandler:
    """An ``elicitation_handler`` for fastmcp's ``Client`` (and pydantic-ai through it):
    the same as :func:`elicitation_callback`, in fastmcp's handler contract.

    Raises:
        ConfigurationError: as :func:`elicitation_callback`.
    """
    callback = ElicitationCallback(
        wait_for, agent=agent, server=server, timeout_s=timeout_s, allow=allow, loop=loop
    )

    async def handler(message: str, response_type: Any, params: Any, context: Any) -> ElicitResult:
        result = await callback(context, params)
        if isinstance(result, ErrorData):
            raise InvalidRequest(result.message)  # fastmcp turns it into the error reply
        return result

    return handler
