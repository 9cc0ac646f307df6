"""Issue #41 observation 5, "A squatted route still turns a durable request into its
default, unseen": threat-model line S5. On a private redis-server loaded with the ACL that
``toolnexus acl`` writes, agent user ``agent-b`` (any agent user may ``SET`` any route)
writes the route of agent A's durable request before A asks, naming A's own durable
waiter (which anyone can compute) and an entry that does not hold A's request. On main the
publish script took the request as published already: no responder was shown it, and at
its deadline A got ``ok=True, reason="expired", defaulted=True`` from ``OnExpiry(ok=True)``.
Now a durable request counts as published only if its route names the entry that the
publish script recorded in the request's state when it added it (a key agent-b's user
cannot write), else it is published afresh: a responder is shown it and answers it. Where
publishing is impossible, A is told ``unavailable``, never the default.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import msgspec
import pytest
import redis.asyncio as aioredis
from test_agent_acl import ADMIN, QUEUE, broker, fleet_server, url

import toolnexus
from conftest import FAST, RedisServer
from redis_topologies import LocalCluster
from toolnexus import Answer, OnExpiry, Request, new_id
from toolnexus.codec import Codec
from toolnexus.keys import Keys
from toolnexus.redis_broker import RedisBroker
from toolnexus.redis_broker._layout import route_value
from toolnexus.security import Keyring, SigningKey

pytestmark = pytest.mark.redis

__all__ = ["fleet_server"]  # the fixture, shared with test_agent_acl

NAMESPACE = "toolnexus"  # the broker's default, as in test_agent_acl
KEYS = Keys(NAMESPACE, QUEUE)
WAITER_A = KEYS.durable_waiter("agent-a")  # computable by anyone
AGENT_KEY, BOT_KEY = SigningKey.generate("agent-a"), SigningKey.generate("ops-bot")


def deploy() -> Request:
    """A durable deploy that goes ahead unless someone declines it in time."""
    return Request(
        id=new_id(), kind="approval", prompt="Deploy build 42?", durable=True,
        on_expiry=OnExpiry(ok=True),
    )  # fmt: skip


def signed_pair(server: RedisServer) -> tuple[RedisBroker, RedisBroker]:
    """Agent A and the responder, each with its Redis user, signatures required."""
    agent = broker(
        server,
        "agent-a",
        signing_key=AGENT_KEY,
        trusted_keys=Keyring.of(BOT_KEY),
        require_signatures=True,
    )
    bot = broker(
        server,
        "responder",
        signing_key=BOT_KEY,
        trusted_keys=Keyring.of(AGENT_KEY),
        require_signatures=True,
    )
    return agent, bot


@pytest.fixture
async def agent_b(fleet_server: RedisServer) -> AsyncIterator[aioredis.Redis]:
    """A plain client of agent-b's Redis user: what a rogue agent can type."""
    client = aioredis.Redis.from_url(url(fleet_server, "agent-b"))
    yield client
    await client.aclose()


@pytest.fixture
async def admin(fleet_server: RedisServer) -> AsyncIterator[aioredis.Redis]:
    """A client that may write anything: a Redis writer beyond the ACL."""
    client = aioredis.Redis.from_url(fleet_server.url, username="admin", password=ADMIN)
    yield client
    await client.aclose()


async def declined_when_shown(bot: RedisBroker, request_id: str, timeout_s: float = 10) -> None:
    """Decline ``request_id`` as soon as the responder is shown it (other requests it is
    shown are skipped)."""
    async with bot.responder("ops") as requests, asyncio.timeout(timeout_s):
        async for pending in requests:
            if pending.request.id == request_id:
                await pending.decline(person="web:alice")
                return
    raise AssertionError("the responder stopped")


async def asked_and_declined(agent: RedisBroker, bot: RedisBroker, request: Request) -> Answer:
    """A waits for ``request`` (deadline 4 s); the responder declines it when shown."""
    waiting = asyncio.create_task(agent.wait_for(request, timeout_s=4))
    try:
        await declined_when_shown(bot, request.id)
    except TimeoutError:
        raise AssertionError(f"no responder was shown it; A got {await waiting}") from None
    return await asyncio.wait_for(waiting, 10)


