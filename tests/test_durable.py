"""SPEC §14 durable waits: an agent process killed while waiting durably, restarted, gets
the answer given while it was down; a non-durable one in the same situation is withdrawn;
attaching processes never publish twice; the attached wait checks the stored answer."""

from __future__ import annotations

import asyncio
import fnmatch
import functools
import shlex
import signal
import time
from pathlib import Path
from typing import Any

import pytest

import toolnexus
from conftest import FAST, Fleet
from helpers import eventually
from test_cli_ops import TOOLNEXUS, _env, broker_args, connected, run
from test_forgery import assert_refusal_audited, decline_genuinely, forged, still_waiting
from toolnexus import AlreadyResolved, Answer, Broker, InvalidRequest, Request, new_id, question
from toolnexus.redis_broker import RedisBroker
from waiting_agents import Agent, AgentFactory

pytestmark = pytest.mark.redis

DEAD_AGENT = {"liveness_ms": 1000}
"""Agents whose liveness mark lapses a second after they die."""


def durable_request(prompt: str = "Deploy build 42 to production?", **fields: Any) -> Request:
    return Request(id=new_id(), kind="approval", prompt=prompt, durable=True, **fields)


def durable_state(broker: RedisBroker, request_id: str) -> str:
    return broker.keys.state(broker.keys.durable_waiter(broker.settings.agent), request_id)


async def published(broker: RedisBroker) -> int:
    """How many requests were ever added to the queue's request stream."""
    if not await broker.redis.exists(broker.keys.requests):
        return 0
    info: dict[Any, Any] = await broker.redis.xinfo_stream(broker.keys.requests)
    return int(info["entries-added"])


async def kill(agent: Agent) -> None:
    agent.process.send_signal(signal.SIGKILL)
    await agent.process.wait()


async def killed_while_waiting(broker: RedisBroker, agents: AgentFactory, request: Request) -> None:
    """Start an agent waiting for ``request``; kill it once its request is published."""
    agent = await agents(request, **DEAD_AGENT)
    await eventually(lambda: published_at_least(broker, 1))
    await kill(agent)


async def published_at_least(broker: RedisBroker, count: int) -> bool:
    return await published(broker) >= count


# -- the done-when scenarios ------------------------------------------------------------------


async def test_a_durable_agent_killed_and_restarted_gets_the_answer_given_meanwhile(
    redis_url: str, namespace: str, agents: AgentFactory
) -> None:
    request = durable_request()
    async with connected(redis_url, namespace) as broker:
        first = await agents(request, **DEAD_AGENT)
        async with broker.responder("ops") as shown:
            pending = await asyncio.wait_for(anext(shown), 20)
            await kill(first)
            # Past the dead agent's liveness, with this responder sweeping every 0.2 s: a
            # durable request is never withdrawn for its waiter's death.
            await asyncio.sleep(2.0)
            await pending.accept(person="ops:alice")
        second = await agents(request, **DEAD_AGENT)
        started = time.monotonic()
        answer = await second.answer(timeout_s=20)
        took_s = time.monotonic() - started
        assert await published(broker) == 1  # the restarted agent published nothing
        records = await broker.audit(request_id=request.id)
    assert (answer.ok, answer.person, answer.reason) == (True, "ops:alice", None)
    assert took_s < 10, took_s  # a process start, then the stored answer at once
    assert [(r.status, r.durable, r.person) for r in records] == [("answered", True, "ops:alice")]


async def test_a_non_durable_agent_killed_while_waiting_is_withdrawn(
    redis_url: str, namespace: str, agents: AgentFactory
) -> None:
    request = Request(id=new_id(), kind="approval", prompt="Deploy build 42 to production?")
    async with connected(redis_url, namespace) as broker:
        first = await agents(request, **DEAD_AGENT)
        async with broker.responder("ops") as shown:
            pending = await asyncio.wait_for(anext(shown), 20)
            await kill(first)
            await asyncio.sleep(2.0)  # its liveness mark lapses; a sweep withdraws it
            with pytest.raises(AlreadyResolved) as refused:
                await pending.accept(person="ops:alice")
        assert refused.value.reason == "withdrawn"
        with pytest.raises(AlreadyResolved, match="withdrawn"):
            await broker.answer(Answer(id=request.id, ok=True))
        [record] = await broker.audit(request_id=request.id)
    assert (record.status, record.durable) == ("withdrawn", False)


def documented_commands() -> list[list[str]]:
    """The commands of the manual's durable-wait example, as argument lists."""
    page = (Path(__file__).parents[1] / "docs" / "how-to" / "beyond.md").read_text()
    section = page.split("## Defaults on expiry and durable waits\n", 1)[1]
    block = section.split("```sh\n", 1)[1].split("```", 1)[0]
    return [shlex.split(line)[1:] for line in block.splitlines() if not line.startswith("#")]


