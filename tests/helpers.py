"""What many test files need, in one place: a request to ask, waiting until something
holds (polling with a deadline, not a guessed sleep), the wait for a request's state in
Redis, the next event of a broker, a clock that tests move by hand, a scripted
pydantic-ai model, and the examples of the manual read from their pages and run."""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import inspect
import json
import re
import textwrap
import time
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any

import redis

import toolnexus
from toolnexus import Broker, EventStream, Pending
from toolnexus.models import Event, EventType, Request, Source, new_id
from toolnexus.redis_broker import RedisBroker
from toolnexus.redis_broker._layout import parse_route

if TYPE_CHECKING:  # pydantic-ai is not in every test environment (.venv-mcp1)
    from pydantic_ai.models.function import FunctionModel

POLL_S = 0.02
"""How often a condition is checked again."""


AGENT_7 = Source(server="booking", tool="book_table", agent="agent-7")
"""Who asks, in the worker tests: agent-7 through the booking server's tool."""


def ask(prompt: str = "?", kind: str = "approval", **fields: Any) -> Request:
    """A request with a fresh id: an approval asking ``prompt`` unless told otherwise."""
    return Request(id=new_id(), kind=kind, prompt=prompt, **fields)


async def eventually(
    check: Callable[[], bool | Awaitable[bool]], what: str = "the condition", timeout_s: float = 20
) -> None:
    """Wait until ``check()`` (plain or async) is true, or fail naming ``what``."""
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                result = check()
                if inspect.isawaitable(result):
                    result = await result
                if result:
                    return
                await asyncio.sleep(POLL_S)
    except TimeoutError:
        raise AssertionError(f"not within {timeout_s} s: {what}") from None


def wait_until(what: str, check: Callable[[], bool], timeout_s: float = 30.0) -> float:
    """Poll ``check`` (outside an event loop: it may block) until it holds; the seconds
    it took. Redis errors count as "not yet". Raises ``RuntimeError`` on timeout."""
    start = time.monotonic()
    while True:
        with contextlib.suppress(redis.exceptions.RedisError, OSError):
            if check():
                return time.monotonic() - start
        if time.monotonic() - start > timeout_s:
            raise RuntimeError(f"{what}: not within {timeout_s} s")
        time.sleep(0.05)


async def opened(broker: RedisBroker, request_id: str, timeout_s: float = 10) -> str:
    """The state key of ``request_id``, once its waiter ``broker`` has opened it in Redis."""
    state = broker.keys.state(broker.waiter_id, request_id)
    await eventually(lambda: _exists(broker, state), f"{request_id} opened", timeout_s)
    return state


async def published_request(broker: RedisBroker, request_id: str) -> Request:
    """Request ``request_id`` as published (signed, with its deadline and reply stream),
    read where its route points: its entry in the queue's request stream (a plain
    request's state does not hold it)."""
    request = await routed_request(broker, request_id)
    assert request is not None, f"{request_id}: its route names no entry"
    return request


async def routed_request(broker: RedisBroker, request_id: str) -> Request | None:
    """The request in the entry the route of ``request_id`` names; None if there is none."""
    route = parse_route(await broker.redis.get(broker.keys.route(request_id)))
    if route is None or route[1] is None:
        return None
    found = await broker.redis.xrange(broker.keys.requests, route[1], route[1])
    return broker.codec.decode_as(found[0][1][b"r"], Request) if found else None


async def _exists(broker: RedisBroker, key: str) -> bool:
    return bool(await broker.redis.exists(key))


async def next_event(
    events: EventStream, event: EventType, request_id: str | None = None, timeout_s: float = 10
) -> Event:
    """The next ``event`` (of ``request_id``, if given) on ``events``; others are skipped."""
    try:
        async with asyncio.timeout(timeout_s):
            async for seen in events:
                if seen.event == event and request_id in (None, seen.id):
                    return seen
    except TimeoutError:
        pass
    raise AssertionError(f"no {event!r} event of {request_id or 'any request'} in {timeout_s} s")


