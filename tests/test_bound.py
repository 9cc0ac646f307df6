"""``Bound``: successive awaits bounded by one timer, as ``asyncio.timeout`` bounds one:
an await past its time raises ``TimeoutError`` and leaves its task uncancelled; one
within its time is untouched; a cancellation from elsewhere stays a cancellation; and a
blocking read whose server never replies fails in bounded time."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time

import pytest
import redis.asyncio as aioredis

from toolnexus._timers import Bound
from toolnexus.redis_broker._connections import BlockingReader


async def test_an_await_past_its_time_raises_timeout_and_the_task_goes_on() -> None:
    bound = Bound()
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(TimeoutError), bound(0.05):
        await asyncio.sleep(10)
    assert 0.04 <= loop.time() - started < 1
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0  # not left cancelled
    await asyncio.sleep(0.01)  # ... so the next await is not cancelled either
    bound.close()


async def test_successive_awaits_share_one_timer_that_moves_on() -> None:
    bound = Bound()
    for _ in range(5):  # each within its time, together past the first one's
        with bound(0.05):
            await asyncio.sleep(0.02)
    # the timer set for the first still bounds the last
    with pytest.raises(TimeoutError), bound(0.05):
        await asyncio.sleep(10)
    with bound(0.05):  # and after a timeout, as before
        assert await asyncio.sleep(0, "ok") == "ok"
    bound.close()


async def test_a_shorter_bound_than_the_timer_set_is_kept() -> None:
    bound = Bound()
    with bound(30):
        await asyncio.sleep(0)
    started = time.monotonic()
    with pytest.raises(TimeoutError), bound(0.05):  # earlier than the timer the first set
        await asyncio.sleep(10)
    assert time.monotonic() - started < 1
    bound.close()


async def test_a_cancellation_from_elsewhere_stays_a_cancellation() -> None:
    bound = Bound()

    async def bounded() -> None:
        with bound(10):
            await asyncio.sleep(10)

    task = asyncio.create_task(bounded())
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    bound.close()


async def test_a_blocking_read_whose_server_never_replies_times_out() -> None:
    """A peer that accepts the connection and then says nothing: the read ends with
    ``TimeoutError`` after its block plus the reader's patience, not never."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    client = aioredis.Redis(host="127.0.0.1", port=port, protocol=2)
    reader = BlockingReader(client, patience_s=0.2)
    started = time.monotonic()
    try:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(reader.xread("s", "0", 10, 100), 10)  # (a backstop)
        assert 0.25 <= time.monotonic() - started < 5
    finally:
        with contextlib.suppress(Exception):
            await reader.aclose()
        listener.close()
