"""The Redis Streams broker (SPEC §11): ``connect("redis://…")``.

Waiter side: a request is written to its state hash and ``XADD``ed to the queue's
request stream; the publishes of one event-loop turn share one pipeline. Answers
come back on this process's reply stream, read by one blocking reader that wakes
every concurrent wait of the process (a handful of connections for any number of
waits). The reply stream belongs to this broker object alone and is read from its
start, so an answer that arrives before the reader looks is never missed.

Responder side: consumer groups on the request stream. Each consumer renews a
lease on what it holds; the entries of a consumer that died are reclaimed with
``XAUTOCLAIM`` once the lease lapses. Entries are acknowledged once the request is
resolved or skipped. Undecodable entries go to the dead-letter stream.

Resolution (an answer, the deadline, a withdrawal) is one Lua script on the
request's slot: the first wins, the rest are told why they lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import heapq
import logging
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import msgspec
import redis.asyncio as aioredis
import redis.exceptions

from ._pipeliner import Pipeliner
from ._scripts import OPEN, PUBLISH, RESOLVE, SETTLE, STATUS
from .broker import (
    DEFAULT_TIMEOUT_S,
    NOT_RESOLVED_REASONS,
    RETENTION_S,
    Broker,
    EventStream,
    Pending,
    Resolution,
    Responder,
    deadline_of,
    default_consumer_name,
)
from .codec import MSGPACK, Codec
from .errors import (
    AlreadyResolved,
    BrokerUnavailable,
    DecodeError,
    InvalidRequest,
    NotResolved,
    UnknownRequest,
)
from .keys import Keys
from .models import UNAVAILABLE, Answer, Event, Heartbeat, Request
from .schema import check_answer

log = logging.getLogger("toolnexus.redis")

T = TypeVar("T")

CONNECTION_ERRORS = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError)
"""Faults that mean "Redis is away for now": retried with backoff, never fatal."""

RESOLVE_PATIENCE_S = 2.0
"""How long a waiter retries recording its own expiry or withdrawal while Redis is away."""


def _ms(seconds: float) -> int:
    return int(seconds * 1000)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class _Backoff:
    """Exponential backoff between reconnect attempts: 0.05 s doubling to ``cap_s``."""

    def __init__(self, cap_s: float = 2.0) -> None:
        self.cap_s, self.delay_s = cap_s, 0.0

    async def wait(self, what: str, exc: BaseException) -> None:
        self.delay_s = min(self.cap_s, self.delay_s * 2 or 0.05)
        log.warning("%s: Redis unavailable (%s); retrying in %.2f s", what, exc, self.delay_s)
        await asyncio.sleep(self.delay_s)

    def reset(self) -> None:
        self.delay_s = 0.0


@dataclass(eq=False, slots=True)
class _Wait:
    """One wait in progress: its answer arrives as the raw bytes of an Answer, or as
    ``None`` when its deadline passes."""

    request_id: str
    payload: bytes  # the encoded request, kept to publish it again if Redis loses it
    deadline_ms: int  # Unix time
    answer: asyncio.Future[bytes | None]
    published: bool = False
    entry_id: bytes | None = None  # in the request stream, once published


class _Deadlines:
    """One timer for every wait of a process: a heap of deadlines, and a single
    ``call_at`` for the earliest. A wait past its deadline gets ``None`` as its answer.

    Entries of waits that ended early stay in the heap until it is rebuilt, which
    happens when they outnumber the live ones.
    """

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, _Wait]] = []
        self._count = 0
        self._timer: asyncio.TimerHandle | None = None

    def add(self, wait: _Wait, when: float, live: int) -> None:
        loop = asyncio.get_running_loop()
        self._count += 1
        if len(self._heap) > 2 * live + 1024:  # drop the entries of waits that ended
            self._heap = [e for e in self._heap if not e[2].answer.done()]
            heapq.heapify(self._heap)
        heapq.heappush(self._heap, (when, self._count, wait))
        if self._timer is None or when < self._timer.when():
            self._arm(loop)

    def _arm(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = loop.call_at(self._heap[0][0], self._fire, loop) if self._heap else None

    def _fire(self, loop: asyncio.AbstractEventLoop) -> None:
        now = loop.time()
        while self._heap and self._heap[0][0] <= now:
            wait = heapq.heappop(self._heap)[2]
            if not wait.answer.done():
                wait.answer.set_result(None)
        self._timer = None
        self._arm(loop)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._heap.clear()


class RedisBroker(Broker):
    """Broker on Redis Streams. Options:

    - ``namespace`` / ``queue``: where keys live (see :mod:`toolnexus.keys`).
    - ``lease_ms``: how long a responder holds a request without renewing (30 s);
      a dead consumer's requests are reclaimed after it.
    - ``default_timeout_s``: a wait's deadline when none is given (600 s).
    - ``retention_s``: how long resolved state is kept to refuse late answers (24 h).
    - ``stream_retention_s``: requests older than this are trimmed from the request
      stream (7 days); it is also the longest a wait may last.
    - ``max_connections``: size of the command connection pool (16).
    - ``block_ms``: how long a blocking read waits before looking around (1000).
    - ``codec``: the wire :class:`~toolnexus.Codec` (msgpack).
    - anything else goes to ``redis.asyncio.Redis.from_url`` (``ssl_ca_certs``, ...).
    """

    def __init__(
        self,
        url: str,
        *,
        namespace: str = "toolnexus",
        queue: str = "default",
        lease_ms: int = 30_000,
        default_timeout_s: float = DEFAULT_TIMEOUT_S,
        retention_s: float = RETENTION_S,
        stream_retention_s: float = 7 * 24 * 3600.0,
        max_connections: int = 16,
        block_ms: int = 1000,
        codec: Codec = MSGPACK,
        **redis_options: Any,
    ) -> None:
        self.url = url
        self.keys = Keys(namespace, queue)
        self.lease_ms = lease_ms
        self.default_timeout_s = default_timeout_s
        self.retention_ms = _ms(retention_s)
        self.stream_retention_ms = _ms(stream_retention_s)
        self.block_ms = block_ms
        self.codec = codec
        self.waiter_id = uuid.uuid4().hex[:16]
        # No socket timeout by default: redis-py enforces it with asyncio.wait_for, which on
        # Python 3.11 can swallow a task's cancellation (CPython gh-86296). Dead peers are
        # found by TCP keepalive and health checks instead.
        self._redis_options = {
            "client_name": f"toolnexus:{namespace}",
            "socket_timeout": None,
            "socket_keepalive": True,
            "health_check_interval": 30,
            **redis_options,
        }
        pool = aioredis.BlockingConnectionPool.from_url(
            url, max_connections=max_connections, timeout=None, **self._redis_options
        )
        self.redis: aioredis.Redis = aioredis.Redis.from_pool(pool)
        self.pipeliner = Pipeliner(self.redis)
        self._answers_key = self.keys.answers(self.waiter_id)
        self._waits: dict[str, _Wait] = {}
        self._deadlines = _Deadlines()
        self._unpublished: set[_Wait] = set()
        self._republisher: asyncio.Task[None] | None = None
        self._reader: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[Any]] = set()
        self._responders: set[RedisResponder] = set()
        self._closed = False

    def blocking_client(self) -> aioredis.Redis:
        """A client of its own for blocking reads: one connection, no socket timeout."""
        return aioredis.Redis.from_url(
            self.url,
            single_connection_client=True,
            **{**self._redis_options, "socket_timeout": None},
        )

    async def __aenter__(self) -> RedisBroker:
        try:
            await self.redis.ping()
        except CONNECTION_ERRORS as exc:
            await self.redis.aclose()
            raise BrokerUnavailable(f"cannot reach Redis at {self.url}: {exc}") from exc
        return self

    # -- waiter side --------------------------------------------------------------

    async def wait_for(self, request: Request, *, timeout_s: float | None = None) -> Answer:
        if request.id in self._waits:
            raise InvalidRequest(f"request {request.id!r} is already being waited for")
        now = time.time()
        deadline = min(
            deadline_of(request, timeout_s, self.default_timeout_s),
            now + self.stream_retention_ms / 1000,
        )
        payload = self.codec.encode(
            msgspec.structs.replace(request, expires_at=deadline, reply_to=self.waiter_id)
        )
        loop = asyncio.get_running_loop()
        wait = _Wait(request.id, payload, _ms(deadline), loop.create_future())
        self._waits[request.id] = wait  # registered before it is published
        if self._reader is None or self._reader.done():
            self._reader = loop.create_task(self._read_answers(), name="toolnexus-answers")
        self._deadlines.add(wait, loop.time() + deadline - now, len(self._waits))
        self._publish(wait)
        try:
            raw = await wait.answer
        except asyncio.CancelledError:
            self._spawn(self._resolve_by_waiter(wait, "withdrawn"))
            raise
        finally:
            del self._waits[request.id]
        if raw is not None:
            if wait.entry_id is not None:  # groups that have not read it yet never will
                self._settle(delete=wait.entry_id)
            return self.codec.decode_as(raw, Answer)
        if not wait.published:  # it may still land: make sure nobody answers it
            self._spawn(self._resolve_by_waiter(wait, "expired"))
            return Answer(id=request.id, ok=False, reason=UNAVAILABLE)
        return await self._resolve_by_waiter(wait, "expired")

    def _publish(self, wait: _Wait) -> None:
        """Open the request's state and add it to the request stream, with everything else
        sent this turn. If Redis is away, :meth:`_republish` tries again."""
        now_ms = _ms(time.time())
        ttl_ms = max(1, wait.deadline_ms - now_ms) + self.retention_ms
        call = self.pipeliner
        opened = call.batch(
            OPEN,
            (self._answers_key,),
            (),
            (self.keys.state(self.waiter_id, wait.request_id),),
            (wait.deadline_ms, wait.payload, ttl_ms),
        )
        added = call.batch(
            PUBLISH,
            (self.keys.requests,),
            # trimmed by age, to the second so that one turn's publishes share a batch
            (max(0, now_ms - self.stream_retention_ms) // 1000 * 1000, self.waiter_id),
            (self.keys.route(wait.request_id),),
            (wait.payload, ttl_ms),
        )
        added.add_done_callback(functools.partial(self._on_published, wait, opened))

    def _on_published(
        self, wait: _Wait, opened: asyncio.Future[Any], added: asyncio.Future[Any]
    ) -> None:
        errors = [f.exception() for f in (opened, added) if f.done() and not f.cancelled()]
        errors = [e for e in errors if e is not None]
        if not errors:
            wait.published = True
            wait.entry_id = added.result()
        elif all(isinstance(e, CONNECTION_ERRORS) for e in errors):
            if not wait.answer.done() and not self._closed:
                self._unpublished.add(wait)
                if self._republisher is None:
                    self._republisher = asyncio.get_running_loop().create_task(self._republish())
        elif not wait.answer.done():  # Redis refuses: this wait cannot be served
            log.error("publishing %s failed: %s", wait.request_id, errors[0])
            unavailable = Answer(id=wait.request_id, ok=False, reason=UNAVAILABLE)
            wait.answer.set_result(self.codec.encode(unavailable))

    async def _republish(self) -> None:
        """The one task that publishes again what Redis could not take, with backoff."""
        backoff = _Backoff()
        try:
            while self._unpublished and not self._closed:
                await backoff.wait("publishing requests", ConnectionError("Redis is away"))
                waits, self._unpublished = self._unpublished, set()
                for wait in waits:
                    if not wait.answer.done():
                        self._publish(wait)
                await self.pipeliner.drain()
        finally:
            self._republisher = None

    async def _resolve_by_waiter(
        self, wait: _Wait, status: Literal["expired", "withdrawn"]
    ) -> Answer:
        """Resolve our own request as expired or withdrawn; the answer that won either way.

        If Redis stays unreachable for ``RESOLVE_PATIENCE_S``, the outcome is decided
        here: the resolve script refuses any answer after the deadline anyway.
        """
        answer = Answer(id=wait.request_id, ok=False, reason=status)
        payload = self.codec.encode(answer)
        backoff = _Backoff(cap_s=0.5)
        give_up = time.monotonic() + RESOLVE_PATIENCE_S
        while True:
            try:
                result = await self._resolve(self.waiter_id, answer.id, status, payload)
                break
            except CONNECTION_ERRORS as exc:
                if self._closed or time.monotonic() > give_up:
                    return answer
                await backoff.wait(f"resolving {answer.id} as {status}", exc)
        if result[0] == "ok":
            self._settle(Event(event=status, id=answer.id, answer=answer), delete=wait.entry_id)
            return answer
        if result[1]:
            return self.codec.decode_as(result[1], Answer)
        return answer

    async def _resolve(
        self, waiter: str, request_id: str, status: Resolution, payload: bytes
    ) -> tuple[str, bytes | None]:
        """Run the resolve script: ("ok"|"unknown"|"late"|<status>, stored answer)."""
        raw = await self.pipeliner.batch(
            RESOLVE,
            (self.keys.answers(waiter),),
            (self.retention_ms,),
            (self.keys.state(waiter, request_id),),
            (status, payload, request_id),
        )
        outcome = _text(raw[0])
        stored: bytes | None = raw[1] if len(raw) > 1 else None
        if outcome in NOT_RESOLVED_REASONS and stored == payload:
            return "ok", None  # our own write, retried after its reply was lost
        return outcome, stored

    def _settle(
        self,
        event: Event | None = None,
        ack: tuple[str, str] | None = None,
        delete: bytes | str | None = None,
    ) -> asyncio.Future[Any]:
        """In the background, publish ``event``, acknowledge ``ack=(group, entry_id)`` and
        delete entry ``delete`` of the request stream.

        Events are advisory, and an entry left behind is dropped by whoever reads it
        next, since its request is resolved: so nobody needs to wait for this.
        """
        future = self.pipeliner.batch(
            SETTLE,
            (self.keys.events, self.keys.requests),
            (),
            (),
            (self.codec.encode(event) if event else "", *(ack or ("", "")), delete or ""),
            lazy=True,
        )
        self.pipeliner.fire(future)
        return future

    async def _read_answers(self) -> None:
        """The one blocking reader of this process's reply stream."""
        client = self.blocking_client()
        last_id = "0-0"
        read_since_trim = 0
        backoff = _Backoff()
        reconnected = False
        try:
            while not self._closed:
                try:
                    if reconnected:
                        await self._reconcile()
                        reconnected = False
                    reply: Any = await client.xread(
                        {self._answers_key: last_id}, count=1000, block=self.block_ms
                    )
                    backoff.reset()
                except CONNECTION_ERRORS as exc:
                    await backoff.wait("reading answers", exc)
                    reconnected = True
                    continue
                except redis.exceptions.RedisError as exc:  # e.g. the key was overwritten
                    log.exception("reading answers failed; retrying")
                    await backoff.wait("reading answers", exc)
                    continue
                for _stream, entries in reply or ():
                    for entry_id, fields in entries:
                        last_id = _text(entry_id)
                        wait = self._waits.get(_text(fields.get(b"id", b"")))
                        if wait is not None and not wait.answer.done():
                            wait.answer.set_result(fields[b"a"])
                    read_since_trim += len(entries)
                if read_since_trim >= 1000:
                    read_since_trim = 0
                    with contextlib.suppress(*CONNECTION_ERRORS):
                        await self.redis.xtrim(self._answers_key, minid=last_id, approximate=True)
        finally:
            await client.aclose()

    async def _reconcile(self) -> None:
        """After a reconnect: take answers from state, republish requests Redis lost."""
        waits = [w for w in self._waits.values() if w.published]
        state = self.keys.state
        states = await asyncio.gather(
            *(
                self.pipeliner.call("HMGET", state(self.waiter_id, w.request_id), "s", "a")
                for w in waits
            )
        )
        for wait, (status, answer) in zip(waits, states, strict=True):
            if status is None:
                log.warning("request %s was lost by Redis; publishing it again", wait.request_id)
                self._publish(wait)
            elif answer is not None and not wait.answer.done():
                wait.answer.set_result(answer)

    # -- answering ----------------------------------------------------------------

    async def answer(self, answer: Answer) -> None:
        waiter = await self.redis.get(self.keys.route(answer.id))
        if waiter is None:
            raise UnknownRequest(answer.id)
        waiter_id = _text(waiter)
        raw_request = await self.redis.hget(self.keys.state(waiter_id, answer.id), "req")
        if raw_request is None:
            raise UnknownRequest(answer.id)
        request = self.codec.decode_as(raw_request, Request)
        await self.resolve_answer(request, check_answer(request, answer, None))

    async def resolve_answer(
        self, request: Request, answer: Answer, ack: tuple[str, str] | None = None
    ) -> None:
        """Resolve ``request`` with an already checked ``answer`` (see :meth:`answer`);
        on success acknowledge ``ack=(group, entry_id)`` too."""
        waiter = request.reply_to
        if waiter is None:
            raise UnknownRequest(request.id)
        payload = self.codec.encode(answer)
        outcome, _stored = await self._resolve(waiter, request.id, "answered", payload)
        if outcome == "ok":
            entry = ack[1] if ack else None
            self._settle(Event(event="answered", id=answer.id, answer=answer), ack, entry)
        elif outcome == "unknown":
            raise UnknownRequest(request.id)
        elif outcome == "late":
            raise AlreadyResolved(request.id, "expired")
        else:
            raise AlreadyResolved(request.id, NOT_RESOLVED_REASONS[outcome])

    async def complete(self, request_id: str) -> None:
        self._settle(Event(event="completed", id=request_id))

    # -- responder side and events ------------------------------------------------

    def responder(
        self,
        group: str,
        consumer: str | None = None,
        *,
        until_idle: bool = False,
        count: int = 100,
    ) -> RedisResponder:
        return RedisResponder(
            self, group, consumer or default_consumer_name(), count=count, until_idle=until_idle
        )

    def events(self) -> RedisEvents:
        return RedisEvents(self)

    # -- lifecycle ----------------------------------------------------------------

    def _spawn(self, coro: Awaitable[T]) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def aclose(self) -> None:
        if self._background:
            await asyncio.wait(self._background, timeout=5)
        self._closed = True
        for responder in list(self._responders):
            await responder.aclose()
        if self._reader is not None and not self._reader.done():
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        with contextlib.suppress(*CONNECTION_ERRORS):
            async with asyncio.timeout(5):
                await self.pipeliner.drain()  # events and acknowledgements still queued
        self.pipeliner.close()
        self._deadlines.close()
        if self._republisher is not None:
            self._republisher.cancel()
        await self.redis.aclose()

    def statistics(self) -> dict[str, int]:
        """Counters for operators: waits in progress, responders open."""
        return {"waiting": len(self._waits), "responders": len(self._responders)}

    # -- heartbeats (sdk branch) ------------------------------------------------------
    # One hash per queue (Keys.heartbeats): field "group/consumer", value an encoded
    # Heartbeat. The key's TTL is kept at the longest heartbeat's, so a fleet that died
    # leaves nothing behind; readers drop the fields that expired.

    async def heartbeat(
        self,
        group: str,
        consumer: str,
        *,
        ttl_s: float,
        info: Mapping[str, str | int | float] | None = None,
    ) -> None:
        key, field = self.keys.heartbeats(), f"{group}/{consumer}"
        try:
            if ttl_s <= 0:
                await self.redis.hdel(key, field)
                return
            now = time.time()
            beat = Heartbeat(group, consumer, now, now + ttl_s, dict(info or {}))
            ttl_ms = max(1, int(ttl_s * 1000))
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.hset(key, field, self.codec.encode(beat))
                pipe.pexpire(key, ttl_ms, nx=True)  # a new key gets this heartbeat's TTL
                pipe.pexpire(key, ttl_ms, gt=True)  # an existing one is only ever extended
                await pipe.execute()
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError) as exc:
            raise BrokerUnavailable(f"cannot record a heartbeat at {self.url}: {exc}") from exc

    async def heartbeats(self) -> list[Heartbeat]:
        key = self.keys.heartbeats()
        errors = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError)
        try:
            fields: dict[bytes | str, bytes | str] = await self.redis.hgetall(key)
        except errors as exc:
            raise BrokerUnavailable(f"cannot read heartbeats at {self.url}: {exc}") from exc
        now = time.time()
        live: list[Heartbeat] = []
        stale: list[bytes | str] = []
        for field, raw in fields.items():
            try:
                beat = self.codec.decode_as(raw, Heartbeat)
            except DecodeError:
                stale.append(field)  # not a heartbeat: nobody can read it either
                continue
            if beat.expires_at > now:
                live.append(beat)
            else:
                stale.append(field)
        if stale:
            with contextlib.suppress(*errors):
                await self.redis.hdel(key, *stale)
        return live


