"""Worker stores (``broker.store(name)``): a named map of keys to bytes that expires as a
whole, the same on both brokers; on Redis one hash in the queue's slot, retried by the
broker's own policy while Redis is away."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time

import pytest
from redis.crc import key_slot

import toolnexus
from conftest import FAST, RedisServer
from toolnexus import Broker, BrokerUnavailable, ConfigurationError
from toolnexus._broker import MAX_STORE_VALUE_BYTES
from toolnexus.errors import BrokerClosed
from toolnexus.keys import Keys
from toolnexus.redis_broker import RedisBroker

pytestmark = pytest.mark.timeout(60)


async def test_a_store_keeps_bytes_and_text_by_key_and_forgets_on_delete(broker: Broker) -> None:
    store = broker.store("bot")
    assert await store.get("req-1") is None and await store.items() == {}
    await store.set("req-1", '{"channel": "C1"}', ttl_s=60)
    await store.set("req-2", b"\x00\xffraw", ttl_s=60)
    await store.set("réq-3", "naïve ✓", ttl_s=60)
    assert await store.get("req-1") == b'{"channel": "C1"}'
    assert await broker.store("bot").get("req-2") == b"\x00\xffraw"  # one name, one store
    assert await broker.store("other").items() == {}  # another name, another store
    assert await store.items() == {
        "req-1": b'{"channel": "C1"}',
        "req-2": b"\x00\xffraw",
        "réq-3": "naïve ✓".encode(),
    }
    await store.set("req-1", "again", ttl_s=60)
    assert await store.get("req-1") == b"again"
    await store.delete("req-1")
    await store.delete("never-set")  # nothing to forget: no error
    assert await store.get("req-1") is None
    assert sorted(await store.items()) == ["req-2", "réq-3"]
    assert repr(store).endswith("'bot'>")


async def test_a_claim_keeps_the_first_value_only_and_says_who_won(broker: Broker) -> None:
    store = broker.store("claims")
    won = await asyncio.gather(*(store.claim("call-1", f"by-{n}", ttl_s=60) for n in range(8)))
    assert won.count(True) == 1
    winner = f"by-{won.index(True)}"
    assert await store.get("call-1") == winner.encode()
    assert await store.claim("call-1", winner, ttl_s=60)  # the winner's claim, retried: still won
    assert not await store.claim("call-1", "late", ttl_s=60)
    assert await store.get("call-1") == winner.encode()  # a lost claim changes nothing
    await store.delete("call-1")
    assert await store.claim("call-1", "late", ttl_s=60)  # forgotten: claimable again
    with pytest.raises(ConfigurationError, match="a store value must be bytes or str"):
        await store.claim("call-2", 7, ttl_s=60)  # type: ignore[arg-type]


async def test_a_replacement_takes_only_the_exact_value_read_and_says_who_won(
    broker: Broker,
) -> None:
    store = broker.store("claims")
    await store.set("call-1", b"\x00forged", ttl_s=60)
    won = await asyncio.gather(
        *(store.replace("call-1", b"\x00forged", f"by-{n}", ttl_s=60) for n in range(8))
    )
    assert won.count(True) == 1, won
    winner = f"by-{won.index(True)}"
    assert await store.get("call-1") == winner.encode()
    # the winner's replacement, retried: still won; a stale one changes nothing
    assert await store.replace("call-1", b"\x00forged", winner, ttl_s=60)
    assert not await store.replace("call-1", b"\x00forged", "late", ttl_s=60)
    assert not await store.replace("call-1", b"\x00forge", "late", ttl_s=60)  # a prefix
    assert await store.get("call-1") == winner.encode()
    assert not await store.replace("never-set", "", "late", ttl_s=60)  # nothing to replace
    assert await store.get("never-set") is None
    # what was read may be longer than a value set keeps (another writer's): still replaced
    huge = b"x" * (MAX_STORE_VALUE_BYTES + 1)
    assert await store.replace("call-1", winner, "text ✓", ttl_s=60)
    assert await store.replace("call-1", "text ✓", b"next", ttl_s=60)
    assert not await store.replace("call-1", huge, b"other", ttl_s=60)
    with pytest.raises(ConfigurationError, match="a store value must be bytes or str, not int"):
        await store.replace("call-1", 7, "v", ttl_s=60)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="at most 65536"):
        await store.replace("call-1", b"next", huge, ttl_s=60)
    with pytest.raises(ConfigurationError, match="ttl_s"):
        await store.replace("call-1", b"next", b"v", ttl_s=0)
    assert await store.get("call-1") == b"next"


@pytest.mark.redis
async def test_on_redis_a_replaced_value_may_be_one_a_store_would_not_keep(
    redis_url: str, namespace: str
) -> None:
    """Whoever may write Redis can leave a value longer than a store keeps: a replacement
    of exactly those bytes still works (and extends the store's TTL as a write does)."""
    async with toolnexus.connect(redis_url, namespace=namespace, **FAST) as broker:
        assert isinstance(broker, RedisBroker)
        store = broker.store("claims")
        huge = b"\xff" * (MAX_STORE_VALUE_BYTES * 2)
        key = Keys(namespace, "default").store("claims")
        await broker.redis.hset(key, "call-1", huge)
        await broker.redis.expire(key, 5)
        assert await store.replace("call-1", huge, "ours", ttl_s=600)
        assert await broker.redis.ttl(key) > 500
        assert await store.get("call-1") == b"ours"


@pytest.mark.redis
async def test_on_redis_brokers_racing_for_one_claim_have_one_winner(
    redis_url: str, namespace: str
) -> None:
    """As processes would: each claimer on a broker (connections) of its own."""
    async with contextlib.AsyncExitStack() as stack:
        brokers = [
            await stack.enter_async_context(toolnexus.connect(redis_url, namespace=namespace))
            for _ in range(6)
        ]
        for _ in range(5):  # a few rounds: the race is not decided by who starts first
            key = f"call-{time.monotonic_ns()}"
            won = await asyncio.gather(
                *(b.store("claims").claim(key, f"by-{n}", ttl_s=60) for n, b in enumerate(brokers))
            )
            assert won.count(True) == 1, won
            assert await brokers[0].store("claims").get(key) == f"by-{won.index(True)}".encode()


@pytest.mark.slow
async def test_a_store_expires_as_a_whole_and_a_write_never_shortens_it(broker: Broker) -> None:
    short, extended = broker.store("short"), broker.store("extended")
    await short.set("a", "1", ttl_s=0.2)  # whole seconds, rounded up: at least 1 s
    await extended.set("a", "1", ttl_s=0.5)
    await extended.set("b", "2", ttl_s=30)  # extends the whole store
    await extended.set("c", "3", ttl_s=1)  # does not shorten it
    assert await short.get("a") == b"1"
    await asyncio.sleep(1.3)
    assert await short.get("a") is None and await short.items() == {}
    assert sorted(await extended.items()) == ["a", "b", "c"]


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda s: s.get(""), "a store key must be a string of 1 to 1000 characters"),
        (lambda s: s.delete("k" * 1001), "a store key must be a string of 1 to 1000"),
        (lambda s: s.get("\ud800"), "store key"),
        (lambda s: s.set("k", 7, ttl_s=1), "a store value must be bytes or str, not int"),
        (lambda s: s.set("k", "\ud800", ttl_s=1), "store value of 'k'"),
        (lambda s: s.set("k", b"x" * (MAX_STORE_VALUE_BYTES + 1), ttl_s=1), "at most 65536"),
        (lambda s: s.set("k", "v", ttl_s=0), "ttl_s"),
        (lambda s: s.set("k", "v", ttl_s=math.nan), "ttl_s"),
    ],
)
async def test_bad_keys_values_and_ttls_are_refused_by_name(
    broker: Broker, call: object, match: str
) -> None:
    store = broker.store("bot")
    with pytest.raises(ConfigurationError, match=match):
        await call(store)  # type: ignore[operator]
    assert await store.items() == {}


