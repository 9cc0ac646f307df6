"""The responder side of the Redis broker: consumer groups on the request stream,
answering, and the events stream.

Each consumer renews a lease on what it holds on a schedule of its own. What it holds
costs no steady Redis work per request: requests resolved elsewhere are let go when the
queue's events stream names them (one blocking read per consumer; an event is only a
hint, which the request's state confirms), requests are expired at their signed deadline
(one local timer for all), and requests whose waiter died are withdrawn (one liveness
check per waiter, every third of the liveness bound). A full sweep of everything held,
every ten leases, catches what the events missed. Entries of a consumer that died are
reclaimed with ``XAUTOCLAIM`` once its lease lapses. Entries
are acknowledged once the request is resolved or skipped. An entry this group cannot or
will not take (not a readable request, or one its signature policy refuses) is settled for
this group only: acknowledged, with one dead letter naming the group, and left in the
stream for every other group. The waiter it names, if it names one, is told (a refusal
on its reply stream, signed by this process's key when it has one: see
:meth:`RedisResponder.refuse`); reading goes on. From its first read on, each
consumer keeps a heartbeat (:meth:`~toolnexus.Responder.keep_heartbeat`).

One of the three files that tell the architecture: the waiter side
(:mod:`toolnexus.redis_broker._waiter`), the responder side
(:mod:`toolnexus.redis_broker._responder`) and the key names (:mod:`toolnexus.keys`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import heapq
import logging
import time
from collections import deque
from typing import Any, ClassVar

import msgspec
import redis.exceptions

from .._broker import Pending, Responder
from ..errors import (
    AlreadyVoted,
    BrokerClosed,
    BrokerUnavailable,
    DecodeError,
    NotConfirmed,
    SignatureError,
    ToolnexusError,
)
from ..keys import WAITER_ID, check_request_id
from ..lifecycle import EventType, Status
from ..models import Answer, ApprovedEvent, Request
from ..protocol import PROTOCOL, READS
from ..security._signing import allowed, sign_refusal
from ._answering import checked_answer, finish, resolve_answer, waiter_of
from ._connections import BlockingReader, Entries
from ._core import CONNECTION_ERRORS, Backoff, Core, boundary, ms, text
from ._heartbeats import heartbeat
from ._layout import ENTRY_EVENT, OPEN_B, REFUSAL_FIELDS, REPLY_ID, protocol_fields
from ._scripts import STATUS

log = logging.getLogger("toolnexus.redis")

RENEW_CHUNK = 1000
"""Entries renewed by one ``XCLAIM``."""

REFUSALS_KEPT = 1000
"""A reply stream is trimmed to about this many entries by a refusal added to it."""

FULL_SWEEP_LEASES = 10
"""Every this many leases a consumer checks the state of everything it holds: the
backstop for events it missed and states Redis forgot. In between, events and deadlines
say what to check."""

EVENTS_READ = 1000
"""Events read at most by one ``XREAD`` of the events stream."""

EVENTS_GATHER_S = 0.1
"""After a read of the events stream that found some (fewer than :data:`EVENTS_READ`),
how long the next waits: a busy stream (an event per answer) costs each consumer a few
reads a second, not one per answer. The first event after a quiet spell is read at once."""

EVENTS_LOOKBACK_MS = 1000
"""A consumer follows the events stream from this long before it started, by its own
clock: a clock ahead of Redis's by less than this misses no event."""

RECENT_KEPT = 1024
"""Ids of the last events that named no request held, kept: a request delivered just
before the event of its resolution may be taken in after the event was read, and is
then checked when it is."""

RECHECK_S = 0.05
"""A request still open at its deadline is checked again when Redis time says it is
due, and no sooner than this."""

RETRY_CAP_S = 2.0
"""The longest pause between attempts of the event follower and the checker while
Redis is away."""

OPEN_EVENTS: frozenset[str] = frozenset({EventType.APPROVED, EventType.ESCALATED})
"""Types of events that say a request is still open: no check."""