class RedisPending(Pending):
    def __init__(self, responder: RedisResponder, request: Request, entry_id: str) -> None:
        self.request = request
        self.entry_id = entry_id
        self.responder_name = f"{responder.group}/{responder.consumer}"
        self._responder = responder

    async def answer(self, answer: Answer) -> None:
        checked = check_answer(self.request, answer, self.responder_name)
        responder = self._responder
        try:
            await responder.broker.resolve_answer(
                self.request, checked, ack=(responder.group, self.entry_id)
            )
        except NotResolved:
            await responder.release(self)
            raise
        await responder.release(self, acknowledged=True)

    async def skip(self) -> None:
        await self._responder.release(self)


class RedisResponder(Responder):
    """One consumer of a consumer group on the request stream.

    Reads its own pending entries first (after a start or a reconnect), then new
    ones; renews the lease on what it holds every ``lease_ms / 3``, reclaims the
    entries of consumers idle longer than ``lease_ms``, acknowledges entries whose
    request was resolved elsewhere, and resolves as expired what outlived its
    deadline with no waiter left to do it.
    """

    def __init__(
        self, broker: RedisBroker, group: str, consumer: str, *, count: int, until_idle: bool
    ) -> None:
        self.broker, self.group, self.consumer, self.count = broker, group, consumer, count
        self.until_idle = until_idle
        self._idle = False  # the last read of new entries found none
        self._stream = broker.keys.requests
        self._held: dict[str, RedisPending] = {}
        self._ready: deque[RedisPending] = deque()
        self._client: aioredis.Redis | None = None
        self._maintainer: asyncio.Task[None] | None = None
        self._backlog_from: str | None = "0"  # where to read our own pending entries from
        self._closed = False
        self.dead_lettered = 0
        broker._responders.add(self)

    async def _ensure_group(self) -> None:
        try:
            await self.broker.redis.xgroup_create(self._stream, self.group, id="0", mkstream=True)
        except redis.exceptions.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    async def __anext__(self) -> RedisPending:
        backoff = _Backoff()
        while not self._closed:
            if self._ready:
                return self._ready.popleft()
            if self._idle and self.until_idle:
                break
            try:
                if self._client is None:
                    await self._ensure_group()
                    self._client = self.broker.blocking_client()
                    self._maintainer = asyncio.get_running_loop().create_task(self._maintain())
                await self._read()
                backoff.reset()
            except CONNECTION_ERRORS as exc:
                self._backlog_from = "0"
                await backoff.wait(f"responder {self.group}/{self.consumer}", exc)
            except redis.exceptions.ResponseError as exc:
                if "NOGROUP" not in str(exc):
                    raise
                await self._ensure_group()  # Redis lost the group (restart without persistence)
        raise StopAsyncIteration

    async def _read(self) -> None:
        assert self._client is not None
        if self._backlog_from is not None:  # our own pending entries, oldest first
            reply: Any = await self._client.xreadgroup(
                self.group, self.consumer, {self._stream: self._backlog_from}, count=self.count
            )
            entries = reply[0][1] if reply else []
            self._backlog_from = _text(entries[-1][0]) if entries else None
            await self._admit(entries, fresh=False)
        else:
            reply = await self._client.xreadgroup(
                self.group,
                self.consumer,
                {self._stream: ">"},
                count=self.count,
                block=None if self.until_idle else self.broker.block_ms,
            )
            self._idle = not reply or not reply[0][1]
            await self._admit(reply[0][1] if reply else [], fresh=True)

    async def _admit(
        self, entries: Iterable[tuple[bytes, dict[bytes, bytes]]], *, fresh: bool
    ) -> None:
        """Queue the open requests among ``entries``; acknowledge or dead-letter the rest.

        ``fresh`` entries were just delivered for the first time: a resolved request's
        entry is deleted from the stream, so they are open unless past their deadline.
        Others (re-read or reclaimed) may have been resolved since: their state is read.
        """
        now = time.time()
        admitted: list[tuple[str, Request]] = []
        unsure: list[tuple[str, Request]] = []
        done: list[str] = []
        for raw_id, fields in entries:
            entry_id = _text(raw_id)
            payload = fields.get(b"r")
            if not fields:  # deleted or trimmed while pending: nothing left to show
                done.append(entry_id)
                continue
            try:
                if payload is None:
                    raise DecodeError("entry has no 'r' field holding a request")
                request = self.broker.codec.decode_as(payload, Request)
                if request.reply_to is None:
                    raise DecodeError("request has no reply_to: it was not published by a broker")
            except DecodeError as exc:
                await self._dead_letter(entry_id, fields, str(exc))
                continue
            held = self._held.get(request.id)
            if held is not None:
                if held.entry_id != entry_id:
                    done.append(entry_id)  # a duplicate XADD of a request we already show
            elif fresh and now < (request.expires_at or float("inf")):
                admitted.append((entry_id, request))
            else:
                unsure.append((entry_id, request))
        if unsure:
            statuses = await self._statuses([request for _, request in unsure])
            for (entry_id, request), status in zip(unsure, statuses, strict=True):
                if status != b"open":
                    done.append(entry_id)
                elif now >= (request.expires_at or float("inf")):
                    await self._expire(request, entry_id)
                    done.append(entry_id)
                else:
                    admitted.append((entry_id, request))
        for entry_id, request in admitted:
            pending = RedisPending(self, request, entry_id)
            self._held[request.id] = pending
            self._ready.append(pending)
        if done:
            await self.broker.redis.xack(self._stream, self.group, *done)

    async def _statuses(self, requests: list[Request]) -> list[bytes | None]:
        """The status of each request's state (``b"open"``, ...; None if Redis forgot it)."""
        keys = self.broker.keys
        batch = self.broker.pipeliner.batch
        statuses: list[bytes | None] = await asyncio.gather(
            *(
                batch(STATUS, (keys.answers(waiter),), (), (keys.state(waiter, r.id),), ())
                for r in requests
                for waiter in (r.reply_to or "",)
            )
        )
        return statuses

    async def _dead_letter(self, entry_id: str, fields: dict[bytes, bytes], error: str) -> None:
        log.error("dead-lettering entry %s of %s: %s", entry_id, self._stream, error)
        record: dict[Any, Any] = {"error": error, "entry": entry_id}
        record.update({b"field:" + k: v for k, v in fields.items()})
        async with self.broker.redis.pipeline(transaction=True) as pipe:
            pipe.xadd(self.broker.keys.dead, record, maxlen=100_000, approximate=True)
            pipe.xack(self._stream, self.group, entry_id)
            await pipe.execute()
        self.dead_lettered += 1

    async def release(self, pending: RedisPending, *, acknowledged: bool = False) -> None:
        """Stop holding ``pending`` (resolved or skipped) and acknowledge its entry."""
        if self._held.get(pending.request.id) is pending:
            del self._held[pending.request.id]
        if not acknowledged:
            await self.broker._settle(ack=(self.group, pending.entry_id))

    async def _maintain(self) -> None:
        """Renew leases, drop what was resolved elsewhere, reclaim what dead consumers held."""
        interval_s = self.broker.lease_ms / 3000
        backoff = _Backoff()
        while not self._closed:
            await asyncio.sleep(interval_s)
            try:
                await self._sweep_held()
                await self._reclaim()
                backoff.reset()
            except CONNECTION_ERRORS as exc:
                await backoff.wait(f"maintaining {self.group}/{self.consumer}", exc)
            except redis.exceptions.RedisError:  # keep renewing leases whatever happened
                log.exception("maintaining %s/%s failed", self.group, self.consumer)

    async def _sweep_held(self) -> None:
        held = list(self._held.values())
        if not held:
            return
        statuses = await self._statuses([pending.request for pending in held])
        now = time.time()
        renew: list[int | bytes | str | memoryview] = []
        for pending, status in zip(held, statuses, strict=True):
            if status != b"open":
                await self._forget(pending)
            elif now >= (pending.request.expires_at or float("inf")):
                await self._expire(pending.request, pending.entry_id)
                await self._forget(pending)
            else:
                renew.append(pending.entry_id)
        if renew:  # XCLAIM by the holder resets the idle time: the lease is renewed
            await self.broker.redis.xclaim(
                self._stream, self.group, self.consumer, 0, renew, justid=True
            )

    async def _expire(self, request: Request, entry_id: str) -> None:
        """Resolve as expired a request past its deadline whose waiter did not (it died)."""
        answer = Answer(id=request.id, ok=False, reason="expired")
        payload = self.broker.codec.encode(answer)
        outcome, _ = await self.broker._resolve(
            request.reply_to or "", answer.id, "expired", payload
        )
        if outcome == "ok":
            self.broker._settle(Event(event="expired", id=answer.id, answer=answer), None, entry_id)

    async def _forget(self, pending: RedisPending) -> None:
        with contextlib.suppress(ValueError):
            self._ready.remove(pending)
        await self.release(pending)

    async def _reclaim(self) -> None:
        cursor = "0-0"
        while True:
            reply: Any = await self.broker.redis.xautoclaim(
                self._stream,
                self.group,
                self.consumer,
                min_idle_time=self.broker.lease_ms,
                start_id=cursor,
                count=self.count,
            )
            cursor, entries = _text(reply[0]), reply[1]
            if entries:
                log.info("%s/%s reclaimed %d requests", self.group, self.consumer, len(entries))
                await self._admit(entries, fresh=False)
            if cursor == "0-0":
                return

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.broker._responders.discard(self)
        if self._maintainer is not None:
            self._maintainer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._maintainer
        if self._client is not None:
            await self._client.aclose()
        self._held.clear()  # unacknowledged: another consumer reclaims them after the lease

    def __repr__(self) -> str:
        return (
            f"<RedisResponder {self.group}/{self.consumer} holding {len(self._held)}, "
            f"dead-lettered {self.dead_lettered}>"
        )


