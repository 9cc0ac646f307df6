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
