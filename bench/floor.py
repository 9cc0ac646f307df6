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

from bench.common import (
    ANSWER_DATA,
    PAYLOAD,
    SPAWN,
    CaseResult,
    Scale,
    measure_sequential,
    measure_throughput,
    redis_clients_of_this_process,
    settled_rss,
    stop_process,
    stream_entries,
    wait_for_entries,
)

REQUESTS: Final = "floor:requests"
GROUP: Final = "floor-responders"
BLOCK_MS: Final = 100

_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder().decode


# --- responder process -------------------------------------------------------


def responder_main(url: str, ready: Any, go: Any, stop: Any) -> None:
    """Entry point of the responder process; answers until ``stop`` is set."""
    asyncio.run(_responder(url, ready, go, stop))


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
            for _stream, entries in batches:
                for entry_id, fields in entries:
                    body = _decode(fields[b"b"])
                    answer = {"id": body["id"], "ok": True, "data": ANSWER_DATA}
                    pipe.xadd(fields[b"r"], {b"id": fields[b"id"], b"b": _encode(answer)})
                    acked.append(entry_id)
            pipe.xack(REQUESTS, GROUP, *acked)
            await pipe.execute()
    finally:
        await r.aclose()


class Responder:
    """A floor responder in another process (started ready, answering once ``go`` is set)."""

    def __init__(self, url: str, *, start_answering: bool = True) -> None:
        self.ready = SPAWN.Event()
        self.go = SPAWN.Event()
        self.stop = SPAWN.Event()
        if start_answering:
            self.go.set()
        self.proc = SPAWN.Process(
            target=responder_main, args=(url, self.ready, self.go, self.stop), daemon=True
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


def _request_fields(request_id: str, reply_to: str) -> dict[Any, Any]:
    body = {"id": request_id, "kind": "input", "data": PAYLOAD}
    return {b"id": request_id.encode(), b"r": reply_to.encode(), b"b": _encode(body)}


class DirectWaiter:
    """Sequential round trips on one connection: XADD, then XREAD BLOCK for the answer."""

    def __init__(self, url: str) -> None:
        self.r = aioredis.Redis.from_url(url, socket_timeout=None)
        self.reply_to = f"floor:reply:{uuid.uuid4().hex}"
        self.last = b"0-0"

    async def round_trip(self) -> dict[str, Any]:
        request_id = uuid.uuid4().hex
        await self.r.xadd(REQUESTS, _request_fields(request_id, self.reply_to))
        want = request_id.encode()
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
    """Concurrent waits: futures by request id, one blocking reader for the reply stream.

    Requests go out as one ``XADD`` per call over a blocking pool of
    ``max_connections``, or, with ``coalesce=True``, every ``XADD`` issued in
    one event-loop turn goes out in one pipeline on one connection.
    """

    def __init__(self, url: str, *, coalesce: bool = False, max_connections: int = 50) -> None:
        pool = aioredis.BlockingConnectionPool.from_url(
            url, max_connections=max_connections, timeout=None
        )
        self.w = aioredis.Redis(connection_pool=pool)
        self.reader = aioredis.Redis.from_url(url, socket_timeout=None)
        self.reply_to = f"floor:reply:{uuid.uuid4().hex}"
        self.pending: dict[bytes, asyncio.Future[dict[str, Any]]] = {}
        self.coalesce = coalesce
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

    async def round_trip(self) -> dict[str, Any]:
        request_id = uuid.uuid4().hex
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.pending[request_id.encode()] = fut  # registered before publishing
        fields = _request_fields(request_id, self.reply_to)
        if self.coalesce:
            self._queued.append(fields)
            if not self._flush_scheduled:
                self._flush_scheduled = True
                asyncio.get_running_loop().call_soon(self._start_flush)
        else:
            await self.w.xadd(REQUESTS, fields)
        async with asyncio.timeout(60):
            return await fut

    def _start_flush(self) -> None:
        self._flush_scheduled = False
        batch, self._queued = self._queued, []
        task = asyncio.create_task(self._flush(batch))
        self._flushes.add(task)
        task.add_done_callback(self._flushes.discard)

    async def _flush(self, batch: list[dict[Any, Any]]) -> None:
        pipe = self.w.pipeline(transaction=False)
        for fields in batch:
            pipe.xadd(REQUESTS, fields)
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
        await self.w.aclose()
        await self.w.connection_pool.disconnect()
        await self.reader.aclose()


# --- cases -----------------------------------------------------------------------


def latency_case(url: str, params: dict[str, Any]) -> CaseResult:
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
            variant="direct",
            settings="XADD; XREADGROUP BLOCK; XADD+XACK pipelined; XREAD BLOCK",
            latency=lat,
            samples_ms=[s / 1e6 for s in samples],
        )

    with Responder(url):
        return asyncio.run(run())


def throughput_case(url: str, params: dict[str, Any]) -> CaseResult:
    coalesce = bool(params.get("coalesce", False))

    async def run() -> CaseResult:
        client = FloorClient(url, coalesce=coalesce)
        await client.start()
        try:
            rows = [
                await measure_throughput(client.round_trip, c, w, n) for c, w, n in params["levels"]
            ]
        finally:
            await client.aclose()
        return CaseResult(
            case="floor",
            variant="coalesced" if coalesce else "pool",
            settings=(
                "XADDs of one loop turn in one pipeline; one demuxing XREAD reader"
                if coalesce
                else "one XADD per wait over a 50-connection pool; one demuxing XREAD reader"
            ),
            throughput=rows,
        )

    with Responder(url):
        return asyncio.run(run())


def scale_case(url: str, params: dict[str, Any]) -> CaseResult:
    """``waits`` pending at once; the responder starts answering only once all are published."""
    waits = int(params["waits"])

    async def run(responder: Responder) -> CaseResult:
        client = FloorClient(url, coalesce=True)
        await client.start()
        before_entries = await stream_entries(url)
        tasks = [asyncio.create_task(client.round_trip())]
        await wait_for_entries(url, before_entries + 1)
        connections_at_one = await redis_clients_of_this_process(url)
        rss0 = settled_rss()
        t0 = time.perf_counter()
        tasks += [asyncio.create_task(client.round_trip()) for _ in range(waits - 1)]
        await wait_for_entries(url, before_entries + waits)
        publish_s = time.perf_counter() - t0
        await asyncio.sleep(0.2)
        rss1 = settled_rss()
        connections = await redis_clients_of_this_process(url)
        t1 = time.perf_counter()
        responder.go.set()
        await asyncio.gather(*tasks)
        resolve_s = time.perf_counter() - t1
        await client.aclose()
        return CaseResult(
            case="floor",
            variant="coalesced",
            settings="futures by id, one demuxing reader",
            scale=Scale(
                waits=waits,
                rss_before_bytes=rss0,
                rss_delta_bytes=rss1 - rss0,
                per_wait_bytes=(rss1 - rss0) / (waits - 1),
                connections=connections,
                connections_at_one=connections_at_one,
                publish_s=publish_s,
                resolve_s=resolve_s,
            ),
        )

    with Responder(url, start_answering=False) as responder:
        return asyncio.run(run(responder))
