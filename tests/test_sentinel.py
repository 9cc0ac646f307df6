"""SPEC §11 on a Sentinel-watched master: waits continue on the new master after a
failover. One master, one replica and three Sentinels on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import toolnexus
from conftest import FAST
from redis_topologies import LocalSentinel, wait_until
from toolnexus import ConfigurationError, Request
from toolnexus.models import new_id

pytestmark = [pytest.mark.redis, pytest.mark.slow]  # private Cluster / Sentinel servers


@pytest.fixture
def sentinel(tmp_path: Path) -> Iterator[LocalSentinel]:
    topology = LocalSentinel(tmp_path)
    try:
        topology.start()
        yield topology
    finally:
        topology.stop()


def test_a_sentinel_url_must_name_its_master() -> None:
    with pytest.raises(ConfigurationError, match="ends in /master-name"):
        toolnexus.connect("redis+sentinel://127.0.0.1:26379")
    with pytest.raises(ConfigurationError, match="every address must be host:port"):
        toolnexus.connect("redis+sentinel://127.0.0.1:26379,nowhere/mymaster")


async def test_waits_continue_on_the_new_master_after_a_failover(
    sentinel: LocalSentinel, namespace: str
) -> None:
    async with toolnexus.connect(sentinel.url, namespace=namespace, **FAST) as broker:
        requests = [Request(id=new_id(), kind="approval", prompt=f"#{i}") for i in range(20)]
        waits = [asyncio.create_task(broker.wait_for(r, timeout_s=60)) for r in requests]
        await asyncio.sleep(1.0)  # published and replicated
        old_port = sentinel.master.port
        sentinel.master.kill()
        killed_at = time.monotonic()

        def failed_over() -> bool:
            return sentinel.master_port() != old_port

        await asyncio.to_thread(wait_until, "the sentinels fail the master over", failed_over, 40)
        assert sentinel.master_port() == sentinel.replica.port

        async def accept_all() -> None:
            async with broker.responder("bot") as responder:
                async for pending in responder:
                    with contextlib.suppress(toolnexus.ToolnexusError):
                        await pending.accept()

        answering = asyncio.create_task(accept_all())
        try:
            answers = await asyncio.wait_for(asyncio.gather(*waits), timeout=45)
        finally:
            answering.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await answering
        recovered_s = time.monotonic() - killed_at
    print(f"Sentinel failover: {len(requests)} waits answered {recovered_s:.2f} s after the kill")
    assert [a.ok for a in answers] == [True] * len(requests)
    assert recovered_s < 45
