"""Bad input to the public API raises a ToolnexusError naming what was wrong, at once, on
both brokers: never ValueError, OverflowError, UnicodeEncodeError or RecursionError, and
never a wait that runs its course first.

Threat-model line S10; issue #24 observation 10.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

import pytest

import toolnexus
from conftest import FAST
from toolnexus import (
    Answer,
    Broker,
    ConfigurationError,
    InvalidAnswer,
    InvalidRequest,
    Quorum,
    Request,
    new_id,
)
from toolnexus.codec import MSGPACK
from toolnexus.errors import DecodeError
from toolnexus.redis_broker import RedisBroker
from toolnexus.security import Keyring, SigningKey

pytestmark = pytest.mark.redis

BROKERS = pytest.mark.parametrize("broker", ["memory", "redis"], indirect=True)


def deep(levels: int) -> list[Any]:
    nested: list[Any] = []
    for _ in range(levels):
        nested = [nested]
    return nested


@BROKERS
@pytest.mark.parametrize("timeout_s", [math.nan, math.inf, -5, 0, 1e300])
async def test_a_timeout_that_is_not_a_duration_is_refused(
    broker: Broker, timeout_s: float
) -> None:
    """S10, observation 10: ``timeout_s=nan`` raised ValueError (Redis) or expired at once
    (memory); ``timeout_s=-5`` was accepted and ended ``unavailable``/``expired``."""
    request = Request(id=new_id(), kind="approval", prompt="Deploy?")
    async with asyncio.timeout(2):
        with pytest.raises(InvalidRequest, match="timeout_s="):
            await broker.wait_for(request, timeout_s=timeout_s)


@BROKERS
async def test_question_refuses_a_negative_timeout(broker: Broker) -> None:
    """S10, observation 10: ``question(timeout_s=-5)`` was published already expired."""
    async with asyncio.timeout(2):
        with pytest.raises(InvalidRequest, match="timeout_s=-5"):
            await toolnexus.question("Deploy?", wait_for=broker.wait_for, timeout_s=-5)


@BROKERS
@pytest.mark.parametrize("field", ["expires_at", "created_at"])
async def test_a_request_time_that_is_not_a_time_is_refused(broker: Broker, field: str) -> None:
    """S10, observation 10: a request whose expiry is NaN failed as ValueError deep inside."""
    request = Request(id=new_id(), kind="approval", prompt="Deploy?")
    setattr(request, field, math.nan)
    if field == "created_at":
        request.escalate = [toolnexus.Hop(1.0, "oncall")]
    async with asyncio.timeout(2):
        with pytest.raises(InvalidRequest, match=f"{field}=nan"):
            await broker.wait_for(request, timeout_s=None if field == "created_at" else 1)


@BROKERS
@pytest.mark.parametrize("ttl_s", [math.inf, math.nan, 1e300])
async def test_a_heartbeat_ttl_that_is_not_a_duration_is_refused(
    broker: Broker, ttl_s: float
) -> None:
    """S10, observation 10: ``heartbeat(ttl_s=inf)`` raised OverflowError on Redis and was
    kept for ever in memory."""
    with pytest.raises(ConfigurationError, match="ttl_s="):
        await broker.heartbeat("web", "w1", ttl_s=ttl_s)
    assert await broker.heartbeats() == []


UNENCODABLE = [
    ("prompt", {"prompt": "Deploy \ud800?"}),
    ("data", {"kind": "input", "data": {"schema": {"type": "object"}, "x": "\udcff"}}),
    ("data", {"data": {"n": 2**70}}),
    ("data", {"data": deep(100_000)}),
    ("meta", {"meta": {"k": object()}}),
]


@BROKERS
@pytest.mark.parametrize(
    ("field", "fields"), UNENCODABLE, ids=["surrogate", "key", "int", "deep", "object"]
)
async def test_a_request_that_cannot_be_encoded_is_refused_at_once(
    broker: Broker, field: str, fields: dict[str, Any]
) -> None:
    """S10, observation 10: a lone surrogate in a prompt raised UnicodeEncodeError (on the
    memory broker only once the wait had run its course); a huge integer OverflowError,
    nesting RecursionError. Now InvalidRequest naming the field, before anything is sent."""
    request = Request(id=new_id(), **{"kind": "approval", **fields})
    async with asyncio.timeout(2):
        with pytest.raises(InvalidRequest, match=f"field '{field}'"):
            await broker.wait_for(request, timeout_s=30)


async def test_a_signed_request_that_cannot_be_encoded_is_refused(
    redis_url: str, namespace: str
) -> None:
    """S10, observation 10: signing met the surrogate first, as UnicodeEncodeError."""
    key = SigningKey.generate("agent-7")
    options = {"signing_key": key, "trusted_keys": Keyring.of(key), "require_signatures": True}
    async with toolnexus.connect(redis_url, namespace=namespace, **FAST, **options) as broker:
        request = Request(id=new_id(), kind="approval", prompt="Deploy \ud800?")
        with pytest.raises(InvalidRequest, match="field 'prompt'"):
            await broker.wait_for(request, timeout_s=30)


@BROKERS
async def test_an_answer_that_cannot_be_encoded_is_refused_and_the_request_stays_open(
    broker: Broker,
) -> None:
    """S10, observation 10: an answer with a lone surrogate raised UnicodeEncodeError from
    ``answer()``; now InvalidAnswer naming the field, and a good answer still resolves."""
    request = Request(id=new_id(), kind="approval", prompt="Deploy?")
    waiting = asyncio.create_task(broker.wait_for(request, timeout_s=10))
    async with broker.responder("web") as responder:
        pending = await asyncio.wait_for(anext(responder), 5)
        for bad in (
            Answer(id=request.id, ok=True, person="web:\ud800"),
            Answer(id=request.id, ok=False, reason="declined\udcff"),
        ):
            with pytest.raises(InvalidAnswer, match="cannot be encoded"):
                await pending.answer(bad)
        with pytest.raises(InvalidAnswer, match="cannot be encoded"):
            await broker.answer(Answer(id=request.id, ok=True, person="ops:\ud800"))
        await pending.accept(person="web:alice")
    answer = await asyncio.wait_for(waiting, 5)
    assert (answer.ok, answer.person) == (True, "web:alice")


@pytest.mark.parametrize("need", [0, -1, True, 2.0, 10**9])
def test_a_quorum_nobody_could_reach_or_everybody_has_is_refused(need: Any) -> None:
    """S10, observation 10: ``Quorum(need=0)`` was accepted (and resolved on no vote)."""
    with pytest.raises(InvalidRequest, match="quorum need="):
        Quorum(need=need)


def test_a_quorum_of_zero_from_the_wire_is_a_decode_error() -> None:
    """S10, observation 10: a request stored with ``need: 0`` decodes to a DecodeError (a
    dead letter for a responder), not a request that needs nobody."""
    good = MSGPACK.encode(Request(id="req-1", kind="approval", quorum=Quorum(need=2)))
    forged = good.replace(b"\xa4need\x02", b"\xa4need\x00")
    assert forged != good
    with pytest.raises(DecodeError, match="quorum need=0"):
        MSGPACK.decode(forged)


@pytest.mark.parametrize("broker", ["redis"], indirect=True)
async def test_a_responder_dead_letters_a_quorum_of_zero(broker: Broker) -> None:
    """S10, observation 10: such an entry in the request stream is dead-lettered; the
    responder goes on to the next request."""
    assert isinstance(broker, RedisBroker)
    good = Request(
        id=new_id(),
        kind="approval",
        quorum=Quorum(need=2),
        reply_to=broker.waiter_id,
        expires_at=time.time() + 30,
    )
    forged = MSGPACK.encode(good).replace(b"\xa4need\x02", b"\xa4need\x00")
    await broker.redis.xadd(broker.keys.requests, {"r": forged})
    request = Request(id=new_id(), kind="approval", prompt="Next")
    waiting = asyncio.create_task(broker.wait_for(request, timeout_s=10))
    async with broker.responder("web") as responder:
        pending = await asyncio.wait_for(anext(responder), 5)
        assert pending.request.id == request.id
        await pending.accept()
    assert (await asyncio.wait_for(waiting, 5)).ok
    assert await broker.redis.xlen(broker.keys.dead) == 1


@BROKERS
@pytest.mark.parametrize(
    "query", [{"since": math.nan}, {"since": -5.0}, {"since": math.inf}, {"limit": 0}]
)
async def test_an_audit_query_no_trail_can_answer_is_refused(
    broker: Broker, query: dict[str, Any]
) -> None:
    """S10, observation 10: ``audit(since=nan)`` raised ValueError on Redis, a negative
    one was "broker unavailable"; the memory broker answered them."""
    with pytest.raises(ConfigurationError, match=f"{next(iter(query))}="):
        await broker.audit(**query)


@BROKERS
async def test_heartbeat_info_that_cannot_be_encoded_is_refused(broker: Broker) -> None:
    """S10, observation 10: a lone surrogate in a heartbeat's info raised
    UnicodeEncodeError on Redis and was kept in memory."""
    with pytest.raises(ConfigurationError, match="field 'info'"):
        await broker.heartbeat("web", "w1", ttl_s=30, info={"host": "\ud800"})
