"""SPEC §11 on a Redis Cluster: every script on one slot, waiters spread over the masters,
a handful of connections per node, and waits that outlive a master's failover.

The behaviour suite (tests/test_broker_behaviour.py) also runs on the session's Cluster
through the ``broker`` fixture."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis
from redis.asyncio.cluster import RedisCluster
from redis.crc import key_slot

import toolnexus
from conftest import FAST
from helpers import ask, wait_until
from redis_topologies import LocalCluster
from toolnexus import Broker, ConfigurationError
from toolnexus.keys import Keys
from toolnexus.redis_broker import RedisBroker
from toolnexus.redis_broker._connections import BlockingReader

pytestmark = [pytest.mark.redis, pytest.mark.slow]  # private Cluster / Sentinel servers


def slot(key: str) -> int:
    return int(key_slot(key.encode()))


@pytest.fixture
def own_cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    """A Cluster of this test alone (it kills a master)."""
    cluster = LocalCluster(tmp_path)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@contextlib.asynccontextmanager
async def answering(broker: Broker, group: str = "bot") -> AsyncIterator[list[str]]:
    """A responder accepting everything it reads, in the background; the ids it accepted."""
    accepted: list[str] = []

    async def run() -> None:
        async with broker.responder(group) as responder:
            async for pending in responder:
                with contextlib.suppress(toolnexus.ToolnexusError):
                    await pending.accept()
                    accepted.append(pending.request.id)

    task = asyncio.create_task(run())
    try:
        yield accepted
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def test_the_keys_of_each_atomic_step_share_a_slot() -> None:
    keys = Keys("ns", "jobs")
    waiter = "0123456789abcdef"
    # open, status, resolve, reopen: a waiter's reply stream, liveness mark and states
    waiter_slots = {
        slot(k)
        for k in (
            keys.answers(waiter),
            keys.alive(waiter),
            *(keys.state(waiter, f"r{i}") for i in range(50)),
        )
    }
    # publish, settle, dead letters, heartbeats: the queue's streams, routes and workers
    queue_slots = {
        slot(k)
        for k in (
            keys.requests,
            keys.events,
            keys.dead,
            keys.audit,
            keys.responder_audit,
            keys.heartbeats(),
            *(keys.route(f"r{i}") for i in range(50)),
        )
    }
    assert len(waiter_slots) == 1 and len(queue_slots) == 1
    assert waiter_slots != queue_slots
    assert slot(Keys("ns", "other").requests) != slot(keys.requests)  # queues spread


def test_a_cluster_url_without_addresses_or_with_a_query_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="every address must be host:port"):
        toolnexus.connect("redis+cluster://127.0.0.1")
    with pytest.raises(ConfigurationError, match="takes no query"):
        toolnexus.connect("redis+cluster://127.0.0.1:7000?ssl=1")
    with pytest.raises(ConfigurationError, match="cannot be used with a Redis Cluster"):
        toolnexus.connect("redis+cluster://127.0.0.1:7000", ssl_password="x")
    with pytest.raises(ConfigurationError, match="only for redis\\+sentinel://"):
        toolnexus.connect("redis+cluster://127.0.0.1:7000", sentinel_password="x")


async def test_waiters_spread_over_slots_on_every_master(
    redis_cluster: LocalCluster, namespace: str
) -> None:
    masters: dict[int, set[int]] = {}  # master port -> slots of waiters on it
    brokers: list[RedisBroker] = []
    try:
        async with (
            toolnexus.connect(redis_cluster.url, namespace=namespace, **FAST) as bot,
            answering(bot),
        ):
            while len(masters) < 3 and len(brokers) < 60:
                broker = toolnexus.connect(redis_cluster.url, namespace=namespace, **FAST)
                assert isinstance(broker, RedisBroker)
                brokers.append(await broker.__aenter__())
                waiter_slot = slot(broker.keys.state(broker.waiter_id, "x"))
                port = redis_cluster.port_of_slot(waiter_slot)
                masters.setdefault(port, set()).add(waiter_slot)
            requests = [ask(f"from waiter {i}") for i in range(len(brokers))]
            answers = await asyncio.gather(
                *(b.wait_for(r, timeout_s=30) for b, r in zip(brokers, requests, strict=True))
            )
        assert all(a.ok for a in answers)
        assert len(masters) == 3 and len(set().union(*masters.values())) >= 3
        for broker, request in zip(brokers, requests, strict=True):  # each state where it says
            state = broker.keys.state(broker.waiter_id, request.id)
            client: RedisCluster = broker.redis  # type: ignore[assignment]
            node = client.get_node_from_key(state)
            assert node is not None and node.port == redis_cluster.port_of_slot(slot(state))
            assert await client.hget(state, "s") == b"answered"
    finally:
        for broker in brokers:
            await broker.aclose()


async def test_the_audit_reads_every_agents_stream_on_every_master(
    redis_cluster: LocalCluster, namespace: str
) -> None:
    """Each agent records its waits in its own stream, on its own slot (S8): the audit
    finds them on every master and merges them into one timeline."""
    keys = Keys(namespace, "default")
    by_master: dict[int, list[str]] = {}
    for name in (f"agent-{i}" for i in range(200)):  # (the slots follow the namespace)
        master = by_master.setdefault(redis_cluster.port_of_slot(slot(keys.agent_audit(name))), [])
        if len(master) < 4:
            master.append(name)
    assert len(by_master) == 3  # the agents' streams are spread over the three masters
    agents = sorted(name for names in by_master.values() for name in names)
    requests = [ask(f"from {a}") for a in agents]
    async with toolnexus.connect(redis_cluster.url, namespace=namespace, **FAST) as bot:
        async with answering(bot):
            for agent, request in zip(agents, requests, strict=True):
                options = {**FAST, "agent": agent}
                async with toolnexus.connect(
                    redis_cluster.url, namespace=namespace, **options
                ) as broker:
                    assert (await broker.wait_for(request, timeout_s=30)).ok
        records = await bot.audit()
    assert [r.id for r in records] == [r.id for r in requests]  # one timeline, in order


async def test_a_thousand_waits_share_a_handful_of_connections_per_node(
    redis_cluster: LocalCluster, namespace: str
) -> None:
    async with toolnexus.connect(redis_cluster.url, namespace=namespace, **FAST) as broker:
        waits = [asyncio.create_task(broker.wait_for(ask(), timeout_s=60)) for _ in range(1000)]
        await asyncio.sleep(1.0)  # published and waiting
        counts = {}
        for port in redis_cluster.master_ports():
            node = redis_cluster.server(port)
            with redis.Redis(port=node.port) as client:
                clients = client.client_list()
                counts[port] = sum(1 for c in clients if c["name"] == f"toolnexus:{namespace}")
        for wait in waits:
            wait.cancel()
        await asyncio.gather(*waits, return_exceptions=True)
    assert sum(counts.values()) >= 2  # the command client and the reply reader
    assert max(counts.values()) <= 4, counts


async def test_waits_continue_after_a_master_fails_over(
    own_cluster: LocalCluster, namespace: str
) -> None:
    url = own_cluster.url
    async with toolnexus.connect(url, namespace=namespace, **FAST) as broker:
        assert isinstance(broker, RedisBroker)
        waiter_port = own_cluster.port_of_slot(slot(broker.keys.answers(broker.waiter_id)))
        requests = [ask(f"pending {i}") for i in range(50)]
        waits = [asyncio.create_task(broker.wait_for(r, timeout_s=60)) for r in requests]
        await asyncio.sleep(1.0)  # published, and replicated to the replicas
        own_cluster.server(waiter_port).kill()
        killed_at = time.monotonic()
        await asyncio.to_thread(wait_until, "a replica is promoted", own_cluster.healthy, 30)
        async with (
            toolnexus.connect(url, namespace=namespace, **FAST) as responders,
            answering(responders),
        ):
            answers = await asyncio.wait_for(asyncio.gather(*waits), timeout=45)
            recovered_s = time.monotonic() - killed_at
        print(
            f"Cluster failover: {len(requests)} waits answered {recovered_s:.2f} s after the kill"
        )
        assert [a.ok for a in answers] == [True] * len(requests)
        assert recovered_s < 45
        # new waits still work on the new topology
        async with answering(broker):
            again = await broker.wait_for(ask("after the failover"), timeout_s=30)
        assert again.ok


async def test_waits_continue_while_their_slots_are_resharded(
    own_cluster: LocalCluster, namespace: str
) -> None:
    async with toolnexus.connect(own_cluster.url, namespace=namespace, **FAST) as broker:
        assert isinstance(broker, RedisBroker)
        slots = {slot(broker.keys.answers(broker.waiter_id)), slot(broker.keys.requests)}
        origin = {s: own_cluster.port_of_slot(s) for s in slots}
        first = [ask(f"before {i}") for i in range(30)]
        waits = [asyncio.create_task(broker.wait_for(r, timeout_s=60)) for r in first]
        await asyncio.sleep(0.5)  # published
        moved = 0
        async with answering(broker):
            for moving in slots:  # to another master, while answers and publishes flow
                here = own_cluster.port_of_slot(moving)
                to_port = next(p for p in own_cluster.master_ports() if p != here)
                moved += await asyncio.to_thread(own_cluster.move_slot, moving, to_port)
                waits.append(asyncio.create_task(broker.wait_for(ask("during"), timeout_s=60)))
            answers = await asyncio.wait_for(asyncio.gather(*waits), timeout=45)
            after = await broker.wait_for(ask("after"), timeout_s=30)
        assert moved >= 30  # the request states and routes went with their slots
        assert all(a.ok for a in answers) and after.ok
        assert all(own_cluster.port_of_slot(s) != port for s, port in origin.items())


def wait_calls(cluster: LocalCluster) -> int:
    """How many ``WAIT`` commands the cluster's masters ran."""
    calls = 0
    for port in cluster.master_ports():
        with redis.Redis(port=port) as client:
            calls += int(client.info("commandstats").get("cmdstat_wait", {}).get("calls", 0))
    return calls


