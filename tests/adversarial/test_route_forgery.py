"""Threat-model line S5, issue #24 observation 5 ("Ids can be taken"), for the route that
issue #30 made the one way to a plain request: a plain request's state no longer holds
the request, so answering by id follows the route (``"<waiter> <entry id>"``) to the
request's entry in the queue's stream. A route is an unsigned hint: one edited to name
another entry, or another waiter, is refused as unknown (the entry must hold this id,
published by this waiter), nothing else changes, and the genuine answer still wins.
On a private redis-server with signatures required."""

from __future__ import annotations

import asyncio

import pytest

from conftest import Fleet
from helpers import ask, opened
from toolnexus import Answer
from toolnexus.errors import UnknownRequest
from toolnexus.redis_broker import RedisBroker
from toolnexus.redis_broker._layout import parse_route, route_value

pytestmark = pytest.mark.redis


async def entry_of(agent: RedisBroker, request_id: str) -> str:
    """The entry id the (genuine) route of ``request_id`` names."""
    route = parse_route(await agent.redis.get(agent.keys.route(request_id)))
    assert route is not None and route[0] == agent.waiter_id and route[1] is not None
    return route[1]


async def declined_when_shown(responder: RedisBroker, request_id: str) -> None:
    """The genuine responder declines ``request_id`` as its group reads it from the stream."""
    async with responder.responder("ops") as requests, asyncio.timeout(20):
        async for pending in requests:
            if pending.request.id == request_id:
                await pending.decline(person="web:alice")
                return


async def test_a_route_naming_another_entry_is_refused_and_the_genuine_answer_wins(
    fleet: Fleet,
) -> None:
    """S5, observation 5: the route of request A edited to name the entry of request B
    (the same waiter's, genuinely signed): an answer to A by id would be checked against
    B's form, allow-list and signature. It is refused as unknown, neither request changes,
    and the genuine decline of A still reaches its waiter."""
    async with fleet.agent() as agent, fleet.responder() as bot:
        first, second = ask("Deploy build 42?"), ask("Drop the staging database?")
        waits = [asyncio.create_task(agent.wait_for(r, timeout_s=30)) for r in (first, second)]
        try:
            states = [await opened(agent, r.id) for r in (first, second)]
            other = await entry_of(agent, second.id)
            route = agent.keys.route(first.id)
            await agent.redis.set(route, route_value(agent.waiter_id, other), keepttl=True)
            with pytest.raises(UnknownRequest):
                await bot.answer(Answer(id=first.id, ok=True, person="web:mallory"))
            assert [await agent.redis.hget(s, "s") for s in states] == [b"open", b"open"]
            await declined_when_shown(bot, first.id)
            answer = await asyncio.wait_for(waits[0], 10)
            assert (answer.ok, answer.reason, answer.person) == (False, "declined", "web:alice")
            assert not waits[1].done()
        finally:
            for wait in waits:
                wait.cancel()
            await asyncio.gather(*waits, return_exceptions=True)


async def test_a_route_naming_another_waiter_is_refused_and_the_genuine_answer_wins(
    fleet: Fleet,
) -> None:
    """S5, observation 5: the route of request A edited to name another waiter (with the
    right entry) and an open state forged under that waiter: an answer by id would be
    recorded there and sent to that waiter's reply stream, and A's own waiter would never
    see it. The entry says who published it: refused as unknown, nothing is written to the
    other waiter, and the genuine decline still reaches A's waiter."""
    async with fleet.agent() as agent, fleet.agent() as thief, fleet.responder() as bot:
        request = ask("Deploy build 42?")
        wait = asyncio.create_task(agent.wait_for(request, timeout_s=30))
        try:
            state = await opened(agent, request.id)
            entry = await entry_of(agent, request.id)
            forged_state = thief.keys.state(thief.waiter_id, request.id)
            await thief.redis.hset(forged_state, mapping={"s": "open", "x": "9999999999999"})
            route = agent.keys.route(request.id)
            await agent.redis.set(route, route_value(thief.waiter_id, entry), keepttl=True)
            with pytest.raises(UnknownRequest):
                await bot.answer(Answer(id=request.id, ok=True, person="web:mallory"))
            assert await thief.redis.hget(forged_state, "s") == b"open"
            assert not await thief.redis.exists(thief.keys.answers(thief.waiter_id))
            assert await agent.redis.hget(state, "s") == b"open"
            await declined_when_shown(bot, request.id)
            answer = await asyncio.wait_for(wait, 10)
            assert (answer.ok, answer.reason, answer.person) == (False, "declined", "web:alice")
        finally:
            wait.cancel()
            await asyncio.gather(wait, return_exceptions=True)


async def test_a_route_naming_no_entry_is_refused(fleet: Fleet) -> None:
    """S5, observation 5: a route whose entry part is not an entry id, or names an entry
    that holds no request of this id, is refused as unknown (never a Redis error); the
    request stays open."""
    async with fleet.agent() as agent, fleet.responder() as bot:
        request = ask()
        wait = asyncio.create_task(agent.wait_for(request, timeout_s=30))
        try:
            state = await opened(agent, request.id)
            route = agent.keys.route(request.id)
            for entry in ("not-an-entry", "1-1"):
                await agent.redis.set(route, route_value(agent.waiter_id, entry), keepttl=True)
                with pytest.raises(UnknownRequest):
                    await bot.answer(Answer(id=request.id, ok=True, person="web:mallory"))
            assert await agent.redis.hget(state, "s") == b"open"
        finally:
            wait.cancel()
            await asyncio.gather(wait, return_exceptions=True)
