"""Redis crashed (SIGKILL) and restarted mid-flight with pending waits, under AOF
``everysec`` and ``always``: what survives in Redis, and what the waits get (SPEC §11:
with persistence on, nothing is lost; a waiter publishes again what Redis lost)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
import redis

import toolnexus
from conftest import FAST, RedisServer
from faults import FULL, REQUESTS, accept_all, figures
from helpers import wait_until
from toolnexus import Request
from toolnexus.models import new_id
from toolnexus.redis_broker import RedisBroker

pytestmark = [pytest.mark.redis, pytest.mark.slow]


@pytest.mark.timeout(240 if FULL else 90)
@pytest.mark.parametrize("fsync", ["everysec", "always"])
async def test_redis_crashed_and_restarted_with_pending_waits(
    tmp_path: Path, namespace: str, fsync: str
) -> None:
    server = RedisServer(tmp_path, "--appendonly", "yes", "--appendfsync", fsync)
    server.start()
    try:
        async with toolnexus.connect(server.url, namespace=namespace, **FAST) as broker:
            assert isinstance(broker, RedisBroker)
            stream = broker.keys.requests
            requests = [Request(id=new_id(), kind="approval", prompt="?") for _ in range(REQUESTS)]
            waits = [asyncio.create_task(broker.wait_for(r, timeout_s=120)) for r in requests]
            with redis.Redis(port=server.port) as probe:

                def all_published() -> bool:
                    return int(probe.xlen(stream)) == REQUESTS

                await asyncio.to_thread(wait_until, "every request is published", all_published)
            server.kill()  # a crash: no shutdown, no final fsync
            killed_at = time.monotonic()
            server.start()
            with redis.Redis(port=server.port) as probe:
                surviving = int(probe.xlen(stream))
            async with asyncio.timeout(100):
                answering = asyncio.create_task(accept_all(broker))
                answers = await asyncio.gather(*waits)
                recovered_s = round(time.monotonic() - killed_at, 2)
                answering.cancel()
    finally:
        server.kill()
    result = figures(
        f"Redis restarted, appendfsync {fsync}",
        REQUESTS,
        answers,
        surviving_in_redis=surviving,
        recovered_s=recovered_s,
    )
    if fsync == "always":
        assert surviving == REQUESTS  # every acknowledged write was on disk
    assert result["lost"] == 0  # what Redis lost, the waiter published again
