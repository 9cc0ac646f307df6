"""Issue #27 (observation 2 of its Done when): an approval is bound to the exact tool call.
On a private redis-server with
signatures required, the signed answer that approved one call, replayed for a new call of
the same tool with the same arguments (same digest of name + arguments, a new request),
is refused: its signature covers the first request, id included (threat-model S1/S2)."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from conftest import Fleet
from test_forgery import decline_genuinely, shown, still_waiting, waiting
from toolnexus import Answer
from toolnexus.frameworks import decide, tool_call_of, tool_call_request

pytestmark = pytest.mark.redis

ARGS = {"to": "ACME", "amount": 10}


async def test_a_signed_approval_replayed_for_a_new_identical_call_is_refused(
    fleet: Fleet,
) -> None:
    async with fleet.agent() as agent, fleet.responder() as bot:
        first = tool_call_request("transfer", ARGS, framework="test", run="r1", call_id="c1")
        async with waiting(agent, first) as wait:
            await (await shown(bot)).accept(person="web:alice")
            approved = await asyncio.wait_for(wait, 10)
        assert decide(first, approved).approved
        [(_, entry)] = await agent.redis.xrange(agent.keys.answers(agent.waiter_id), count=1)
        genuine = agent.codec.decode_as(entry[b"a"], Answer)
        assert genuine.signature is not None

        second = tool_call_request("transfer", ARGS, framework="test", run="r1", call_id="c2")
        assert tool_call_of(second).digest == tool_call_of(first).digest  # same action
        async with waiting(agent, second) as wait:
            replayed = msgspec.structs.replace(genuine, id=second.id)
            reply_stream = agent.keys.answers(agent.waiter_id)
            await agent.redis.xadd(
                reply_stream, {"id": second.id, "a": agent.codec.encode(replayed)}
            )
            await still_waiting(wait)  # the replay approved nothing
            await decline_genuinely(bot, second.id)
            answer = await asyncio.wait_for(wait, 10)
        decision = decide(second, answer)
        assert not decision.approved and decision.arguments is None
        async with asyncio.timeout(10):
            while not (records := await agent.audit(request_id=second.id)):
                await asyncio.sleep(0.05)
        [record] = records
        assert "bad signature" in [refusal.reason for refusal in record.refused]
        assert (record.ok, record.responder) == (False, "ops-bot")
