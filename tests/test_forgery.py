"""SPEC §11 Security, on a private redis-server with signatures required: every forgery a
user with Redis access can try never reaches the waiting code, the genuine answer
afterwards wins, and the audit trail shows the refusal."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import msgspec
import pytest

import toolnexus
from conftest import FAST, Fleet
from helpers import ask, opened, published_request, routed_request
from toolnexus import AlreadyResolved, Answer, Pending, Request
from toolnexus.errors import NotAllowed
from toolnexus.observability import Metrics
from toolnexus.redis_broker import RedisBroker
from toolnexus.security._signing import sign_answer

pytestmark = pytest.mark.redis


@asynccontextmanager
async def waiting(
    agent: RedisBroker, request: Request, **options: object
) -> AsyncIterator[asyncio.Task[Answer]]:
    task = asyncio.create_task(agent.wait_for(request, timeout_s=30, **options))  # type: ignore[arg-type]
    await opened(agent, request.id)
    try:
        yield task
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def shown(responder: RedisBroker, group: str = "ops") -> Pending:
    async with responder.responder(group) as r, asyncio.timeout(10):
        return await anext(r)


async def decline_genuinely(responder: RedisBroker, request_id: str) -> None:
    """The genuine responder declines ``request_id``, as soon as it is shown open."""
    async with responder.responder("ops") as r, asyncio.timeout(20):
        async for pending in r:
            if pending.request.id != request_id:
                continue
            try:
                await pending.decline(person="web:alice")
                return
            except AlreadyResolved:
                continue  # an edited state: the waiter refuses it and reopens the request


async def still_waiting(task: asyncio.Task[Answer], for_s: float = 0.5) -> None:
    await asyncio.sleep(for_s)
    assert not task.done(), task.result()


async def assert_refusal_audited(agent: RedisBroker, request_id: str, reason: str) -> None:
    async with asyncio.timeout(10):
        while True:
            records = await agent.audit(request_id=request_id)
            if records:
                break
            await asyncio.sleep(0.05)
    [record] = records
    assert reason in [refusal.reason for refusal in record.refused], record.refused
    assert (record.status, record.ok, record.responder) == ("answered", False, "ops-bot")
    assert record.person == "web:alice" and record.verified is True
    assert record.requester == "agent-7"


def forged(agent: RedisBroker, request_id: str, **fields: object) -> bytes:
    answer = Answer(id=request_id, ok=True, responder="alice@ops", **fields)  # type: ignore[arg-type]
    return agent.codec.encode(answer)


async def test_a_direct_xadd_into_the_reply_stream_is_refused(fleet: Fleet) -> None:
    async with fleet.agent() as agent, fleet.responder() as bot:
        request = ask()
        async with waiting(agent, request) as wait:
            reply_stream = agent.keys.answers(agent.waiter_id)
            await agent.redis.xadd(reply_stream, {"id": request.id, "a": forged(agent, request.id)})
            await still_waiting(wait)
            await decline_genuinely(bot, request.id)
            answer = await asyncio.wait_for(wait, 10)
        assert (answer.ok, answer.reason, answer.responder) == (False, "declined", "ops-bot")
        assert answer.person == "web:alice"
        await assert_refusal_audited(agent, request.id, "missing signature")
        assert agent.statistics()["refused_answers"] == 1
        metrics = Metrics()
        metrics.watch_broker(agent)
        assert "toolnexus_answers_refused_total 1.0" in metrics.text()
        assert "toolnexus_answers_unreadable_total 0.0" in metrics.text()


async def test_an_edited_state_is_refused_and_the_genuine_answer_still_wins(fleet: Fleet) -> None:
    async with fleet.agent() as agent, fleet.responder() as bot:
        request = ask()
        async with waiting(agent, request) as wait:
            state = await opened(agent, request.id)
            await agent.redis.hset(state, mapping={"s": "answered", "a": forged(agent, request.id)})
            await still_waiting(wait)
            await decline_genuinely(bot, request.id)
            answer = await asyncio.wait_for(wait, 20)
        assert (answer.reason, answer.responder) == ("declined", "ops-bot")
        await assert_refusal_audited(agent, request.id, "missing signature")


@pytest.mark.slow
async def test_a_deadline_that_finds_only_a_forged_answer_is_expired(fleet: Fleet) -> None:
    async with fleet.agent() as agent:
        request = ask()
        wait = asyncio.create_task(agent.wait_for(request, timeout_s=1.0))
        state = await opened(agent, request.id)
        await agent.redis.hset(state, mapping={"s": "answered", "a": forged(agent, request.id)})
        answer = await asyncio.wait_for(wait, 10)
    assert (answer.ok, answer.reason) == (False, "expired")


async def test_an_answer_copied_from_another_request_is_refused(fleet: Fleet) -> None:
    async with fleet.agent() as agent, fleet.responder() as bot:
        first = ask("Order lunch?")
        async with waiting(agent, first) as wait:
            await (await shown(bot)).accept()
            assert (await asyncio.wait_for(wait, 10)).ok
        [(_, entry)] = await agent.redis.xrange(agent.keys.answers(agent.waiter_id), count=1)
        genuine = agent.codec.decode_as(entry[b"a"], Answer)
        second = ask()
        async with waiting(agent, second) as wait:
            copied = msgspec.structs.replace(genuine, id=second.id)
            reply_stream = agent.keys.answers(agent.waiter_id)
            await agent.redis.xadd(reply_stream, {"id": second.id, "a": agent.codec.encode(copied)})
            await still_waiting(wait)
            await decline_genuinely(bot, second.id)
            assert (await asyncio.wait_for(wait, 10)).reason == "declined"
        await assert_refusal_audited(agent, second.id, "bad signature")


async def test_broker_answer_from_a_process_without_a_trusted_key_is_refused(
    fleet: Fleet,
) -> None:
    rogue = toolnexus.connect(fleet.url, namespace="sec", **FAST)  # Redis access, no key
    async with fleet.agent() as agent, fleet.responder() as bot, rogue:
        request = ask()
        async with waiting(agent, request) as wait:
            await rogue.answer(Answer(id=request.id, ok=True, responder="ops-bot"))
            await still_waiting(wait)
            await decline_genuinely(bot, request.id)
            assert (await asyncio.wait_for(wait, 20)).reason == "declined"
        await assert_refusal_audited(agent, request.id, "missing signature")


async def test_a_trusted_key_the_allow_list_excludes_is_refused(fleet: Fleet) -> None:
    async with (
        fleet.agent() as agent,
        fleet.responder() as bot,
        fleet.responder(fleet.intern_key) as intern,
    ):
        request = ask()
        async with waiting(agent, request, allow=["ops-bot"]) as wait:
            # The intern's own responder says no, and does not show it to the intern.
            with pytest.raises(NotAllowed, match="not allowed"):
                await intern.answer(Answer(id=request.id, ok=True))
            async with intern.responder("interns", until_idle=True) as r:
                assert [p async for p in r] == []
            # An intern bypassing its own checks: a signed answer the waiter refuses.
            published = await published_request(agent, request.id)
            answer = sign_answer(Answer(id=request.id, ok=True), published, fleet.intern_key)
            reply_stream = agent.keys.answers(agent.waiter_id)
            await agent.redis.xadd(
                reply_stream, {"id": request.id, "a": agent.codec.encode(answer)}
            )
            await still_waiting(wait)
            await decline_genuinely(bot, request.id)
            assert (await asyncio.wait_for(wait, 10)).reason == "declined"
        await assert_refusal_audited(agent, request.id, "not allowed")


async def spoof(agent: RedisBroker, prompt: str) -> None:
    """Replace the request stream's one entry by a copy asking ``prompt``."""
    stream = agent.keys.requests
    [(entry_id, fields)] = await agent.redis.xrange(stream)
    spoofed = agent.codec.decode_as(fields[b"r"], Request)
    spoofed.prompt = prompt  # the agent's signature no longer matches
    await agent.redis.xdel(stream, entry_id)
    await agent.redis.xadd(stream, {"r": agent.codec.encode(spoofed)})


