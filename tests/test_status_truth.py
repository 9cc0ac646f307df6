"""Issue 25, observation 3: ``status`` tells the truth. Every path that ends a request
leaves no open entry behind in the request stream (a refused answer followed by the genuine
one left "1 open" for good), and each end is in the audit trail."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from pathlib import Path

import pytest

import toolnexus
from conftest import Fleet
from toolnexus import Answer, Request, new_id
from toolnexus.models import Hop, Quorum
from toolnexus.redis_broker import RedisBroker

pytestmark = pytest.mark.redis

TOOLNEXUS = str(Path(sys.executable).with_name("toolnexus"))
FAST = {"block_ms": 100, "lease_ms": 600}


async def status_json(url: str, namespace: str, *queues: str) -> dict[str, int]:
    """``toolnexus status --json``: open requests per queue."""
    flags = [f for q in queues for f in ("--queue", q)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLNEXUS_")}
    process = await asyncio.create_subprocess_exec(
        TOOLNEXUS, "status", "--json", "--url", url, "--namespace", namespace, *flags,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env,
    )  # fmt: skip
    async with asyncio.timeout(30):
        out, err = await process.communicate()
    assert process.returncode == 0, err.decode()
    return {q["queue"]: q["open_requests"] for q in json.loads(out)["queues"]}


async def nothing_open(url: str, namespace: str, *queues: str) -> dict[str, int]:
    """Open requests per queue once they reach 0 (a resolved entry is deleted after the
    outcome is written, lazily), or as they are after 5 s."""
    loop = asyncio.get_running_loop()
    give_up = loop.time() + 5
    while True:
        counts = await status_json(url, namespace, *queues)
        if not any(counts.values()) or loop.time() > give_up:
            return counts
        await asyncio.sleep(0.2)


async def until_published(broker: RedisBroker, count: int = 1) -> None:
    async with asyncio.timeout(10):
        while await broker.redis.xlen(broker.keys.requests) < count:
            await asyncio.sleep(0.02)


async def test_refused_then_genuine_answer_leaves_nothing_open(fleet: Fleet) -> None:
    """The reported phantom: an unsigned answer the waiter refuses (it opens the request
    again and publishes it anew), then the genuine signed one."""
    request = Request(id=new_id(), kind="approval", prompt="Deploy?")
    async with fleet.agent() as agent:
        waiting = asyncio.create_task(agent.wait_for(request, timeout_s=60))
        await until_published(agent)
        async with toolnexus.connect(fleet.url, namespace="sec", **FAST) as plain:
            await plain.answer(Answer(id=request.id, ok=True))  # unsigned: refused
        async with asyncio.timeout(10):  # opened again and published anew
            while await agent.redis.xlen(agent.keys.requests) < 2:
                await asyncio.sleep(0.02)
        async with fleet.responder() as bot:
            await bot.answer(Answer(id=request.id, ok=True))
        assert (await asyncio.wait_for(waiting, 20)).ok
    assert await nothing_open(fleet.url, "sec", "default") == {"default": 0}


@pytest.mark.slow
async def test_an_escalated_request_answered_leaves_nothing_open(
    redis_url: str, namespace: str
) -> None:
    request = Request(id=new_id(), kind="approval", escalate=[Hop(0.2, "oncall")])
    desk = toolnexus.connect(redis_url, namespace=namespace, queue="desk", **FAST)
    oncall = toolnexus.connect(redis_url, namespace=namespace, queue="oncall", **FAST)
    async with desk, oncall, oncall.responder("pager") as pager:
        waiting = asyncio.create_task(desk.wait_for(request, timeout_s=60))
        pending = await asyncio.wait_for(anext(pager), 20)
        await pending.accept(person="pager:ada")
        assert (await asyncio.wait_for(waiting, 20)).ok
    counts = await nothing_open(redis_url, namespace, "desk", "oncall")
    assert counts == {"desk": 0, "oncall": 0}


@pytest.mark.slow
async def test_a_quorum_reached_leaves_nothing_open(redis_url: str, namespace: str) -> None:
    request = Request(id=new_id(), kind="approval", prompt="Two of you?", quorum=Quorum(2))
    broker = toolnexus.connect(redis_url, namespace=namespace, **FAST)
    async with broker, broker.responder("web") as web, broker.responder("slack") as slack:
        waiting = asyncio.create_task(broker.wait_for(request, timeout_s=60))
        on_web = await asyncio.wait_for(anext(web), 20)
        on_slack = await asyncio.wait_for(anext(slack), 20)
        await on_web.accept(person="alice")
        await on_slack.accept(person="bob")
        assert (await asyncio.wait_for(waiting, 20)).ok
    assert await nothing_open(redis_url, namespace, "default") == {"default": 0}


@pytest.mark.slow
async def test_a_durable_request_answered_leaves_nothing_open(
    redis_url: str, namespace: str
) -> None:
    request = Request(id=new_id(), kind="approval", prompt="Later?", durable=True)
    async with toolnexus.connect(redis_url, namespace=namespace, **FAST) as broker:
        waiting = asyncio.create_task(broker.wait_for(request, timeout_s=60))
        async with broker.responder("web") as web:
            pending = await asyncio.wait_for(anext(web), 20)
            await pending.decline(person="alice")
        assert (await asyncio.wait_for(waiting, 20)).reason == "declined"
    assert await nothing_open(redis_url, namespace, "default") == {"default": 0}


@pytest.mark.slow
async def test_a_withdrawn_request_leaves_nothing_open(redis_url: str, namespace: str) -> None:
    request = Request(id=new_id(), kind="approval", prompt="Never mind?")
    async with toolnexus.connect(redis_url, namespace=namespace, **FAST) as broker:
        assert isinstance(broker, RedisBroker)
        waiting = asyncio.create_task(broker.wait_for(request, timeout_s=60))
        await until_published(broker)
        waiting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await waiting
    assert await nothing_open(redis_url, namespace, "default") == {"default": 0}


@pytest.mark.slow
async def test_an_expired_request_leaves_nothing_open(redis_url: str, namespace: str) -> None:
    request = Request(id=new_id(), kind="approval", prompt="Anyone?")
    async with toolnexus.connect(redis_url, namespace=namespace, **FAST) as broker:
        answer = await broker.wait_for(request, timeout_s=0.5)
    assert answer.reason == "expired"
    assert await nothing_open(redis_url, namespace, "default") == {"default": 0}
