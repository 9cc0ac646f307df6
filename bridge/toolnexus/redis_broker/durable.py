"""Durable waits (SPEC §14): requests that outlive the process waiting for them.

A durable request's state and reply stream live under the *durable waiter* id of its
agent and queue (:meth:`Keys.durable_waiter <toolnexus.keys.Keys.durable_waiter>`), not
under the process that asked, so any process of that agent finds them by the request id
alone (and no other agent's: the ACL keeps each agent to its own waiter keys). Its state
is marked durable (``d``): it counts as alive whatever process waits, so neither a dead
waiter's liveness mark nor a responder's sweep ever withdraws it. It ends with an answer or at its
deadline, like any request; cancelling a durable wait, or closing the broker (a deploy),
leaves it open for the next wait.

Waiting with the id of a durable request that exists *attaches* to it: the stored request
(the one responders saw and signed answers for) and its deadline are taken over; a stored
answer is returned at once (checked as usual); an open request is published only if it
never was (the publish script skips a request whose route exists, so processes attaching
at the same time publish it once between them), and the wait goes on.

The durable reply stream is read by every process of the agent that waits durably on the
queue, each reading from where the stream ended when it began: it is trimmed by age
(:data:`REPLIES_KEEP_MS`), never by a reader's position. An answer that arrives while no
process reads is found in the request's state by the next attach.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from ..broker import check_same_question
from ..errors import DecodeError, InvalidRequest
from ..models import EXPIRED, WITHDRAWN, Answer, Request
from ..outcomes import expired_answer
from ._core import CONNECTION_ERRORS, Backoff, Core, ms, text
from ._scripts import OPEN

T = TypeVar("T")

REPLIES_KEEP_MS = 10 * 60 * 1000
"""Entries of a durable reply stream older than this are trimmed (ten minutes): readers
take an entry at once, and after a reconnect look at their requests' states anyway."""


@dataclass(eq=False, slots=True)
class ReplyStream:
    """A reply stream a process reads: its own, or (``durable``) its queue's durable one,
    which every process waiting durably reads, so it is trimmed by age."""

    waiter: str  # the waiter id its keys are under
    key: str
    alive_key: str
    durable: bool
    last_id: str = "0-0"  # the reader's position
    reader: asyncio.Task[None] | None = None


@dataclass(frozen=True, slots=True)
class Stored:
    """A durable request that existed when a wait attached to it: its status (``open``,
    or how it was resolved), deadline, request as published, stored answer, and where it
    was published (the state's field ``q``, see :mod:`.escalation`)."""

    status: str
    deadline_ms: int
    payload: bytes
    answer: bytes | None
    queues: bytes | None  # the queues it was published to, and its entries there


def min_id() -> str:
    """The ``XTRIM MINID`` bound of a durable reply stream: :data:`REPLIES_KEEP_MS` ago."""
    return f"{max(0, ms(time.time()) - REPLIES_KEEP_MS)}-0"


async def patiently(core: Core, what: str, call: Callable[[], Awaitable[T]]) -> T:
    """``call()``, retried with backoff while Redis is away, for up to
    ``answer_patience_s``; then its connection error is raised."""
    backoff = Backoff(cap_s=0.5)
    give_up = time.monotonic() + core.settings.answer_patience_s
    while True:
        try:
            return await call()
        except CONNECTION_ERRORS as exc:
            if core.closed or time.monotonic() > give_up:
                raise
            await backoff.wait(what, exc)


async def reply_position(core: Core, stream: str) -> str:
    """Where a new reader of ``stream`` starts: its last entry (``0-0`` if empty), so that
    every entry added from now on is read."""
    last: Any = await core.command("XREVRANGE", stream, "+", "-", "COUNT", 1)
    return text(last[0][0]) if last else "0-0"


async def attach(
    core: Core, waiter: str, request_id: str, payload: bytes, deadline_ms: int
) -> Stored | None:
    """Open the durable state of ``request_id`` with ``payload``, or find the one stored:
    None if this call opened it, else what it holds. Atomic: of processes attaching at the
    same time, one opens it and the others are told what it opened.

    Raises:
        CONNECTION_ERRORS: Redis was away for longer than ``answer_patience_s``.
        BrokerClosed: the broker was closed.
    """
    keys = core.keys
    ttl_ms = max(1, deadline_ms - ms(time.time())) + core.settings.retention_ms

    def run() -> Awaitable[Any]:
        return core.pipeliner.batch(
            OPEN,
            (keys.answers(waiter), keys.alive(waiter)),
            (0,),
            (keys.state(waiter, request_id),),
            (deadline_ms, payload, ttl_ms, 1),
        )

    reply = await patiently(core, f"attaching to {request_id}", run)
    if not isinstance(reply, list):
        return None
    status, deadline, stored, answer, queues = reply
    return Stored(text(status), int(deadline), stored, answer, queues)


async def start_reader(
    core: Core,
    stream: ReplyStream,
    lock: asyncio.Lock,
    read: Callable[[ReplyStream], Coroutine[Any, Any, None]],
) -> None:
    """Start the reader ``read(stream)`` of a durable reply stream unless it runs, from
    the stream's end as it is now: every answer added from this call's return on is read.

    Raises:
        CONNECTION_ERRORS: Redis was away for longer than ``answer_patience_s``.
    """
    async with lock:
        if stream.reader is None or stream.reader.done():
            where = functools.partial(reply_position, core, stream.key)
            stream.last_id = await patiently(core, "reading durable answers", where)
            stream.reader = asyncio.get_running_loop().create_task(
                read(stream), name="toolnexus-durable"
            )


def stored_request(core: Core, stored: Stored, asked: Request) -> Request:
    """The request a durable state holds, which an attaching wait takes over.

    Raises:
        InvalidRequest: it is unreadable, or asks something else than ``asked`` (see
            :data:`~toolnexus.broker.SAME_QUESTION`): a durable request's id names one question.
    """
    try:
        request = core.codec.decode_as(stored.payload, Request)
    except DecodeError as exc:
        raise InvalidRequest(f"durable request {asked.id!r} is unreadable: {exc}") from exc
    check_same_question(request, asked)
    return request


def broker_outcome(request: Request, status: str) -> Answer | None:
    """The outcome of a durable request the broker resolved (its deadline, or a withdrawal
    from before it was durable), as the waiter gives it: rebuilt from the request rather
    than read from the state, since it names no person and holds no signature to check."""
    if status == EXPIRED:
        return expired_answer(request)
    if status == WITHDRAWN:
        return Answer(id=request.id, ok=False, reason=WITHDRAWN)
    return None
