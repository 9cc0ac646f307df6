"""SPEC §11 under outages: errors at the boundary, bounded awaits, no request stranded by
a failed answer, leases that never starve, and waiters whose death withdraws their
requests. Each runs on private redis-servers."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator

import pytest

import toolnexus
from conftest import FAST, RedisServer
from helpers import ask, eventually
from toolnexus import AlreadyResolved, Answer, BrokerUnavailable, ConfigurationError, Pending
from toolnexus.errors import BrokerClosed
from toolnexus.redis_broker import RedisBroker

pytestmark = pytest.mark.redis


# -- errors at the boundary -------------------------------------------------------------


def test_an_unknown_option_names_itself_and_the_valid_ones() -> None:
    with pytest.raises(ConfigurationError, match="unknown option require_signed_answers") as info:
        toolnexus.connect("redis://127.0.0.1:6379/0", require_signed_answers=True)
    assert "lease_ms" in str(info.value) and "ssl_ca_certs" in str(info.value)
    with pytest.raises(ConfigurationError, match="lease_ms=0 must be positive"):
        toolnexus.connect("redis://127.0.0.1:6379/0", lease_ms=0)


async def test_a_server_that_accepts_but_never_replies_fails_to_connect_in_time() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(Exception):
            await reader.read(-1)  # read everything, answer nothing
        writer.close()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    started = time.monotonic()
    try:
        with pytest.raises(BrokerUnavailable, match=r"within 0\.5 s"):
            async with toolnexus.connect(f"redis://127.0.0.1:{port}/0", connect_timeout_s=0.5):
                pass
    finally:
        server.close()
    assert time.monotonic() - started < 5


async def test_with_redis_down_answering_raises_broker_unavailable(
    redis_server: RedisServer,
) -> None:
    options = {**FAST, "answer_patience_s": 0.3, "command_timeout_s": 1.0}
    async with toolnexus.connect(redis_server.url, namespace="down", **options) as broker:
        wait = asyncio.create_task(broker.wait_for(ask(), timeout_s=30))
        async with broker.responder("bot") as responder:
            pending = await asyncio.wait_for(anext(responder), 10)
            redis_server.stop()
            with pytest.raises(BrokerUnavailable) as info:
                await pending.accept()
            assert not isinstance(info.value.__cause__, toolnexus.ToolnexusError)
            with pytest.raises(BrokerUnavailable):
                await broker.answer(Answer(id=pending.request.id, ok=True))
            redis_server.start()  # the answer did not get through: the request is shown again
            again = await asyncio.wait_for(anext(responder), 20)
            assert again.request.id == pending.request.id
            await again.accept()
        assert (await asyncio.wait_for(wait, 20)).ok


async def test_a_paused_redis_times_commands_out_as_broker_unavailable(
    redis_server: RedisServer,
) -> None:
    options = {**FAST, "command_timeout_s": 0.5}
    async with toolnexus.connect(redis_server.url, namespace="pause", **options) as broker:
        assert isinstance(broker, RedisBroker)
        await broker.redis.execute_command("CLIENT", "PAUSE", "3000", "ALL")
        started = time.monotonic()
        with pytest.raises(BrokerUnavailable):
            await broker.answer(Answer(id="req-1", ok=True))
        assert time.monotonic() - started < 2.5


async def test_closing_is_its_own_error_not_an_outage(redis_url: str, namespace: str) -> None:
    broker = toolnexus.connect(redis_url, namespace=namespace, **FAST)
    async with broker:
        wait = asyncio.create_task(broker.wait_for(ask(), timeout_s=30))
        await asyncio.sleep(0.2)
    with pytest.raises(BrokerClosed):
        await wait  # the wait in progress ends: the request is withdrawn
    with pytest.raises(BrokerClosed):
        await broker.wait_for(ask())
    assert not issubclass(BrokerClosed, BrokerUnavailable)


# -- no request stranded ----------------------------------------------------------------


@pytest.mark.slow
async def test_a_restart_mid_answering_strands_nothing_with_responders_that_never_retry(
    redis_server: RedisServer,
) -> None:
    """200 waits; the responder answers each once and moves on when that fails (the
    README's shape). Redis restarts (AOF always) while it answers: all 200 are answered."""
    options = {**FAST, "answer_patience_s": 0.2}
    async with (
        toolnexus.connect(redis_server.url, namespace="rs", **options) as agent,
        toolnexus.connect(redis_server.url, namespace="rs", **options) as bot,
    ):
        waits = [
            asyncio.create_task(agent.wait_for(ask(f"q{i}"), timeout_s=120)) for i in range(200)
        ]
        failed = 0

        async def answer_once(pending: Pending) -> None:
            nonlocal failed
            await asyncio.sleep(0.01)
            try:
                await pending.accept()
            except BrokerUnavailable:
                failed += 1
            except AlreadyResolved:
                pass

        async def respond() -> None:
            async with bot.responder("bot") as responder, asyncio.TaskGroup() as tasks:
                async for pending in responder:
                    tasks.create_task(answer_once(pending))

        responding = asyncio.create_task(respond())
        await eventually(
            lambda: asyncio.sleep(0, sum(w.done() for w in waits) >= 40), "40 answers", 30
        )
        redis_server.stop()
        await asyncio.sleep(1.0)
        redis_server.start()
        async with asyncio.timeout(90):
            answers = await asyncio.gather(*waits)
        responding.cancel()
        await asyncio.gather(responding, return_exceptions=True)
    assert [a.ok for a in answers] == [True] * 200
    print(f"answers that failed and were shown again: {failed}")


# -- leases and releasing ---------------------------------------------------------------


@pytest.mark.slow
async def test_withdrawn_requests_are_released_in_bulk_and_live_leases_never_starve(
    redis_server: RedisServer,
) -> None:
    """A responder holds 600 requests (500 withdrawn, 100 live, lease 3 s): a second consumer
    of its group is shown none of the live ones while it is alive, and the withdrawn ones
    are released within seconds."""
    options = {"block_ms": 100, "lease_ms": 3000}
    async with (
        toolnexus.connect(redis_server.url, namespace="lease", **options) as agent,
        toolnexus.connect(redis_server.url, namespace="lease", **options) as bot,
    ):
        assert isinstance(bot, RedisBroker)
        withdrawn = [
            asyncio.create_task(agent.wait_for(ask("w"), timeout_s=300)) for _ in range(500)
        ]
        live = [asyncio.create_task(agent.wait_for(ask("live"), timeout_s=300)) for _ in range(100)]
        holder = bot.responder("web", "holder")
        held = [await asyncio.wait_for(anext(holder), 10) for _ in range(600)]
        assert len({p.request.id for p in held}) == 600
        for task in withdrawn:
            task.cancel()
        await asyncio.gather(*withdrawn, return_exceptions=True)
        started = time.monotonic()
        stream = bot.keys.requests

        async def released() -> bool:
            info = await bot.redis.xpending(stream, "web")
            return bool(info["pending"] == 100)

        await eventually(released, "the 500 withdrawn requests to be released", 15)
        release_s = time.monotonic() - started
        shown_to_other: list[str] = []

        async def other() -> None:
            async with bot.responder("web", "other") as responder:
                async for pending in responder:
                    shown_to_other.append(pending.request.id)

        watching = asyncio.create_task(other())
        await asyncio.sleep(7)  # more than two leases
        watching.cancel()
        await asyncio.gather(watching, return_exceptions=True)
        assert shown_to_other == []
        for task in live:
            task.cancel()
        await asyncio.gather(*live, return_exceptions=True)
        await holder.aclose()
    print(f"500 withdrawn requests released in {release_s:.2f} s")


@pytest.mark.slow
async def test_ten_thousand_withdrawn_requests_are_released_within_seconds(
    redis_url: str, namespace: str
) -> None:
    async with (
        toolnexus.connect(redis_url, namespace=namespace, **FAST) as agent,
        toolnexus.connect(redis_url, namespace=namespace, **FAST) as bot,
    ):
        assert isinstance(bot, RedisBroker)
        waits = [asyncio.create_task(agent.wait_for(ask(), timeout_s=300)) for _ in range(10_000)]
        async with bot.responder("web") as holder:
            for _ in range(10_000):
                await asyncio.wait_for(anext(holder), 30)
            for task in waits:
                task.cancel()
            await asyncio.gather(*waits, return_exceptions=True)
            started = time.monotonic()

            async def released() -> bool:
                info = await bot.redis.xpending(bot.keys.requests, "web")
                return bool(info["pending"] == 0)

            await eventually(released, "10,000 withdrawn requests to be released", 30)
            elapsed = time.monotonic() - started
    assert elapsed < 20
    print(f"10,000 withdrawn requests released in {elapsed:.2f} s")


# -- waiter liveness --------------------------------------------------------------------

WAITER = """
import asyncio, sys, toolnexus
from toolnexus import Request
async def main():
    async with toolnexus.connect(sys.argv[1], namespace="live", liveness_ms=1000, block_ms=100,
                                 lease_ms=600, retention_s=1) as broker:
        waits = [asyncio.create_task(broker.wait_for(
            Request(id=f"req-{i}", kind="approval", prompt="?"), timeout_s=float(sys.argv[2])))
            for i in range(100)]
        while await broker.redis.xlen(broker.keys.requests) < 100:
            await asyncio.sleep(0.05)
        print("published", flush=True)
        await asyncio.gather(*waits)
asyncio.run(main())
"""


@contextlib.asynccontextmanager
async def killed_waiter(url: str, timeout_s: float) -> AsyncIterator[None]:
    """A waiting process with 100 requests published, SIGKILLed as the block starts."""
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(WAITER), url, str(timeout_s)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 30)
        assert line.strip() == "published"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        yield
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()


