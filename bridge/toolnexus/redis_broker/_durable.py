"""Durable waits (SPEC §14): requests that outlive the process waiting for them.

A durable request's state and reply stream live under the *durable waiter* id of its
agent and queue (:meth:`Keys.durable_waiter <toolnexus.keys.Keys.durable_waiter>`), not
under the process that asked, so any process of that agent finds them by the request id
alone (and no other agent's: the ACL keeps each agent to its own waiter keys). Its state
is marked durable (``d``): it counts as alive whatever process waits, so neither a dead
waiter's liveness mark nor a responder's sweep ever withdraws it. It ends with an answer or at its
deadline, like any request; cancelling a durable wait, or closing the broker (a deploy),
leaves it open for the next wait.

Waiting with the id of a durable request that exists *attaches* to it. What Redis holds
is a hint (SPEC §11) until checked against the signed request: the stored request must be
this process's own (with a signing key, signed by it; see :func:`stored_request`), and
asking the same question; its signed deadline is taken over, never the state's field
``x``. A stored answer is checked as any answer. The state's status counts only as far as
the signed request and this process's clock support it: ``expired`` once the signed
deadline has passed (the outcome computed from the request, never read from the state);
a durable request is never withdrawn. Before its deadline, a state ended without an
answer the wait takes is opened again (:func:`renew`) and published again. A stored
request past its deadline and the retention (a state restored after it should have gone)
counts as absent: it is replaced by this wait's request, published afresh. An open
request is published again only if its route does not name the entry its state recorded
(field ``e``, written by the publish script that added it; on a Cluster, the hop record's
entry): processes attaching at the same time publish it once between them, and a route
that anybody else wrote, before the request was asked say, is replaced, so a request
nobody was shown never ends in its default. Its hops, by the signed plan, are published
again where their route is not the durable waiter's (see
:meth:`Escalator.plan <toolnexus.redis_broker.escalation.Escalator.plan>`): the state's
hop record ``q`` is a hint that only names entries.

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

from .._broker import SAME_QUESTION, check_same_question
from ..errors import DecodeError, InvalidRequest, SignatureError
from ..models import Request
from ..security._signing import Keyring, verify_request
from ._core import CONNECTION_ERRORS, Backoff, Core, ms, text
from ._scripts import OPEN, RENEW

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
    or how it was resolved), request as published, stored answer, and where it was
    published (the state's field ``q``, see :mod:`._escalation`). All of it unchecked."""

    request_id: str
    status: str
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
            (0, core.liveness_value, core.protocol),
            (keys.state(waiter, request_id),),
            (deadline_ms, payload, ttl_ms, 1),
        )

    reply = await patiently(core, f"attaching to {request_id}", run)
    if not isinstance(reply, list):
        return None
    status, _deadline, stored, answer, queues = reply  # the deadline is the signed request's
    return Stored(request_id, text(status), stored, answer, queues)


async def renew(core: Core, waiter: str, stored: Stored, payload: bytes, deadline_ms: int) -> bool:
    """Open the durable state ``stored`` again, if it still holds what was read: with the
    request ``payload`` (deadline ``deadline_ms``, the signed one) afresh if that is not the
    stored request (a stale one replaced), else keeping its votes and hop record (a state
    ended without an outcome before its deadline). Whether it was renewed.

    Raises:
        CONNECTION_ERRORS: Redis was away for longer than ``answer_patience_s``.
        BrokerClosed: the broker was closed.
    """
    keys = core.keys
    ttl_ms = max(1, deadline_ms - ms(time.time())) + core.settings.retention_ms
    fresh = int(payload != stored.payload)
    try:  # the state says the protocol of the request it holds from now on
        protocol = core.codec.decode_with_protocol(payload)[0]
    except DecodeError:
        protocol = core.protocol

    def run() -> Awaitable[Any]:
        return core.pipeliner.batch(
            RENEW,
            (keys.answers(waiter), keys.alive(waiter)),
            (protocol,),
            (keys.state(waiter, stored.request_id),),
            (stored.payload, stored.status, payload, deadline_ms, ttl_ms, fresh),
        )

    return bool(await patiently(core, f"renewing {stored.request_id}", run))


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


def stored_request(core: Core, stored: Stored, mine: Request) -> Request | None:
    """The request a durable state holds, which an attaching wait takes over; None if it
    is stale: its signed deadline and the retention are past by this process's clock (a
    state restored after it should have gone), which counts as no request at all.

    Raises:
        InvalidRequest: it is unreadable; it is not this process's own (with a signing key:
            signed by another key, unsigned, or altered since it was signed, SPEC §11); or
            it asks something else than ``mine`` (this wait's request as it would publish
            it): see :data:`~toolnexus._broker.SAME_QUESTION`, and the allow-list.
    """
    request_id = stored.request_id
    try:
        request = core.codec.decode_as(stored.payload, Request)
    except DecodeError as exc:
        raise InvalidRequest(f"durable request {request_id!r} is unreadable: {exc}") from exc
    expires_at = request.expires_at
    if expires_at is None or expires_at + core.settings.retention_s < time.time():
        return None
    key = core.signatures.key
    if key is not None:
        signature = request.signature
        if signature is None or signature.key != key.name:
            owner = "no agent-key" if signature is None else f"agent-key {signature.key!r}"
            raise InvalidRequest(
                f"durable request {request_id!r} belongs to {owner}, not to this process's "
                f"key {key.name!r}: attaching needs the identity that made it"
            )
        try:
            verify_request(request, Keyring.of(key))
        except SignatureError as exc:
            raise InvalidRequest(
                f"durable request {request_id!r} as stored does not verify with this "
                f"process's key {key.name!r} ({exc.reason}): it was altered in Redis"
            ) from exc
    if request.id != request_id:
        raise InvalidRequest(f"durable request {request_id!r} holds request {request.id!r}")
    check_same_question(request, mine, (*SAME_QUESTION, "allow"))
    return request


def expired_by_clock(request: Request) -> bool:
    """Whether the signed deadline of ``request`` has passed by this process's clock: the
    only way a durable state's ``expired`` counts (SPEC §11)."""
    return request.expires_at is not None and request.expires_at <= time.time()
