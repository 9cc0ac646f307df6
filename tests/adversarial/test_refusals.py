"""Issue #25 observation 2, "A signature mismatch is invisible to the agent", on a private
redis-server with signatures required: threat-model line S2 (a responder's refusal of a
request ends a wait only when a trusted key signed it for exactly the request's bytes and
reason). A refusal written straight into Redis, unsigned, signed by an untrusted key,
edited or signed for another request, is a hint that is logged: the wait goes on and the
genuine answer still wins (S4). A genuine refusal is given at once as ``Refused``.
"""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from conftest import Fleet
from helpers import ask, opened
from test_forgery import decline_genuinely, still_waiting, waiting
from toolnexus.errors import Refused
from toolnexus.models import Signature
from toolnexus.redis_broker import RedisBroker
from toolnexus.security import Keyring, SigningKey
from toolnexus.security._signing import sign_refusal

pytestmark = pytest.mark.redis


async def published_bytes(agent: RedisBroker, request_id: str) -> bytes:
    """The request ``request_id`` as its waiter published it (the entry's ``r`` field)."""
    async with asyncio.timeout(10):
        while True:
            for _, fields in await agent.redis.xrange(agent.keys.requests):
                payload: bytes = fields[b"r"]
                if request_id.encode() in payload:
                    return payload
            await asyncio.sleep(0.01)


@pytest.mark.slow
async def test_a_forged_refusal_does_not_end_a_signed_wait_and_the_genuine_answer_wins(
    fleet: Fleet, caplog: pytest.LogCaptureFixture
) -> None:
    """S2, observation 2: every refusal a user with Redis access can write without a
    trusted responder's key is let be."""
    caplog.set_level(logging.WARNING, logger="toolnexus")
    mallory = SigningKey.generate("mallory")
    async with fleet.agent() as agent, fleet.responder() as bot:
        request = ask()
        async with waiting(agent, request) as wait:
            payload = await published_bytes(agent, request.id)
            reason = "missing signature"
            good = sign_refusal(request.id, payload, reason, fleet.bot_key)  # the bot never sent it
            forgeries = [
                {},  # unsigned
                _signed(sign_refusal(request.id, payload, reason, mallory)),  # untrusted key
                _signed(sign_refusal(request.id, b"other bytes", reason, fleet.bot_key)),
                {"k": "ops-bot", "s": b"\0" * 64, "d": good.digest or b""},  # a bad signature
            ]
            reply_stream = agent.keys.answers(agent.waiter_id)
            for extra in forgeries:
                fields = {"id": request.id, "x": reason, "b": "ops/bot", **extra}
                await agent.redis.xadd(reply_stream, fields)  # type: ignore[arg-type]
            # the bot's genuine signature, for another reason than the one it signed
            await agent.redis.xadd(
                reply_stream, {"id": request.id, "x": "unknown key", **_signed(good)}
            )
            await still_waiting(wait, 1.0)
            assert not agent.refusal(request.id).done()
            await decline_genuinely(bot, request.id)
            answer = await asyncio.wait_for(wait, 10)
        assert (answer.ok, answer.reason, answer.responder) == (False, "declined", "ops-bot")
    hints = [r.getMessage() for r in caplog.records if "does not verify" in r.getMessage()]
    assert len(hints) == 5, hints
    assert any("(missing signature)" in h for h in hints)
    assert any("(unknown key 'mallory')" in h for h in hints)
    assert any("(signed for another request)" in h for h in hints)
    assert sum("(bad signature)" in h for h in hints) == 2


async def test_a_trusted_responders_refusal_is_given_at_once(fleet: Fleet) -> None:
    """S2, observation 2: a responder that does not trust the agent's key dead-letters its
    request and says so, signed; the agent trusts that responder, so the refusal counts at
    once (verified), while the wait itself goes on."""
    strict = fleet.responder(trusted=Keyring.of(fleet.intern_key))
    async with fleet.agent() as agent, strict:
        request = ask()
        started = time.monotonic()
        wait = asyncio.create_task(agent.wait_for(request, timeout_s=600))
        await opened(agent, request.id)

        async def read() -> None:
            async with strict.responder("ops") as requests:
                async for _ in requests:
                    pass

        reading = asyncio.create_task(read())
        try:
            refused = await asyncio.wait_for(agent.refusal(request.id), 30)
            assert not wait.done()
        finally:
            for task in (reading, wait):
                task.cancel()
            await asyncio.gather(reading, wait, return_exceptions=True)
        assert time.monotonic() - started < 30
    assert isinstance(refused, Refused)
    assert refused.reason == "unknown key 'agent-7'"
    assert (refused.responder, refused.verified) == ("ops-bot", True)


def _signed(signature: Signature) -> dict[str, str | bytes]:
    return {"k": signature.key, "s": signature.sig, "d": signature.digest or b""}
