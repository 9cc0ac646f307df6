"""Issue #39 item 3, "nothing deleted that another reader still needs": a consumer group
that cannot or will not take an entry (its own signature policy here) settles it for itself
only, with its own dead letter and its own acknowledgement; the entry stays in the stream
for every other group. The waiter learns of the refusal at once and keeps its chance of
another group's answer: the refusal is final (``refusal()``, ``ask`` exit 5) only once no
live group could still take the request. A requeue moves an entry still in the stream,
never copies it."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

import toolnexus
from conftest import FAST
from helpers import ask, eventually
from toolnexus.cli._ops import requeue
from toolnexus.errors import Refused
from toolnexus.redis_broker import RedisBroker
from toolnexus.security import Keyring, SigningKey

pytestmark = pytest.mark.redis

TOOLNEXUS = str(Path(sys.executable).with_name("toolnexus"))


def strict(redis_url: str, namespace: str, name: str = "strict-bot") -> RedisBroker:
    """A responder's broker that requires signatures and trusts none of the agents here."""
    broker = toolnexus.connect(
        redis_url, namespace=namespace, signing_key=SigningKey.generate(name),
        trusted_keys=Keyring.of(SigningKey.generate("someone-else")), require_signatures=True,
        **FAST,
    )  # fmt: skip
    assert isinstance(broker, RedisBroker)
    return broker


def plain(redis_url: str, namespace: str) -> RedisBroker:
    """A broker without signatures: an unsigned agent, or a group that requires none."""
    broker = toolnexus.connect(redis_url, namespace=namespace, **FAST)
    assert isinstance(broker, RedisBroker)
    return broker


@asynccontextmanager
async def reading(
    broker: RedisBroker, group: str, taken: list[str] | None = None
) -> AsyncIterator[None]:
    """Group ``group`` reads the queue meanwhile, accepting what it is shown (noting each
    request id in ``taken``)."""

    async def run() -> None:
        async with broker.responder(group) as requests:
            async for pending in requests:
                if taken is not None:
                    taken.append(pending.request.id)
                await pending.accept({"by": group})

    task = asyncio.create_task(run())
    try:
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def letters(broker: RedisBroker) -> list[dict[bytes, bytes]]:
    return [fields for _, fields in await broker.redis.xrange(broker.keys.dead)]


