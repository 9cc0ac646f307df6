"""Issue #25 observations 1, 2 and 7: an agent learns why nobody answers. Every responder
keeps a heartbeat (``broker.responder()`` as much as ``serve()``); a publish to a queue
no live worker reads is warned about at once, naming where workers are alive; a request
a responder dead-letters ends its wait as refused, with the reason; and ``ask``'s exit
statuses (Ctrl-C included) are as documented."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import signal
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

import toolnexus
from conftest import FAST
from toolnexus import Broker, Request, new_id
from toolnexus._broker import READER_GRACE_S
from toolnexus._memory import MemoryBroker
from toolnexus.cli import EXIT_INTERRUPTED
from toolnexus.cli._exits import EXIT_NOT_ANSWERED, EXIT_REQUEST_REFUSED
from toolnexus.errors import Refused
from toolnexus.redis_broker import RedisBroker
from toolnexus.security import Keyring, SigningKey

TOOLNEXUS = str(Path(sys.executable).with_name("toolnexus"))


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLNEXUS_")}
    return {**env, **extra}


async def _run(*args: str, timeout_s: float = 60, **env: str) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        TOOLNEXUS, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env=_env(**env),
    )  # fmt: skip
    async with asyncio.timeout(timeout_s):
        out, err = await process.communicate()
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


@asynccontextmanager
async def answering(broker: Broker, group: str = "ops-bot") -> AsyncIterator[None]:
    """The README's first responder, accepting whatever it is shown, running meanwhile."""

    async def respond() -> None:
        async with broker.responder(group) as requests:
            async for pending in requests:
                await pending.accept()

    task = asyncio.create_task(respond())
    try:
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def _eventually(check: object, timeout_s: float = 10) -> None:
    async with asyncio.timeout(timeout_s):
        while not await check():  # type: ignore[operator]
            await asyncio.sleep(0.05)


# -- observation 7: plain responders keep a heartbeat ------------------------------------


@pytest.mark.slow
@pytest.mark.redis
async def test_a_plain_responder_is_alive_for_check_and_status(
    redis_url: str, namespace: str
) -> None:
    args = ["--url", redis_url, "--namespace", namespace]
    async with toolnexus.connect(redis_url, namespace=namespace, **FAST) as broker:
        async with answering(broker):

            async def beating() -> bool:
                return bool(await broker.heartbeats())

            await _eventually(beating)
            check = await _run("check", *args)
            named = await _run("check", "--worker", "ops-bot", *args)
            status = await _run("status", *args)
            [beat] = await broker.heartbeats()
        gone = await _run("check", *args)
    assert check[0] == 0 and check[1].startswith("ok: 1 worker(s) with fresh heartbeats"), check
    assert named[0] == 0, named
    assert (beat.group, beat.info["worker"], beat.info["pid"]) == (
        "ops-bot",
        "responder",
        os.getpid(),
    )
    assert f"{beat.consumer}: holds 0" in status[1] and "heartbeat " in status[1], status[1]
    assert "no heartbeat" not in status[1]
    # closed, it leaves: nothing reads the queue any more
    assert gone[0] == 1 and "no worker has a fresh heartbeat" in gone[2], gone


async def test_a_plain_responder_keeps_a_heartbeat_on_memory() -> None:
    async with MemoryBroker() as broker:
        responder = broker.responder("ops-bot")
        reading = asyncio.create_task(anext(responder))
        await asyncio.sleep(0.05)
        [beat] = await broker.heartbeats()
        assert (beat.group, beat.consumer, beat.info["worker"]) == (
            "ops-bot", responder.consumer, "responder",
        )  # fmt: skip
        assert beat.expires_at - beat.at == pytest.approx(30.0)
        await responder.aclose()
        await asyncio.gather(reading, return_exceptions=True)
        assert await broker.heartbeats() == []


async def test_serve_hands_its_heartbeat_with_its_counters_to_the_responder() -> None:
    async with MemoryBroker() as broker:
        service = toolnexus.Service(broker, lambda pending: pending.accept(), group="bot",
                                    heartbeat_ttl_s=12)  # fmt: skip
        running = asyncio.create_task(service.run())
        await asyncio.sleep(0.1)
        [beat] = await broker.heartbeats()
        assert beat.expires_at - beat.at == pytest.approx(12.0)
        assert beat.info["concurrency"] == 100 and "shown" in beat.info, beat.info
        service.stop()
        await asyncio.wait_for(running, 10)
        assert await broker.heartbeats() == []


# -- observation 1: nobody reads the queue -------------------------------------------------