@pytest.mark.parametrize("name", ["", "a:b", "{x}", "a b"])
def test_a_store_name_that_cannot_be_part_of_a_key_is_refused(broker: Broker, name: str) -> None:
    with pytest.raises(ConfigurationError, match="store name"):
        broker.store(name)


@pytest.mark.redis
async def test_on_redis_a_store_is_one_hash_in_the_queues_slot_with_a_ttl(
    redis_url: str, namespace: str
) -> None:
    async with toolnexus.connect(redis_url, namespace=namespace, queue="q1", **FAST) as broker:
        assert isinstance(broker, RedisBroker)
        key = Keys(namespace, "q1").store("slack")
        assert key == f"{{{namespace}:q:q1}}:store:slack"
        assert key_slot(key.encode()) == key_slot(broker.keys.requests.encode())
        await broker.store("slack").set("req-1", "{}", ttl_s=3600)
        assert await broker.redis.hgetall(key) == {b"req-1": b"{}"}
        assert 3590 < await broker.redis.ttl(key) <= 3600
        await broker.store("slack").set("req-2", "{}", ttl_s=60)
        assert await broker.redis.ttl(key) > 3590  # not shortened
        # what Redis holds is untrusted: a field nobody could ask for is left out
        await broker.redis.hset(key, b"\xff\xfe", b"garbage")
        assert sorted(await broker.store("slack").items()) == ["req-1", "req-2"]


