"""Responder processes SIGKILLed at random while requests flow: every request is answered
exactly once, none is lost (SPEC §11: at-least-once delivery, exactly-once resolution)."""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

import pytest

import toolnexus
from conftest import RedisServer
from faults import FULL, REQUESTS, figures, responder_process
from toolnexus import Request
from toolnexus.models import new_id

pytestmark = [pytest.mark.redis, pytest.mark.slow]


@pytest.mark.timeout(300 if FULL else 90)
async def test_responders_sigkilled_at_random_lose_and_duplicate_nothing(
    redis_server: RedisServer, namespace: str, tmp_path: Path
) -> None:
    accepted = tmp_path / "accepted"
    url, rng = redis_server.url, random.Random(13)
    processes = [responder_process(url, namespace, accepted, delay_s=0.01) for _ in range(3)]
    kills = 0
    try:
        async with toolnexus.connect(url, namespace=namespace, block_ms=100) as broker:
            requests = [Request(id=new_id(), kind="approval", prompt="?") for _ in range(REQUESTS)]
            start = time.monotonic()
            waiting = asyncio.ensure_future(
                asyncio.gather(*(broker.wait_for(r, timeout_s=240) for r in requests))
            )
            while not waiting.done():
                await asyncio.wait([waiting], timeout=rng.uniform(0.3, 0.8))
                if waiting.done():
                    break
                victim = rng.randrange(len(processes))
                processes[victim].kill()
                processes[victim].wait(10)
                kills += 1
                processes[victim] = responder_process(url, namespace, accepted, delay_s=0.01)
            answers = waiting.result()
            seconds = round(time.monotonic() - start, 1)
    finally:
        for process in processes:
            process.kill()
            process.wait(10)
    result = figures(
        "responders SIGKILLed", REQUESTS, answers, accepted, kills=kills, seconds=seconds
    )
    assert kills >= 1
    assert result["lost"] == 0 and result["duplicated"] == 0
    assert sorted(a.id for a in answers) == sorted(r.id for r in requests)
