"""Every worker of this repository passes the responder conformance suite (SPEC §12)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

import toolnexus
from conformance import ADAPTERS, CHECKS, WorkerUnderTest, survives_a_reconnect
from conftest import FAST, RedisServer
from toolnexus import Broker

QUEUE = "conformance"

pytestmark = [pytest.mark.redis, pytest.mark.slow]


@pytest.fixture(params=sorted(ADAPTERS))
async def worker(
    request: pytest.FixtureRequest, tmp_path: Path, namespace: str
) -> AsyncIterator[WorkerUnderTest]:
    """The adapter, closed before ``namespace`` is cleaned up (it depends on it): a worker
    still running after the clean-up would make its queue's stream and group again."""
    adapter = ADAPTERS[request.param](tmp_path)
    try:
        yield adapter
    finally:
        await adapter.close()


@pytest.mark.parametrize("check", CHECKS.values(), ids=list(CHECKS))
async def test_the_worker(
    check: Callable[[WorkerUnderTest, Broker], Awaitable[None]],
    worker: WorkerUnderTest,
    redis_url: str,
    namespace: str,
) -> None:
    async with toolnexus.connect(redis_url, namespace=namespace, queue=QUEUE, **FAST) as broker:
        await worker.start(redis_url, namespace, QUEUE)
        await check(worker, broker)


async def test_the_worker_survives_a_reconnect(
    worker: WorkerUnderTest, redis_server: RedisServer, namespace: str
) -> None:
    url = redis_server.url
    async with toolnexus.connect(url, namespace=namespace, queue=QUEUE, **FAST) as broker:
        await worker.start(url, namespace, QUEUE)
        await survives_a_reconnect(worker, broker, redis_server)