async def test_durability_wait_waits_for_a_replica_of_every_master_written(
    redis_cluster: LocalCluster, namespace: str
) -> None:
    before = wait_calls(redis_cluster)
    options = {**FAST, "durability": "wait", "wait_timeout_ms": 500}
    async with (
        toolnexus.connect(redis_cluster.url, namespace=namespace, **options) as broker,
        answering(broker),
    ):
        answers = await asyncio.gather(*(broker.wait_for(ask(), timeout_s=30) for _ in range(20)))
    assert all(a.ok for a in answers)
    assert wait_calls(redis_cluster) > before
    with pytest.raises(ConfigurationError, match="durability='always' must be one of none, wait"):
        toolnexus.connect(redis_cluster.url, durability="always")


def getkeys_calls(cluster: LocalCluster) -> int:
    """How many ``COMMAND GETKEYS`` the cluster's nodes answered (redis-py asks one to find
    the slot of a command whose keys it cannot find itself)."""
    calls = 0
    for server in cluster.servers:
        if server.process is not None:
            with redis.Redis(port=server.port) as client:
                stats = client.info("commandstats")
                calls += int(stats.get("cmdstat_command|getkeys", {}).get("calls", 0))
    return calls


@pytest.mark.parametrize("public_api", [False, True], ids=["internals", "public-api"])
async def test_blocking_reads_find_their_node_without_asking_a_node_for_their_keys(
    redis_cluster: LocalCluster, namespace: str, public_api: bool
) -> None:
    options = {**FAST, "redis_public_api": public_api}
    async with (
        toolnexus.connect(redis_cluster.url, namespace=namespace, **options) as broker,
        answering(broker),
    ):
        assert isinstance(broker, RedisBroker)
        await broker.wait_for(ask("warm up"), timeout_s=30)
        before = getkeys_calls(redis_cluster)
        answers = []
        for batch in range(10):  # waiter's XREAD and responder's XREADGROUP per round trip
            requests = [ask(f"{batch}.{i}") for i in range(20)]
            answers += await asyncio.gather(*(broker.wait_for(r, timeout_s=30) for r in requests))
        after = getkeys_calls(redis_cluster)
        # the control: redis-py's own routing of the same read asks a node for its keys
        client: RedisCluster = broker.redis  # type: ignore[assignment]
        await client.xread({broker.keys.answers(broker.waiter_id): "$"}, block=1)
        control = getkeys_calls(redis_cluster)
    assert len(answers) == 200 and all(a.ok for a in answers)
    assert after == before, f"{after - before} COMMAND GETKEYS for 200 round trips"
    assert control > after


