"""Escalation (SPEC §14): a request unanswered after a hop's time moves on to further queues.

The end-to-end tests run responders in processes of their own, one per queue, on real
Redis: the first queue's holds every request and never answers, the next one answers.
"""

from __future__ import annotations

import asyncio
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import redis.asyncio as aioredis

import toolnexus
from conftest import FAST
from helpers import eventually
from mcp_processes import responder_process
from toolnexus import InvalidRequest, Request, question, question_tool
from toolnexus._broker import deadline_of
from toolnexus._hops import hops
from toolnexus._memory import MemoryBroker
from toolnexus.cli._ops import read_status, status_text
from toolnexus.keys import Keys
from toolnexus.models import Hop
from toolnexus.redis_broker import RedisBroker
from toolnexus.security import AuditRecord
from waiting_agents import AgentFactory

if TYPE_CHECKING:
    from redis_topologies import LocalCluster

ORIGIN, ONCALL, MANAGERS = "desk", "oncall", "managers"
PROMPT = "Deploy to production?"
HOLD = {PROMPT: "hold"}
ACCEPT = {PROMPT: {"accept": {"answer": "yes"}}}


def request(*hop: tuple[float, str], **fields: Any) -> Request:
    return Request(
        id=toolnexus.new_id(), kind="approval", prompt=PROMPT, escalate=hops(hop), **fields
    )


async def entries(redis_url: str, namespace: str, queue: str) -> int:
    client = aioredis.Redis.from_url(redis_url)
    try:
        return int(await client.xlen(Keys(namespace, queue).requests))
    finally:
        await client.aclose()


async def eventually_empty(redis_url: str, namespace: str, queue: str) -> None:
    async with asyncio.timeout(5):
        while await entries(redis_url, namespace, queue):
            await asyncio.sleep(0.05)


async def record_of(broker: toolnexus.Broker, request_id: str) -> AuditRecord:
    """The audit record of ``request_id``, once written (the waiter writes it in the
    background)."""
    async with asyncio.timeout(5):
        while not (records := await broker.audit(request_id=request_id)):
            await asyncio.sleep(0.05)
    (record,) = records
    return record


@pytest.mark.slow
async def test_an_escalation_whose_first_queue_never_answers_and_whose_second_does(
    redis_url: str, namespace: str
) -> None:
    with (
        responder_process(redis_url, namespace, HOLD, ORIGIN) as desk,
        responder_process(redis_url, namespace, ACCEPT, ONCALL) as oncall,
    ):
        async with toolnexus.connect(redis_url, namespace=namespace, queue=ORIGIN, **FAST) as b:
            started = time.monotonic()
            result = await question(
                PROMPT, wait_for=b.wait_for, escalate=[(0.8, ONCALL)], timeout_s=20
            )
            took = time.monotonic() - started
            assert result.ok and result.answer == "yes"
            assert took >= 0.8  # nobody answered before the hop
            seen = desk.by_prompt(PROMPT)
            assert oncall.by_prompt(PROMPT)["id"] == seen["id"]  # the same request

            def events(kind: str) -> list[dict[str, Any]]:
                return [e for e in desk.events if e["id"] == seen["id"] and e["event"] == kind]

            await eventually(lambda: bool(events("answered")), "the desk told it was answered")
            assert events("escalated") == [
                {"event": "escalated", "id": seen["id"], "queue": ONCALL}
            ]
            assert desk.events.index(events("escalated")[0]) < desk.events.index(
                events("answered")[0]
            )
            for queue in (ORIGIN, ONCALL):  # settled on every queue it reached
                await eventually_empty(redis_url, namespace, queue)
            record = await record_of(b, seen["id"])
            assert record.status == "answered" and record.person == "tester"
            assert [hop.queue for hop in record.escalated] == [ONCALL]
            assert 0.8 <= record.escalated[0].after_s < took


async def test_an_escalation_on_a_redis_cluster(
    redis_cluster: LocalCluster, namespace: str
) -> None:
    """The hop's publish, its record in the state and the settling touch other slots."""
    url = redis_cluster.url
    async with (
        toolnexus.connect(url, namespace=namespace, queue=ORIGIN, **FAST) as desk,
        toolnexus.connect(url, namespace=namespace, queue=ONCALL, **FAST) as oncall,
        desk.responder("web") as held,
        oncall.responder("pager") as pager,
        desk.events() as desk_events,
    ):
        asked = request((0.3, ONCALL))
        waiting = asyncio.create_task(desk.wait_for(asked, timeout_s=30))
        assert (await anext(held)).request.id == asked.id  # shown on the desk, never answered
        pending = await anext(pager)
        escalated = await anext(desk_events)
        assert (escalated.event, escalated.queue) == ("escalated", ONCALL)
        await pending.accept(person="pager:ada")
        assert (await waiting).person == "pager:ada"
        answered = await anext(desk_events)
        assert (answered.event, answered.id) == ("answered", asked.id)
        for broker in (desk, oncall):
            assert isinstance(broker, RedisBroker)
            async with asyncio.timeout(5):
                while await broker.redis.xlen(broker.keys.requests):
                    await asyncio.sleep(0.05)
        record = await record_of(desk, asked.id)
        assert [hop.queue for hop in record.escalated] == [ONCALL]


