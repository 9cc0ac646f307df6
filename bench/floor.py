"""The floor: the same request → answer round trip, hand-written on bare redis-py asyncio.

Two processes. The waiter ``XADD``s a request (id, reply stream, msgpack body)
to one request stream; the responder reads it with ``XREADGROUP BLOCK``,
decodes the body, encodes the answer, and sends ``XADD`` answer + ``XACK`` in
one pipeline; the waiter wakes on a blocking ``XREAD`` of its reply stream.

Sequential latency uses the most direct form (``XADD`` then ``XREAD`` on the
same connection, no background task). Concurrent waits use what a reasonable
hand-written client would: one blocking reader per process that demultiplexes
answers by request id to futures, and request ``XADD``s either one per call
over a connection pool (``FloorClient``) or coalesced into one pipeline per
event-loop turn (``coalesce=True``).

With ``writes=True`` (variant ``same writes``: coalesced, for comparison) the floor
also makes the Redis writes toolnexus makes per round trip, as plain commands in the
same pipelines, with no checks: the waiter opens a state hash (status and deadline: a
non-durable state does not hold the request), sets its TTL and a route key beside the
``XADD``; the responder records its
answer in the state and deletes the entry it acknowledges; the waiter then adds an
event (the answer) and an audit record (request and answer). What is left between it
and toolnexus is toolnexus's own work, in Python and in its scripts.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from typing import Any, Final

import msgspec
import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from bench import harness
from bench.common import (
    ANSWER_DATA,
    PAYLOAD,
    SPAWN,
    CaseResult,
    measure_sequential,
    measure_throughput,
    stop_process,
)

REQUESTS: Final = "floor:requests"
EVENTS: Final = "floor:events"
AUDIT: Final = "floor:audit"
GROUP: Final = "floor-responders"
BLOCK_MS: Final = 100
RETENTION_MS: Final = 60_000
DEADLINE_MS: Final = 60_000  # what writes=True records as a request's deadline (waits: 60 s)

_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder().decode


# --- responder process -------------------------------------------------------


def responder_main(url: str, ready: Any, go: Any, stop: Any, loop: str = "asyncio") -> None:
    """Entry point of the responder process; answers until ``stop`` is set."""
    harness.run(_responder(url, ready, go, stop), loop)


async def _responder(url: str, ready: Any, go: Any, stop: Any) -> None:
    r = aioredis.Redis.from_url(url, socket_timeout=None)
    with contextlib.suppress(ResponseError):  # BUSYGROUP: it exists
        await r.xgroup_create(REQUESTS, GROUP, id="0", mkstream=True)
    ready.set()
    await asyncio.to_thread(go.wait)
    consumer = f"c-{os.getpid()}"
    try:
        while not stop.is_set():
            batches: Any = await r.xreadgroup(
                GROUP, consumer, {REQUESTS: ">"}, count=500, block=BLOCK_MS
            )
            if not batches:
                continue
            pipe = r.pipeline(transaction=False)
            acked: list[bytes] = []
            delete = False
            for _stream, entries in batches:
                for entry_id, fields in entries:
                    acked.append(entry_id)
                    if b"h" in fields:  # a wait nobody answers (the wake-up case's)
                        continue
                    body = _decode(fields[b"b"])
                    answer = _encode({"id": body["id"], "ok": True, "data": ANSWER_DATA})
                    state = fields.get(b"s")
                    if state is not None:  # writes=True: record it as the state's answer
                        delete = True
                        pipe.hset(state, mapping={b"s": b"answered", b"a": answer})
                        pipe.pexpire(state, RETENTION_MS)
                    pipe.xadd(fields[b"r"], {b"id": fields[b"id"], b"b": answer})
            pipe.xack(REQUESTS, GROUP, *acked)
            if delete:
                pipe.xdel(REQUESTS, *acked)
            await pipe.execute()
    finally:
        await r.aclose()


class Responder:
    """A floor responder in another process (started ready, answering once ``go`` is set)."""

    def __init__(self, url: str, *, start_answering: bool = True, loop: str = "asyncio") -> None:
        self.ready = SPAWN.Event()
        self.go = SPAWN.Event()
        self.stop = SPAWN.Event()
        if start_answering:
            self.go.set()
        self.proc = SPAWN.Process(
            target=responder_main, args=(url, self.ready, self.go, self.stop, loop), daemon=True
        )

    def __enter__(self) -> Responder:
        self.proc.start()
        if not self.ready.wait(60):
            raise RuntimeError("floor responder did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.go.set()
        stop_process(self.proc)


# --- waiter side ---------------------------------------------------------------


def new_request(hold: bool = False) -> dict[str, Any]:
    """The floor's request: what its body carries (``hold``: no responder answers it)."""
    request: dict[str, Any] = {"id": uuid.uuid4().hex, "kind": "input", "data": PAYLOAD}
    if hold:
        request["hold"] = True
    return request