@pytest.mark.slow
async def test_a_killed_waiter_s_requests_are_withdrawn_within_the_bound(
    redis_server: RedisServer,
) -> None:
    # Kept for 30 s once withdrawn (retention_s): the 100 answers below, sent after the
    # withdrawals, must find the states to be told "withdrawn" (with none, an answer before
    # the deadline is contested: threat-model S4), however loaded the machine is.
    options = {"block_ms": 100, "lease_ms": 600, "liveness_ms": 1000, "retention_s": 30}
    async with toolnexus.connect(redis_server.url, namespace="live", **options) as bot:
        assert isinstance(bot, RedisBroker)
        async with bot.events() as events, bot.responder("web") as responder:
            async with killed_waiter(redis_server.url, timeout_s=600):
                killed = time.monotonic()
                held = [await asyncio.wait_for(anext(responder), 10) for _ in range(100)]
                withdrawn: set[str] = set()
                async with asyncio.timeout(15):
                    async for event in events:
                        if event.event == "withdrawn":
                            withdrawn.add(event.id)
                        if len(withdrawn) == 100:
                            break
                bound_s = time.monotonic() - killed
            refused = 0
            for pending in held:
                with pytest.raises(AlreadyResolved) as info:
                    await pending.accept()
                refused += info.value.reason == "withdrawn"
        assert refused == 100
        with pytest.raises(AlreadyResolved, match="withdrawn"):
            await bot.answer(Answer(id="req-7", ok=True))
        assert bound_s < 1.0 + 0.6 + 5  # liveness + a sweep, with room for a loaded machine
    print(f"100 requests of a killed waiter withdrawn {bound_s:.2f} s after the kill")


