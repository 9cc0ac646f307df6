"""Issue #30: an open request held by a responder costs no steady Redis work of its own.

A responder learns of a resolution elsewhere from the queue's events stream (one blocking
read per responder; an event only asks for a check of the request's state), expires a
held request at its signed deadline with a local timer, and sweeps everything it holds
only every ten leases, as a backstop. On a private redis-server, with settings that put
the full sweep far beyond each test: what these tests see, the events and the timers did.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import redis.asyncio as aioredis

import toolnexus
from conftest import RedisServer
from helpers import ask, eventually
from redis_topologies import LocalCluster
from toolnexus import Answer, Request
from toolnexus.models import AnsweredEvent
from toolnexus.redis_broker import RedisBroker, RedisPending, RedisResponder

pytestmark = pytest.mark.redis

FAR = {"block_ms": 100, "lease_ms": 60_000, "liveness_ms": 60_000}
"""A responder's settings that keep its sweeps away from these tests: leases renewed every
20 s, waiters' liveness looked at every 20 s, the full sweep after 600 s."""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A private redis-server without persistence: its command counts are these tests'."""
    server = RedisServer(tmp_path_factory.mktemp("held"))
    server.start()
    try:
        yield server
    finally:
        with contextlib.suppress(Exception):
            server.kill()


@asynccontextmanager
async def connected(url: str, namespace: str, **options: Any) -> AsyncIterator[RedisBroker]:
    async with toolnexus.connect(url, namespace=namespace, **options) as broker:
        assert isinstance(broker, RedisBroker)
        yield broker


async def calls(url: str) -> dict[str, int]:
    """Redis commands run so far, by name (Lua-called commands included)."""
    client = aioredis.Redis.from_url(url)
    try:
        stats: dict[str, Any] = await client.info("commandstats")
    finally:
        await client.aclose()
    skip = ("cmdstat_info", "cmdstat_config|resetstat")
    return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items() if k not in skip}


def holding(responder: RedisResponder) -> int:
    return responder.statistics()["holding"]


async def held(responder: RedisResponder, timeout_s: float = 10) -> RedisPending:
    async with asyncio.timeout(timeout_s):
        return await anext(responder)


async def test_a_request_answered_by_another_group_is_let_go_within_a_second(
    server: RedisServer,
) -> None:
    assert await answered_elsewhere_let_go_after(server.url, "elsewhere") < 1.5


async def test_on_a_cluster_a_request_answered_elsewhere_is_let_go_within_a_second(
    redis_cluster: LocalCluster, namespace: str
) -> None:
    """The events stream is on the queue's slot, the states on the waiters' slots."""
    assert await answered_elsewhere_let_go_after(redis_cluster.url, namespace) < 1.5


async def test_after_an_outage_events_are_followed_from_where_they_were(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Redis away for a while and back (its data kept): the event follower reconnects and
    resumes, saying so once; the responder goes on."""
    async with (
        connected(redis_server.url, "outage", block_ms=100) as agent,
        connected(redis_server.url, "outage", **FAR) as web_broker,
        web_broker.responder("web") as web,
    ):
        request = ask("Deploy?")
        waiting = asyncio.create_task(agent.wait_for(request, timeout_s=60))
        await held(web)
        redis_server.stop()
        await asyncio.sleep(3)
        redis_server.start()
        async with agent.responder("chat") as chat:
            await (await held(chat, 30)).accept(person="chat:alice")
            assert (await asyncio.wait_for(waiting, 30)).person == "chat:alice"
            answered = time.monotonic()
            await eventually(lambda: holding(web) == 0, "the web responder letting it go", 10)
            assert time.monotonic() - answered < 3
    said = [r.getMessage() for r in caplog.records if "following events" in r.getMessage()]
    assert len([m for m in said if "retrying" in m]) == 1, said


async def answered_elsewhere_let_go_after(url: str, namespace: str) -> float:
    """How long a responder of group ``web`` holds a request after group ``chat``
    answered it."""
    async with (
        connected(url, namespace, block_ms=100, lease_ms=600) as agent,
        connected(url, namespace, **FAR) as web_broker,
        web_broker.responder("web") as web,
        agent.responder("chat") as chat,
    ):
        request = ask("Deploy?")
        waiting = asyncio.create_task(agent.wait_for(request, timeout_s=60))
        shown = await held(web)
        assert holding(web) == 1
        await (await held(chat)).accept(person="chat:alice")
        answered = time.monotonic()
        await eventually(lambda: holding(web) == 0, "the web responder letting it go", 5)
        let_go_s = time.monotonic() - answered
        assert (await waiting).person == "chat:alice"
        assert shown.request.id == request.id
    return let_go_s  # (the full sweep was 600 s away)