@pytest.mark.slow
async def test_the_documented_toolnexus_ask_durable_killed_answered_and_asked_again(
    redis_url: str, namespace: str
) -> None:
    ask, answer, ask_again = documented_commands()
    assert ask == ask_again and "--durable" in ask
    where = broker_args(redis_url, namespace)
    async with connected(redis_url, namespace) as broker:
        process = await asyncio.create_subprocess_exec(
            TOOLNEXUS, *ask, *where, env=_env(),
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        await eventually(lambda: published_at_least(broker, 1))
        process.send_signal(signal.SIGKILL)
        await process.wait()
        answered = await run(*answer, *where)
        again = await run(*ask_again, *where, "--json")
        assert await published(broker) == 1
    # nobody waits for it while the job is down: stored, not confirmed (toolnexus.exits)
    assert answered.returncode == 4, answered.stderr
    assert "deploy-42: sent, not confirmed" in answered.stderr
    assert again.returncode == 0, again.stderr
    assert "waiting durably for an answer to deploy-42" in again.stderr
    assert '"ok": true' in again.stdout


async def test_processes_attaching_at_once_publish_the_request_once(
    redis_url: str, namespace: str
) -> None:
    request = durable_request()
    brokers = [toolnexus.connect(redis_url, namespace=namespace, **FAST) for _ in range(5)]
    try:
        waits = [asyncio.create_task(b.wait_for(request, timeout_s=30)) for b in brokers]
        redis_brokers = [b for b in brokers if isinstance(b, RedisBroker)]
        first = redis_brokers[0]
        await eventually(lambda: published_at_least(first, 1))
        await asyncio.sleep(0.5)  # every attach has had time to publish
        assert await published(first) == 1
        assert all(b.statistics()["waiting_durably"] == 1 for b in redis_brokers)
        await first.answer(Answer(id=request.id, ok=True, person="ops:alice"))
        answers = await asyncio.wait_for(asyncio.gather(*waits), 10)
    finally:
        for b in brokers:
            await b.aclose()
    assert {(a.ok, a.person) for a in answers} == {(True, "ops:alice")}


async def test_attaching_to_an_open_request_waits_on_and_keeps_its_deadline(
    redis_url: str, namespace: str, agents: AgentFactory
) -> None:
    request = durable_request()
    async with connected(redis_url, namespace) as broker:
        started = time.time()
        await killed_while_waiting(broker, agents, request)
        stored: Any = await broker.redis.hget(durable_state(broker, request.id), "x")
        deadline = float(stored) / 1000
        attached = asyncio.create_task(broker.wait_for(request, timeout_s=600))
        await still_waiting(attached, 1.0)
        assert await published(broker) == 1
        async with broker.responder("ops") as shown:
            pending = await asyncio.wait_for(anext(shown), 20)
            await pending.decline(person="ops:bob")
        answer = await asyncio.wait_for(attached, 10)
    assert (answer.ok, answer.reason, answer.person) == (False, "declined", "ops:bob")
    assert started + 100 < deadline < started + 130  # the first agent's (120 s), not 600 s


async def test_an_attached_wait_ends_at_the_stored_deadline(
    redis_url: str, namespace: str, agents: AgentFactory
) -> None:
    request = durable_request()
    async with connected(redis_url, namespace) as broker:
        agent = await agents(request, timeout_s=3, **DEAD_AGENT)
        await eventually(lambda: published_at_least(broker, 1))
        await kill(agent)
        started = time.monotonic()
        answer = await asyncio.wait_for(broker.wait_for(request, timeout_s=600), 15)
        took_s = time.monotonic() - started
    assert (answer.ok, answer.reason, answer.defaulted) == (False, "expired", False)
    assert took_s < 4, took_s


async def test_closing_the_broker_leaves_a_durable_request_open(
    redis_url: str, namespace: str
) -> None:
    request = durable_request()
    async with connected(redis_url, namespace) as first:
        waiting = asyncio.create_task(first.wait_for(request, timeout_s=30))
        await eventually(lambda: published_at_least(first, 1))
    with pytest.raises(toolnexus.errors.BrokerClosed):
        await waiting
    async with connected(redis_url, namespace) as second:
        await second.answer(Answer(id=request.id, ok=True, person="ops:carol"))
        answer = await asyncio.wait_for(second.wait_for(request), 5)
    assert (answer.ok, answer.person) == (True, "ops:carol")


async def test_an_attach_that_asks_something_else_is_refused(
    redis_url: str, namespace: str
) -> None:
    request = durable_request()
    async with connected(redis_url, namespace) as broker:
        waiting = asyncio.create_task(broker.wait_for(request, timeout_s=30))
        await eventually(lambda: published_at_least(broker, 1))
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        other = Request(id=request.id, kind="approval", prompt="Drop the database?", durable=True)
        with pytest.raises(InvalidRequest, match=r"asks something else \(prompt differ"):
            await broker.wait_for(other)
        assert await published(broker) == 1


# -- both brokers ---------------------------------------------------------------------------


@pytest.mark.parametrize("broker", ["memory", "redis"], indirect=True)
async def test_a_cancelled_durable_wait_is_not_withdrawn_and_waiting_again_attaches(
    broker: Broker,
) -> None:
    request = Request(id=new_id(), kind="approval", prompt="Deploy?")
    async with broker.responder("ops") as shown:
        waiting = asyncio.create_task(broker.wait_for(request, timeout_s=30, durable=True))
        pending = await asyncio.wait_for(anext(shown), 10)
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        assert pending.request.durable
        await pending.accept(person="ops:alice")  # not withdrawn
    answer = await asyncio.wait_for(broker.wait_for(request, durable=True), 5)
    again = await asyncio.wait_for(broker.wait_for(request, durable=True), 5)
    assert (answer.ok, answer.person) == (True, "ops:alice")
    assert (again.ok, again.person) == (True, "ops:alice")
    with pytest.raises(AlreadyResolved):
        await broker.answer(Answer(id=request.id, ok=False, reason="declined"))


@pytest.mark.parametrize("broker", ["memory", "redis"], indirect=True)
async def test_a_durable_question_asked_again_gets_the_answer(broker: Broker) -> None:
    request_id = new_id("qst")

    async def ask() -> Any:
        return await question(
            "Which region?", options=["eu", "us"], wait_for=broker.wait_for,
            durable=True, request_id=request_id, timeout_s=30,
        )  # fmt: skip

    async with broker.responder("ops") as shown:
        asking = asyncio.create_task(ask())
        pending = await asyncio.wait_for(anext(shown), 10)
        asking.cancel()
        await asyncio.gather(asking, return_exceptions=True)
        await pending.accept({"answer": "eu"})
    result = await asyncio.wait_for(ask(), 5)
    assert (result.ok, result.answer) == (True, "eu")


# -- signatures -----------------------------------------------------------------------------


async def test_an_attached_wait_verifies_the_stored_answer(fleet: Fleet) -> None:
    async with fleet.agent() as agent, fleet.responder() as bot:
        genuine, forgery = durable_request(), durable_request("Drop table users?")
        for count, request in enumerate((genuine, forgery), 1):
            waiting = asyncio.create_task(agent.wait_for(request, timeout_s=30))
            await eventually(functools.partial(published_at_least, agent, count))
            waiting.cancel()  # not withdrawn: nobody waits for it now
            await asyncio.gather(waiting, return_exceptions=True)
        # A genuine answer given while nobody waits is taken at once, verified.
        await decline_genuinely(bot, genuine.id)
        answer = await asyncio.wait_for(agent.wait_for(genuine), 5)
        assert (answer.reason, answer.responder, answer.person) == (
            "declined", "ops-bot", "web:alice",
        )  # fmt: skip
        [record] = await agent.audit(request_id=genuine.id)
        assert (record.verified, record.durable) == (True, True)
        # A forged answer in the state is refused, and the genuine one afterwards wins.
        state = durable_state(agent, forgery.id)
        await agent.redis.hset(state, mapping={"s": "answered", "a": forged(agent, forgery.id)})
        attached = asyncio.create_task(agent.wait_for(forgery, timeout_s=30))
        await still_waiting(attached)
        await decline_genuinely(bot, forgery.id)
        answer = await asyncio.wait_for(attached, 20)
        assert (answer.reason, answer.responder) == ("declined", "ops-bot")
        await assert_refusal_audited(agent, forgery.id, "missing signature")


def test_the_durable_waiter_id_is_a_waiter_id_of_its_own_per_queue_and_agent() -> None:
    from toolnexus.keys import WAITER_ID, Keys

    ids = {Keys("ns", q).durable_waiter(a) for q in ("a", "b") for a in ("bob", "eve")}
    ids |= {Keys("ns2", "a").durable_waiter("bob")}
    assert len(ids) == 5 and all(WAITER_ID.fullmatch(i) for i in ids)
    assert Keys("ns", "a").durable_waiter("bob") == Keys("ns", "a").durable_waiter("bob")
    assert Keys("ns", "a").durable_waiter("bob").startswith("bob.")
    # ops counts every agent's durable requests of a queue, and nothing else
    keys = Keys("ns", "a")
    assert keys.is_durable_state(keys.state(keys.durable_waiter("eve"), "elc-1"))
    assert not keys.is_durable_state(keys.state("eve.0123456789abcdef", "elc-1"))
    assert not keys.is_durable_state(
        Keys("ns", "b").state(Keys("ns", "b").durable_waiter("eve"), "x")
    )
    crafted = keys.state("eve.0123456789abcdef", f"x.{keys.durable_waiter('eve')[4:]}}}:r:y")
    assert fnmatch.fnmatchcase(crafted, keys.durable_states_pattern())  # SCAN finds it
    assert not keys.is_durable_state(crafted)