@pytest.mark.slow
async def test_a_long_lease_does_not_delay_withdrawing_a_killed_waiter_s_requests(
    redis_server: RedisServer,
) -> None:
    """A responder whose lease is long (its full sweep comes every 20 s) withdraws a killed
    waiter's requests once its liveness mark is gone: it looks for waiters without one
    every third of the liveness bound (one EXISTS per waiter), not only in full sweeps."""
    options = {"block_ms": 100, "lease_ms": 60_000, "liveness_ms": 1000, "retention_s": 30}
    withdrawn: set[str] = set()
    async with (
        toolnexus.connect(redis_server.url, namespace="live", **options) as bot,
        bot.events() as events,
        bot.responder("web") as responder,
        killed_waiter(redis_server.url, timeout_s=600),
    ):
        for _ in range(100):
            await asyncio.wait_for(anext(responder), 10)
        async with asyncio.timeout(15):  # the first full sweep: 20 s
            async for event in events:
                if event.event == "withdrawn":
                    withdrawn.add(event.id)
                if len(withdrawn) == 100:
                    break
    assert withdrawn == {f"req-{i}" for i in range(100)}


@pytest.mark.slow
async def test_nothing_of_a_killed_waiter_stays_after_deadline_and_retention(
    redis_server: RedisServer,
) -> None:
    options = {"block_ms": 100, "lease_ms": 600, "liveness_ms": 1000, "retention_s": 1}
    async with toolnexus.connect(redis_server.url, namespace="live", **options) as bot:
        assert isinstance(bot, RedisBroker)
        async with bot.responder("web") as responder:
            async with killed_waiter(redis_server.url, timeout_s=2):
                for _ in range(100):
                    await asyncio.wait_for(anext(responder), 10)
            await asyncio.sleep(2 + 1 + 2)  # deadline + retention + a sweep or two
            keys = sorted([k.decode() async for k in bot.redis.scan_iter(match="*live*")])
            pending = await bot.redis.xpending(bot.keys.requests, "web")
            length = await bot.redis.xlen(bot.keys.requests)
    # The queue's request stream, empty but for its consumer group, the responders' audit
    # trail (the responder recorded the dead waiter's ends; kept for audit_retention_s) and
    # the heartbeat of the responder still open are all that remain: nothing of the waiter.
    left = [bot.keys.requests, bot.keys.responder_audit, bot.keys.heartbeats()]
    assert keys == sorted(left)
    assert (pending["pending"], length) == (0, 0)