def _request_fields(request: dict[str, Any], reply_to: str) -> dict[Any, Any]:
    fields = {b"id": request["id"].encode(), b"r": reply_to.encode(), b"b": _encode(request)}
    if request.get("hold"):
        fields[b"h"] = b"1"
    return fields


class DirectWaiter:
    """Sequential round trips on one connection: XADD, then XREAD BLOCK for the answer."""

    def __init__(self, url: str) -> None:
        self.r = aioredis.Redis.from_url(url, socket_timeout=None)
        self.reply_to = f"floor:reply:{uuid.uuid4().hex}"
        self.last = b"0-0"

    async def round_trip(self) -> dict[str, Any]:
        request = new_request()
        await self.r.xadd(REQUESTS, _request_fields(request, self.reply_to))
        want = request["id"].encode()
        while True:
            got: Any = await self.r.xread({self.reply_to: self.last}, block=1000)
            for _stream, entries in got or ():
                for entry_id, fields in entries:
                    self.last = entry_id
                    if fields[b"id"] == want:
                        answer: dict[str, Any] = _decode(fields[b"b"])
                        return answer

    async def aclose(self) -> None:
        await self.r.aclose()


class FloorClient:
    """Concurrent waits: futures by request id, one blocking reader for the reply stream,
    one timer for every deadline (:class:`bench.harness.Deadlines`, as toolnexus has).

    Requests go out as one ``XADD`` per call over a blocking pool of
    ``max_connections``, or, with ``coalesce=True``, every ``XADD`` issued in
    one event-loop turn goes out in one pipeline on one connection.
    """

    def __init__(
        self, url: str, *, coalesce: bool = False, writes: bool = False, max_connections: int = 50
    ) -> None:
        pool = aioredis.BlockingConnectionPool.from_url(
            url, max_connections=max_connections, timeout=None
        )
        self.w = aioredis.Redis(connection_pool=pool)
        self.reader = aioredis.Redis.from_url(url, socket_timeout=None)
        self.reply_to = f"floor:reply:{uuid.uuid4().hex}"
        self.pending: dict[bytes, asyncio.Future[dict[str, Any]]] = {}
        self.coalesce = coalesce or writes
        self.writes = writes
        self._requests: dict[bytes, bytes] = {}  # writes=True: each wait's body, for its record
        self._settles: list[tuple[bytes, bytes]] = []  # writes=True: (body, answer) to record
        self._deadlines = harness.Deadlines()
        self._queued: list[dict[Any, Any]] = []
        self._flush_scheduled = False
        self._flushes: set[asyncio.Task[None]] = set()
        self._running = True
        self._reader_task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._reader_task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        last = b"0-0"
        while self._running:
            got: Any = await self.reader.xread({self.reply_to: last}, count=1000, block=BLOCK_MS)
            for _stream, entries in got or ():
                for entry_id, fields in entries:
                    last = entry_id
                    fut = self.pending.pop(fields[b"id"], None)
                    if fut is not None and not fut.done():
                        fut.set_result(_decode(fields[b"b"]))
                        if self.writes:
                            body = self._requests.pop(fields[b"id"], b"")
                            self._settles.append((body, fields[b"b"]))
                            self._schedule_flush()

    async def round_trip(self) -> dict[str, Any]:
        return await self.wait(new_request())

    async def wait(self, request: dict[str, Any], timeout_s: float = 60) -> dict[str, Any]:
        """Publish ``request`` and wait for its answer (``TimeoutError`` at the deadline)."""
        key = request["id"].encode()
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.pending[key] = fut  # registered before publishing
        self._deadlines.add(fut, timeout_s, len(self.pending))
        try:
            if self.coalesce:
                self._enqueue(request)
            else:
                await self._xadd(request)
            return await fut
        finally:
            self.pending.pop(key, None)
            self._requests.pop(key, None)  # (writes=True: a wait that timed out)

    async def _xadd(self, request: dict[str, Any]) -> None:
        await self.w.xadd(REQUESTS, _request_fields(request, self.reply_to))

    def _enqueue(self, request: dict[str, Any]) -> None:
        fields = _request_fields(request, self.reply_to)
        if self.writes:
            fields[b"s"] = b"floor:state:" + fields[b"id"]
            self._requests[fields[b"id"]] = fields[b"b"]
        self._queued.append(fields)
        self._schedule_flush()

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._start_flush)

    def _start_flush(self) -> None:
        self._flush_scheduled = False
        batch, self._queued = self._queued, []
        settles, self._settles = self._settles, []
        task = asyncio.create_task(self._flush(batch, settles))
        self._flushes.add(task)
        task.add_done_callback(self._flushes.discard)

    async def _flush(self, batch: list[dict[Any, Any]], settles: list[tuple[bytes, bytes]]) -> None:
        pipe = self.w.pipeline(transaction=False)
        for fields in batch:
            if self.writes:
                state, deadline = fields[b"s"], str(int(time.time() * 1000) + DEADLINE_MS)
                pipe.hset(state, mapping={b"s": b"open", b"x": deadline})
                pipe.pexpire(state, DEADLINE_MS + RETENTION_MS)
                pipe.set(b"floor:route:" + fields[b"id"], self.reply_to, px=RETENTION_MS)
            pipe.xadd(REQUESTS, fields)
        for body, answer in settles:  # writes=True: with the next requests, as toolnexus's
            pipe.xadd(EVENTS, {b"e": answer})
            pipe.xadd(AUDIT, {b"r": _encode([body, answer])})
        try:
            await pipe.execute()
        except Exception as exc:
            for fields in batch:
                fut = self.pending.pop(fields[b"id"], None)
                if fut is not None and not fut.done():
                    fut.set_exception(exc)

    async def aclose(self) -> None:
        self._running = False
        if self._reader_task is not None:
            await self._reader_task
        self._deadlines.close()
        await self.w.aclose()
        await self.w.connection_pool.disconnect()
        await self.reader.aclose()


