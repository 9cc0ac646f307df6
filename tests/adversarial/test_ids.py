"""Issue #24 observation 5, "Ids can be taken", on a private redis-server with signatures
required: threat-model line S5 (ids are owned). A route is set only if absent or held by
the same waiter, so an answer by id reaches only the request's own waiter; a request whose
id another waiter owns ends with a clear ``InvalidRequest``, never a silent default; and
attaching to a durable request needs the identity (signing key) and allow-list that made it.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import redis.asyncio as aioredis

import toolnexus
from conftest import FAST, Fleet, RedisServer
from helpers import opened
from toolnexus import Answer, InvalidRequest, OnExpiry, Request, new_id
from toolnexus.keys import Keys
from toolnexus.redis_broker import RedisBroker
from toolnexus.redis_broker._layout import parse_route
from toolnexus.redis_broker._scripts import PUBLISH
from toolnexus.security import Keyring, SigningKey

pytestmark = pytest.mark.redis

OTHER_WAITER = "0123456789abcdef"


def deploy(**fields: Any) -> Request:
    """A deploy that goes ahead unless someone declines it in time."""
    return Request(
        id=new_id(), kind="approval", prompt="Deploy build 42?", on_expiry=OnExpiry(ok=True),
        **fields,
    )  # fmt: skip


async def refused_quickly(wait: asyncio.Task[Answer], request_id: str) -> float:
    """How long ``wait`` took to end with the ``InvalidRequest`` naming ``request_id``."""
    started = time.monotonic()
    with pytest.raises(InvalidRequest, match=f"request id '{request_id}' is owned by another"):
        await asyncio.wait_for(wait, 10)
    return time.monotonic() - started


async def opened_durably(broker: RedisBroker, request_id: str) -> None:
    state = broker.keys.state(broker.keys.durable_waiter(broker.settings.agent), request_id)
    async with asyncio.timeout(10):
        while not await broker.redis.exists(state):
            await asyncio.sleep(0.01)


async def test_an_answer_by_id_reaches_only_the_waiter_that_owns_the_id(fleet: Fleet) -> None:
    """S5, obs 5: another agent publishing the id of a request being waited for is refused,
    and the operator's decline by id reaches the genuine waiter (on main the second publish
    took the route: the decline went to it and the deploy was accepted by default)."""
    async with fleet.agent() as first, fleet.agent() as second, fleet.responder() as operator:
        request = deploy()
        genuine = asyncio.create_task(first.wait_for(request, timeout_s=3))
        await opened(first, request.id)
        taker = asyncio.create_task(second.wait_for(request, timeout_s=3))
        await asyncio.wait([taker], timeout=1.0)
        await operator.answer(Answer(id=request.id, ok=False, reason="declined", person="ops:al"))
        answer = await asyncio.wait_for(genuine, 10)
        assert (answer.ok, answer.reason, answer.defaulted) == (False, "declined", False)
        assert answer.person == "ops:al"
        await refused_quickly(taker, request.id)
        route = parse_route(await first.redis.get(first.keys.route(request.id)))
        assert route is not None and route[0] == first.waiter_id


async def test_a_route_set_before_the_id_is_asked_refuses_it_at_once(fleet: Fleet) -> None:
    """S5, obs 5: one ``SET`` of a route by a user with agent rights, before the id is asked,
    makes the durable request fail at once with a clear error (on main it was never shown
    and ended with its default: accepted)."""
    async with fleet.agent() as agent:
        taken = deploy(durable=True)
        await agent.redis.set(agent.keys.route(taken.id), OTHER_WAITER)
        took_s = await refused_quickly(
            asyncio.create_task(agent.wait_for(taken, timeout_s=3)), taken.id
        )
        assert took_s < 2, took_s


async def test_a_durable_request_with_an_id_used_before_is_refused(fleet: Fleet) -> None:
    """S5, obs 5: a durable request whose id an earlier (plain) request used is refused while
    that request's route lives (on main: never shown, and ended with its default)."""
    async with fleet.agent() as agent, fleet.agent() as later, fleet.responder() as operator:
        earlier = deploy()
        waiting = asyncio.create_task(agent.wait_for(earlier, timeout_s=30))
        await opened(agent, earlier.id)
        await operator.answer(Answer(id=earlier.id, ok=True, person="ops:al"))
        assert (await asyncio.wait_for(waiting, 10)).ok
        again = Request(
            id=earlier.id, kind="approval", prompt="Drop the database?", durable=True,
            on_expiry=OnExpiry(ok=True),
        )  # fmt: skip
        await refused_quickly(asyncio.create_task(later.wait_for(again, timeout_s=3)), again.id)


async def test_attaching_needs_the_key_and_the_allow_list_that_made_it(
    fleet: Fleet,
) -> None:
    """S5, obs 5 (and obs 6's attach): another agent, with another key, attaching to an
    existing durable id is refused, and so is an attach with another allow-list (on main
    both received the stored answer's data)."""
    intruder_key = SigningKey.generate("agent-9")
    intruder = toolnexus.connect(
        fleet.url, namespace="sec", signing_key=intruder_key,
        trusted_keys=Keyring.of(fleet.bot_key), require_signatures=True, **FAST,
    )  # fmt: skip
    async with fleet.agent() as agent, intruder, fleet.responder() as operator:
        request = Request(id=new_id(), kind="input", prompt="Vault code?", durable=True)
        waiting = asyncio.create_task(agent.wait_for(request, timeout_s=30))
        await opened_durably(agent, request.id)
        await operator.answer(Answer(id=request.id, ok=True, data={"code": "vault-7731"}))
        assert (await asyncio.wait_for(waiting, 10)).data == {"code": "vault-7731"}
        with pytest.raises(InvalidRequest, match="belongs to agent-key 'agent-7'"):
            await asyncio.wait_for(intruder.wait_for(request, timeout_s=30), 10)
        with pytest.raises(InvalidRequest, match=r"asks something else \(allow differ"):
            await asyncio.wait_for(agent.wait_for(request, allow=["web:mallory"]), 10)
        same = await asyncio.wait_for(agent.wait_for(request), 10)  # the owner attaches
        assert same.data == {"code": "vault-7731"}


async def test_the_publish_script_sets_a_route_only_if_absent_or_its_waiters(
    redis_server: RedisServer,
) -> None:
    """S5, obs 5: a publish retried (its reply lost) succeeds, its route being its own; a
    publish of an id another waiter owns adds no entry and leaves the route alone."""
    keys = Keys("ids", "default")
    client = aioredis.Redis.from_url(redis_server.url)
    try:

        async def publish(waiter: str) -> Any:
            [reply] = await client.eval(
                PUBLISH.source, 2, keys.requests, keys.route("r1"), 0, waiter, 2, b"req", 60_000, 0
            )
            return reply

        mine = "aaaaaaaaaaaaaaaa"
        assert isinstance(await publish(mine), bytes)
        again = (await publish(mine)).decode()  # retried: still ours
        assert await publish(OTHER_WAITER) == 0
        route = await client.get(keys.route("r1"))  # the waiter, its latest entry, protocol 2
        assert route == f"{mine} {again} 2".encode()
        assert await client.xlen(keys.requests) == 2
    finally:
        await client.aclose()