async def test_a_served_answer_that_fails_shows_its_request_again(
    redis_server: RedisServer,
) -> None:
    """Through the responder SDK: an accept() that cannot get through is not skipped; the
    request is shown again when Redis is back, and answered then."""
    options = {**FAST, "answer_patience_s": 0.2, "command_timeout_s": 1.0}
    shown: list[str] = []
    go = asyncio.Event()

    async def handler(pending: Pending) -> None:
        shown.append(pending.request.id)
        await go.wait()
        await pending.accept()

    async with (
        toolnexus.connect(redis_server.url, namespace="sv", **options) as agent,
        toolnexus.connect(redis_server.url, namespace="sv", **options) as bot,
    ):
        service = toolnexus.Service(bot, handler, group="bot", heartbeat_ttl_s=60)
        serving = asyncio.create_task(service.run())
        wait = asyncio.create_task(agent.wait_for(ask(), timeout_s=60))
        await eventually(lambda: asyncio.sleep(0, len(shown) == 1), "the request shown", 10)
        redis_server.stop()
        go.set()
        await eventually(
            lambda: asyncio.sleep(0, service.statistics()["errors"] == 1), "a failure", 10
        )
        redis_server.start()
        answer = await asyncio.wait_for(wait, 30)
        service.stop()
        await asyncio.wait_for(serving, 20)
    assert answer.ok
    assert len(shown) == 2 and shown[0] == shown[1]


async def test_errors_never_quote_the_password_of_the_url() -> None:
    broker = toolnexus.connect("redis://agent:s3cret-pw@127.0.0.1:1/0", connect_timeout_s=0.5)
    assert "s3cret-pw" not in repr(broker)
    with pytest.raises(BrokerUnavailable) as info:
        async with broker:
            pass
    assert "s3cret-pw" not in str(info.value) and "agent:***@" in str(info.value)
