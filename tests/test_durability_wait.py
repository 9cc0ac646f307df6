"""``durability="wait"`` is honest (issue 40): a responder is told its answer was taken
only once ``WAIT`` counted the replicas asked for; otherwise it gets ``NotConfirmed``,
and the waiter's own view decides. A master and one replica on loopback; the replica is frozen
(SIGSTOP) to make ``WAIT`` fall short, as a partition would. Through Sentinels, a
``READONLY`` reply (a master demoted under its clients) is a fault of the connection."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import redis.asyncio as aioredis
import redis.exceptions
from redis.exceptions import ReadOnlyError

import toolnexus
from conftest import FAST, RedisServer
from redis_topologies import wait_until
from toolnexus import Quorum, Request
from toolnexus.errors import NotConfirmed
from toolnexus.models import new_id
from toolnexus.redis_broker._pipeliner import Pipeliner, Unconfirmed

pytestmark = [pytest.mark.redis]

OPTIONS = {**FAST, "durability": "wait", "wait_replicas": 1, "wait_timeout_ms": 100}


@pytest.fixture
def replicated(tmp_path: Path) -> Iterator[tuple[RedisServer, RedisServer]]:
    """A master and its replica, in sync."""
    (tmp_path / "master").mkdir()
    (tmp_path / "replica").mkdir()
    master = RedisServer(tmp_path / "master")
    master.start()
    replica = RedisServer(tmp_path / "replica", "--replicaof", "127.0.0.1", str(master.port))
    try:
        replica.start()

        def in_sync() -> bool:
            with redis.Redis(port=replica.port) as client:
                return bool(client.info("replication").get("master_link_status") == "up")

        wait_until("the replica is in sync", in_sync)
        yield master, replica
    finally:
        for server in (replica, master):
            if server.process is not None:
                server.process.send_signal(signal.SIGCONT)
            server.kill()


async def accept(broker: toolnexus.Broker, request_id: str) -> None:
    """Accept request ``request_id`` as a responder."""
    async with broker.responder("bot") as responder:
        async for pending in responder:
            if pending.request.id == request_id:
                await pending.accept({"n": 1})
                return


async def test_an_answer_wait_confirms_is_accepted(
    replicated: tuple[RedisServer, RedisServer], namespace: str
) -> None:
    master, _replica = replicated
    async with toolnexus.connect(master.url, namespace=namespace, **OPTIONS) as broker:
        request = Request(id=new_id(), kind="input")
        waiting = asyncio.create_task(broker.wait_for(request, timeout_s=30))
        await accept(broker, request.id)
        answer = await waiting
    assert answer.ok and answer.data == {"n": 1}


async def test_an_answer_wait_cannot_confirm_is_not_confirmed_and_the_waiter_decides(
    replicated: tuple[RedisServer, RedisServer], namespace: str
) -> None:
    master, replica = replicated
    async with toolnexus.connect(master.url, namespace=namespace, **OPTIONS) as broker:
        assert replica.process is not None
        replica.process.send_signal(signal.SIGSTOP)  # WAIT 1 now times out
        request = Request(id=new_id(), kind="input")
        waiting = asyncio.create_task(broker.wait_for(request, timeout_s=30))
        with pytest.raises(NotConfirmed) as caught:
            await accept(broker, request.id)
        assert (caught.value.request_id, caught.value.replicas) == (request.id, 0)
        assert caught.value.required == 1
        assert "may be lost in a failover" in str(caught.value)
        # the master took it: here (no failover), the waiter gets it
        answer = await waiting
        assert answer.ok and answer.data == {"n": 1}


async def test_a_vote_wait_cannot_confirm_is_not_confirmed_counted_or_deciding(
    replicated: tuple[RedisServer, RedisServer], namespace: str
) -> None:
    master, replica = replicated
    async with toolnexus.connect(master.url, namespace=namespace, **OPTIONS) as broker:
        request = Request(id=new_id(), kind="approval", quorum=Quorum(3))
        waiting = asyncio.create_task(broker.wait_for(request, timeout_s=30))
        async with broker.responder("bot") as responder:
            pending = await anext(aiter(responder))
            assert (await pending.accept(person="web:carol")) is not None  # confirmed: counted
            assert replica.process is not None
            replica.process.send_signal(signal.SIGSTOP)  # WAIT 1 now times out
            with pytest.raises(NotConfirmed) as counted:
                await pending.accept(person="web:alice")
            assert (counted.value.request_id, counted.value.replicas) == (request.id, 0)
            assert not waiting.done()
            with pytest.raises(NotConfirmed):  # the deciding vote
                await pending.accept({"n": 2}, person="web:bob")
        # the master counted both: here (no failover), the waiter gets them
        answer = await waiting
    assert answer.ok and answer.data == {"n": 2}
    assert [a.person for a in answer.approvals or ()] == ["web:carol", "web:alice", "web:bob"]


async def test_only_confirm_items_get_unconfirmed_and_the_reply_travels_with_it(
    replicated: tuple[RedisServer, RedisServer], namespace: str
) -> None:
    master, replica = replicated
    client = aioredis.Redis(port=master.port)
    pipeliner = Pipeliner(client, timeout_s=5, wait=(1, 50))
    try:
        confirmed = await pipeliner.call("SET", f"{namespace}:a", "1", confirm=True)
        assert confirmed in (True, b"OK")
        assert replica.process is not None
        replica.process.send_signal(signal.SIGSTOP)
        checked = pipeliner.call("SET", f"{namespace}:b", "2", confirm=True)
        plain = pipeliner.call("SET", f"{namespace}:c", "3")
        with pytest.raises(Unconfirmed) as caught:
            await checked
        assert caught.value.reply in (True, b"OK") and caught.value.replicas == 0
        assert await plain in (True, b"OK")  # not asked to confirm: its reply as ever
    finally:
        pipeliner.close()
        await client.delete(f"{namespace}:a", f"{namespace}:b", f"{namespace}:c")
        await client.aclose()


@pytest.mark.parametrize("demotable", [False, True])
async def test_readonly_is_a_connection_fault_only_for_a_master_sentinel_may_demote(
    replicated: tuple[RedisServer, RedisServer], namespace: str, demotable: bool
) -> None:
    _master, replica = replicated
    client = aioredis.Redis(port=replica.port)  # a replica: what a demoted master becomes
    pipeliner = Pipeliner(client, timeout_s=5, demotable=demotable)
    try:
        expected = redis.exceptions.ConnectionError if demotable else ReadOnlyError
        with pytest.raises(expected) as caught:
            await pipeliner.call("SET", f"{namespace}:a", "1")
        assert isinstance(caught.value, ReadOnlyError) is not demotable
    finally:
        pipeliner.close()
        await client.aclose()