@pytest.mark.parametrize("entry", ["no entry", "another entry"])
async def test_a_route_squatted_before_a_durable_request_is_asked_does_not_hide_it(
    fleet_server: RedisServer, agent_b: aioredis.Redis, entry: str
) -> None:
    """S5, observation 5: agent-b sets the route of A's durable request before A asks,
    naming A's durable waiter and an entry that is not A's request (none at all, or one
    agent-b added). On main no responder saw it and A got the default at its deadline;
    now the responder is shown it and its decline is A's answer."""
    request = deploy()
    if entry == "no entry":
        named: str = "1-1"
    else:
        added = await agent_b.xadd(KEYS.requests, {"r": b"not the deploy"})
        named = added.decode()
    await agent_b.set(KEYS.route(request.id), route_value(WAITER_A, named), px=60_000)
    agent, bot = signed_pair(fleet_server)
    async with agent, bot:
        assert agent.keys.durable_waiter(agent.settings.agent) == WAITER_A
        answer = await asked_and_declined(agent, bot, request)
    assert (answer.ok, answer.reason, answer.defaulted) == (False, "declined", False)
    assert (answer.responder, answer.person) == ("ops-bot", "web:alice")


async def test_a_forged_open_state_and_squatted_route_do_not_hide_a_durable_request(
    fleet_server: RedisServer, admin: aioredis.Redis
) -> None:
    """S5, observation 5, unsigned (where a forged request can pass as A's): a Redis writer
    writes A's durable state, open, holding the same question, and its route, before A
    asks. A attaches to it; on main the route made it count as published and A got the
    default; now the entry is checked, the request published, and the decline wins."""
    agent = broker(fleet_server, "agent-a")
    bot = broker(fleet_server, "responder")
    request = deploy()
    deadline = time.time() + 4
    forged = msgspec.structs.replace(request, expires_at=deadline, reply_to=WAITER_A)
    await admin.hset(
        KEYS.state(WAITER_A, request.id),
        mapping={"s": "open", "x": int(deadline * 1000), "d": "1", "req": Codec().encode(forged)},
    )
    await admin.set(KEYS.route(request.id), route_value(WAITER_A, "1-1"), px=60_000)
    async with agent, bot:
        answer = await asked_and_declined(agent, bot, request)
    assert (answer.ok, answer.reason, answer.defaulted) == (False, "declined", False)


async def test_a_squatted_durable_request_that_cannot_be_published_is_unavailable(
    fleet_server: RedisServer, agent_b: aioredis.Redis, admin: aioredis.Redis
) -> None:
    """S5, observation 5: the route squatted as above, and the queue's request stream made
    unusable by a Redis writer (a string in its place), so the request cannot be
    published. On main A got the default at its deadline; now A is told ``unavailable``."""
    request = deploy()
    await agent_b.set(KEYS.route(request.id), route_value(WAITER_A, "1-1"), px=60_000)
    await admin.set(KEYS.requests, "not a stream")
    agent, _ = signed_pair(fleet_server)
    async with agent:
        answer = await asyncio.wait_for(agent.wait_for(request, timeout_s=2), 10)
    assert (answer.ok, answer.reason, answer.defaulted) == (False, "unavailable", False)


@pytest.mark.slow
async def test_on_a_cluster_a_squatted_route_is_replaced_and_an_attach_publishes_once(
    redis_cluster: LocalCluster,
) -> None:
    """S5, observation 5, on a Redis Cluster (the state and the route on different slots:
    the publish script compares the route with the entry of the state's hop record). A
    route squatted before the durable request is asked is replaced and the request shown;
    a second wait attaching to it later, its route genuine, publishes nothing more."""
    keys = Keys("squat", QUEUE)
    request = deploy()

    def connect() -> RedisBroker:
        made = toolnexus.connect(redis_cluster.url, namespace="squat", queue=QUEUE, **FAST)
        assert isinstance(made, RedisBroker)
        return made

    async with connect() as agent, connect() as bot:
        squatter = agent.redis
        waiter = keys.durable_waiter(agent.settings.agent)
        await squatter.set(keys.route(request.id), route_value(waiter, "1-1"), px=60_000)
        waiting = asyncio.create_task(agent.wait_for(request, timeout_s=30))
        async with asyncio.timeout(10):
            while int(await squatter.xlen(keys.requests)) < 1:
                await asyncio.sleep(0.01)
        waiting.cancel()  # a deploy: the durable request stays open
        await asyncio.gather(waiting, return_exceptions=True)
        again = asyncio.create_task(agent.wait_for(request, timeout_s=30))
        await asyncio.sleep(0.5)
        assert int(await squatter.xlen(keys.requests)) == 1  # the attach published nothing
        await declined_when_shown(bot, request.id)
        answer = await asyncio.wait_for(again, 10)
    assert (answer.ok, answer.reason, answer.defaulted) == (False, "declined", False)