async def test_a_request_one_group_refuses_still_reaches_the_other_whose_answer_resolves_it(
    redis_url: str, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The issue's measurement: group ``strict`` requires signatures, group ``plain`` does
    not and is restarting (alive by its heartbeat, not reading). ``strict`` refuses the
    unsigned request; it stays in the stream, ``plain`` takes it when it is back, and its
    answer resolves the wait. The waiter saw the refusal at once, and did not take it as
    final while ``plain`` was alive."""
    caplog.set_level(logging.WARNING, logger="toolnexus")
    agent, a, b = (
        plain(redis_url, namespace),
        strict(redis_url, namespace),
        plain(redis_url, namespace),
    )
    async with agent, a, b, reading(a, "strict"):
        await b.heartbeat("plain", "restarting", ttl_s=60)
        request = ask("Deploy?")
        wait = asyncio.create_task(agent.wait_for(request, timeout_s=60))
        await eventually(
            lambda: "was refused by strict/" in caplog.text, "the waiter saw the refusal"
        )
        await eventually(lambda: "may still take it" in caplog.text, "the waiter judged it")
        assert "group(s) plain, alive on its queue, may still take it" in caplog.text
        (letter,) = await letters(agent)
        assert letter[b"group"] == b"strict" and letter[b"error"].endswith(
            b"refused: missing signature"
        )
        assert await agent.redis.xlen(agent.keys.requests) == 1  # still there for plain
        assert not wait.done() and not agent.refusal(request.id).done()
        taken: list[str] = []
        async with reading(b, "plain", taken):
            async with asyncio.timeout(20):
                answer = await wait
        assert answer.ok and answer.data == {"by": "plain"}
        assert taken == [request.id]
        assert len(await letters(agent)) == 1  # one dead letter: strict's own
        assert await agent.redis.xlen(agent.keys.requests) == 0  # resolved: gone for all


async def test_the_refusal_is_final_once_every_live_group_refused(
    redis_url: str, namespace: str
) -> None:
    agent = plain(redis_url, namespace)
    one, two = strict(redis_url, namespace, "one"), strict(redis_url, namespace, "two")
    async with agent, one, two, reading(one, "one"):
        await two.heartbeat("two", "starting", ttl_s=60)
        request = ask()
        wait = asyncio.create_task(agent.wait_for(request, timeout_s=60))
        refusal = agent.refusal(request.id)
        await eventually(_count(agent, 1), "group one's dead letter")
        await asyncio.sleep(0.5)
        assert not refusal.done()  # group two is alive and has not refused it
        async with reading(two, "two"):
            async with asyncio.timeout(20):
                refused = await refusal
        assert isinstance(refused, Refused) and refused.reason == "missing signature"
        assert refused.responder is not None and refused.responder.startswith("two/")
        assert not wait.done()  # the wait itself goes on: an operator may requeue it
        groups = sorted(letter[b"group"] for letter in await letters(agent))
        assert groups == [b"one", b"two"]  # one dead letter per group that refused it
        wait.cancel()
        await asyncio.gather(wait, return_exceptions=True)


def _count(broker: RedisBroker, n: int) -> Any:
    async def check() -> bool:
        return await broker.redis.xlen(broker.keys.dead) >= n

    return check


@pytest.mark.slow
async def test_ask_reports_a_refusal_and_takes_another_groups_answer(
    redis_url: str, namespace: str
) -> None:
    """``ask``: group ``strict`` refuses the unsigned request while group ``plain`` is alive
    but restarting; ``ask`` says so on stderr and waits on, and exits 0 with ``plain``'s
    answer once it is back (on the code before, 5: refused, the request gone)."""
    a, b = strict(redis_url, namespace), plain(redis_url, namespace)
    async with a, b, reading(a, "strict"):
        await b.heartbeat("plain", "restarting", ttl_s=60)
        env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLNEXUS_")}
        process = await asyncio.create_subprocess_exec(
            TOOLNEXUS, "ask", "Deploy?", "--timeout", "60", "--url", redis_url,
            "--namespace", namespace, env=env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        await eventually(_count(b, 1), "strict's dead letter")
        await asyncio.sleep(0.5)
        async with reading(b, "plain"):
            out, err = await asyncio.wait_for(process.communicate(), 60)
    said = err.decode()
    assert process.returncode == 0, said
    assert out.decode().strip() == '{"by": "plain"}'
    assert "was refused by strict/" in said
    assert "group(s) plain, alive on its queue, may still take it" in said


async def test_a_requeue_moves_an_entry_still_in_the_stream_and_never_copies_it(
    redis_url: str, namespace: str
) -> None:
    """Groups ``one`` and ``two`` refused the request (a dead letter each); group ``plain``
    has not read it yet. Requeueing ``one``'s dead letter moves the entry (one entry in the
    stream, at a new id); requeueing ``two``'s finds it there and adds nothing. ``plain``
    then reads the request once."""
    agent = plain(redis_url, namespace)
    one, two = strict(redis_url, namespace, "one"), strict(redis_url, namespace, "two")
    async with agent, one, two:
        redis_, stream = agent.redis, agent.keys.requests
        await redis_.xgroup_create(stream, "plain", id="0", mkstream=True)
        request = ask()
        wait = asyncio.create_task(agent.wait_for(request, timeout_s=60))
        await eventually(lambda: _length(agent, stream, 1), "the request published")
        for broker, group in ((one, "one"), (two, "two")):
            async with broker.responder(group, until_idle=True) as requests:
                assert [p async for p in requests] == []
        await eventually(_count(agent, 2), "a dead letter of each group")
        letter_one, letter_two = await agent.dead_letters()
        assert (letter_one.group, letter_two.group) == ("one", "two")
        entry = letter_one.entry
        assert letter_two.entry == entry
        assert [e.decode() for e, _ in await redis_.xrange(stream)] == [entry]  # kept
        moved = await requeue(agent, letter_one)
        assert moved is not None and moved != entry
        assert [e.decode() for e, _ in await redis_.xrange(stream)] == [moved]
        assert await requeue(agent, letter_two) == moved  # there already: nothing added
        assert [e.decode() for e, _ in await redis_.xrange(stream)] == [moved]
        assert await agent.dead_letters() == []
        taken: list[str] = []
        async with reading(agent, "plain", taken):
            async with asyncio.timeout(20):
                answer = await wait
        assert answer.ok and taken == [request.id]  # once, not once per copy


async def _length(broker: RedisBroker, key: str, n: int) -> bool:
    return await broker.redis.xlen(key) >= n
