"""The Redis broker's pipeliner on one server: lazy items, error replies in place, and a
connection abandoned mid-reply never read again."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis
import redis.exceptions

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