@pytest.mark.slow
async def test_a_request_answered_before_its_hop_never_reaches_the_next_queue(
    redis_url: str, namespace: str
) -> None:
    with responder_process(redis_url, namespace, ACCEPT, ORIGIN) as desk:
        async with toolnexus.connect(redis_url, namespace=namespace, queue=ORIGIN, **FAST) as b:
            answered = await b.wait_for(request((1.0, ONCALL)), timeout_s=20)
            assert answered.ok
            await asyncio.sleep(1.3)  # past the hop's time
            assert await entries(redis_url, namespace, ONCALL) == 0
            client = aioredis.Redis.from_url(redis_url)
            try:
                assert not await client.exists(Keys(namespace, ONCALL).events)
            finally:
                await client.aclose()
            assert not [e for e in desk.events if e["event"] == "escalated"]
            record = await record_of(b, answered.id)
            assert record.escalated == []


@pytest.mark.slow
async def test_two_hops_are_taken_in_turn_and_shown_to_the_queues_before(
    redis_url: str, namespace: str
) -> None:
    with (
        responder_process(redis_url, namespace, HOLD, ORIGIN) as desk,
        responder_process(redis_url, namespace, HOLD, ONCALL) as oncall,
        responder_process(redis_url, namespace, ACCEPT, MANAGERS) as managers,
    ):
        async with toolnexus.connect(redis_url, namespace=namespace, queue=ORIGIN, **FAST) as b:
            answer = await b.wait_for(request((0.4, ONCALL), (0.9, MANAGERS)), timeout_s=20)
            assert answer.ok and (answer.responder or "").startswith("process-responder/")
            assert managers.by_prompt(PROMPT)["id"] == answer.id

            def told(responder: Any, kind: str) -> list[str | None]:
                return [e["queue"] for e in responder.events if e["event"] == kind]

            await eventually(
                lambda: bool(told(desk, "answered") and told(oncall, "answered")),
                "every queue told it was answered",
            )
            assert told(desk, "escalated") == [ONCALL, MANAGERS]
            assert told(oncall, "escalated") == [MANAGERS]
            record = await record_of(b, answer.id)
            assert [hop.queue for hop in record.escalated] == [ONCALL, MANAGERS]
            for queue in (ORIGIN, ONCALL, MANAGERS):
                async with asyncio.timeout(5):
                    while await entries(redis_url, namespace, queue):
                        await asyncio.sleep(0.05)


@pytest.mark.slow
async def test_a_withdrawn_escalated_request_is_withdrawn_on_every_queue(
    redis_url: str, namespace: str
) -> None:
    with (
        responder_process(redis_url, namespace, HOLD, ORIGIN) as desk,
        responder_process(redis_url, namespace, HOLD, ONCALL) as oncall,
    ):
        async with toolnexus.connect(redis_url, namespace=namespace, queue=ORIGIN, **FAST) as b:
            asked = request((0.3, ONCALL))
            waiting = asyncio.create_task(b.wait_for(asked, timeout_s=20))
            await eventually(lambda: bool(oncall.seen), "the request reached oncall")
            status = await read_status(redis_url, namespace, [ORIGIN, ONCALL])
            assert [q.escalated for q in status.queues] == [1, 1]
            (shown,) = status.queues[1].escalations
            assert shown.id == asked.id and shown.queues == [ORIGIN, ONCALL]
            lines = status_text(status).splitlines()
            assert lines[1].startswith(f"queue {ORIGIN}: 1 open (oldest ")
            assert lines[1].endswith("), 1 escalated, 0 dead letters")
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
            for responder in (desk, oncall):
                await eventually(
                    lambda r=responder: any(e["event"] == "withdrawn" for e in r.events),  # type: ignore[misc]
                    "told it was withdrawn",
                )
            for queue in (ORIGIN, ONCALL):
                async with asyncio.timeout(5):
                    while await entries(redis_url, namespace, queue):
                        await asyncio.sleep(0.05)


