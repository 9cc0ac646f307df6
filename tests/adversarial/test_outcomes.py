"""Issue #24, observations 1-3, on a private redis-server with signatures required: one Redis
write by a user with responder or agent rights neither blocks the genuine answer nor changes
the outcome. Each test names the threat-model line it checks (docs/security.md)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import msgspec
import pytest

import toolnexus
from conftest import Fleet
from helpers import ask, opened, published_request
from toolnexus import AlreadyResolved, Answer, OnExpiry, Request
from toolnexus.redis_broker import RedisBroker
from toolnexus.security import Keyring, SigningKey
from toolnexus.security._signing import sign_answer

pytestmark = pytest.mark.redis


@asynccontextmanager
async def waiting(
    agent: RedisBroker, request: Request, timeout_s: float = 60, **options: object
) -> AsyncIterator[tuple[asyncio.Task[Answer], str]]:
    """The wait for ``request`` in a task, and its state key once it is open in Redis."""
    task = asyncio.create_task(agent.wait_for(request, timeout_s=timeout_s, **options))  # type: ignore[arg-type]
    state = await opened(agent, request.id)
    try:
        yield task, state
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def answer_when_shown(
    responder: RedisBroker, request_id: str, *, ok: bool, person: str = "web:alice"
) -> None:
    """The genuine responder answers ``request_id`` once, when it is shown; the call must
    not be refused (threat model S4: never "already answered" for an answer that wins)."""
    async with responder.responder("ops") as requests, asyncio.timeout(20):
        async for pending in requests:
            if pending.request.id == request_id:
                if ok:
                    await pending.accept(person=person)
                else:
                    await pending.decline(person=person)
                return


async def answered_state(agent: RedisBroker, responder: RedisBroker) -> dict[bytes, bytes]:
    """The state fields of another request, genuinely answered: what an attacker copies."""
    other = ask("Order lunch?")
    async with waiting(agent, other) as (task, state):
        await answer_when_shown(responder, other.id, ok=True)
        assert (await asyncio.wait_for(task, 10)).ok
        fields: dict[bytes, bytes] = await agent.redis.hgetall(state)
    assert fields[b"s"] == b"answered"
    return fields


@pytest.mark.parametrize("copy", ["verbatim", "id replaced", "deadline in the past"])
async def test_a_copied_answered_state_does_not_block_the_genuine_answer(
    fleet: Fleet, copy: str
) -> None:
    """Threat model S4 (issue #24, observation 1): another request's answered state copied
    into this request's state hash, then the genuine decline: the responder is not told
    "already answered", and the waiter gets the decline at once."""
    async with fleet.agent() as agent, fleet.responder() as bot:
        fields = await answered_state(agent, bot)
        request = ask()
        async with waiting(agent, request) as (task, state):
            forged = dict(fields)
            if copy == "id replaced":
                answer = agent.codec.decode_as(fields[b"a"], Answer)
                forged[b"a"] = agent.codec.encode(msgspec.structs.replace(answer, id=request.id))
            elif copy == "deadline in the past":
                forged[b"x"] = str(int(time.time() * 1000) - 1000).encode()
            await agent.redis.hset(state, mapping=forged)  # type: ignore[arg-type]
            await answer_when_shown(bot, request.id, ok=False)
            answer = await asyncio.wait_for(task, 5)
            assert (answer.ok, answer.reason, answer.responder) == (False, "declined", "ops-bot")
            assert answer.person == "web:alice"
            # The state now records the genuine answer: later answers lose to it.
            assert agent.codec.decode_as(await agent.redis.hget(state, "a"), Answer).ok is False
        [record] = await agent.audit(request_id=request.id)
        assert (record.ok, record.responder, record.verified) == (False, "ops-bot", True)
        if copy == "id replaced":  # its signature is another request's: refused, audited
            assert [refusal.reason for refusal in record.refused] == ["bad signature"]
        else:  # an answer to another request: dead-lettered
            assert agent.statistics()["unreadable_answers"] >= 1


async def test_a_deleted_state_does_not_lose_the_genuine_answer(fleet: Fleet) -> None:
    """Threat model S4: the request's state deleted before the genuine answer: the answer
    still reaches the waiter, which checks it and records it."""
    async with fleet.agent() as agent, fleet.responder() as bot:
        request = ask()
        async with waiting(agent, request) as (task, state):
            async with bot.responder("ops") as requests, asyncio.timeout(10):
                pending = await anext(requests)
                await agent.redis.delete(state)
                await pending.accept(person="web:alice")
            answer = await asyncio.wait_for(task, 5)
            assert (answer.ok, answer.responder) == (True, "ops-bot")
            assert await agent.redis.hget(state, "s") == b"answered"


async def test_an_edited_deadline_does_not_turn_a_decline_into_a_default(fleet: Fleet) -> None:
    """Threat model S1 (issue #24, observation 2): ``HSET <state> x 1`` and then a person
    declines a request whose default on expiry accepts: the decline wins, 60 s before the
    signed deadline; nobody is told the request expired."""
    async with fleet.agent() as agent, fleet.responder() as bot:
        request = ask(on_expiry=OnExpiry(ok=True))
        async with waiting(agent, request) as (task, state):
            await agent.redis.hset(state, "x", 1)
            await answer_when_shown(bot, request.id, ok=False)
            answer = await asyncio.wait_for(task, 5)
        assert (answer.ok, answer.reason, answer.defaulted) == (False, "declined", False)


async def test_a_forged_expiry_before_the_deadline_is_refused(fleet: Fleet) -> None:
    """Threat model S1: an expiry with the request's default, signed by a trusted
    responder key and recorded in the state 60 s before the deadline: the waiter's own
    clock decides, so the wait goes on and the genuine answer wins."""
    async with fleet.agent() as agent, fleet.responder() as bot:
        request = ask(on_expiry=OnExpiry(ok=True))
        async with waiting(agent, request) as (task, _state):
            published = await published_request(agent, request.id)
            early = Answer(id=request.id, ok=True, reason="expired", defaulted=True)
            signed = sign_answer(early, published, fleet.bot_key)
            outcome, _, _ = await bot.core.resolve(
                agent.waiter_id, request.id, "expired", bot.codec.encode(signed)
            )
            assert outcome == "ok"  # Redis took it: only the waiter can refuse it
            await asyncio.sleep(0.5)
            assert not task.done(), task.result()
            await answer_when_shown(bot, request.id, ok=False)
            answer = await asyncio.wait_for(task, 10)
        assert (answer.ok, answer.reason, answer.defaulted) == (False, "declined", False)


@pytest.mark.parametrize("reason", ["unavailable", "expired", "withdrawn"])
async def test_broker_reasons_obey_the_allow_list_and_carry_no_answer(
    fleet: Fleet, reason: str
) -> None:
    """Threat model S2 (issue #24, observation 3): a trusted key that the allow-list
    leaves out resolves with a broker reason, ``ok=True`` and data: the waiter takes none
    of it, and the allowed person's answer wins."""
    async with fleet.agent() as agent, fleet.responder() as bot:
        request = ask()
        async with waiting(agent, request, allow=["web:alice"]) as (task, _state):
            published = await published_request(agent, request.id)
            forged = Answer(id=request.id, ok=True, data={"iban": "XX00 EVIL"}, reason=reason)
            signed = sign_answer(forged, published, fleet.intern_key)
            outcome, _, _ = await bot.core.resolve(
                agent.waiter_id, request.id, "answered", bot.codec.encode(signed)
            )
            assert outcome == "ok"
            await asyncio.sleep(0.5)
            assert not task.done(), task.result()
            await answer_when_shown(bot, request.id, ok=True, person="web:alice")
            answer = await asyncio.wait_for(task, 10)
        assert (answer.ok, answer.data, answer.reason) == (True, None, None)
        assert answer.person == "web:alice"
        [record] = await agent.audit(request_id=request.id)
        assert [refusal.responder for refusal in record.refused] == ["intern"]


async def test_a_genuine_late_comer_is_still_told_it_lost(fleet: Fleet) -> None:
    """Threat model S4, the other way round: two genuine responders answer; the second is
    told "already answered" at once (its process verifies the stored answer) and the
    waiter keeps the first."""
    async with fleet.agent() as agent, fleet.responder() as bot:
        intern = fleet.responder(
            fleet.intern_key, trusted=Keyring.of(fleet.agent_key, fleet.bot_key)
        )
        async with intern:
            request = ask()
            async with waiting(agent, request) as (task, _):
                async with (
                    bot.responder("ops") as first,
                    intern.responder("chat") as second,
                    asyncio.timeout(10),
                ):
                    mine, theirs = await anext(first), await anext(second)
                    await mine.accept(person="web:alice")
                    started = time.monotonic()
                    with pytest.raises(AlreadyResolved) as lost:
                        await theirs.decline(person="chat:bob")
                    assert time.monotonic() - started < 1.0
                assert lost.value.reason == "already answered"
                answer = await asyncio.wait_for(task, 5)
        assert (answer.ok, answer.responder) == (True, "ops-bot")


async def test_unsigned_fields_of_a_stored_answer_change_nothing(fleet: Fleet) -> None:
    """Threat model S1, S3: a genuine decline, stored; one ``HSET`` relabels it as a default
    on expiry with an invented approver. The next attach gets the decline as it was signed:
    no default, no approvals (a default is the waiter's own, approvals come from votes)."""
    async with fleet.agent() as agent, fleet.responder() as bot:
        request = ask(durable=True)
        task = asyncio.create_task(agent.wait_for(request, timeout_s=60))
        await answer_when_shown(bot, request.id, ok=False)
        assert (await asyncio.wait_for(task, 5)).reason == "declined"
        state = agent.keys.state(agent.keys.durable_waiter(agent.settings.agent), request.id)
        genuine = agent.codec.decode_as(await agent.redis.hget(state, "a"), Answer)
        relabelled = msgspec.structs.replace(
            genuine,
            defaulted=True,
            approvals=[toolnexus.Approval(responder="ops-bot", person="web:mallory", at=1.0)],
        )
        await agent.redis.hset(state, "a", agent.codec.encode(relabelled))
        again = await asyncio.wait_for(agent.wait_for(request, timeout_s=60), 5)
    assert (again.ok, again.reason, again.responder) == (False, "declined", "ops-bot")
    assert (again.defaulted, again.approvals) == (False, None)


def test_an_answers_meta_is_signed() -> None:
    """Threat model S1: ``Answer.meta`` is signed where set: edited in Redis, it breaks the
    signature instead of reaching the waiting code."""
    agent, bot = SigningKey.generate("agent-7"), SigningKey.generate("ops-bot")
    request = toolnexus.security._signing.sign_request(ask(), agent)
    answer = sign_answer(Answer(id=request.id, ok=True, meta={"ticket": 7}), request, bot)
    assert toolnexus.security._signing.verify_answer(answer, request, Keyring.of(bot)) == "ops-bot"
    edited = msgspec.structs.replace(answer, meta={"ticket": 8})
    with pytest.raises(toolnexus.errors.SignatureError, match="bad signature"):
        toolnexus.security._signing.verify_answer(edited, request, Keyring.of(bot))


async def test_a_responder_after_a_withdrawal_is_told_so_at_once(fleet: Fleet) -> None:
    """Threat model S4: the waiter's own end (here a withdrawal) is stored signed with its
    key, which responders trust, so a responder answering afterwards is told "withdrawn" at
    once, not left waiting for a verdict on a state it could not tell from an edited one."""
    async with fleet.agent() as agent, fleet.responder() as bot:
        request = ask()
        async with bot.responder("ops") as requests, asyncio.timeout(10):
            async with waiting(agent, request) as (task, state):
                pending = await anext(requests)
                task.cancel()
                async with asyncio.timeout(5):
                    while await agent.redis.hget(state, "s") != b"withdrawn":
                        await asyncio.sleep(0.01)
            started = time.monotonic()
            with pytest.raises(AlreadyResolved) as lost:
                await pending.accept(person="web:alice")
            assert time.monotonic() - started < 1.0
        assert lost.value.reason == "withdrawn"