class ManualClock:
    """A clock that moves only when told (:meth:`advance`): give it to a
    :class:`toolnexus._timers.Timers` and a test passes a deadline without sleeping."""

    def __init__(self, start: float = 1000.0) -> None:
        self._now = start
        self._calls: list[tuple[float, int, ManualHandle]] = []
        self._count = 0

    def now(self) -> float:
        return self._now

    def call_at(self, when: float, callback: Callable[[], object]) -> ManualHandle:
        handle = ManualHandle(when, callback)
        self._count += 1
        heapq.heappush(self._calls, (when, self._count, handle))
        return handle

    async def sleep(self, seconds: float) -> None:
        done = asyncio.get_running_loop().create_future()
        self.call_at(self._now + seconds, lambda: done.done() or done.set_result(None))
        await done

    def advance(self, seconds: float) -> None:
        """Move the time on by ``seconds``, calling what fell due, in time order."""
        until = self._now + seconds
        while self._calls and self._calls[0][0] <= until:
            when, _, handle = heapq.heappop(self._calls)
            self._now = max(self._now, when)
            if not handle.cancelled:
                handle.callback()
        self._now = until


class ManualHandle:
    """A call planned on a :class:`ManualClock`."""

    def __init__(self, when: float, callback: Callable[[], object]) -> None:
        self._when, self.callback, self.cancelled = when, callback, False

    def when(self) -> float:
        return self._when

    def cancel(self) -> None:
        self.cancelled = True


async def asked(responder: Any, prompt: str, timeout_s: float = 20) -> dict[str, Any]:
    """What the responder process ``responder`` (``tests/mcp_processes.py``) was asked with
    ``prompt``, once it has been."""

    def seen() -> bool:
        return any(item["prompt"] == prompt for item in responder.seen)

    await eventually(seen, f"{prompt!r} asked", timeout_s)
    return responder.by_prompt(prompt)  # type: ignore[no-any-return]


async def cancelling_withdraws(broker: Broker, run: Coroutine[Any, Any, Any]) -> Pending:
    """Run ``run`` (an agent that asks) as a task and cancel it once its question reaches a
    responder; assert the question was withdrawn (its event seen, its audit record so)."""
    async with broker.events() as events:
        task = asyncio.create_task(run)
        async with broker.responder("ops") as responder, asyncio.timeout(60):
            pending = await anext(responder)
        task.cancel()
        async with asyncio.timeout(30):
            async for event in events:
                if event.id == pending.request.id and event.event == "withdrawn":
                    break
    [record] = await broker.audit(request_id=pending.request.id)
    assert record.status == "withdrawn"
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return pending


def scripted(*calls: tuple[str, dict[str, Any]]) -> FunctionModel:
    """A pydantic-ai model without a model: it calls ``calls`` in turn, then answers with
    what the tools returned, as a JSON list."""
    from pydantic_ai.messages import (
        ModelMessage,
        ModelRequest,
        ModelResponse,
        TextPart,
        ToolCallPart,
        ToolReturnPart,
    )
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    def respond(messages: list[ModelMessage], _info: AgentInfo) -> ModelResponse:
        returned = [
            part.content
            for message in messages
            if isinstance(message, ModelRequest)
            for part in message.parts
            if isinstance(part, ToolReturnPart)
        ]
        if len(returned) < len(calls):
            name, arguments = calls[len(returned)]
            return ModelResponse(parts=[ToolCallPart(name, arguments)])
        return ModelResponse(parts=[TextPart(json.dumps(returned))])

    return FunctionModel(respond)


ROOT = Path(__file__).resolve().parents[1]


def page_block(page: str, first_line: str, language: str = "python") -> str:
    """The ``language`` block of ``page`` (a path from the repository's root, such as
    ``docs/how-to/workers.md``) whose text starts with ``first_line``."""
    text = (ROOT / page).read_text()
    for match in re.finditer(rf"^```{language}\n(.*?)^```", text, re.S | re.M):
        if match.group(1).startswith(first_line):
            return match.group(1)
    raise AssertionError(f"{page} has no {language} block starting {first_line!r}")


async def run_fragment(code: str, page: str, **names: Any) -> dict[str, Any]:
    """Run ``code``, a fragment of ``page`` (top-level ``await`` allowed), with ``names``
    (and ``toolnexus``) bound; its local names when it ends."""
    source = "async def example():\n" + textwrap.indent(code + "\nreturn locals()", "    ")
    scope: dict[str, Any] = {"toolnexus": toolnexus, **names}
    exec(compile(source, page, "exec"), scope)
    result: dict[str, Any] = await scope["example"]()
    return result