@pytest.mark.parametrize("protocol", [2, 3])
async def test_a_blocking_reader_follows_its_stream_when_its_slot_moves(
    own_cluster: LocalCluster, protocol: int
) -> None:
    stream = "{c2}:replies"
    here = own_cluster.port_of_slot(slot(stream))
    there = next(p for p in own_cluster.master_ports() if p != here)
    writer = RedisCluster(host="127.0.0.1", port=here)
    client = RedisCluster(host="127.0.0.1", port=here, protocol=protocol)
    reader = BlockingReader(client, patience_s=5)
    try:
        first = (await writer.xadd(stream, {"n": "1"})).decode()
        await writer.xgroup_create(stream, "g", id="0")
        assert [e[1] for e in await reader.xread(stream, "0-0", 10, 100)] == [{b"n": b"1"}]
        assert [e[0].decode() for e in await reader.xreadgroup("g", "c", stream, ">", 10, 100)] == [
            first
        ]
        # half-moved: the stream is on the new master, the slot still the old one's (ASK)
        with redis.Redis(port=here) as source, redis.Redis(port=there) as target:
            source_id, target_id = (
                c.execute_command("CLUSTER", "MYID").decode() for c in (source, target)
            )
            target.execute_command("CLUSTER", "SETSLOT", slot(stream), "IMPORTING", source_id)
            source.execute_command("CLUSTER", "SETSLOT", slot(stream), "MIGRATING", target_id)
            source.execute_command("MIGRATE", "127.0.0.1", there, "", 0, 5000, "KEYS", stream)
            assert [e[0].decode() for e in await reader.xread(stream, "0-0", 10, 100)] == [first]
            for port in own_cluster.master_ports():
                with redis.Redis(port=port) as master:
                    master.execute_command("CLUSTER", "SETSLOT", slot(stream), "NODE", target_id)
        # moved (MOVED), a new entry, and one pending for the group deleted meanwhile
        second = (await writer.xadd(stream, {"n": "2"})).decode()
        assert await reader.xread(stream, first, 10, 100) == [(second.encode(), {b"n": b"2"})]
        assert [e[0].decode() for e in await reader.xreadgroup("g", "c", stream, ">", 10, 100)] == [
            second
        ]
        await writer.xdel(stream, first)
        pending = await reader.xreadgroup("g", "c", stream, "0", 10, None)
        assert pending == [(first.encode(), None), (second.encode(), {b"n": b"2"})]
        assert own_cluster.port_of_slot(slot(stream)) == there
    finally:
        await reader.aclose()
        await writer.aclose()


async def test_a_blocking_reader_finds_its_stream_again_after_its_master_fails_over(
    own_cluster: LocalCluster,
) -> None:
    stream = "{c2}:replies"
    here = own_cluster.port_of_slot(slot(stream))
    client = RedisCluster(host="127.0.0.1", port=here)
    reader = BlockingReader(client, patience_s=5)
    writer = None
    try:
        assert await reader.xread(stream, "0-0", 10, 1) == []  # it knows the stream's node
        own_cluster.server(here).kill()
        await asyncio.to_thread(wait_until, "a replica is promoted", own_cluster.healthy, 30)
        there = own_cluster.port_of_slot(slot(stream))
        writer = RedisCluster(host="127.0.0.1", port=there)
        entry = await writer.xadd(stream, {"n": "1"})
        # the node it knew is gone: the read asks for the new topology and is made again
        assert await reader.xread(stream, "0-0", 10, 100) == [(entry, {b"n": b"1"})]
        assert there != here
    finally:
        await reader.aclose()
        if writer is not None:
            await writer.aclose()