async def test_a_forged_event_costs_one_check_and_leaves_the_request_held(
    server: RedisServer,
) -> None:
    async with (
        connected(server.url, "forged", block_ms=100) as agent,
        connected(server.url, "forged", **FAR) as web_broker,
        web_broker.responder("web") as web,
    ):
        request = ask("Pay the invoice?")
        waiting = asyncio.create_task(agent.wait_for(request, timeout_s=60))
        shown = await held(web)
        before = (await calls(server.url)).get("hmget", 0)
        forged = AnsweredEvent(id=request.id, answer=Answer(id=request.id, ok=False))
        client = aioredis.Redis.from_url(server.url)
        try:
            await client.xadd(agent.keys.events, {"e": agent.core.codec.encode(forged)})
        finally:
            await client.aclose()

        async def checked() -> bool:  # the STATUS script read the request's state
            return (await calls(server.url)).get("hmget", 0) > before

        await eventually(checked, "a check of the request's state", 5)
        await asyncio.sleep(0.3)
        assert holding(web) == 1  # the state says open: the event changed nothing
        await shown.accept(person="web:bob")
        answer = await asyncio.wait_for(waiting, 5)
    assert (answer.ok, answer.person) == (True, "web:bob")


async def test_a_held_request_is_expired_at_its_deadline_without_a_sweep(
    server: RedisServer,
) -> None:
    # A durable request whose wait was cancelled stays open with nobody waiting: only the
    # responder holding it can end it at its deadline.
    request = Request(id=toolnexus.new_id(), kind="approval", prompt="Rotate keys?", durable=True)
    async with (
        connected(server.url, "deadline", **FAR) as web_broker,
        web_broker.responder("web") as web,
    ):
        async with connected(server.url, "deadline", block_ms=100) as agent:
            waiting = asyncio.create_task(agent.wait_for(request, timeout_s=2.5, durable=True))
            shown = await held(web)
            waiting.cancel()
            await asyncio.gather(waiting, return_exceptions=True)
            state = agent.keys.state(agent.keys.durable_waiter(agent.settings.agent), request.id)
        deadline = shown.request.expires_at
        assert deadline is not None and holding(web) == 1
        client = aioredis.Redis.from_url(server.url)
        try:
            assert await client.hget(state, "s") == b"open"
            await eventually(lambda: holding(web) == 0, "the expiry", 10)
            late_s = time.time() - deadline
            assert await client.hget(state, "s") == b"expired"
        finally:
            await client.aclose()
    assert late_s < 1.0, late_s  # the responder's first sweep of any kind was 20 s away


async def commands_holding(url: str, namespace: str, n: int, seconds: float) -> dict[str, int]:
    """Redis commands over ``seconds`` while a responder holds ``n`` open requests of one
    waiting agent, renewing its leases and looking at the waiter's liveness every 0.5 s."""
    fast = {"block_ms": 100, "lease_ms": 1500, "liveness_ms": 1500}  # full sweep after 15 s
    async with (
        connected(url, namespace, **fast) as agent,
        connected(url, namespace, **fast) as web_broker,
        web_broker.responder("web", count=1000) as web,
    ):
        waits = [asyncio.create_task(agent.wait_for(ask(), timeout_s=600)) for _ in range(n)]
        try:
            shown = [await held(web) for _ in range(n)]
            assert len(shown) == holding(web) == n
            await asyncio.sleep(1.0)  # past the publishing's own commands
            before = await calls(url)
            await asyncio.sleep(seconds)
            after = await calls(url)
            assert holding(web) == n
        finally:
            for wait in waits:
                wait.cancel()
            await asyncio.gather(*waits, return_exceptions=True)
    return {k: v - before.get(k, 0) for k, v in after.items() if v > before.get(k, 0)}


async def test_the_commands_of_held_requests_do_not_grow_with_their_number(
    server: RedisServer,
) -> None:
    few = await commands_holding(server.url, "few", 10, 3.0)
    many = await commands_holding(server.url, "many", 200, 3.0)
    # About six renewals and six liveness looks each, the waiter's own renewals and reads,
    # the event follower's reads: the same whatever the number held (a sweep of every
    # request each time would add 200 HMGETs to every one of them).
    assert few.get("xclaim", 0) >= 4 and few.get("exists", 0) >= 4, few
    assert many.get("hmget", 0) == few.get("hmget", 0) == 0, (few, many)
    # (a periodic task's ticks in a window vary by one; connections set up now and then)
    setup = ("hello", "client|setname", "ping", "auth", "select")
    few_n = sum(v for k, v in few.items() if k not in setup)
    many_n = sum(v for k, v in many.items() if k not in setup)
    assert many_n <= few_n * 1.5, (few, many)
