"""SPEC §11 on a real Redis: faults, dead letters, scale, key layout, housekeeping."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import anyio
import msgspec
import pytest
import redis.asyncio as aioredis
import redis.exceptions
from redis.crc import key_slot

import toolnexus
from conftest import FAST, RedisServer
from helpers import ask, opened, published_request
from toolnexus import Answer, Broker, OnExpiry, Pending, Request
from toolnexus.errors import AlreadyResolved, UnknownRequest
from toolnexus.keys import Keys
from toolnexus.redis_broker import RedisBroker
from toolnexus.redis_broker._layout import parse_route

pytestmark = pytest.mark.redis


async def answer_all(broker: RedisBroker, count: int, group: str = "auto") -> None:
    """Accept ``count`` requests, echoing each prompt back as data."""
    async with broker.responder(group) as responder:
        async for pending in responder:
            await pending.accept({"echo": pending.request.prompt})
            count -= 1
            if count == 0:
                return


def test_keys_of_one_atomic_step_share_a_slot_and_waiters_spread() -> None:
    keys = Keys("ns", "orders")
    # The resolve script touches a request's state and its waiter's reply stream.
    for waiter in ("a1", "b2", "c3"):
        assert key_slot(keys.state(waiter, "elc-1").encode()) == key_slot(
            keys.answers(waiter).encode()
        )
    # A queue's streams and routes share a slot (the publish script touches them) ...
    queue_keys = (keys.requests, keys.events, keys.dead, keys.route("elc-1"), keys.route("elc-2"))
    assert len({key_slot(k.encode()) for k in queue_keys}) == 1
    # ... while many waiters and queues spread over many slots.
    assert len({key_slot(keys.answers(f"w{i}").encode()) for i in range(100)}) > 90
    assert key_slot(Keys("ns", "a").requests.encode()) != key_slot(
        Keys("ns", "b").requests.encode()
    )
    with pytest.raises(toolnexus.ConfigurationError, match="queue 'a:b'"):
        Keys("ns", "a:b")


@pytest.mark.slow
async def test_a_killed_consumer_s_request_is_reclaimed_by_another(
    redis_server: RedisServer,
) -> None:
    holder = textwrap.dedent(
        f"""
        import asyncio, sys, toolnexus
        async def main():
            async with toolnexus.connect({redis_server.url!r}, namespace="kill", lease_ms=500,
                                         block_ms=100) as broker:
                async with broker.responder("web", "doomed") as responder:
                    pending = await anext(responder)
                    print("holding", pending.request.id, flush=True)
                    await asyncio.sleep(3600)
        asyncio.run(main())
        """
    )
    async with toolnexus.connect(
        redis_server.url, namespace="kill", lease_ms=500, block_ms=100
    ) as broker:
        request = ask("who?")
        wait = asyncio.create_task(broker.wait_for(request, timeout_s=30))
        proc = subprocess.Popen([sys.executable, "-c", holder], stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout is not None
            line = await asyncio.to_thread(proc.stdout.readline)
            assert line.split() == ["holding", request.id]
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            assert proc.stdout is not None
            proc.stdout.close()
        async with broker.responder("web", "survivor") as survivor:
            async with asyncio.timeout(10):
                pending = await anext(survivor)
            assert pending.request.id == request.id
            await pending.accept()
        answer = await wait
        assert answer.ok and answer.responder == "web/survivor"


@pytest.mark.slow
async def test_a_live_consumer_keeps_its_lease_for_longer_than_the_lease(
    redis_server: RedisServer,
) -> None:
    async with toolnexus.connect(
        redis_server.url, namespace="lease", lease_ms=300, block_ms=50
    ) as broker:
        wait = asyncio.create_task(broker.wait_for(ask(), timeout_s=30))
        async with (
            broker.responder("web", "slow") as slow,
            broker.responder("web", "other") as other,
        ):
            pending = await anext(slow)
            with pytest.raises(TimeoutError):  # renewed: never reclaimed by "other"
                async with asyncio.timeout(1.5):
                    await anext(other)
            await pending.accept()
        assert (await wait).responder == "web/slow"


async def test_the_broker_s_close_waits_for_a_responder_s_close_cut_short(
    redis_url: str, namespace: str
) -> None:
    """A responder closed under an anyio cancel scope (an MCP server's task group) goes on
    closing in a task of its own. Closing the broker right after waits for it: the
    responder still leaves (its heartbeat deleted, what it held reclaimable at once), and
    opens no connection to Redis once the broker has closed its pool (a socket nobody
    closes, found by the garbage collector in some later test)."""
    keys = Keys(namespace, "default")
    async with toolnexus.connect(redis_url, namespace=namespace, **FAST) as agent:
        wait = asyncio.create_task(agent.wait_for(ask(), timeout_s=30))
        async with toolnexus.connect(redis_url, namespace=namespace, **FAST) as broker:
            held = asyncio.Event()

            async def hold() -> None:
                async with broker.responder("web", "closing") as responder:
                    await anext(responder)
                    held.set()
                    await asyncio.sleep(60)

            async with anyio.create_task_group() as tasks:
                tasks.start_soon(hold)
                await held.wait()
                tasks.cancel_scope.cancel()
        async with aioredis.Redis.from_url(redis_url) as client:
            assert await client.hget(keys.heartbeats(), "web/closing") is None
            [entry] = await client.xpending_range(keys.requests, "web", "-", "+", 10)
        assert entry["time_since_delivered"] >= FAST["lease_ms"]
        wait.cancel()
        await asyncio.gather(wait, return_exceptions=True)


async def test_waits_survive_a_redis_restart_with_aof(redis_server: RedisServer) -> None:
    """100 waits pending and a responder holding them across a restart: all resolve."""
    gate = asyncio.Event()
    held: list[Pending] = []

    async def answer_after_restart(responder_broker: Broker) -> None:
        async with responder_broker.responder("web") as responder:
            async for pending in responder:
                held.append(pending)
                await gate.wait()
                await pending.accept({"echo": pending.request.prompt})
                if len(held) == 100:
                    return

    async with (
        toolnexus.connect(redis_server.url, namespace="restart", **FAST) as broker,
        toolnexus.connect(redis_server.url, namespace="restart", **FAST) as responder_broker,
    ):
        requests = [ask(f"q{i}") for i in range(100)]
        waits = [asyncio.create_task(broker.wait_for(r, timeout_s=60)) for r in requests]
        responder = asyncio.create_task(answer_after_restart(responder_broker))
        async with asyncio.timeout(10):
            while not held:
                await asyncio.sleep(0.05)

        redis_server.stop()
        await asyncio.sleep(0.5)  # readers are now retrying with backoff
        assert not any(w.done() for w in waits)
        redis_server.start()
        gate.set()

        await asyncio.wait_for(responder, 30)
        answers = await asyncio.wait_for(asyncio.gather(*waits), 30)
    assert [a.data for a in answers] == [{"echo": f"q{i}"} for i in range(100)]


async def test_requests_redis_lost_in_a_restart_are_published_again(tmp_path: Path) -> None:
    server = RedisServer(tmp_path)  # no persistence at all: a restart forgets everything
    server.start()
    try:
        async with toolnexus.connect(server.url, namespace="amnesia", **FAST) as broker:
            requests = [ask(f"q{i}") for i in range(20)]
            waits = [asyncio.create_task(broker.wait_for(r, timeout_s=60)) for r in requests]
            await asyncio.sleep(0.3)
            server.kill()
            server.start()
            async with toolnexus.connect(server.url, namespace="amnesia", **FAST) as responder:
                await asyncio.wait_for(answer_all(responder, 20), 30)
            answers = await asyncio.wait_for(asyncio.gather(*waits), 30)
        assert [a.data for a in answers] == [{"echo": f"q{i}"} for i in range(20)]
    finally:
        server.kill()


@pytest.mark.parametrize("signed", [False, True])
async def test_a_request_published_again_is_the_same_bytes(tmp_path: Path, signed: bool) -> None:
    """A plain wait does not keep its encoded request once published: after Redis lost it,
    it is encoded again from the caller's request, and that must give the very bytes
    published first (deadline and all); a signing wait keeps its encoding."""
    options: dict[str, object] = {}
    if signed:
        toolnexus.security.SigningKey.generate("agent-1").save(tmp_path)
        options["signing_key"] = str(tmp_path / "agent-1.key")
    server = RedisServer(tmp_path)
    server.start()
    try:
        async with toolnexus.connect(server.url, namespace="again", **FAST, **options) as broker:
            assert isinstance(broker, RedisBroker)
            request = ask("same?")
            allow = ["ops"] if signed else None  # (an allow-list too makes a wait keep it)
            wait = asyncio.create_task(broker.wait_for(request, timeout_s=60, allow=allow))

            async def entries() -> list[bytes]:
                async with asyncio.timeout(30):
                    while True:
                        with contextlib.suppress(redis.exceptions.ConnectionError):
                            found = await broker.redis.xrange(broker.keys.requests)
                            if found:
                                return [fields[b"r"] for _, fields in found]
                        await asyncio.sleep(0.05)

            [first] = await entries()
            server.kill()
            server.start()  # forgets everything: the waiter publishes the request again
            [again] = await entries()
            assert again == first
            decoded = broker.codec.decode_as(again, Request)
            assert decoded.allow == allow and decoded.prompt == "same?"
            assert (decoded.signature is not None) == signed
            wait.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await wait
    finally:
        server.kill()


@pytest.mark.slow
async def test_garbage_goes_to_the_dead_letter_stream_and_real_requests_still_flow(
    redis_url: str, namespace: str
) -> None:
    async with toolnexus.connect(redis_url, namespace=namespace, **FAST) as broker:
        assert isinstance(broker, RedisBroker)
        redis_ = broker.redis
        await redis_.xgroup_create(broker.keys.requests, "auto", id="0", mkstream=True)
        garbage: list[dict[str, bytes]] = [
            {"r": b"\xc1 not msgpack"},
            {"r": msgspec.msgpack.encode([1, {"type": "request", "kind": "x"}])},  # no id
            {"r": msgspec.msgpack.encode([1, {"type": "answer", "id": "a", "ok": True}])},
            {"r": b"x" * (1024 * 1024 + 1)},  # over the size limit
            {"other": b"field"},
            {"r": broker.codec.encode(Request(id="r1", kind="input"))},  # no reply_to
        ]
        async with redis_.pipeline(transaction=False) as pipe:
            for i in range(1000):
                pipe.xadd(broker.keys.requests, garbage[i % len(garbage)])
            await pipe.execute()
        wait = asyncio.create_task(broker.wait_for(ask("real"), timeout_s=30))
        async with broker.responder("auto") as responder:
            async with asyncio.timeout(30):
                pending = await anext(responder)
            assert pending.request.prompt == "real"
            await pending.accept()
            assert responder.dead_lettered == 1000  # type: ignore[attr-defined]
        assert (await wait).ok
        assert await redis_.xlen(broker.keys.dead) == 1000
        [(_, first)] = await redis_.xrange(broker.keys.dead, count=1)
        assert first[b"error"].startswith(b"not a msgpack message")
        assert first[b"raw"] == b"r=" + garbage[0]["r"]  # the original bytes are kept
        assert first[b"stream"] == broker.keys.requests.encode()
        assert first[b"group"] == b"auto"  # the group that could not take it
        # settled for this group only: kept for any other group (the age rule trims it)
        assert await redis_.xlen(broker.keys.requests) == 1000
        errors = {e[b"error"].split(b":")[0] for _, e in await redis_.xrange(broker.keys.dead)}
        assert b"message of 1048577 bytes exceeds the limit of 1048576 bytes" in errors
        pending_count = await redis_.xpending(broker.keys.requests, "auto")
        assert pending_count["pending"] == 0


@pytest.mark.slow
async def test_ten_thousand_waits_share_a_handful_of_connections(
    redis_url: str, namespace: str
) -> None:
    name = f"waiter-{namespace}"
    count = 10_000
    async with (
        toolnexus.connect(redis_url, namespace=namespace, client_name=name, **FAST) as waiter,
        toolnexus.connect(redis_url, namespace=namespace, **FAST) as responder,
    ):
        assert isinstance(waiter, RedisBroker) and isinstance(responder, RedisBroker)
        requests = [ask(f"{i}") for i in range(count)]
        waits = [asyncio.create_task(waiter.wait_for(r, timeout_s=120)) for r in requests]
        async with asyncio.timeout(60):
            while await waiter.redis.xlen(waiter.keys.requests) < count:
                await asyncio.sleep(0.1)
        clients = await responder.redis.client_list()
        held = [c for c in clients if c["name"] == name]
        assert 1 <= len(held) <= 5, held
        await asyncio.wait_for(answer_all(responder, count), 120)
        answers = await asyncio.gather(*waits)
    assert all(a.data == {"echo": r.prompt} for a, r in zip(answers, requests, strict=True))


@pytest.mark.slow
async def test_resolved_state_expires_after_the_retention_time(
    redis_url: str, namespace: str
) -> None:
    async with toolnexus.connect(redis_url, namespace=namespace, retention_s=1, **FAST) as broker:
        assert isinstance(broker, RedisBroker)
        request = ask()
        answer = await broker.wait_for(request, timeout_s=0.2)
        assert answer.reason == "expired"
        state = broker.keys.state(broker.waiter_id, request.id)
        assert 0 < await broker.redis.pttl(state) <= 1000
        await asyncio.sleep(1.2)
        assert not await broker.redis.exists(state, broker.keys.route(request.id))
        with pytest.raises(UnknownRequest):
            await broker.answer(Answer(id=request.id, ok=True))


async def test_a_wait_is_no_longer_than_the_request_stream_keeps_requests(
    redis_url: str, namespace: str
) -> None:
    async with toolnexus.connect(
        redis_url, namespace=namespace, stream_retention_s=0.3, **FAST
    ) as broker:
        started = time.monotonic()
        answer = await broker.wait_for(ask(), timeout_s=3600)
        assert answer.reason == "expired" and time.monotonic() - started < 2


async def test_an_unreachable_redis_is_a_clear_error() -> None:
    with pytest.raises(
        toolnexus.BrokerUnavailable, match=r"cannot reach Redis at redis://127\.0\.0\.1:1/0"
    ):
        async with toolnexus.connect("redis://127.0.0.1:1/0"):
            pass


def test_an_unknown_scheme_is_a_clear_error() -> None:
    with pytest.raises(toolnexus.ConfigurationError, match="unknown broker URL scheme 'amqp'"):
        toolnexus.connect("amqp://localhost")


async def test_scripts_redis_forgot_are_loaded_again(redis_url: str, namespace: str) -> None:
    async with toolnexus.connect(redis_url, namespace=namespace, **FAST) as broker:
        assert isinstance(broker, RedisBroker)
        responder = asyncio.create_task(answer_all(broker, 2))
        assert (await broker.wait_for(ask("before"), timeout_s=10)).ok
        await broker.redis.script_flush()
        assert (await broker.wait_for(ask("after"), timeout_s=10)).data == {"echo": "after"}
        await asyncio.wait_for(responder, 10)


async def test_an_answered_entry_is_acknowledged_and_gone_when_accept_returns(
    redis_url: str, namespace: str
) -> None:
    async with (
        toolnexus.connect(redis_url, namespace=namespace, **FAST) as agent,
        toolnexus.connect(redis_url, namespace=namespace, **FAST) as bot,
    ):
        assert isinstance(bot, RedisBroker)
        wait = asyncio.create_task(agent.wait_for(ask("gone?"), timeout_s=20))
        async with bot.responder("first") as first:
            async for pending in first:
                await pending.accept()
                # Acknowledged by this group and deleted from the stream before accept()
                # returned (the waiter's own delete goes later, and acknowledges nothing).
                assert (await bot.redis.xpending(bot.keys.requests, "first"))["pending"] == 0
                assert await bot.redis.xlen(bot.keys.requests) == 0
                break
        async with bot.responder("late", until_idle=True) as late:
            assert [p async for p in late] == []  # a group reading afterwards never sees it
        assert (await wait).ok


# -- the state's layout (issue #30: memory near the floor) -------------------------------------


async def test_a_plain_state_holds_no_request_and_answering_by_id_reads_its_entry(
    redis_url: str, namespace: str
) -> None:
    """A plain request's one home while it is open is its request-stream entry: its state
    holds no request, its route names the waiter and the entry, and an answer by id (from
    another process) reads the request there, is checked against it and wins. Ended, the
    state still holds no request bytes."""
    async with (
        toolnexus.connect(redis_url, namespace=namespace, **FAST) as agent,
        toolnexus.connect(redis_url, namespace=namespace, **FAST) as ops,
    ):
        assert isinstance(agent, RedisBroker) and isinstance(ops, RedisBroker)
        schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
        request = ask(kind="input", data={"schema": schema})
        wait = asyncio.create_task(agent.wait_for(request, timeout_s=30))
        state = await opened(agent, request.id)
        assert set(await agent.redis.hgetall(state)) == {b"s", b"x", b"p"}  # (p: protocol 2)
        route = parse_route(await agent.redis.get(agent.keys.route(request.id)))
        assert route is not None and route[0] == agent.waiter_id
        assert (await published_request(agent, request.id)).prompt == request.prompt
        with pytest.raises(toolnexus.errors.InvalidAnswer):  # checked against the entry's form
            await ops.answer(Answer(id=request.id, ok=True, data={"n": "three"}))
        await ops.answer(Answer(id=request.id, ok=True, data={"n": 3}))
        answer = await asyncio.wait_for(wait, 10)
        assert answer.ok and answer.data == {"n": 3}
        ended = await agent.redis.hgetall(state)
        assert ended[b"s"] == b"answered" and not {b"req", b"ex", b"dg"} & set(ended)
        assert sum(len(v) for v in ended.values()) < 200
        with pytest.raises(AlreadyResolved, match="already answered"):
            await ops.answer(Answer(id=request.id, ok=False))


async def test_the_waiters_own_withdrawal_stores_the_status_alone_and_adds_no_reply(
    redis_url: str, namespace: str
) -> None:
    """A plain request withdrawn by its own waiter (cancelled): the state records the
    status alone (no answer, no request), the waiter's reply stream gets no entry (it
    resolved it itself), the end has its audit record, and a late answer by id is told
    "withdrawn" at once."""
    async with (
        toolnexus.connect(redis_url, namespace=namespace, **FAST) as agent,
        toolnexus.connect(redis_url, namespace=namespace, **FAST) as ops,
    ):
        assert isinstance(agent, RedisBroker)
        request = ask()
        wait = asyncio.create_task(agent.wait_for(request, timeout_s=30))
        state = await opened(agent, request.id)
        wait.cancel()
        await asyncio.gather(wait, return_exceptions=True)
        async with asyncio.timeout(5):
            while await agent.redis.hget(state, "s") != b"withdrawn":
                await asyncio.sleep(0.01)
        assert set(await agent.redis.hgetall(state)) == {b"s", b"x", b"p"}  # (p: protocol 2)
        assert await agent.redis.xlen(agent.keys.answers(agent.waiter_id)) == 0
        started = time.monotonic()
        with pytest.raises(AlreadyResolved) as lost:
            await ops.answer(Answer(id=request.id, ok=True))
        assert lost.value.reason == "withdrawn" and time.monotonic() - started < 1.0
        async with asyncio.timeout(5):
            while not (records := await agent.audit(request_id=request.id)):
                await asyncio.sleep(0.02)
        assert [r.status for r in records] == ["withdrawn"]


async def test_an_expiry_with_a_default_answer_keeps_it_in_the_state(
    redis_url: str, namespace: str
) -> None:
    """An expiry that carries a default answer is stored with it (a late answer by id is
    told "expired"), unlike a plain expiry, whose status says it all."""
    async with toolnexus.connect(redis_url, namespace=namespace, **FAST) as agent:
        assert isinstance(agent, RedisBroker)
        defaulted, plain = ask(on_expiry=OnExpiry(ok=True)), ask()
        answers = await asyncio.gather(
            agent.wait_for(defaulted, timeout_s=0.3), agent.wait_for(plain, timeout_s=0.3)
        )
        assert [(a.ok, a.defaulted) for a in answers] == [(True, True), (False, False)]
        kept = [
            await agent.redis.hgetall(agent.keys.state(agent.waiter_id, r.id))
            for r in (defaulted, plain)
        ]
        assert [k[b"s"] for k in kept] == [b"expired", b"expired"]
        assert agent.codec.decode_as(kept[0][b"a"], Answer).defaulted
        assert b"a" not in kept[1]
        for request in (defaulted, plain):
            with pytest.raises(AlreadyResolved, match="expired"):
                await agent.answer(Answer(id=request.id, ok=False))