async def test_a_dead_waiters_escalated_request_is_withdrawn_on_every_queue(
    redis_url: str, namespace: str, agents: AgentFactory
) -> None:
    with (
        responder_process(redis_url, namespace, HOLD) as desk,
        responder_process(redis_url, namespace, HOLD, ONCALL) as oncall,
    ):
        agent = await agents(request((0.3, ONCALL)), timeout_s=60)
        await eventually(lambda: bool(oncall.seen), "the request reached oncall")
        agent.process.kill()  # its liveness mark lapses (15 s): a responder withdraws it
        await agent.process.wait()
        for responder in (desk, oncall):
            await eventually(
                lambda r=responder: any(e["event"] == "withdrawn" for e in r.events),  # type: ignore[misc]
                "told it was withdrawn",
                timeout_s=40,
            )
        for queue in ("default", ONCALL):
            async with asyncio.timeout(5):
                while await entries(redis_url, namespace, queue):
                    await asyncio.sleep(0.05)


@pytest.mark.parametrize("backend", ["memory", "redis"])
async def test_without_a_timeout_the_wait_ends_a_default_timeout_after_the_last_hop(
    backend: str, redis_url: str, namespace: str
) -> None:
    url = "memory://" if backend == "memory" else redis_url
    options = {"namespace": namespace, "queue": ORIGIN, "default_timeout_s": 0.5}
    if backend == "redis":
        options.update(FAST)
    async with toolnexus.connect(url, **options) as b:
        asked = request((0.4, ONCALL))
        assert deadline_of(asked, None, 0.5) == pytest.approx(asked.created_at + 0.9)
        assert deadline_of(asked, 3.0, 0.5) == pytest.approx(time.time() + 3.0, abs=0.1)
        answer = await b.wait_for(asked)
        took = time.time() - asked.created_at
        assert answer.reason == "expired"
        assert 0.85 <= took < 3.0
        record = await record_of(b, asked.id)
        assert [hop.queue for hop in record.escalated] == [ONCALL]


async def test_the_memory_broker_records_each_hop_and_says_so(namespace: str) -> None:
    async with MemoryBroker() as b, b.events() as events, b.responder("web") as requests:
        asked = request((0.2, ONCALL), (0.4, MANAGERS))
        waiting = asyncio.create_task(b.wait_for(asked, timeout_s=10))
        pending = await anext(requests)
        seen = [await anext(events), await anext(events)]
        assert [(e.event, e.id, e.queue) for e in seen] == [
            ("escalated", asked.id, ONCALL),
            ("escalated", asked.id, MANAGERS),
        ]
        await pending.accept(person="boss")
        assert (await waiting).ok
        record = await record_of(b, asked.id)
        assert [hop.queue for hop in record.escalated] == [ONCALL, MANAGERS]
        assert record.escalated[0].after_s >= 0.2


BAD: list[tuple[list[Hop], float | None, str]] = [
    ([Hop(1.0, ONCALL), Hop(0.5, MANAGERS)], None, "hop 2 .*increasing order"),
    ([Hop(1.0, ONCALL), Hop(1.0, MANAGERS)], None, "hop 2 .*increasing order"),
    ([Hop(0.0, ONCALL)], None, "hop 1 .*positive"),
    ([Hop(-5.0, ONCALL)], None, "hop 1 .*positive"),
    ([Hop(math.nan, ONCALL)], None, "hop 1 .*positive"),
    ([Hop(1.0, "on:call")], None, "hop 1 .*queue name must be non-empty without braces"),
    ([Hop(1.0, "")], None, "hop 1 .*queue name must be non-empty"),
    ([Hop(1.0, ONCALL), Hop(2.0, ONCALL)], None, "hop 2 .*reaches queue 'oncall' already"),
    ([Hop(5.0, ONCALL)], 5.0, "hop 1 .*at or past the request's deadline"),
    ([Hop(1.0, ONCALL), Hop(9.0, MANAGERS)], 5.0, "hop 2 .*past the request's deadline"),
]


@pytest.mark.parametrize("backend", ["memory", "redis"])
@pytest.mark.parametrize(("escalate", "expires_after_s", "match"), BAD)
async def test_an_escalation_that_cannot_be_followed_is_refused(
    backend: str,
    redis_url: str,
    namespace: str,
    escalate: list[Hop],
    expires_after_s: float | None,
    match: str,
) -> None:
    url, options = ("memory://", {}) if backend == "memory" else (redis_url, FAST)
    async with toolnexus.connect(url, namespace=namespace, queue=ORIGIN, **options) as b:
        asked = Request(id=toolnexus.new_id(), kind="approval", escalate=escalate)
        if expires_after_s is not None:
            asked.expires_at = asked.created_at + expires_after_s
        with pytest.raises(InvalidRequest, match=match):
            await b.wait_for(asked)


