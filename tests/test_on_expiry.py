"""SPEC §14 default on expiry: a request says what its waiter gets when nobody answers in
time. Through Redis with a responder process that holds the request and never answers,
and on the embedded broker: the waiter gets it marked ``reason="expired"``,
``defaulted=True``, and so do the audit record and the events."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

import toolnexus
from helpers import eventually
from test_cli_ops import broker_args, connected, run
from test_durable import DEAD_AGENT, kill, published, published_at_least
from toolnexus import (
    AlreadyResolved,
    Answer,
    Broker,
    Event,
    InvalidAnswer,
    InvalidRequest,
    Request,
    new_id,
)
from toolnexus._outcomes import expired_answer
from toolnexus.cli._ops import audit_text, read_status, status_text
from toolnexus.mcp import answer_to_elicit_result
from toolnexus.models import ExpiredEvent, OnExpiry
from toolnexus.rendering import gone_note, standing_notes
from toolnexus.security._audit import audit_record
from toolnexus_workers.chat import header
from waiting_agents import AgentFactory

FORM = {
    "type": "object",
    "properties": {
        "seats": {"type": "integer", "minimum": 1, "default": 2},
        "terrace": {"type": "boolean", "default": False},
        "note": {"type": "string"},
    },
    "required": ["seats"],
}

HOLDER = r"""
import asyncio, sys
import toolnexus

async def main():
    url, namespace = sys.argv[1:3]
    async with toolnexus.connect(url, namespace=namespace, block_ms=100, lease_ms=600) as b:
        async with b.responder("holder") as shown:
            async for pending in shown:
                print(pending.request.id, flush=True)  # shown, and never answered

asyncio.run(main())
"""


def booking(on_expiry: OnExpiry | None, **fields: Any) -> Request:
    return Request(
        id=new_id(), kind="input", prompt="Book a table?", data={"schema": FORM},
        on_expiry=on_expiry, **fields,
    )  # fmt: skip


@asynccontextmanager
async def holder(url: str, namespace: str) -> AsyncIterator[asyncio.subprocess.Process]:
    """A responder process that shows every request and answers none."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", HOLDER, url, namespace, stdout=asyncio.subprocess.PIPE
    )
    try:
        yield process
    finally:
        process.kill()
        await process.wait()


async def held(process: asyncio.subprocess.Process) -> str:
    assert process.stdout is not None
    line = await asyncio.wait_for(process.stdout.readline(), 20)
    return line.decode().strip()


async def expired_event(events: toolnexus.EventStream, request_id: str) -> Event:
    async with asyncio.timeout(10):
        async for event in events:
            if event.event == "expired" and event.id == request_id:
                return event
    raise AssertionError("no expired event")


# -- through Redis, with a responder process holding the request ----------------------------


@pytest.mark.redis
@pytest.mark.parametrize(
    ("on_expiry", "ok", "data"),
    [
        (OnExpiry(ok=True), True, {"seats": 2, "terrace": False}),
        (OnExpiry(ok=True, data={"seats": 4, "note": "window"}), True,
         {"seats": 4, "terrace": False, "note": "window"}),
        (OnExpiry(ok=False), False, None),
    ],
    ids=["accept-with-defaults", "accept-with-data", "decline"],
)  # fmt: skip
@pytest.mark.slow
async def test_a_default_on_expiry_through_redis_is_marked_as_such(
    redis_url: str, namespace: str, on_expiry: OnExpiry, ok: bool, data: Any
) -> None:
    request = booking(on_expiry)
    async with (
        holder(redis_url, namespace) as responder,
        connected(redis_url, namespace) as broker,
        broker.events() as events,
    ):
        waiting = asyncio.create_task(broker.wait_for(request, timeout_s=3))
        assert await held(responder) == request.id
        answer = await asyncio.wait_for(waiting, 10)
        event = await expired_event(events, request.id)
        [record] = await broker.audit(request_id=request.id)
    assert (answer.ok, answer.data, answer.reason, answer.defaulted) == (ok, data, "expired", True)
    assert answer.responder is None and answer.person is None  # nobody's answer
    assert event.answer is not None and event.answer.defaulted and event.answer.ok == ok
    assert (record.status, record.ok, record.reason, record.defaulted) == (
        "expired", ok, "expired", True,
    )  # fmt: skip
    assert record.responder is None and record.person is None


@pytest.mark.redis
async def test_a_responder_applies_the_default_when_the_waiter_is_gone(
    redis_url: str, namespace: str, agents: AgentFactory
) -> None:
    """A durable request past its deadline with no process waiting: the responder's sweep
    applies the default, a late answer is refused, and the next wait gets the default."""
    request = booking(OnExpiry(ok=True), durable=True)
    async with holder(redis_url, namespace) as responder, connected(redis_url, namespace) as b:
        agent = await agents(request, timeout_s=2, **DEAD_AGENT)
        await eventually(lambda: published_at_least(b, 1))
        assert await held(responder) == request.id
        await kill(agent)

        async def expired() -> bool:
            state = b.keys.state(b.keys.durable_waiter(b.settings.agent), request.id)
            return bool(await b.redis.hget(state, "s") == b"expired")

        await eventually(expired)
        with pytest.raises(AlreadyResolved, match="expired"):
            await b.answer(Answer(id=request.id, ok=True, data={"seats": 9}))
        answer = await asyncio.wait_for(b.wait_for(request), 5)

        async def recorded() -> bool:  # by the responder, which sends it with its next writes
            return bool(await b.audit(request_id=request.id))

        await eventually(recorded)
        records = await b.audit(request_id=request.id)
        assert await published(b) == 1
    assert (answer.ok, answer.data, answer.reason, answer.defaulted) == (
        True, {"seats": 2, "terrace": False}, "expired", True,
    )  # fmt: skip
    [first] = records  # by the responder; the wait that attached afterwards writes none (S8)
    assert (first.status, first.defaulted, first.durable) == ("expired", True, True)


