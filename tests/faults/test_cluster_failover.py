"""A Redis Cluster master killed (its replica promoted) with pending waits: what is lost,
and how long until the waits are answered again. Replication is asynchronous: a write
the master acknowledged but had not yet sent to its replica is gone after the failover.
The master killed here holds the queue's request stream, so a request lost with it is
never seen by a responder (its waiter still holds it as open) and its wait expires."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis.crc import key_slot

import toolnexus
from conftest import FAST
from faults import FULL, REQUESTS, accept_all, figures
from helpers import wait_until
from redis_topologies import LocalCluster
from toolnexus import Request
from toolnexus.models import EXPIRED, new_id
from toolnexus.redis_broker import RedisBroker

pytestmark = [pytest.mark.redis, pytest.mark.slow]

WAIT_S = 30.0
"""How long each wait lasts: a request lost with the master expires after it."""


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    topology = LocalCluster(tmp_path)
    try:
        topology.start()
        yield topology
    finally:
        topology.stop()


@pytest.mark.timeout(180 if FULL else 120)
async def test_a_master_killed_with_pending_waits(cluster: LocalCluster, namespace: str) -> None:
    url = cluster.url
    async with toolnexus.connect(url, namespace=namespace, **FAST) as broker:
        assert isinstance(broker, RedisBroker)
        queue_port = cluster.port_of_slot(int(key_slot(broker.keys.requests.encode())))
        requests = [Request(id=new_id(), kind="approval", prompt="?") for _ in range(REQUESTS)]
        waits = [asyncio.create_task(broker.wait_for(r, timeout_s=WAIT_S)) for r in requests]
        await broker.core.pipeliner.drain()  # every publish acknowledged by its master
        cluster.server(queue_port).kill()  # at once: replication may still be behind
        killed_at = time.monotonic()
        await asyncio.to_thread(wait_until, "a replica is promoted", cluster.healthy, 30)
        promoted_s = round(time.monotonic() - killed_at, 2)
        answering = asyncio.create_task(accept_all(broker))
        answers = []
        last_answer_s = 0.0
        for finished in asyncio.as_completed(waits):
            answer = await finished
            answers.append(answer)
            if answer.ok:
                last_answer_s = time.monotonic() - killed_at
        answering.cancel()
    result = figures(
        "Cluster master failover (the queue's master)",
        REQUESTS,
        answers,
        promoted_s=promoted_s,
        recovered_s=round(last_answer_s, 2),
    )
    assert all(a.ok or a.reason == EXPIRED for a in answers)  # each wait ended, none raised
    assert result["duplicated"] == 0
    assert promoted_s < 30


@pytest.mark.timeout(120)
async def test_a_whole_cluster_down_and_back_is_an_outage(
    cluster: LocalCluster, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Every node of the Cluster killed, then started again (empty: nothing is kept on
    disk, the slots are): redis-py then says no node is reachable
    (``RedisClusterUnreachableError``), which is Redis away for now like any other outage:
    no error logged with a traceback, and once the Cluster is back a wait is answered."""
    async with toolnexus.connect(cluster.url, namespace=namespace, **FAST) as broker:
        answering = asyncio.create_task(accept_all(broker))
        first = await broker.wait_for(Request(id=new_id(), kind="approval", prompt="?"))
        assert first.ok
        for server in cluster.servers:
            server.kill()
        await asyncio.sleep(3.0)  # the reader, the renewals and the responder find nobody
        for server in cluster.servers:
            server.start()
        await asyncio.to_thread(wait_until, "the Cluster is back", cluster.healthy, 60)
        again = await asyncio.wait_for(
            broker.wait_for(Request(id=new_id(), kind="approval", prompt="?"), timeout_s=60),
            60,
        )
        answering.cancel()
        await asyncio.gather(answering, return_exceptions=True)
    assert again.ok
    tracebacks = [r for r in caplog.records if r.exc_info and r.levelname in ("ERROR", "CRITICAL")]
    assert tracebacks == []