async def test_a_spoofed_prompt_is_never_shown_by_a_responder_requiring_signatures(
    fleet: Fleet,
) -> None:
    async with fleet.agent() as agent, fleet.responder() as bot:
        request = ask("Drop table users?")
        async with waiting(agent, request) as wait:
            await spoof(agent, "Order lunch?")
            async with bot.responder("strict", until_idle=True) as strict:
                assert [p async for p in strict] == []
            async with asyncio.timeout(10):  # the move travels with the next commands
                while not (dead := await agent.redis.xrange(agent.keys.dead)):
                    await asyncio.sleep(0.02)
            assert b"bad signature" in dead[-1][1][b"error"]
            # The strict responder's signed refusal names another request than the agent's:
            # its entry was replaced, so it publishes the genuine one again (the route names
            # the new entry, where answering by id reads it: the state does not hold it).
            async with asyncio.timeout(10):
                while getattr(await routed_request(agent, request.id), "prompt", None) != (
                    request.prompt
                ):
                    await asyncio.sleep(0.02)
            # The genuine responder answers the request as the agent asked it, by id.
            await bot.answer(Answer(id=request.id, ok=False, reason="declined", person="web:alice"))
            answer = await asyncio.wait_for(wait, 10)
        assert (answer.reason, answer.responder) == ("declined", "ops-bot")


async def test_an_answer_to_a_spoofed_prompt_is_refused_and_the_genuine_one_wins(
    fleet: Fleet,
) -> None:
    async with fleet.agent() as agent, fleet.responder() as bot:
        async with fleet.responder(required=False) as lax:
            request = ask("Drop table users?")
            async with waiting(agent, request) as wait:
                await spoof(agent, "Order lunch?")
                # A responder that does not require signatures shows it and signs an answer
                # to what it saw: the waiter refuses it as an answer to another request,
                # and publishes the request again as it asked it.
                pending = await shown(lax, "lax")
                assert pending.request.prompt == "Order lunch?"
                await pending.accept()
                await still_waiting(wait)
                await decline_genuinely(bot, request.id)
                answer = await asyncio.wait_for(wait, 10)
        assert (answer.reason, answer.responder) == ("declined", "ops-bot")
        await assert_refusal_audited(agent, request.id, "signed for another request")