@pytest.mark.redis
async def test_ask_warns_at_once_that_nobody_reads_its_queue_and_ctrl_c_is_130(
    redis_url: str, namespace: str
) -> None:
    broker = toolnexus.connect(redis_url, namespace=namespace, **FAST)
    async with broker, answering(broker, "web"):  # alive on queue default, not on 'deploys'

        async def beating() -> bool:
            return bool(await broker.heartbeats())

        await _eventually(beating)
        process = await asyncio.create_subprocess_exec(
            TOOLNEXUS, "ask", "Deploy?", "--queue", "deploys", "--timeout", "10m",
            "--url", redis_url, "--namespace", namespace,
            stderr=asyncio.subprocess.PIPE, env=_env(),
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )  # fmt: skip
        assert process.stderr is not None
        started = time.monotonic()
        async with asyncio.timeout(30):
            waiting = (await process.stderr.readline()).decode()
            warning = (await process.stderr.readline()).decode()
        took_s = time.monotonic() - started
        process.send_signal(signal.SIGINT)
        returncode = await asyncio.wait_for(process.wait(), 20)
    assert waiting.startswith("toolnexus ask: waiting for an answer to "), waiting
    assert warning.startswith(
        f"toolnexus ask: nobody reads queue 'deploys' of namespace '{namespace}': no worker "
        "has a fresh heartbeat there"
    ), warning
    assert "(workers alive elsewhere: queue 'default': web/" in warning, warning
    assert took_s < 20  # at once, not at the 10 minutes' deadline
    assert returncode == EXIT_INTERRUPTED


@pytest.mark.redis
async def test_a_wait_warns_once_nobody_reads_and_not_when_a_worker_does(
    redis_url: str, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="toolnexus")
    async with toolnexus.connect(redis_url, namespace=namespace, **FAST) as broker:
        request = Request(id=new_id(), kind="approval")
        answer = await broker.wait_for(request, timeout_s=0.5)
        assert answer.reason == "expired"
        warned = [r.getMessage() for r in caplog.records if "nobody reads" in r.getMessage()]
        assert len(warned) == 1 and request.id in warned[0], warned
    caplog.clear()
    broker = toolnexus.connect(redis_url, namespace=namespace, **FAST)
    async with broker, answering(broker):

        async def beating() -> bool:
            return bool(await broker.heartbeats())

        await _eventually(beating)
        answer = await broker.wait_for(Request(id=new_id(), kind="approval"), timeout_s=20)
    assert answer.ok
    assert not [r for r in caplog.records if "nobody reads" in r.getMessage()]


async def test_the_embedded_broker_warns_too(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="toolnexus")
    async with MemoryBroker(queue="deploys") as broker:
        answer = await broker.wait_for(Request(id="r-1", kind="approval"), timeout_s=0.1)
        assert answer.reason == "expired"
        async with answering(broker):
            await asyncio.sleep(0.05)
            answer = await broker.wait_for(Request(id="r-2", kind="approval"), timeout_s=10)
        assert answer.ok
    [warned] = [r.getMessage() for r in caplog.records if "nobody reads" in r.getMessage()]
    assert "queue 'deploys'" in warned and "r-1" in warned


async def _started_with_its_responder(broker: Broker) -> toolnexus.Answer:
    """The first tutorial's order (issue #43): the responder's task made, then the wait
    published before that task ran, so before its first heartbeat. The responder holds
    the request past the grace, so the look finds it open and must see the heartbeat."""

    async def slow_person() -> None:
        async with broker.responder("me") as requests:
            pending = await anext(requests)
            await asyncio.sleep(READER_GRACE_S + 0.5)
            await pending.accept()

    responder = asyncio.create_task(slow_person())
    answer = await broker.wait_for(Request(id=new_id(), kind="approval"), timeout_s=30)
    await responder
    return answer


@pytest.mark.slow
async def test_a_responder_started_with_the_wait_is_given_until_its_first_heartbeat(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="toolnexus")
    async with MemoryBroker() as broker:
        assert (await _started_with_its_responder(broker)).ok
    assert not [r for r in caplog.records if "nobody reads" in r.getMessage()]


@pytest.mark.slow
@pytest.mark.redis
async def test_on_redis_a_responder_started_with_the_wait_is_given_its_grace_too(
    redis_url: str, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="toolnexus")
    async with toolnexus.connect(redis_url, namespace=namespace, **FAST) as broker:
        assert (await _started_with_its_responder(broker)).ok
    assert not [r for r in caplog.records if "nobody reads" in r.getMessage()]


