"""Issue #24 observation 4, "Durable state is believed", on a private redis-server with
signatures required: threat-model lines S1 (outcomes from signed material: the deadline,
creation time and escalation plan are the signed request's, expiry is judged by the
waiter's clock) and S3 (stored state read back on an attach, and hop records, is verified
against the signed request before it counts). Each edit below costs time at most: the
genuine answer still arrives and wins.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import msgspec
import pytest

import toolnexus
from conftest import FAST, Fleet, RedisServer
from test_forgery import decline_genuinely, shown, still_waiting
from toolnexus import Answer, InvalidRequest, OnExpiry, Request, new_id
from toolnexus._hops import hops
from toolnexus.errors import ToolnexusError
from toolnexus.keys import Keys
from toolnexus.redis_broker import RedisBroker
from toolnexus.security import Keyring
from toolnexus.security._signing import sign_answer

pytestmark = pytest.mark.redis

ONCALL = "oncall"


def deploy(**fields: Any) -> Request:
    """A durable deploy that goes ahead unless someone declines it in time."""
    return Request(
        id=new_id(), kind="approval", prompt="Deploy build 42?", durable=True,
        on_expiry=OnExpiry(ok=True), **fields,
    )  # fmt: skip


def state_of(broker: RedisBroker, request_id: str) -> str:
    return broker.keys.state(broker.keys.durable_waiter(broker.settings.agent), request_id)


async def left_open(broker: RedisBroker, request: Request, timeout_s: float = 120) -> None:
    """Wait durably for ``request`` until it is published, then end the wait (a deploy):
    the request stays open for the next wait."""
    waiting = asyncio.create_task(broker.wait_for(request, timeout_s=timeout_s))
    async with asyncio.timeout(10):
        while not await broker.redis.exists(broker.keys.route(request.id)):
            await asyncio.sleep(0.01)
    waiting.cancel()
    await asyncio.gather(waiting, return_exceptions=True)


async def hop_entries(broker: RedisBroker) -> int:
    return int(await broker.redis.xlen(Keys("sec", ONCALL).requests))


@pytest.mark.parametrize("status", ["expired", "withdrawn"])
async def test_a_durable_state_marked_ended_before_its_deadline_is_a_hint(
    fleet: Fleet,
    status: str,
) -> None:
    """S1/S3, obs 4: ``HSET <durable state> s expired`` (or ``withdrawn``) made the next
    attach return the default (ok=True) at once, 120 s before the deadline. Now the attach
    waits on, the request is opened again, and the genuine decline wins."""
    async with fleet.agent() as agent, fleet.responder() as bot:
        request = deploy()
        await left_open(agent, request)
        await agent.redis.hset(state_of(agent, request.id), "s", status)
        attached = asyncio.create_task(agent.wait_for(request))
        await still_waiting(attached)
        await decline_genuinely(bot, request.id)
        answer = await asyncio.wait_for(attached, 10)
    assert (answer.ok, answer.reason, answer.defaulted) == (False, "declined", False)
    assert answer.responder == "ops-bot"


@pytest.mark.slow
async def test_a_decline_given_while_a_durable_state_was_marked_expired_wins(
    fleet: Fleet,
) -> None:
    """S3 (and S4), obs 4: a decline given while nobody waits and the state says
    ``expired`` is kept as contested; the next attach takes it, not the default."""
    async with fleet.agent() as agent, fleet.responder() as bot:
        request = deploy()
        await left_open(agent, request)
        await agent.redis.hset(state_of(agent, request.id), "s", "expired")
        pending = await shown(bot)
        with pytest.raises(ToolnexusError):  # not taken now: nobody waits to check it
            await pending.decline(person="web:alice")
        answer = await asyncio.wait_for(agent.wait_for(request), 10)
    assert (answer.ok, answer.reason, answer.defaulted) == (False, "declined", False)
    assert (answer.responder, answer.person) == ("ops-bot", "web:alice")


@pytest.mark.slow
async def test_a_durable_state_marked_expired_counts_once_the_signed_deadline_passed(
    fleet: Fleet,
) -> None:
    """S1, obs 4: an edited deadline (field ``x``) and status do not end the wait sooner;
    at the signed deadline the default comes from the signed request."""
    async with fleet.agent() as agent:
        request = deploy()
        await left_open(agent, request, timeout_s=2)
        state = state_of(agent, request.id)
        await agent.redis.hset(state, mapping={"s": "expired", "x": "1"})
        started = time.time()
        answer = await asyncio.wait_for(agent.wait_for(request), 10)
        took_s = time.time() - started
    assert (answer.ok, answer.reason, answer.defaulted) == (True, "expired", True)
    assert took_s > 1, took_s


@pytest.mark.slow
async def test_a_durable_state_restored_after_its_retention_is_stale(fleet: Fleet) -> None:
    """S3, obs 4: an old durable state restored after its retention (RESTORE without a TTL)
    returned its old accept. Now it counts as absent: the request is asked afresh."""
    short = {**FAST, "retention_s": 0.5}
    agent = toolnexus.connect(
        fleet.url, namespace="sec", signing_key=fleet.agent_key,
        trusted_keys=Keyring.of(fleet.bot_key), require_signatures=True, **short,
    )  # fmt: skip
    assert isinstance(agent, RedisBroker)
    async with agent, fleet.responder() as bot:
        request = deploy()
        waiting = asyncio.create_task(agent.wait_for(request, timeout_s=1))
        async with asyncio.timeout(10):
            while not await agent.redis.exists(agent.keys.route(request.id)):
                await asyncio.sleep(0.01)
        await bot.answer(Answer(id=request.id, ok=True, person="ops:al"))
        assert (await asyncio.wait_for(waiting, 10)).person == "ops:al"
        state = state_of(agent, request.id)
        dumped: Any = await agent.redis.dump(state)
        await asyncio.sleep(1.8)  # past the signed deadline and the retention
        await agent.redis.delete(state)  # gone (its responder's retention, 24 h, is longer)
        await agent.redis.restore(state, 0, dumped)
        again = asyncio.create_task(agent.wait_for(request, timeout_s=30))
        await still_waiting(again)
        await decline_genuinely(bot, request.id)
        answer = await asyncio.wait_for(again, 10)
    assert (answer.ok, answer.reason, answer.person) == (False, "declined", "web:alice")


async def test_an_edited_created_at_does_not_move_a_hop(fleet: Fleet) -> None:
    """S1, obs 4: an edited ``created_at`` in the stored request moved a hop due at 30 s to
    0.01 s. It is signed now (an escalating request's digest holds it): the edited request
    does not verify, so the attach is refused and nothing hops."""
    async with fleet.agent() as agent:
        request = deploy(escalate=hops([(30, ONCALL)]))
        await left_open(agent, request, timeout_s=60)
        state = state_of(agent, request.id)
        stored = agent.codec.decode_as(await agent.redis.hget(state, "req"), Request)
        moved = msgspec.structs.replace(stored, created_at=time.time() - 29.99)
        await agent.redis.hset(state, "req", agent.codec.encode(moved))
        with pytest.raises(InvalidRequest, match="does not verify"):
            await asyncio.wait_for(agent.wait_for(request), 10)
        await asyncio.sleep(0.5)
        assert await hop_entries(agent) == 0


async def test_a_forged_hop_record_does_not_suppress_a_hop(fleet: Fleet) -> None:
    """S3, obs 4: a forged hop record (field ``q``) claiming a queue was reached made the
    next attach skip that hop. The record is a hint: a hop whose entry does not hold the
    request is published when due."""
    async with fleet.agent() as agent:
        request = deploy(escalate=hops([(0.8, ONCALL)]))
        await left_open(agent, request, timeout_s=30)
        [(origin, _)] = await agent.redis.xrange(agent.keys.requests)
        q = f"default {origin.decode()} {ONCALL} 1-1"
        await agent.redis.hset(state_of(agent, request.id), "q", q)
        attached = asyncio.create_task(agent.wait_for(request))
        try:
            async with asyncio.timeout(5):
                while not await hop_entries(agent):
                    await asyncio.sleep(0.05)
            assert await agent.redis.xlen(agent.keys.requests) == 1  # the origin, confirmed
        finally:
            attached.cancel()
            await asyncio.gather(attached, return_exceptions=True)


async def test_without_signatures_an_ended_mark_neither_ends_nor_strands_the_wait(
    redis_server: RedisServer,
) -> None:
    """S1, obs 4, unsigned: the same edit neither ends the attached wait nor strands it;
    the answer given afterwards reaches it."""
    async with toolnexus.connect(redis_server.url, namespace="sec", **FAST) as agent:
        assert isinstance(agent, RedisBroker)
        request = deploy()
        await left_open(agent, request)
        await agent.redis.hset(state_of(agent, request.id), "s", "expired")
        attached = asyncio.create_task(agent.wait_for(request))
        await still_waiting(attached)
        await agent.answer(Answer(id=request.id, ok=False, reason="declined", person="ops:al"))
        answer = await asyncio.wait_for(attached, 10)
    assert (answer.ok, answer.reason, answer.person) == (False, "declined", "ops:al")


async def test_a_signed_withdrawal_never_ends_a_durable_request(fleet: Fleet) -> None:
    """S2/S3, obs 4: a durable request is never withdrawn; a withdrawal signed by a trusted
    responder key, stored in the state, is refused on the attach and the wait goes on to
    the genuine answer (on main the attach ended ``unavailable`` at once)."""
    async with fleet.agent() as agent, fleet.responder() as bot:
        request = deploy()
        await left_open(agent, request)
        state = state_of(agent, request.id)
        published = agent.codec.decode_as(await agent.redis.hget(state, "req"), Request)
        withdrawal = Answer(id=request.id, ok=False, reason="withdrawn")
        signed = sign_answer(withdrawal, published, fleet.bot_key)
        await agent.redis.hset(state, mapping={"s": "withdrawn", "a": agent.codec.encode(signed)})
        attached = asyncio.create_task(agent.wait_for(request))
        await still_waiting(attached)
        await decline_genuinely(bot, request.id)
        answer = await asyncio.wait_for(attached, 10)
    assert (answer.ok, answer.reason, answer.responder) == (False, "declined", "ops-bot")