class _Named(msgspec.Struct):
    """What a consumer reads of an event: the request it names, and its type. A hint:
    an unsigned event may be forged, so it only asks for a check of the state."""

    id: str
    type: str = ""


def route_of(payload: bytes, format: str) -> tuple[str, str, int] | None:
    """The request id and reply stream's waiter that the encoded request ``payload`` names,
    read leniently (it may be a request this toolnexus cannot read otherwise), if both look
    like an id and a waiter id; and the protocol to tell its waiter in: the request's, or
    for a newer one than this toolnexus writes, the newest it does (a newer waiter reads
    the protocol before its own)."""
    try:
        decoded = (msgspec.msgpack if format == "msgpack" else msgspec.json).decode(payload)
    except (msgspec.DecodeError, ValueError):
        return None
    body = decoded[1] if isinstance(decoded, list) and len(decoded) == 2 else None
    if not isinstance(body, dict):
        return None
    request_id, waiter = body.get("id"), body.get("reply_to")
    if not isinstance(request_id, str) or check_request_id(request_id) is not None:
        return None
    if not isinstance(waiter, str) or not WAITER_ID.fullmatch(waiter):
        return None
    number = decoded[0]
    readable = isinstance(number, int) and not isinstance(number, bool) and number in READS
    return request_id, waiter, number if readable else PROTOCOL


_Parsed = tuple[str, Request, str | None, int]
"""An entry read: its id, its request, the key that verifiably signed it, its protocol."""


class RedisPending(Pending):
    def __init__(
        self,
        responder: RedisResponder,
        request: Request,
        entry_id: str,
        signer: str | None,
        protocol: int,
    ) -> None:
        self.request = request
        self.entry_id = entry_id
        self.protocol = protocol
        """The protocol the request was written in: what this responder writes about it
        (its answer, events) is written in it."""
        self.signer = signer
        self.responder_name = responder.name
        self._responder = responder
        self._queued = True  # in the responder's ready queue, not yet delivered

    async def answer(self, answer: Answer) -> ApprovedEvent | None:
        return await self._responder.answer(self, answer)

    async def skip(self) -> None:
        self._responder.release(self)