# --- cases -----------------------------------------------------------------------


def _loop_suffix(loop: str) -> str:
    return "" if loop == "asyncio" else f", {loop}"


def latency_case(url: str, params: dict[str, Any]) -> CaseResult:
    loop = str(params.get("loop", "asyncio"))

    async def run() -> CaseResult:
        waiter = DirectWaiter(url)
        try:
            lat, samples = await measure_sequential(
                waiter.round_trip, params["warmup"], params["n"]
            )
        finally:
            await waiter.aclose()
        return CaseResult(
            case="floor",
            variant="direct" + _loop_suffix(loop),
            settings="XADD; XREADGROUP BLOCK; XADD+XACK pipelined; XREAD BLOCK",
            latency=lat,
            samples_ms=[s / 1e6 for s in samples],
        )

    with Responder(url, loop=loop):
        return harness.run(run(), loop)


THROUGHPUT_SETTINGS: Final = {
    "pool": "one XADD per wait over a 50-connection pool; one demuxing XREAD reader",
    "coalesced": "XADDs of one loop turn in one pipeline; one demuxing XREAD reader",
    "same writes": (
        "coalesced, plus toolnexus's per-wait writes as plain commands: state hash + TTL, "
        "route, answer in the state, XDEL, event and audit record"
    ),
}


def throughput_case(url: str, params: dict[str, Any]) -> CaseResult:
    coalesce = bool(params.get("coalesce", False))
    writes = bool(params.get("writes", False))
    loop = str(params.get("loop", "asyncio"))
    kind = "same writes" if writes else "coalesced" if coalesce else "pool"

    async def run() -> CaseResult:
        client = FloorClient(url, coalesce=coalesce, writes=writes)
        await client.start()
        try:
            rows = [
                await measure_throughput(client.round_trip, c, w, n) for c, w, n in params["levels"]
            ]
        finally:
            await client.aclose()
        return CaseResult(
            case="floor",
            variant=kind + _loop_suffix(loop),
            settings=THROUGHPUT_SETTINGS[kind],
            throughput=rows,
        )

    with Responder(url, loop=loop):
        return harness.run(run(), loop)


def scale_case(url: str, params: dict[str, Any]) -> CaseResult:
    """``waits`` pending at once; the responder starts answering only once all are published."""
    waits = int(params["waits"])

    async def run(responder: Responder) -> CaseResult:
        client = FloorClient(url, coalesce=True)
        await client.start()
        requests = [new_request() for _ in range(waits)]  # before the baseline, as toolnexus's
        scale, _answers = await harness.measure_scale(
            url, requests, lambda request: client.wait(request, 600), responder.go.set
        )
        await client.aclose()
        return CaseResult(
            case="floor",
            variant="coalesced",
            settings="futures by id, one demuxing reader, one deadline timer",
            scale=scale,
        )

    with Responder(url, start_answering=False) as responder:
        return asyncio.run(run(responder))


def wakeup_case(url: str, params: dict[str, Any]) -> CaseResult:
    """Sequential round trips alone, then with ``pending`` other waits nobody answers."""

    async def run() -> CaseResult:
        client = FloorClient(url, coalesce=True)
        await client.start()
        try:
            wakeup = await harness.measure_wakeup(
                url,
                client.round_trip,
                lambda: client.wait(new_request(hold=True), 600),
                int(params["pending"]),
                int(params["warmup"]),
                int(params["n"]),
            )
        finally:
            await client.aclose()
        return CaseResult(
            case="floor",
            variant="coalesced",
            settings="futures by id, one demuxing reader, one deadline timer",
            wakeup=wakeup,
        )

    with Responder(url):
        return asyncio.run(run())