@pytest.mark.redis
@pytest.mark.slow
async def test_toolnexus_ask_on_expiry(redis_url: str, namespace: str) -> None:
    accepted, declined = await asyncio.gather(
        run("ask", "Deploy?", "--timeout", "1s", "--on-expiry", "accept",
            *broker_args(redis_url, namespace)),
        run("ask", "Deploy?", "--timeout", "1s", "--on-expiry", "decline", "--json",
            *broker_args(redis_url, namespace)),
    )  # fmt: skip
    assert accepted.returncode == 0, accepted.stderr
    assert accepted.stderr.rstrip().endswith(" expired: accepted by default")
    assert declined.returncode == 1, declined.stderr
    assert '"defaulted": true' in declined.stdout


# -- both brokers ---------------------------------------------------------------------------


@pytest.mark.parametrize("broker", ["memory", "redis"], indirect=True)
async def test_the_default_on_expiry_on_both_brokers(broker: Broker) -> None:
    answer = await broker.wait_for(booking(OnExpiry(ok=True)), timeout_s=0.3)
    plain = await broker.wait_for(booking(None), timeout_s=0.3)
    assert (answer.ok, answer.data, answer.defaulted) == (
        True,
        {"seats": 2, "terrace": False},
        True,
    )
    assert (plain.ok, plain.reason, plain.defaulted) == (False, "expired", False)
    async with asyncio.timeout(5):  # audit records are written in the background
        while len(records := {r.id: r for r in await broker.audit()}) < 2:
            await asyncio.sleep(0.02)
    assert records[answer.id].defaulted and not records[plain.id].defaulted


@pytest.mark.parametrize("broker", ["memory", "redis"], indirect=True)
async def test_defaults_that_fail_the_form_are_refused_before_publishing(broker: Broker) -> None:
    strict = {"type": "object", "properties": {"why": {"type": "string"}}, "required": ["why"]}
    request = Request(
        id=new_id(), kind="input", prompt="Why?", data={"schema": strict},
        on_expiry=OnExpiry(ok=True),
    )  # fmt: skip
    with pytest.raises(InvalidRequest, match="default on expiry fails: field 'why' is required"):
        await broker.wait_for(request, timeout_s=5)
    with pytest.raises(InvalidRequest, match="seats"):
        await broker.wait_for(booking(OnExpiry(ok=True, data={"seats": 0})), timeout_s=5)
    with pytest.raises(toolnexus.errors.UnknownRequest):
        await broker.answer(Answer(id=request.id, ok=True, data={"why": "x"}))


@pytest.mark.parametrize("broker", ["memory", "redis"], indirect=True)
async def test_a_responder_cannot_pass_an_answer_off_as_a_default(broker: Broker) -> None:
    request = booking(OnExpiry(ok=True))
    async with broker.responder("ops") as shown:
        waiting = asyncio.create_task(broker.wait_for(request, timeout_s=10))
        pending = await asyncio.wait_for(anext(shown), 10)
        with pytest.raises(InvalidAnswer, match="defaulted"):
            await pending.answer(Answer(id=request.id, ok=True, data={"seats": 3}, defaulted=True))
        with pytest.raises(InvalidAnswer, match="the broker's to give"):
            await pending.answer(Answer(id=request.id, ok=True, reason="expired"))
        await pending.accept({"seats": 3}, person="ops:alice")
        answer = await asyncio.wait_for(waiting, 10)
    assert (answer.ok, answer.data["seats"], answer.defaulted) == (True, 3, False)


def test_a_defaulted_accept_is_an_mcp_accept_with_its_data() -> None:
    answer = expired_answer(booking(OnExpiry(ok=True)))
    result = answer_to_elicit_result(answer)
    assert (result.action, result.content) == ("accept", {"seats": 2, "terrace": False})
    declined = expired_answer(booking(OnExpiry(ok=False)))
    assert answer_to_elicit_result(declined).action == "decline"
    assert answer_to_elicit_result(expired_answer(booking(None))).action == "cancel"


def test_workers_status_and_audit_show_a_default_and_a_durable_request_as_such() -> None:
    request = booking(OnExpiry(ok=True), durable=True)
    lines = header(request)
    assert "If nobody answers in time, it is accepted by default." in lines
    assert "Durable: it stays open while the agent restarts." in lines
    assert standing_notes(booking(None)) == []
    defaulted = expired_answer(request)
    event = ExpiredEvent(id=request.id, answer=defaulted)
    assert gone_note(event) == "Expired: nobody answered in time; accepted by default."
    plain = ExpiredEvent(id=request.id, answer=expired_answer(booking(None)))
    assert gone_note(plain) == "Expired: nobody answered in time."
    line = audit_text(audit_record(request, "expired", defaulted, verified=None))
    assert " expired (accepted by default) by - " in line and " durably " in line


@pytest.mark.redis
async def test_status_counts_open_durable_requests(redis_url: str, namespace: str) -> None:
    request = booking(None, durable=True)
    async with connected(redis_url, namespace) as broker:
        waiting = asyncio.create_task(broker.wait_for(request, timeout_s=30))
        await eventually(lambda: published_at_least(broker, 1))
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        status = await read_status(redis_url, namespace, ["default"])
        await broker.answer(Answer(id=request.id, ok=True, data={"seats": 3}))
        after = await read_status(redis_url, namespace, ["default"])
    assert status.queues[0].durable_open == 1 and after.queues[0].durable_open == 0
    assert "1 durable open" in status_text(status)
