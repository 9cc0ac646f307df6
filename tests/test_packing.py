"""Commands packed by hiredis (``toolnexus.redis_broker._redispy``): the same bytes as
redis-py's own asyncio packer, the same refusals, and a real server takes them."""

from __future__ import annotations

from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.asyncio.connection import Connection, SSLConnection, UnixDomainSocketConnection
from redis.exceptions import DataError

from toolnexus.redis_broker._redispy import hiredis_packing

COMMANDS: list[tuple[Any, ...]] = [
    ("SET", "k", "v"),
    ("CLIENT SETNAME", "name"),  # a multi-word command name, split as redis-py splits it
    (b"CONFIG GET", b"maxmemory"),
    ("EVALSHA", "a" * 40, 2, "k1", "k2", 15_000, 1.5, 0.1, 1e20, -3, 10**20),
    ("XADD", "s", "*", "r", b"\x00\xff" * 5000),  # larger than redis-py's chunking cutoff
    ("SET", "k", memoryview(b"view")),
    ("SET", "ключ", "värde ✓"),
]


@pytest.mark.parametrize("command", COMMANDS)
def test_hiredis_packs_the_bytes_redis_py_packs(command: tuple[Any, ...]) -> None:
    fast = hiredis_packing(Connection)()
    assert b"".join(fast.pack_command(*command)) == b"".join(
        bytes(chunk) for chunk in Connection().pack_command(*command)
    )


@pytest.mark.parametrize("bad", [True, None])
def test_arguments_redis_py_refuses_are_refused(bad: Any) -> None:
    with pytest.raises(DataError):
        Connection().pack_command("SET", "k", bad)
    with pytest.raises(DataError, match=type(bad).__name__):
        hiredis_packing(Connection)().pack_command("SET", "k", bad)


def test_every_connection_class_keeps_its_own_behaviour() -> None:
    for cls in (Connection, SSLConnection, UnixDomainSocketConnection):
        fast = hiredis_packing(cls)
        assert issubclass(fast, cls) and fast is not cls
        assert hiredis_packing(cls) is fast and hiredis_packing(fast) is fast


@pytest.mark.redis
async def test_a_server_takes_what_hiredis_packs(redis_url: str, namespace: str) -> None:
    pool = aioredis.ConnectionPool.from_url(redis_url)
    pool.connection_class = hiredis_packing(pool.connection_class)
    client = aioredis.Redis.from_pool(pool)
    try:
        value, key = "värde ✓".encode() * 2000, f"{namespace}:packing"
        async with client.pipeline(transaction=False) as pipe:
            pipe.set(key, value, px=10_000)
            pipe.get(key)
            pipe.delete(key)
            assert await pipe.execute() == [True, value, 1]
        assert await client.client_setname("toolnexus-packing-test")
    finally:
        await client.aclose()
