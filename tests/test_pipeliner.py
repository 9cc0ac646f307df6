"""The Redis broker's pipeliner and blocking reads on one server: lazy items, posted items
and work put off, error replies in place, and a connection abandoned mid-reply never read
again."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis
import redis.exceptions

from toolnexus.redis_broker._connections import BlockingReader
from toolnexus.redis_broker._pipeliner import LAZY_DELAY_S, Pipeliner

pytestmark = pytest.mark.redis


async def test_lazy_items_travel_behind_the_next_urgent_ones(
    redis_url: str, namespace: str
) -> None:
    client = aioredis.Redis.from_url(redis_url)
    pipeliner = Pipeliner(client, timeout_s=5)
    try:
        key = f"{namespace}:k"
        lazy = pipeliner.call("SET", key, "lazy", lazy=True)
        urgent = pipeliner.call("GET", key)
        assert await urgent is None  # issued after the lazy SET, but it runs first ...
        assert await lazy == b"OK"  # ... and the lazy one in the same pipeline
        assert pipeliner.round_trips == 1
        alone = pipeliner.call("SET", key, "alone", lazy=True)
        await asyncio.sleep(LAZY_DELAY_S / 4)
        assert not alone.done()  # a lazy item waits for company ...
        assert await asyncio.wait_for(alone, 1) == b"OK"  # ... for LAZY_DELAY_S at most
        assert await client.get(key) == b"alone"
        assert pipeliner.round_trips == 2
    finally:
        pipeliner.close()
        await client.aclose()


async def test_an_error_reply_fails_its_own_command_only(redis_url: str, namespace: str) -> None:
    client = aioredis.Redis.from_url(redis_url)
    pipeliner = Pipeliner(client, timeout_s=5)
    try:
        key = f"{namespace}:text"
        await pipeliner.call("SET", key, "not a number")
        before, bad, after = (
            pipeliner.call("GET", key),
            pipeliner.call("INCR", key),
            pipeliner.call("STRLEN", key),
        )
        assert await before == b"not a number"
        with pytest.raises(redis.exceptions.ResponseError, match="not an integer"):
            await bad
        assert await after == len("not a number")
    finally:
        pipeliner.close()
        await client.aclose()


async def test_a_connection_given_up_mid_reply_is_not_read_again(
    redis_url: str, namespace: str
) -> None:
    """A pipeline that outlives ``timeout_s`` fails; its connection (the one the pipeliner
    keeps), whose reply is still to come, is closed: the next command must get its own
    reply, not the late one."""
    client = aioredis.Redis.from_url(redis_url)
    pipeliner = Pipeliner(client, timeout_s=0.2)
    try:
        queue, key = f"{namespace}:list", f"{namespace}:key"
        with pytest.raises(TimeoutError):
            await pipeliner.call("BLPOP", queue, 1)
        await client.set(key, "mine")
        other = aioredis.Redis.from_url(redis_url)
        await other.rpush(queue, "late")  # what the abandoned BLPOP would have returned
        await other.aclose()
        assert await pipeliner.call("GET", key) == b"mine"
    finally:
        pipeliner.close()
        await client.aclose()


async def test_posted_items_deliver_their_reply_or_log_their_failure(
    redis_url: str, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    """``post`` and ``post_batch`` have no future: a handler gets the reply (or the
    exception) as soon as it is read, and a failure without a handler is logged."""
    from toolnexus.redis_broker._scripts import SETTLE

    client = aioredis.Redis.from_url(redis_url)
    pipeliner = Pipeliner(client, timeout_s=5)
    try:
        key, events = f"{namespace}:text", f"{namespace}:events"
        await pipeliner.call("SET", key, "not a number")
        pipeliner.post("INCR", key, lazy=False)  # fails: logged, raised nowhere
        got: list[object] = []
        item = (b"an event", "", "", "", "")
        requests, audit = f"{namespace}:requests", f"{namespace}:audit"
        shared = (0, 60_000, 0, 100)  # the last: the audit stream's length cap
        pipeliner.post_batch(
            SETTLE, (events, requests, audit), shared, (), item, on_reply=got.append
        )
        pipeliner.post_batch(
            SETTLE, (key, requests, audit), shared, (), item, lazy=False, on_reply=got.append
        )  # its event goes to a string key: WRONGTYPE, handed to the handler
        await pipeliner.drain()
        assert isinstance(got[0], redis.exceptions.ResponseError)  # the urgent one ran first
        assert "WRONGTYPE" in str(got[0])
        assert got[1] == 1  # the lazy batch: one item settled
        assert await client.xlen(events) == 1
        assert "background Redis command failed" in caplog.text
        assert "not an integer" in caplog.text
    finally:
        pipeliner.close()
        await client.aclose()


async def test_work_put_off_runs_once_the_next_pipeline_is_written(
    redis_url: str, namespace: str
) -> None:
    """``after_send`` work runs after the next pipeline is written (its lazy items go with
    the pipeline after), after ``LAZY_DELAY_S`` if none is, and before ``drain`` returns."""
    client = aioredis.Redis.from_url(redis_url)
    pipeliner = Pipeliner(client, timeout_s=5)
    key = f"{namespace}:order"
    try:
        ran: list[int] = []

        def work() -> None:
            ran.append(pipeliner.round_trips)
            pipeliner.post("RPUSH", key, "work")

        pipeliner.after_send(work)
        urgent = pipeliner.call("RPUSH", key, "urgent")
        assert await urgent == 1  # the urgent push went first ...
        assert ran == [1]  # ... and the work ran once its pipeline was written
        assert await pipeliner.call("RPUSH", key, "next") == 2  # "work" rode behind it
        assert await client.lrange(key, 0, -1) == [b"urgent", b"next", b"work"]
        assert pipeliner.round_trips == 2

        pipeliner.after_send(work)  # no pipeline follows: the lazy delay runs it
        await asyncio.sleep(LAZY_DELAY_S * 3)
        assert ran == [1, 2] and await client.llen(key) == 4

        pipeliner.after_send(work)
        await pipeliner.drain()  # runs it, and sends what it issued
        assert await client.llen(key) == 5
    finally:
        pipeliner.close()
        await client.aclose()


async def test_a_blocking_read_given_up_is_not_read_again(redis_url: str, namespace: str) -> None:
    """A read cancelled while Redis still owes its reply closes the reader's connection: the
    next read gets its own reply, not the late one."""
    reader = BlockingReader(aioredis.Redis.from_url(redis_url), patience_s=5)
    other = aioredis.Redis.from_url(redis_url)
    stream = f"{namespace}:stream"
    try:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.2):
                await reader.xread(stream, "0-0", 10, 2000)
        late = await other.xadd(stream, {"k": "late"})  # what the abandoned read would get
        assert await reader.xread(stream, late.decode(), 10, 50) == []
        new = await other.xadd(stream, {"k": "new"})
        assert await reader.xread(stream, "0-0", 10, 50) == [
            (late, {b"k": b"late"}),
            (new, {b"k": b"new"}),
        ]
    finally:
        await reader.aclose()
        await other.aclose()


@pytest.mark.parametrize("protocol", [2, 3])
async def test_blocking_reads_in_either_protocol(
    redis_url: str, namespace: str, protocol: int
) -> None:
    """``XREAD`` and ``XREADGROUP`` give the same entries in RESP2 and RESP3; an entry
    deleted while pending comes back without fields."""
    reader = BlockingReader(aioredis.Redis.from_url(redis_url, protocol=protocol), patience_s=5)
    other = aioredis.Redis.from_url(redis_url)
    stream = f"{namespace}:stream"
    try:
        await other.xgroup_create(stream, "g", id="0", mkstream=True)
        first = await other.xadd(stream, {"a": "1", "b": "2"})
        second = await other.xadd(stream, {"a": "3"})
        assert await reader.xread(stream, "0-0", 10, 50) == [
            (first, {b"a": b"1", b"b": b"2"}),
            (second, {b"a": b"3"}),
        ]
        assert await reader.xreadgroup("g", "c", stream, ">", 1, 50) == [
            (first, {b"a": b"1", b"b": b"2"})
        ]
        await other.xdel(stream, first)
        assert await reader.xreadgroup("g", "c", stream, "0", 10, None) == [(first, None)]
        assert await reader.xreadgroup("g", "c", stream, ">", 10, 50) == [(second, {b"a": b"3"})]
        assert await reader.xreadgroup("g", "c", stream, ">", 10, 50) == []
    finally:
        await reader.aclose()
        await other.aclose()


async def test_a_caller_alone_sends_its_own_commands(redis_url: str, namespace: str) -> None:
    """Commands issued in ``sending()`` are sent and answered by the caller's own task when
    nothing else is on its way; with another pipeline out, or with ``now=False``, they go
    as usual; a caller cancelled mid-send takes only its own commands down with it."""
    client = aioredis.Redis.from_url(redis_url)
    pipeliner = Pipeliner(client, timeout_s=5)
    key, queue = f"{namespace}:k", f"{namespace}:list"
    try:
        await pipeliner.call("PING")
        async with pipeliner.sending():
            mine = pipeliner.call("SET", key, "alone")
        assert mine.done() and mine.result() == b"OK"  # answered before the block ended

        async with pipeliner.sending(now=False):
            usual = pipeliner.call("GET", key)
        assert not usual.done()  # the pipeliner's task sends it, a turn later
        assert await usual == b"alone"

        out = pipeliner.call("BLPOP", queue, 0.3)  # a pipeline on its way ...
        async with pipeliner.sending():
            behind = pipeliner.call("GET", key)
        assert not behind.done()  # ... so this one waits for it, as usual
        assert await out is None and await behind == b"alone"

        async def blocked() -> None:
            async with pipeliner.sending():
                pipeliner.call("BLPOP", queue, 2)

        caller = asyncio.create_task(blocked())
        await asyncio.sleep(0.1)
        caller.cancel()
        with pytest.raises(asyncio.CancelledError):
            await caller
        other = aioredis.Redis.from_url(redis_url)
        await other.rpush(queue, "late")  # what the abandoned BLPOP would have returned
        await other.aclose()
        assert await asyncio.wait_for(pipeliner.call("GET", key), 1) == b"alone"
        assert await client.lrange(queue, 0, -1) == [b"late"]
    finally:
        pipeliner.close()
        await client.aclose()


# -- The public-API-only mode (toolnexus.redis_broker._redispy): redis-py's pipelines and
# reads, the same guarantees


async def test_public_api_pipelines_keep_the_order_errors_and_lazy_items(
    redis_url: str, namespace: str
) -> None:
    client = aioredis.Redis.from_url(redis_url)
    pipeliner = Pipeliner(client, timeout_s=5, public_api=True)
    try:
        key = f"{namespace}:k"
        await pipeliner.call("SET", key, "text")
        lazy = pipeliner.call("SET", key, "lazy", lazy=True)
        urgent = pipeliner.call("GET", key)
        bad = pipeliner.call("INCR", key)
        assert await urgent == b"text"  # the urgent ones first, the lazy one behind them
        with pytest.raises(redis.exceptions.ResponseError, match="not an integer"):
            await bad
        assert await lazy  # redis-py's response callback: True for OK
        assert pipeliner.round_trips == 2
        assert await pipeliner.call("STRLEN", key) == 4
    finally:
        pipeliner.close()
        await client.aclose()


async def test_public_api_pipelines_given_up_mid_reply_are_not_read_again(
    redis_url: str, namespace: str
) -> None:
    client = aioredis.Redis.from_url(redis_url)
    pipeliner = Pipeliner(client, timeout_s=0.2, public_api=True)
    try:
        queue, key = f"{namespace}:list", f"{namespace}:key"
        with pytest.raises(TimeoutError):
            await pipeliner.call("BLPOP", queue, 1)
        with pytest.raises(TimeoutError):  # as a pipeline of two
            await asyncio.gather(pipeliner.call("PING"), pipeliner.call("BLPOP", queue, 1))
        await client.set(key, "mine")
        await client.rpush(queue, "late", "later")  # what the abandoned BLPOPs would get
        assert await pipeliner.call("GET", key) == b"mine"
        assert await asyncio.gather(pipeliner.call("GET", key), pipeliner.call("PING")) == [
            b"mine",
            True,
        ]
    finally:
        pipeliner.close()
        await client.aclose()


@pytest.mark.parametrize("protocol", [2, 3])
async def test_public_api_blocking_reads(redis_url: str, namespace: str, protocol: int) -> None:
    """The same entries as direct reads, in RESP2 and RESP3; a read given up is not read
    again."""
    client = aioredis.Redis.from_url(redis_url, protocol=protocol)
    reader = BlockingReader(client, patience_s=5, public_api=True)
    other = aioredis.Redis.from_url(redis_url)
    stream = f"{namespace}:stream"
    try:
        await other.xgroup_create(stream, "g", id="0", mkstream=True)
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.2):
                await reader.xreadgroup("g", "c", stream, ">", 10, 2000)
        first = await other.xadd(stream, {"a": "1", "b": "2"})  # the abandoned read's
        second = await other.xadd(stream, {"a": "3"})
        assert await reader.xread(stream, "0-0", 10, 50) == [
            (first, {b"a": b"1", b"b": b"2"}),
            (second, {b"a": b"3"}),
        ]
        assert await reader.xreadgroup("g", "c", stream, ">", 1, 50) == [
            (first, {b"a": b"1", b"b": b"2"})
        ]
        await other.xdel(stream, first)
        assert await reader.xreadgroup("g", "c", stream, "0", 10, None) == [(first, None)]
        assert await reader.xreadgroup("g", "c", stream, ">", 10, 50) == [(second, {b"a": b"3"})]
    finally:
        await reader.aclose()
        await other.aclose()