@pytest.mark.slow
@pytest.mark.redis
async def test_the_demo_without_a_responder_says_where_it_asks(
    redis_url: str, namespace: str
) -> None:
    process = await asyncio.create_subprocess_exec(
        TOOLNEXUS, "demo", "--responder", "none", "--url", redis_url, "--namespace", namespace,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=_env(),
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    assert process.stdout is not None and process.stderr is not None
    async with asyncio.timeout(60):
        said = ""  # after the introduction of the demo's three parts
        while not said.startswith("demo: asking"):
            said = (await process.stdout.readline()).decode()
            assert said, "no line says where the demo asks"
        warned = ""  # the MCP server's log handler may wrap the line
        while "nobody reads queue 'demo' of" not in warned:
            line = await process.stderr.readline()
            assert line, warned
            warned += line.decode()
    process.send_signal(signal.SIGINT)
    await asyncio.wait_for(process.wait(), 20)
    assert said.startswith(f"demo: asking on queue 'demo' of namespace '{namespace}' at "), said
    assert "nothing in this process answers" in said and "--queue demo" in said, said


# -- observation 2: a request the responder dead-letters is refused at once ----------------


@pytest.mark.slow
@pytest.mark.redis
async def test_an_unsigned_ask_to_a_worker_requiring_signatures_is_refused_at_once(
    redis_url: str, namespace: str
) -> None:
    agent, bot = SigningKey.generate("agent-7"), SigningKey.generate("ops-bot")
    worker = toolnexus.connect(
        redis_url, namespace=namespace, signing_key=bot, trusted_keys=Keyring.of(agent),
        require_signatures=True, **FAST,
    )  # fmt: skip
    async with worker, answering(worker):
        started = time.monotonic()
        code, out, err = await _run(
            "ask", "Deploy?", "--timeout", "10m", "--url", redis_url, "--namespace", namespace
        )
        took_s = time.monotonic() - started
        dead = await worker.redis.xlen(worker.keys.dead)
    assert code == EXIT_REQUEST_REFUSED, (code, err)
    assert took_s < 30
    assert out == ""
    last = err.splitlines()[-1]
    assert last.startswith("toolnexus ask: request 'req-") and " was refused by ops-bot/" in last
    assert last.endswith(": missing signature (unverified): withdrawn"), last
    assert "(unverified: not signed by a key this process trusts); it waits on" in err
    assert dead == 1  # and the operator finds it among the dead letters


@pytest.mark.redis
async def test_a_refusal_is_given_at_once_while_the_wait_goes_on(
    redis_url: str, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="toolnexus")
    agent, bot = SigningKey.generate("agent-7"), SigningKey.generate("ops-bot")
    worker = toolnexus.connect(
        redis_url, namespace=namespace, signing_key=bot, trusted_keys=Keyring.of(agent),
        require_signatures=True, **FAST,
    )  # fmt: skip
    unsigned = toolnexus.connect(redis_url, namespace=namespace, **FAST)
    async with worker, unsigned, answering(worker):
        assert isinstance(unsigned, RedisBroker)
        request = Request(id=new_id(), kind="approval", prompt="Deploy?")
        wait = asyncio.create_task(unsigned.wait_for(request, timeout_s=600))
        await asyncio.sleep(0)
        refusal = await asyncio.wait_for(unsigned.refusal(request.id), 30)
        await asyncio.sleep(0.3)
        assert not wait.done()  # another group may take it, an operator may requeue it
        wait.cancel()
        await asyncio.gather(wait, return_exceptions=True)
        assert unsigned.refusal(request.id).cancelled() is False  # a new one: nothing leaks
    assert isinstance(refusal, Refused) and isinstance(refusal, toolnexus.NotResolved)
    assert (refusal.reason, refusal.verified) == ("missing signature", False)
    assert refusal.responder is not None and refusal.responder.startswith("ops-bot/")
    [said] = [r.getMessage() for r in caplog.records if "was refused by" in r.getMessage()]
    assert said.startswith(f"request {request.id} was refused by ops-bot/"), said


def test_ask_exit_statuses_are_documented() -> None:
    text = (Path(__file__).parents[1] / "docs" / "reference" / "cli.md").read_text()
    [row] = [line for line in text.splitlines() if line.startswith("| `ask` |")]
    said = dict(re.findall(r"\*\*(\d+)\*\* ([^*]+)", row))  # **2** expired, ...
    assert said[str(EXIT_NOT_ANSWERED)].startswith("expired")
    assert said[str(EXIT_REQUEST_REFUSED)].startswith("refused by a responder")
    assert said[str(EXIT_INTERRUPTED)].startswith("Ctrl-C")