class RedisEvents(EventStream):
    """Follows the events stream from the moment it was created."""

    def __init__(self, broker: RedisBroker) -> None:
        self._broker = broker
        self._last_id = f"{_ms(time.time())}-0"
        self._client: aioredis.Redis | None = None
        self._buffer: deque[Event] = deque()
        self._closed = False

    async def __anext__(self) -> Event:
        backoff = _Backoff()
        while not self._buffer:
            if self._closed:
                raise StopAsyncIteration
            if self._client is None:
                self._client = self._broker.blocking_client()
            try:
                reply: Any = await self._client.xread(
                    {self._broker.keys.events: self._last_id},
                    count=100,
                    block=self._broker.block_ms,
                )
                backoff.reset()
            except CONNECTION_ERRORS as exc:
                await backoff.wait("reading events", exc)
                continue
            for _stream, entries in reply or ():
                for entry_id, fields in entries:
                    self._last_id = _text(entry_id)
                    try:
                        self._buffer.append(self._broker.codec.decode_as(fields[b"e"], Event))
                    except (DecodeError, KeyError) as exc:
                        log.error("skipping unreadable event %s: %s", entry_id, exc)
        return self._buffer.popleft()

    async def aclose(self) -> None:
        self._closed = True
        if self._client is not None:
            await self._client.aclose()