async def test_an_agent_store_is_apart_from_the_queues_store_of_that_name(
    broker: Broker,
) -> None:
    await broker.store("tasks").set("k", "queue's", ttl_s=60)
    await broker.store("tasks", agent=True).set("k", "agent's", ttl_s=60)
    assert await broker.store("tasks").get("k") == b"queue's"
    assert await broker.store("tasks", agent=True).get("k") == b"agent's"


@pytest.mark.redis
async def test_on_redis_an_agent_store_lies_among_the_agents_own_waiter_keys(
    redis_url: str, namespace: str
) -> None:
    async with toolnexus.connect(
        redis_url, namespace=namespace, queue="q1", agent="agent-7", **FAST
    ) as broker:
        assert isinstance(broker, RedisBroker)
        key = Keys(namespace, "q1").agent_store("agent-7", "mcp-tasks")
        assert key == f"{{{namespace}:w:{broker.keys.durable_waiter('agent-7')}}}:store:mcp-tasks"
        assert key.startswith(f"{{{namespace}:w:agent-7.")  # its ACL pattern {ns:w:agent-7.*}
        await broker.store("mcp-tasks", agent=True).set("call", "{}", ttl_s=60)
        assert await broker.redis.hgetall(key) == {b"call": b"{}"}


@pytest.mark.slow
@pytest.mark.redis
async def test_a_store_call_waits_out_a_short_outage_then_says_unavailable(
    redis_server: RedisServer,
) -> None:
    options = {**FAST, "answer_patience_s": 1.0, "connect_timeout_s": 0.5}
    async with toolnexus.connect(redis_server.url, **options) as broker:
        store = broker.store("bot")
        await store.set("req-1", "kept", ttl_s=60)
        redis_server.stop()
        restarted = asyncio.get_running_loop().run_in_executor(None, _restart, redis_server, 0.4)
        assert await store.get("req-1") == b"kept"  # retried until Redis was back (AOF)
        await restarted
        redis_server.kill()
        started = time.monotonic()
        with pytest.raises(BrokerUnavailable, match="store 'bot': reading 'req-1'"):
            await store.get("req-1")
        assert 0.9 < time.monotonic() - started < 10  # retried for answer_patience_s
    with pytest.raises(BrokerClosed):
        broker.store("bot")
    with pytest.raises(BrokerClosed):
        await store.get("req-1")


def _restart(server: RedisServer, after_s: float) -> None:
    time.sleep(after_s)
    server.start()