class RedisResponder(Responder):
    """One consumer of a consumer group on the request stream.

    Reads its own pending entries first (after a start or a reconnect), then new ones.
    With ``until_idle``, iteration ends when a read of new entries finds none.
    """

    _closing: asyncio.Future[None] | None = None
    """The cleanup :meth:`aclose` started, once it did."""
    full_sweep_leases: ClassVar[int] = FULL_SWEEP_LEASES
    """Every this many leases (``lease_ms``) a consumer reads the state of every request
    it holds (one ``HMGET`` each, in one script call per waiter): the only Redis work it
    does per request held, besides renewing leases many at a time."""

    def __init__(
        self, core: Core, group: str, consumer: str, *, count: int, until_idle: bool
    ) -> None:
        self.core, self.group, self.consumer, self.count = core, group, consumer, count
        self.until_idle = until_idle
        self.name = f"{group}/{consumer}"
        self.dead_lettered = 0
        self._stream = core.keys.requests
        self._held: dict[str, RedisPending] = {}
        self._ready: deque[RedisPending] = deque()
        self._reader: BlockingReader | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._backlog_from: str | None = "0"  # where to read our own pending entries from
        self._idle = False  # the last read of new entries found none
        self._closed = False
        self._markless: set[str] = set()  # durable waiters found without a liveness mark
        self._checks: set[str] = set()  # requests held that events named: to check
        self._deadlines: list[tuple[float, int, RedisPending]] = []  # by Redis time (heap)
        self._scheduled = 0  # tie-breaker of equal deadlines
        self._wake = asyncio.Event()  # a check to make, or an earlier deadline
        self._recent: dict[str, None] = {}  # ids events named, not held (RECENT_KEPT)
        self._skew_s = 0.0  # Redis's clock minus this process's, at the last check
        self._events_reader: BlockingReader | None = None

    # -- delivering ---------------------------------------------------------------

    async def __anext__(self) -> RedisPending:
        backoff: Backoff | None = None
        while not self._closed and not self.core.closed:
            if self._ready:
                pending = self._ready.popleft()
                pending._queued = False
                return pending
            if self._idle and self.until_idle:
                break
            try:
                if self._reader is None:
                    await self._ensure_group()
                    self._reader = self.core.blocking_reader()
                if not self._tasks:
                    loop = asyncio.get_running_loop()
                    beat = functools.partial(heartbeat, self.core, self.group, self.consumer)
                    start = f"{ms(time.time()) - EVENTS_LOOKBACK_MS}-0"
                    self._tasks = [
                        loop.create_task(self._renew()),
                        loop.create_task(self._sweep()),
                        loop.create_task(self._follow_events(start)),
                        loop.create_task(self._check_due()),
                        loop.create_task(self.keep_heartbeat(beat)),
                    ]
                await self._read()
                backoff = None  # it worked: a failure from now on starts the backoff again
            except BrokerClosed:
                break
            except redis.exceptions.ResponseError as exc:
                if "NOGROUP" in str(exc):  # Redis lost the group (restart without persistence)
                    await self._drop_reader()
                    continue
                log.error("responder %s/%s: %s; retrying", self.group, self.consumer, exc)
                backoff = backoff or Backoff()
                await backoff.wait(f"responder {self.group}/{self.consumer}", exc)
            except Exception as exc:  # a lost connection, a timeout, anything: never die
                if not isinstance(exc, CONNECTION_ERRORS):
                    log.exception("responder %s/%s failed; retrying", self.group, self.consumer)
                self._backlog_from = "0"
                await self._drop_reader()
                backoff = backoff or Backoff()
                await backoff.wait(f"responder {self.group}/{self.consumer}", exc)
        raise StopAsyncIteration

    async def _ensure_group(self) -> None:
        try:
            await self.core.bounded(
                self.core.redis.xgroup_create(self._stream, self.group, id="0", mkstream=True)
            )
        except redis.exceptions.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    async def _drop_reader(self) -> None:
        if self._reader is not None:
            reader, self._reader = self._reader, None
            with contextlib.suppress(Exception):
                await reader.aclose()

    async def _read(self) -> None:
        reader = self._reader
        assert reader is not None
        block_ms = self.core.settings.block_ms
        group, consumer, stream, count = self.group, self.consumer, self._stream, self.count
        if self._backlog_from is not None:  # our own pending entries, oldest first
            entries = await reader.xreadgroup(
                group, consumer, stream, self._backlog_from, count, None
            )
            self._backlog_from = text(entries[-1][0]) if entries else None
            await self._admit(entries, fresh=False)
            return
        entries = await reader.xreadgroup(
            group, consumer, stream, ">", count, None if self.until_idle else block_ms
        )
        self._idle = not entries
        await self._admit(entries, fresh=True)

    def _parse(self, entry_id: str, fields: dict[bytes, bytes]) -> _Parsed | None:
        """The request of one entry, the key that verifiably signed it and the protocol it
        was written in, or None after settling a bad entry for this group only (its dead
        letter, its acknowledgement: the entry stays for every other group, which may well
        read it)."""
        try:
            payload = fields.get(b"r")
            if payload is None:
                raise DecodeError("the entry has no 'r' field holding a request")
            protocol, request = self.core.codec.decode_as_with_protocol(payload, Request)
            problem = check_request_id(request.id)
            if problem is not None:
                raise DecodeError(problem)
            if request.reply_to is None or not WAITER_ID.fullmatch(request.reply_to):
                raise DecodeError("the request has no valid reply_to: no broker published it")
            signer = self.core.signatures.admit_request(request)
        except (DecodeError, SignatureError) as exc:
            self.core.refuse_entry(self._stream, entry_id, fields, str(exc), self.group)
            self.dead_lettered += 1
            why = exc.reason if isinstance(exc, SignatureError) else str(exc)
            self.refuse(fields.get(b"r"), why)
            return None
        return entry_id, request, signer, protocol

    def refuse(self, payload: bytes | None, reason: str) -> None:
        """Tell the waiter of the request published as ``payload`` (dead-lettered for this
        group, for ``reason``) that this responder refused it, on its reply stream (fields
        :data:`~._layout.REFUSAL_FIELDS`, in the request's protocol): the reason, this
        consumer and, when this process signs, a signature bound to those bytes
        (:func:`sign_refusal`). Bytes that name no waiter are only dead-lettered."""
        if payload is None:
            return
        core = self.core
        route = route_of(payload, core.codec.format)
        if route is None:
            return
        request_id, waiter, protocol = route
        names = REFUSAL_FIELDS[protocol]
        reason = reason[:500]
        fields: list[Any] = [REPLY_ID, request_id, names.reason, reason, names.by, self.name]
        key = core.signatures.key
        if key is not None:
            signature = sign_refusal(request_id, payload, reason, key)
            fields += [names.key, signature.key, names.sig, signature.sig]
            fields += [names.digest, signature.digest]
        fields += protocol_fields(protocol)
        stream = core.keys.answers(waiter)
        call = core.pipeliner
        call.post("XADD", stream, "MAXLEN", "~", REFUSALS_KEPT, "*", *fields, lazy=False)
        call.post("PEXPIRE", stream, core.settings.retention_ms, lazy=False)

    async def _admit(self, entries: Entries, *, fresh: bool) -> None:
        """Queue the open requests among ``entries``; acknowledge or dead-letter the rest.

        ``fresh`` entries were just delivered for the first time: a resolved request's
        entry is deleted from the stream, so they are open unless past their deadline.
        Others (re-read or reclaimed) may have been resolved since: their state is read.
        """
        now = time.time()
        admitted: list[_Parsed] = []
        unsure: list[_Parsed] = []
        done: list[str] = []
        for raw_id, fields in entries:
            entry_id = text(raw_id)
            if not fields:  # deleted or trimmed while pending: nothing left to show
                done.append(entry_id)
                continue
            parsed = self._parse(entry_id, fields)
            if parsed is None:
                continue
            request = parsed[1]
            if not self._may_answer(request):
                done.append(entry_id)  # its allow-list leaves this responder out
                continue
            held = self._held.get(request.id)
            if held is not None:
                if held.entry_id != entry_id:
                    done.append(entry_id)  # a duplicate XADD of a request we already show
            elif fresh and now < (request.expires_at or float("inf")):
                # (this clock only spares a round trip: one that runs slow shows a late
                # request, whose answer Redis time refuses; one that runs fast asks Redis)
                admitted.append(parsed)
            else:
                unsure.append(parsed)
        if unsure:
            states = await self._states([parsed[1] for parsed in unsure])
            for parsed, (status, alive, past, _) in zip(unsure, states, strict=True):
                entry_id, request, _signer, protocol = parsed
                if status != OPEN_B or (
                    (not alive or past) and await self._end(request, alive, entry_id, protocol)
                ):
                    done.append(entry_id)
                else:
                    admitted.append(parsed)
        for entry_id, request, signer, protocol in admitted:
            pending = RedisPending(self, request, entry_id, signer, protocol)
            self._held[request.id] = pending
            self._ready.append(pending)
            self._schedule(pending)
            if request.id in self._recent:  # an event named it before it was held
                self._hint(request.id)
        if done:
            self.core.pipeliner.post("XACK", self._stream, self.group, *done, lazy=False)

    def _may_answer(self, request: Request) -> bool:
        """Whether this responder may answer ``request``: its allow-list names this key (or
        consumer), or names persons (``web:*``), whom a worker tells apart itself."""
        if not request.allow:
            return True
        key = self.core.signatures.key
        me = key.name if key is not None else self.name
        return any(":" in entry for entry in request.allow) or allowed(request.allow, me, None)

    async def _end(
        self, request: Request, alive: bool, entry_id: str | None, protocol: int
    ) -> bool:
        """End ``request`` (written in ``protocol``), open but its waiter gone (withdrawn)
        or past its signed deadline by Redis time (expired): whether it is no longer open."""
        if not alive:
            return await finish(self.core, request, Status.WITHDRAWN, entry_id, protocol)
        return await finish(self.core, request, Status.EXPIRED, entry_id, protocol)

    async def _states(
        self, requests: list[Request]
    ) -> list[tuple[bytes | None, bool, bool, float]]:
        """Each request's status (``b"open"``, ...; None if Redis forgot it), whether its
        waiter is alive, whether its signed deadline has passed by Redis time (the judge
        of a deadline, whatever this process's clock says), and Redis time (s), in one
        round trip."""
        keys = self.core.keys
        batch = self.core.pipeliner.batch
        replies: list[list[Any]] = await asyncio.gather(
            *(
                batch(STATUS, (keys.answers(w), keys.alive(w)), (), (keys.state(w, r.id),), ())
                for r in requests
                for w in (waiter_of(r),)
            )
        )
        if replies:  # when this process's timers see a deadline come (see _check_due)
            self._skew_s = int(replies[0][2]) / 1000 - time.time()
        return [
            (
                reply[0] or None,
                bool(reply[1]),
                r.expires_at is not None and int(reply[2]) >= ms(r.expires_at),
                int(reply[2]) / 1000,
            )
            for r, reply in zip(requests, replies, strict=True)
        ]

    # -- answering ----------------------------------------------------------------

    async def answer(self, pending: RedisPending, answer: Answer) -> ApprovedEvent | None:
        """:meth:`RedisPending.answer`. An answer that cannot get through because Redis is
        away hands the request back: it is shown again once Redis returns. A quorum's vote
        that counted but did not decide keeps the request held, for other persons here."""
        core, request, entry = self.core, pending.request, pending.entry_id
        checked = checked_answer(core, request, answer, pending.responder_name)
        payload = core.codec.encode_answer(checked, pending.protocol)
        # On one server, the resolve settles the entry too, if it won: one round trip per
        # answer instead of two. A quorum's votes are settled after.
        group = self.group if request.quorum is None else None
        try:
            with boundary(f"answering {request.id}"):
                progress, settled = await resolve_answer(
                    core,
                    request,
                    checked,
                    payload,
                    entry,
                    group,
                    protocol=pending.protocol,
                    alone=len(self._held) == 1,  # the only answer going out, likely
                )
        except BrokerUnavailable:
            self._hand_back(pending)
            raise
        except AlreadyVoted:
            raise  # still open: others may vote through this pending
        except NotConfirmed:
            self._forget(pending)  # taken on the master (its entry settled there, or not)
            raise
        except ToolnexusError:
            self.release(pending)
            raise
        if progress is not None:
            core.settle(progress, protocol=pending.protocol)
            return progress
        self._forget(pending)
        if settled:
            return None
        # Returns once the entry is gone too, so that no group reads it from now on; the
        # answer has won already, so a failure here is only logged (by settle).
        settling = core.settle_now((self.group, entry), entry)
        with contextlib.suppress(Exception):  # the waiter publishes the answered event
            await asyncio.shield(settling)
        return None

    def _forget(self, pending: RedisPending) -> None:
        if self._held.get(pending.request.id) is pending:
            del self._held[pending.request.id]
        if pending._queued:  # rare: most are delivered before they are let go
            pending._queued = False
            with contextlib.suppress(ValueError):  # cleared by aclose()
                self._ready.remove(pending)

    def release(self, pending: RedisPending) -> None:
        """Stop holding ``pending`` (resolved or skipped) and acknowledge its entry."""
        self._forget(pending)
        self.core.settle(ack=(self.group, pending.entry_id))

    def _hand_back(self, pending: RedisPending) -> None:
        """Stop holding ``pending`` unacknowledged: our own backlog is read again, so it is
        shown again when Redis is back."""
        self._forget(pending)
        self._backlog_from = "0"

    # -- maintenance --------------------------------------------------------------

    async def _renew(self) -> None:
        """Renew the lease on everything held, every ``lease_ms / 3``, whatever else is busy."""
        interval_s = self.core.settings.lease_ms / 3000
        while not self._closed:
            await asyncio.sleep(interval_s)
            ids: list[Any] = [pending.entry_id for pending in self._held.values()]
            for start in range(0, len(ids), RENEW_CHUNK):
                try:  # XCLAIM by the holder resets the idle time: the lease is renewed
                    await self.core.bounded(
                        self.core.redis.xclaim(
                            self._stream, self.group, self.consumer, 0,
                            ids[start : start + RENEW_CHUNK], justid=True,
                        )
                    )  # fmt: skip
                except BrokerClosed:
                    return
                except Exception as exc:  # keep renewing whatever happened
                    log.warning("renewing leases of %s/%s: %s", self.group, self.consumer, exc)

    async def _sweep(self) -> None:
        """Every third of the liveness bound (or of the lease, when shorter): withdraw
        the requests of waiters whose liveness mark is gone (one ``EXISTS`` per waiter
        held, not per request), so that a dead agent's requests end within the liveness
        bound and a third of it. Every third of the lease: reclaim what dead consumers
        held (and now and then remove consumers long gone). Every
        :data:`FULL_SWEEP_LEASES` leases: check the state of everything held, for what
        the events stream did not tell (:meth:`_follow_events`: requests resolved
        elsewhere; deadlines have timers of their own, :meth:`_check_due`)."""
        settings = self.core.settings
        interval_s = min(settings.lease_ms, settings.liveness_ms) / 3000
        reclaim_every = max(1, round(settings.lease_ms / 3000 / interval_s))
        full_every = reclaim_every * 3 * FULL_SWEEP_LEASES
        ticks = reclaims = 0
        while not self._closed:
            await asyncio.sleep(interval_s)
            ticks += 1
            try:
                if ticks % full_every == 0:
                    self._markless.clear()
                    await self._judge(list(self._held.values()))
                else:
                    await self._judge(await self._of_waiters_gone())
                if ticks % reclaim_every == 0:
                    await self._reclaim()
                    reclaims += 1
                    if reclaims % 30 == 1:
                        await self._remove_departed_consumers()
            except BrokerClosed:
                return
            except Exception as exc:  # keep sweeping whatever happened
                log.warning("sweeping %s/%s: %s", self.group, self.consumer, exc)

    async def _of_waiters_gone(self) -> list[RedisPending]:
        """The requests held whose waiter has no liveness mark, one ``EXISTS`` per waiter.
        A durable waiter has none (its requests stay alive): it is not asked again until
        the next full sweep."""
        by_waiter: dict[str, list[RedisPending]] = {}
        for pending in self._held.values():
            waiter = waiter_of(pending.request)
            if waiter not in self._markless:
                by_waiter.setdefault(waiter, []).append(pending)
        if not by_waiter:
            return []
        call, alive_key = self.core.pipeliner.call, self.core.keys.alive
        marks = await self.core.bounded(
            asyncio.gather(*(call("EXISTS", alive_key(w)) for w in by_waiter))
        )
        gone = [w for w, mark in zip(by_waiter, marks, strict=True) if not mark]
        # (a waiter of other requests is asked again next time: it may have renewed its
        # mark just before the states were read, and die before the next full sweep)
        self._markless.update(w for w in gone if all(p.request.durable for p in by_waiter[w]))
        return [pending for w in gone for pending in by_waiter[w]]

    async def _judge(self, held: list[RedisPending]) -> list[float | None]:
        """Read the state of each of ``held`` and let go of those resolved elsewhere;
        withdraw those whose waiter is gone and expire those past their signed deadline
        by Redis time (:meth:`_end`). Only the state decides, never what asked for the
        check. For each, Redis time (s) if it is still held and open, else None."""
        if not held:
            return []
        states = await self._states([pending.request for pending in held])
        still: list[float | None] = []
        for pending, (status, alive, past, now_s) in zip(held, states, strict=True):
            if self._held.get(pending.request.id) is not pending:
                still.append(None)  # let go (answered, skipped) while its state was read
            elif status != OPEN_B or (
                (not alive or past)
                and await self._end(pending.request, alive, pending.entry_id, pending.protocol)
            ):
                self.release(pending)
                still.append(None)
            else:
                still.append(now_s)
        return still

    # -- what events and deadlines say to check -------------------------------------

    def _schedule(self, pending: RedisPending, at: float | None = None) -> None:
        """Check ``pending`` at ``at`` (Redis time, s; by default its signed deadline,
        if it has one). One heap holds every held request's next check; entries of
        requests let go stay until they come up, or until they are most of the heap."""
        at = pending.request.expires_at if at is None else at
        if at is None:
            return
        heap = self._deadlines
        if len(heap) > 2 * len(self._held) + 64:
            heap[:] = [e for e in heap if self._held.get(e[2].request.id) is e[2]]
            heapq.heapify(heap)
        self._scheduled += 1
        heapq.heappush(heap, (at, self._scheduled, pending))
        if heap[0][2] is pending:
            self._wake.set()

    def _hint(self, request_id: str) -> None:
        """An event named ``request_id``: check its state if it is held, else remember it
        for a while (:data:`RECENT_KEPT`)."""
        if request_id in self._held:
            self._checks.add(request_id)
            self._wake.set()
            return
        recent = self._recent
        recent[request_id] = None
        if len(recent) > RECENT_KEPT:
            del recent[next(iter(recent))]

    async def _follow_events(self, last_id: str) -> None:
        """Follow the queue's events stream from ``last_id``: one blocking ``XREAD`` at a
        time (re-issued when it times out, every third of the liveness bound), whatever
        the number of requests held. An event naming a request held is only a hint (an
        unsigned one may be forged): it asks for a check of that request's state
        (:meth:`_check_due`), which alone may let it go. While Redis is away it retries,
        saying so once, and resumes after the last event it read."""
        core = self.core
        settings = core.settings
        block_ms = max(settings.block_ms, settings.liveness_ms // 3)
        mod: Any = msgspec.msgpack if core.codec.format == "msgpack" else msgspec.json
        decoder = mod.Decoder(tuple[int, _Named])
        field = ENTRY_EVENT.encode()
        delay, failing = 0.0, False
        while not self._closed and not core.closed:
            try:
                if self._events_reader is None:
                    self._events_reader = core.blocking_reader()
                entries = await self._events_reader.xread(
                    core.keys.events, last_id, EVENTS_READ, block_ms
                )
            except Exception as exc:  # a lost connection, a timeout, WRONGTYPE: never die
                await self._drop_events_reader()
                if self._closed or core.closed:
                    return
                if not failing:
                    log.warning("%s following events: %s; retrying", self.name, exc)
                failing, delay = True, min(RETRY_CAP_S, delay * 2 or 0.05)
                await asyncio.sleep(delay)
                continue
            if failing:
                log.info("%s following events again", self.name)
            failing, delay = False, 0.0
            for _, fields in entries:
                payload = fields.get(field) if fields else None
                if payload is None:
                    continue  # the events' readers copy what they cannot read to the dead letters
                try:
                    named: _Named = decoder.decode(payload)[1]
                except (msgspec.DecodeError, ValueError, IndexError):
                    continue
                if named.type not in OPEN_EVENTS:
                    self._hint(named.id)
            if entries:
                last_id = text(entries[-1][0])
                if len(entries) < EVENTS_READ:
                    await asyncio.sleep(EVENTS_GATHER_S)

    async def _drop_events_reader(self) -> None:
        if self._events_reader is not None:
            reader, self._events_reader = self._events_reader, None
            with contextlib.suppress(Exception):
                await reader.aclose()

    async def _check_due(self) -> None:
        """Check, in one round trip, the requests that events named and those whose
        deadline came (by Redis time, as the last check saw it against this process's
        clock): one timer for all, no task per request. A request still open when Redis
        time says its deadline has not come yet is checked again when it says it will."""
        delay, failing = 0.0, False
        heap = self._deadlines
        while not self._closed:
            now = time.time() + self._skew_s
            due: list[RedisPending] = []
            while heap and heap[0][0] <= now:
                pending = heapq.heappop(heap)[2]
                if self._held.get(pending.request.id) is pending:
                    due.append(pending)
            named = [self._held[r] for r in self._checks if r in self._held]
            self._checks.clear()
            if not due and not named:
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(heap[0][0] - now if heap else None):
                        await self._wake.wait()
                continue
            checked = list({id(pending): pending for pending in due + named}.values())
            try:
                still = await self._judge(checked)
            except BrokerClosed:
                return
            except Exception as exc:  # Redis away: check them all again after a pause
                for pending in due:
                    self._schedule(pending)
                self._checks.update(pending.request.id for pending in named)
                if not failing:
                    log.warning("%s checking held requests: %s; retrying", self.name, exc)
                failing, delay = True, min(RETRY_CAP_S, delay * 2 or 0.05)
                await asyncio.sleep(delay)
                continue
            failing, delay = False, 0.0
            now_of = {id(p): now_s for p, now_s in zip(checked, still, strict=True)}
            for pending in due:
                now_s = now_of[id(pending)]
                deadline = pending.request.expires_at
                if now_s is not None and deadline is not None:
                    self._schedule(pending, max(deadline, now_s + RECHECK_S))

    async def _reclaim(self) -> None:
        cursor = "0-0"
        while not self._closed:
            reply: Any = await self.core.bounded(
                self.core.redis.xautoclaim(
                    self._stream, self.group, self.consumer,
                    self.core.settings.lease_ms, cursor, count=self.count,
                )
            )  # fmt: skip
            cursor, entries = text(reply[0]), reply[1]
            if entries:
                log.info("%s/%s reclaimed %d requests", self.group, self.consumer, len(entries))
                await self._admit(entries, fresh=False)
            if cursor == "0-0":
                return

    async def _remove_departed_consumers(self) -> None:
        """Consumers idle longer than the retention, holding nothing, are deleted."""
        redis_ = self.core.redis
        consumers = await self.core.bounded(redis_.xinfo_consumers(self._stream, self.group))
        for info in consumers:
            name = text(info.get("name", b""))
            if (
                name != self.consumer
                and info.get("pending", 1) == 0
                and info.get("idle", 0) > self.core.settings.retention_ms
            ):
                await self.core.bounded(redis_.xgroup_delconsumer(self._stream, self.group, name))

    async def aclose(self) -> None:
        """Stop; held requests not yet answered go back to the group at once. The cleanup
        is a task of its own, finished even if this caller is cancelled (an anyio cancel
        scope cancels every await of a closing ``async with``); a later call waits for it,
        as the broker's close does before it closes the connections the cleanup uses."""
        if self._closing is None:
            self._closed = True
            for task in self._tasks:
                task.cancel()
            ids: list[Any] = [pending.entry_id for pending in self._held.values()]
            self._held.clear()
            self._ready.clear()
            self._closing = asyncio.ensure_future(self._close(ids))
        await asyncio.shield(self._closing)

    async def _close(self, ids: list[Any]) -> None:
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._tasks and not self.core.closed:  # it kept a heartbeat: it leaves
            with contextlib.suppress(Exception):
                await heartbeat(self.core, self.group, self.consumer, 0, None)
        if ids and not self.core.closed:  # idle as if their lease had lapsed: reclaimable now
            with contextlib.suppress(Exception):
                await self.core.bounded(
                    self.core.redis.xclaim(
                        self._stream, self.group, self.consumer, 0, ids,
                        idle=self.core.settings.lease_ms, justid=True,
                    )
                )  # fmt: skip
        await self._drop_reader()
        await self._drop_events_reader()

    def statistics(self) -> dict[str, int]:
        """Counters: requests held, ready to deliver, and dead-lettered by this consumer."""
        return {
            "holding": len(self._held),
            "ready": len(self._ready),
            "dead_lettered": self.dead_lettered,
        }

    def __repr__(self) -> str:
        return (
            f"<RedisResponder {self.group}/{self.consumer} holding {len(self._held)}, "
            f"dead-lettered {self.dead_lettered}>"
        )