async def test_the_origin_queue_is_no_hop(redis_url: str, namespace: str) -> None:
    async with toolnexus.connect(redis_url, namespace=namespace, queue=ORIGIN, **FAST) as b:
        with pytest.raises(InvalidRequest, match=r"hop 1 .*reaches queue 'desk' already"):
            await b.wait_for(request((1.0, ORIGIN)), timeout_s=5)


def test_hops_are_given_in_seconds_or_as_durations() -> None:
    assert hops([("15m", ONCALL), (3600, MANAGERS), Hop(7200.0, "it")]) == [
        Hop(900.0, ONCALL),
        Hop(3600.0, MANAGERS),
        Hop(7200.0, "it"),
    ]
    with pytest.raises(InvalidRequest, match="hop 1: 'soon' is not a positive duration"):
        hops([("soon", ONCALL)])
    with pytest.raises(InvalidRequest, match=r"hop 2 must be \(after, queue\)"):
        hops([("1m", ONCALL), ("2m",)])  # type: ignore[list-item]


async def test_a_question_takes_its_escalation_from_the_caller() -> None:
    asked: list[Request] = []

    async def wait_for(request: Request) -> toolnexus.Answer:
        asked.append(request)
        return toolnexus.Answer(id=request.id, ok=True, data={"answer": "ok"})

    await question("Ship it?", wait_for=wait_for, escalate=[("15m", ONCALL), ("1h", MANAGERS)])
    assert asked[0].escalate == [Hop(900.0, ONCALL), Hop(3600.0, MANAGERS)]
    with pytest.raises(InvalidRequest, match="not a positive duration"):
        await question("Ship it?", wait_for=wait_for, escalate=[("-1m", ONCALL)])
    tool = question_tool(wait_for, escalate=[("30m", ONCALL)])
    assert await tool("Ship it now?") == {"ok": True, "answer": "ok"}
    assert asked[-1].escalate == [Hop(1800.0, ONCALL)]
    with pytest.raises(InvalidRequest, match="hop 1 must be"):
        question_tool(wait_for, escalate=[ONCALL])  # type: ignore[list-item]


@pytest.mark.slow
def test_the_escalation_example_runs(redis_url: str, namespace: str) -> None:
    page = (Path(__file__).parents[1] / "docs" / "how-to" / "beyond.md").read_text()
    section = page.split("## Escalation\n", 1)[1]
    example = section.split("```python\n", 1)[1].split("```", 1)[0]
    example = example.replace(
        "toolnexus.connect(url, ", f"toolnexus.connect(url, namespace={namespace!r}, "
    )
    assert example.count(namespace) == 2
    done = subprocess.run(
        [sys.executable, "-c", example], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "yes\n"


@pytest.mark.slow
async def test_a_durable_escalation_is_published_once_per_queue_across_attaches(
    redis_url: str, namespace: str
) -> None:
    """A durable request's hops go on after a wait attaches to it again; each queue gets it
    once (its route there says it was published), and its answer reaches the new wait."""
    async with (
        toolnexus.connect(redis_url, namespace=namespace, queue=ORIGIN, **FAST) as desk,
        toolnexus.connect(redis_url, namespace=namespace, queue=ONCALL, **FAST) as oncall,
    ):
        asked = request((0.3, ONCALL), durable=True)
        for _ in range(2):  # waits that end (a deploy) before and after the hop
            waiting = asyncio.create_task(desk.wait_for(asked, timeout_s=30))
            await asyncio.sleep(0.6)
            waiting.cancel()
            await asyncio.gather(waiting, return_exceptions=True)
        attached = asyncio.create_task(desk.wait_for(asked, timeout_s=30))
        await asyncio.sleep(0.6)
        assert isinstance(oncall, RedisBroker)
        info: Any = await oncall.redis.xinfo_stream(oncall.keys.requests)
        assert info["entries-added"] == 1  # hopped once, whichever wait was on
        async with oncall.responder("pager") as pager:
            pending = await asyncio.wait_for(anext(pager), 10)
            assert pending.request.id == asked.id
            await pending.accept(person="pager:ada")
        answer = await asyncio.wait_for(attached, 10)
        assert (answer.ok, answer.person) == (True, "pager:ada")
        for queue in (ORIGIN, ONCALL):  # settled on both
            await eventually_empty(redis_url, namespace, queue)
        record = await record_of(desk, asked.id)
        assert [hop.queue for hop in record.escalated] == [ONCALL]
