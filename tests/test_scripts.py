"""The resolve script on one server settles the entry of the request it resolves: the
entry is acknowledged and deleted once the request is no longer open, and left alone
while it is (an answer too late, or to a waiter gone, is ended by the responder). The
settle script acknowledges each item's entry for that item's group. The dead-letter script
settles an entry for the refusing group only: one dead letter per group, the entry kept."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from toolnexus.keys import Keys
from toolnexus.redis_broker._scripts import DEAD_LETTER, RESOLVE, SETTLE

pytestmark = pytest.mark.redis

WAITER = "0123456789abcdef"
GROUP = "g"


@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    redis_ = aioredis.Redis.from_url(redis_url)
    yield redis_
    await redis_.aclose()


async def test_resolve_settles_the_entry_unless_the_request_stays_open(
    client: aioredis.Redis, namespace: str
) -> None:
    keys = Keys(namespace, "default")
    await client.xgroup_create(keys.requests, GROUP, id="0", mkstream=True)
    entries = {}
    for name in ("open", "late", "unknown", "resolved"):
        entries[name] = (await client.xadd(keys.requests, {"r": name})).decode()
    await client.xreadgroup(GROUP, "c", {keys.requests: ">"})
    await client.set(keys.alive(WAITER), "1")
    now_ms = int(time.time() * 1000)
    for name, deadline in (("open", now_ms + 60_000), ("late", now_ms - 1)):
        await client.hset(keys.state(WAITER, name), mapping={"s": "open", "x": deadline})
    await client.hset(keys.state(WAITER, "resolved"), mapping={"s": "expired", "a": "before"})

    names = list(entries)
    args: list[str | int] = [60_000, 1]
    for name in names:
        args += ["answered", f"answer to {name}", name, GROUP, entries[name], 0]
    state_keys = [keys.state(WAITER, name) for name in names]
    shared = [keys.answers(WAITER), keys.alive(WAITER), keys.requests]
    replies = await client.eval(RESOLVE.source, 3 + len(names), *shared, *state_keys, *args)

    assert replies == [
        [1, b"ok"],
        [0, b"late"],
        [1, b"unknown"],
        [1, b"expired", b"before"],
    ]
    left = [entry_id.decode() for entry_id, _ in await client.xrange(keys.requests)]
    assert left == [entries["late"]]  # still open: the only entry neither acked nor gone
    pending = await client.xpending_range(keys.requests, GROUP, "-", "+", 10)
    assert [p["message_id"].decode() for p in pending] == [entries["late"]]
    assert await client.hget(keys.state(WAITER, "open"), "s") == b"answered"

    # Without settle (a Cluster's form: the request stream is on another slot), the
    # same script leaves every entry to the caller.
    late = await client.eval(
        RESOLVE.source,
        3,
        keys.answers(WAITER),
        keys.alive(WAITER),
        keys.state(WAITER, "late"),
        60_000,
        0,
        "expired",
        "ended",
        "late",
        "",
        "",
        0,
    )
    assert late == [[0, b"ok"]]
    assert len(await client.xrange(keys.requests)) == 1


async def test_settle_acknowledges_each_entry_for_its_own_group(
    client: aioredis.Redis, namespace: str
) -> None:
    keys = Keys(namespace, "default")
    ids = [(await client.xadd(keys.requests, {"r": str(i)})).decode() for i in range(3)]
    for group in ("g1", "g2"):
        await client.xgroup_create(keys.requests, group, id="0")
        await client.xreadgroup(group, "c", {keys.requests: ">"})
    items = [
        ("", "g1", ids[0], ids[0], ""),  # acknowledged for g1 and deleted
        ("event", "g2", ids[1], "", "record"),  # acknowledged for g2, kept
        ("", "g1", ids[2], "", ""),  # acknowledged for g1, kept
    ]
    args = [arg for item in items for arg in item]
    shared = (keys.events, keys.requests, keys.responder_audit)
    assert await client.eval(SETTLE.source, 3, *shared, 0, 60_000, 0, 100, *args) == 3

    left = [entry_id.decode() for entry_id, _ in await client.xrange(keys.requests)]
    assert left == ids[1:]
    g1 = await client.xpending_range(keys.requests, "g1", "-", "+", 10)
    g2 = await client.xpending_range(keys.requests, "g2", "-", "+", 10)
    assert [p["message_id"].decode() for p in g1] == [ids[1]]  # g1 never acked it
    # nor g2 these (a deleted entry stays in the lists of groups that did not ack it)
    assert [p["message_id"].decode() for p in g2] == [ids[0], ids[2]]
    assert [f for _, f in await client.xrange(keys.events)] == [{b"e": b"event"}]
    assert [f for _, f in await client.xrange(keys.responder_audit)] == [{b"r": b"record"}]


async def test_dead_letter_settles_for_the_refusing_group_only_once_each(
    client: aioredis.Redis, namespace: str
) -> None:
    keys = Keys(namespace, "default")
    entry = (await client.xadd(keys.requests, {"r": "garbage"})).decode()
    for group in ("g1", "g2", "g3"):
        await client.xgroup_create(keys.requests, group, id="0")
        await client.xreadgroup(group, "c", {keys.requests: ">"})
    shared = (keys.dead, keys.requests)
    # g1 twice in one batch (two consumers, a reclaim) and once more: one dead letter
    items = [(entry, "g1", "bad", "r=garbage")] * 2 + [(entry, "g2", "bad", "r=garbage")]
    args = [arg for item in items for arg in item]
    assert await client.eval(DEAD_LETTER.source, 2, *shared, 100, 1, *args) == [1, 0, 1]
    assert await client.eval(DEAD_LETTER.source, 2, *shared, 100, 1, *items[0]) == [0]

    dead = [f for _, f in await client.xrange(keys.dead)]
    assert [(f[b"group"], f[b"entry"].decode()) for f in dead] == [(b"g1", entry), (b"g2", entry)]
    assert [e.decode() for e, _ in await client.xrange(keys.requests)] == [entry]  # kept
    for group, held in (("g1", 0), ("g2", 0), ("g3", 1)):  # g3 still holds it: its own call
        assert (await client.xpending(keys.requests, group))["pending"] == held
