"""Redis paused (``CLIENT PAUSE``, ``DEBUG SLEEP``) for longer than the reconnect backoff
and the command timeout: waits survive, and answers given during the pause arrive."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
import redis

import toolnexus
from conftest import RedisServer
from faults import REQUESTS, accept_all, figures
from toolnexus import Request
from toolnexus.models import new_id

pytestmark = [pytest.mark.redis, pytest.mark.slow]

PAUSE_S = 3.0
"""Longer than the reconnect backoff's cap (2 s) and the broker's command timeout here."""


def pause(port: int, how: str) -> None:
    with redis.Redis(port=port, socket_timeout=PAUSE_S + 5) as client:
        if how == "CLIENT PAUSE":
            client.execute_command("CLIENT", "PAUSE", int(PAUSE_S * 1000), "ALL")
        else:
            client.execute_command("DEBUG", "SLEEP", PAUSE_S)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("how", ["CLIENT PAUSE", "DEBUG SLEEP"])
async def test_waits_survive_redis_paused_longer_than_the_backoff(
    tmp_path: Path, namespace: str, how: str
) -> None:
    server = RedisServer(tmp_path, "--enable-debug-command", "local")
    server.start()
    options = {"block_ms": 100, "lease_ms": 1000, "command_timeout_s": 1.0}
    try:
        async with (
            toolnexus.connect(server.url, namespace=namespace, **options) as broker,
            toolnexus.connect(server.url, namespace=namespace, **options) as responders,
        ):
            requests = [Request(id=new_id(), kind="approval", prompt="?") for _ in range(REQUESTS)]
            waits = [asyncio.create_task(broker.wait_for(r, timeout_s=60)) for r in requests]
            await asyncio.sleep(0.5)  # published
            pausing = asyncio.create_task(asyncio.to_thread(pause, server.port, how))
            paused_at = time.monotonic()
            await asyncio.sleep(0.2)
            answering = asyncio.create_task(accept_all(responders))  # starts during the pause
            async with asyncio.timeout(60):
                answers = await asyncio.gather(*waits)
            recovered_s = round(time.monotonic() - paused_at, 2)
            answering.cancel()
            await pausing
    finally:
        server.kill()
    result = figures(
        f"Redis paused ({how}, {PAUSE_S} s)", REQUESTS, answers, recovered_s=recovered_s
    )
    assert result["lost"] == 0
    assert recovered_s >= PAUSE_S - 0.5  # nothing could be answered while Redis slept
