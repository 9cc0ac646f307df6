"""The protocol numbers (issue #39): protocol 1 written as the previous release (56a6318)
wrote it, byte for byte; processes of either protocol answering each other, in the
request's protocol; a newer protocol refused by name without crashing anything; the
``write_protocol`` setting checked; ``status`` and ``check`` telling versions and
protocols, and who cannot talk to whom."""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest
import redis.asyncio as aioredis

import toolnexus
from helpers import eventually
from toolnexus import Answer, Request, new_id
from toolnexus.codec import JSON, MSGPACK
from toolnexus.errors import ConfigurationError, Refused
from toolnexus.frameworks import Ledger, tool_call_digest
from toolnexus.models import AnsweredEvent, Heartbeat, Quorum
from toolnexus.protocol import PROTOCOL, READS, version
from toolnexus.redis_broker import RedisBroker
from toolnexus.security import Keyring, SigningKey
from toolnexus.security._audit import decode_record
from toolnexus.settings import RedisSettings
from wire_layout import is_audit, round_trip

FAST = {"block_ms": 100, "lease_ms": 600}
TOOLNEXUS = str(Path(sys.executable).with_name("toolnexus"))
LAYOUT = Path(__file__).parent / "data" / "protocol1_layout.json"

# -- protocol 1: what the previous release wrote ---------------------------------------------

PREVIOUS_BYTES = [
    (
        Request(
            id="r-1",
            kind="approval",
            prompt="Refund?",
            data={"a": 1},
            created_at=1.5,
            expires_at=2.5,
            reply_to="agent-1.0123456789abcdef",
        ),
        "9201de0008a474797065a772657175657374a26964a3722d31a46b696e64a8617070726f76616ca670"
        "726f6d7074a7526566756e643fa46461746181a16101aa637265617465645f6174cb3ff8000000000000"
        "aa657870697265735f6174cb4004000000000000a87265706c795f746fb86167656e742d312e30313233"
        "343536373839616263646566",
        '[1,{"type":"request","id":"r-1","kind":"approval","prompt":"Refund?","data":{"a":1},'
        '"created_at":1.5,"expires_at":2.5,"reply_to":"agent-1.0123456789abcdef"}]',
    ),
    (
        Answer(id="r-1", ok=True, data={"x": 1}, answered_at=3.5, person="alice"),
        "920186a474797065a6616e73776572a26964a3722d31a26f6bc3a46461746181a17801a6706572736f6e"
        "a5616c696365ab616e7377657265645f6174cb400c000000000000",
        '[1,{"type":"answer","id":"r-1","ok":true,"data":{"x":1},"person":"alice",'
        '"answered_at":3.5}]',
    ),
    (
        AnsweredEvent(
            id="r-1",
            at=4.5,
            answer=Answer(id="r-1", ok=True, data={"x": 1}, answered_at=3.5, person="alice"),
        ),
        "920184a474797065a8616e737765726564a26964a3722d31a26174cb4012000000000000a6616e737765"
        "7286a474797065a6616e73776572a26964a3722d31a26f6bc3a46461746181a17801a6706572736f6ea5"
        "616c696365ab616e7377657265645f6174cb400c000000000000",
        '[1,{"type":"answered","id":"r-1","at":4.5,"answer":{"type":"answer","id":"r-1",'
        '"ok":true,"data":{"x":1},"person":"alice","answered_at":3.5}}]',
    ),
]
"""Messages as 56a6318 encoded them (msgpack as hex, JSON), captured from that commit."""


@pytest.mark.parametrize(
    ("message", "packed", "text"), PREVIOUS_BYTES, ids=["request", "answer", "event"]
)
def test_protocol_1_messages_are_the_previous_releases_bytes(
    message: Any, packed: str, text: str
) -> None:
    assert MSGPACK.writing(1).encode(message).hex() == packed
    assert JSON.writing(1).encode(message).decode() == text
    # protocol 2 differs in its number alone, and both read either
    assert MSGPACK.encode(message) == bytes.fromhex("9202" + packed[4:])
    for codec in (MSGPACK, MSGPACK.writing(1)):
        assert codec.decode(bytes.fromhex(packed)) == message
        assert codec.decode_with_protocol(MSGPACK.encode(message)) == (2, message)


def _renumber(text: str, kind: str) -> str:
    """``text`` with its ``<kindN>`` placeholders numbered in the order they are met."""
    met: dict[str, str] = {}
    return re.sub(rf"<{kind}\d+>", lambda m: met.setdefault(m[0], f"<{kind}#{len(met)}>"), text)


def _previous(dump: dict[str, Any]) -> dict[str, Any]:
    """``dump`` without what this release adds to protocol 1 on purpose: a heartbeat's
    version and protocols (fields the previous release's decoder ignores); the group a
    dead letter names (one per group that refused the entry, which the previous release's
    listing reads by name and so ignores); the entry a durable state records (``entry``, which
    the previous release's scripts, reading fields by name, ignore); a quorum's audit votes
    in one order (the order the waiter took them in varies)."""
    text = json.dumps(dump, sort_keys=True)
    for kind in ("waiter", "entry"):  # numbered again as met here (audit streams left out)
        text = _renumber(text, kind)
    for added in ('"reads": [1, 2], ', '"version": "' + version() + '", ', ', "writes": 1'):
        text = text.replace(added, "")
    shown: dict[str, Any] = json.loads(text)
    for key, (_, entries) in shown.items():
        if ":r:" in key and isinstance(entries, dict):
            entries.pop("entry", None)
        if key.endswith(":dead"):
            for entry in entries:
                entry[:] = [field for field in entry if field[0] != "group"]
        if key.endswith(":audit"):
            for entry in entries:
                record = entry[0][1]["message"][1]
                record.get("votes", []).sort(key=json.dumps)
    return shown


async def test_protocol_1_leaves_in_redis_what_the_previous_release_left(
    redis_url: str, namespace: str
) -> None:
    """The round trip of ``wire_layout.round_trip`` (plain, durable, quorum, a signed
    refusal and its dead letter, heartbeats, liveness marks) with ``write_protocol=1``
    leaves the keys, fields, values and encoded messages 56a6318 left."""
    found = await round_trip(redis_url, namespace, write_protocol=1, audits=False)
    expected = json.loads(LAYOUT.read_text())
    records = sum(len(content) for key, (_, content) in expected.items() if is_audit(key))
    expected = {key: value for key, value in expected.items() if not is_audit(key)}
    assert _previous(json.loads(json.dumps(found))) == _previous(expected)
    # The records themselves moved on purpose (issue #41: each agent's own stream, the
    # responders' apart, which no other role may trim): as many, each readable.
    client = aioredis.Redis.from_url(redis_url)
    try:
        keys = [k.decode() async for k in client.scan_iter(match=f"*{namespace}*:audit*")]
        entries = [e for key in keys if is_audit(key) for e in await client.xrange(key)]
    finally:
        await client.aclose()
    assert len(entries) == records
    assert all(decode_record(fields[b"r"]) for _, fields in entries)


async def test_protocol_2_numbers_what_has_no_envelope(redis_url: str, namespace: str) -> None:
    """The same round trip in protocol 2: states, reply entries and dead letters carry
    ``p``, routes a third part, liveness marks the protocol and version, heartbeats the
    version and protocols; a refusal's fields are named as they are everywhere else."""
    found = await round_trip(redis_url, namespace)
    for key, (_, content) in found.items():
        if ":route:" in key:
            assert content.endswith(" 2"), (key, content)
        elif key.endswith(":alive"):
            assert content == f"2 {version()}"
        elif ":r:" in key:
            assert content["p"] == "2", key
        elif key.endswith(":answers") or key.endswith(":dead"):
            assert all(["p", "2"] in entry for entry in content), (key, content)
        elif key.endswith(":workers"):
            for beat in content.values():
                assert beat["envelope"] == "9202"
                body = beat["message"][1]
                assert (body["version"], body["reads"], body["writes"]) == (version(), [1, 2], 2)
    refusal = next(v for k, v in found.items() if k.endswith(":answers") and "x" not in str(v))
    fields = [name for name, _ in refusal[1][0]]
    assert fields == ["id", "w", "b", "k", "sig", "h", "p"]


# -- either protocol answers the other ----------------------------------------------------------


def _reply_entries(raw: list[Any], request_id: str) -> list[dict[bytes, bytes]]:
    return [fields for _, fields in raw if fields.get(b"id") == request_id.encode()]


@pytest.mark.parametrize("shape", ["plain", "durable", "quorum"])
@pytest.mark.parametrize(("agent_protocol", "responder_protocol"), [(1, 2), (2, 1), (2, 2)])
async def test_agents_and_responders_of_either_protocol_answer_each_other(
    redis_url: str, namespace: str, shape: str, agent_protocol: int, responder_protocol: int
) -> None:
    """An agent writing ``agent_protocol`` is answered by a responder writing
    ``responder_protocol``: the responder reads the request, and writes everything about
    it (answer, reply entry, events) in the request's protocol, which the agent reads."""
    options: dict[str, Any] = {"namespace": namespace, "agent": "agent-1", **FAST}
    async with (
        toolnexus.connect(redis_url, write_protocol=agent_protocol, **options) as agent,
        toolnexus.connect(redis_url, write_protocol=responder_protocol, **options) as other,
    ):
        assert isinstance(agent, RedisBroker) and isinstance(other, RedisBroker)
        quorum = Quorum(need=2) if shape == "quorum" else None
        request = Request(id=new_id(), kind="approval", prompt="Refund?", quorum=quorum)
        wait = asyncio.ensure_future(
            agent.wait_for(request, timeout_s=30, durable=shape == "durable")
        )
        responder = other.responder("staff", "alice")
        pending = await asyncio.wait_for(responder.__anext__(), 10)
        assert pending.protocol == agent_protocol
        for person in ["p0", "p1"] if quorum else ["alice"]:
            await pending.answer(Answer(id=request.id, ok=True, person=person))
        answer = await asyncio.wait_for(wait, 10)
        assert answer.ok and answer.id == request.id
        waiter = pending.request.reply_to
        assert waiter is not None
        entries = _reply_entries(await agent.redis.xrange(agent.keys.answers(waiter)), request.id)
        assert entries
        for fields in entries:
            assert MSGPACK.decode_with_protocol(fields[b"a"])[0] == agent_protocol
            assert fields.get(b"p") == (b"2" if agent_protocol == 2 else None)
        state = await agent.redis.hgetall(agent.keys.state(waiter, request.id))
        assert state.get(b"p") == (b"2" if agent_protocol == 2 else None)
        route = await agent.redis.get(agent.keys.route(request.id))
        assert route.endswith(b" 2") == (agent_protocol == 2)

        async def ended() -> bool:  # (the waiter's answered event goes out lazily)
            events = await agent.redis.xrange(agent.keys.events)
            return any(b'"answered"' in f[b"e"] or b"answered" in f[b"e"] for _, f in events)

        await eventually(ended, "the answered event")
        events = await agent.redis.xrange(agent.keys.events)
        assert {MSGPACK.decode_with_protocol(f[b"e"])[0] for _, f in events} == {agent_protocol}
        await responder.aclose()


@pytest.mark.parametrize(("agent_protocol", "responder_protocol"), [(1, 2), (2, 1)])
async def test_signed_requests_and_answers_verify_across_protocols(
    redis_url: str, namespace: str, agent_protocol: int, responder_protocol: int
) -> None:
    """With signatures required on both sides, a request signed in one protocol and its
    answer signed in the other verify: a request's signature covers its fields, not the
    envelope's number (a refusal's covers the bytes, its number with them)."""
    agent_key, responder_key = SigningKey.generate("agent-1"), SigningKey.generate("resp-1")
    common: dict[str, Any] = {"namespace": namespace, "require_signatures": True, **FAST}
    async with (
        toolnexus.connect(
            redis_url,
            write_protocol=agent_protocol,
            signing_key=agent_key,
            trusted_keys=Keyring.of(responder_key),
            **common,
        ) as agent,
        toolnexus.connect(
            redis_url,
            write_protocol=responder_protocol,
            signing_key=responder_key,
            trusted_keys=Keyring.of(agent_key),
            **common,
        ) as other,
    ):
        request = Request(id=new_id(), kind="approval", prompt="Ship it?")
        wait = asyncio.ensure_future(agent.wait_for(request, timeout_s=30))
        responder = other.responder("staff", "alice")
        pending = await asyncio.wait_for(responder.__anext__(), 10)
        assert pending.protocol == agent_protocol and pending.signer == "agent-1"
        await pending.answer(Answer(id=request.id, ok=True))
        answer = await asyncio.wait_for(wait, 10)
        assert answer.ok and answer.responder == "resp-1"
        await responder.aclose()


@pytest.mark.parametrize("agent_protocol", READS)
async def test_a_refusal_is_written_in_the_requests_protocol_and_verifies(
    redis_url: str, namespace: str, agent_protocol: int
) -> None:
    """A responder that requires signatures refuses an unsigned request in the request's
    protocol (protocol 2's field names: w, b, k, sig, h, p), signed; the agent, trusting
    its key, takes the refusal as verified."""
    key = SigningKey.generate("resp-1")
    async with (
        toolnexus.connect(
            redis_url,
            namespace=namespace,
            write_protocol=agent_protocol,
            trusted_keys=Keyring.of(key),
            **FAST,
        ) as agent,
        toolnexus.connect(
            redis_url,
            namespace=namespace,
            signing_key=key,
            trusted_keys=Keyring.of(key),
            require_signatures=True,
            **FAST,
        ) as strict,
    ):
        assert isinstance(agent, RedisBroker)
        request = Request(id=new_id(), kind="approval", prompt="?")
        refused = agent.refusal(request.id)
        wait = asyncio.ensure_future(agent.wait_for(request, timeout_s=30))
        responder = strict.responder("strict", "bob")
        reading = asyncio.ensure_future(responder.__anext__())
        said = await asyncio.wait_for(refused, 10)
        assert isinstance(said, Refused)
        assert "missing signature" in str(said) and "unverified" not in str(said)
        raw = _reply_entries(
            await agent.redis.xrange(agent.keys.answers(agent.waiter_id)), request.id
        )
        names = [name.decode() for name in raw[0]]
        expected = {1: ["id", "x", "b", "k", "s", "d"], 2: ["id", "w", "b", "k", "sig", "h", "p"]}
        assert names == expected[agent_protocol]
        for task in (reading, wait):
            task.cancel()
        await asyncio.gather(reading, wait, return_exceptions=True)
        await responder.aclose()


# -- a newer protocol ---------------------------------------------------------------------------

NEWER = "protocol 3 is newer than this toolnexus reads (1, 2): upgrade this process"


async def test_a_request_of_a_newer_protocol_is_refused_by_name_and_reading_goes_on(
    redis_url: str, namespace: str
) -> None:
    async with (
        toolnexus.connect(redis_url, namespace=namespace, **FAST) as agent,
        toolnexus.connect(redis_url, namespace=namespace, **FAST) as other,
    ):
        assert isinstance(agent, RedisBroker)
        request = Request(id=new_id(), kind="approval", prompt="From the future?")
        refused = agent.refusal(request.id)
        wait = asyncio.ensure_future(agent.wait_for(request, timeout_s=30))
        redis_, stream = agent.redis, agent.keys.requests

        async def published() -> bool:
            return bool(await redis_.xlen(stream))

        await eventually(published, "the request published")
        ((entry_id, fields),) = await redis_.xrange(stream)
        assert fields[b"r"][:2] == b"\x92\x02"
        await redis_.xdel(stream, entry_id)
        await redis_.xadd(stream, {b"r": b"\x92\x03" + fields[b"r"][2:]})
        responder = other.responder("staff", "alice")
        reading = asyncio.ensure_future(responder.__anext__())
        said = await asyncio.wait_for(refused, 10)
        assert isinstance(said, Refused) and NEWER in str(said)
        assert any(NEWER in letter.error for letter in await agent.dead_letters())
        assert not wait.done()  # another group may still read it
        later = Request(id=new_id(), kind="approval", prompt="Now?")
        answering = asyncio.ensure_future(agent.wait_for(later, timeout_s=30))
        pending = await asyncio.wait_for(reading, 10)  # the responder read on
        assert pending.request.id == later.id
        await pending.answer(Answer(id=later.id, ok=True))
        assert (await asyncio.wait_for(answering, 10)).ok
        wait.cancel()
        await asyncio.gather(wait, return_exceptions=True)
        await responder.aclose()


async def test_a_reply_of_a_newer_protocol_is_dead_lettered_and_the_wait_goes_on(
    redis_url: str, namespace: str
) -> None:
    async with (
        toolnexus.connect(redis_url, namespace=namespace, **FAST) as agent,
        toolnexus.connect(redis_url, namespace=namespace, **FAST) as other,
    ):
        assert isinstance(agent, RedisBroker)
        request = Request(id=new_id(), kind="approval", prompt="?")
        wait = asyncio.ensure_future(agent.wait_for(request, timeout_s=30))
        newer = MSGPACK.encode(Answer(id=request.id, ok=False, reason="declined"))
        await agent.redis.xadd(
            agent.keys.answers(agent.waiter_id), {"id": request.id, "a": newer, "p": "3"}
        )

        async def dead_lettered() -> bool:
            return any(NEWER in letter.error for letter in await agent.dead_letters())

        await eventually(dead_lettered, "the newer reply dead-lettered")
        assert not wait.done()
        responder = other.responder("staff", "alice")
        pending = await asyncio.wait_for(responder.__anext__(), 10)
        await pending.answer(Answer(id=request.id, ok=True))
        assert (await asyncio.wait_for(wait, 10)).ok
        await responder.aclose()


# -- the write_protocol setting -----------------------------------------------------------------


@pytest.mark.parametrize("bad", [0, 3, "2x", True, None, 2.0])
def test_write_protocol_other_than_1_or_2_is_a_configuration_error(bad: Any) -> None:
    with pytest.raises(ConfigurationError, match=r"write_protocol=.* give 1 or 2"):
        RedisSettings(write_protocol=bad)
    with pytest.raises(ConfigurationError, match=r"write_protocol=.* give 1 or 2"):
        toolnexus.connect("redis://127.0.0.1:6379/0", write_protocol=bad)
    if bad is not None:
        with pytest.raises(ConfigurationError, match=r"write_protocol=.* give 1 or 2"):
            toolnexus.connect("memory://", write_protocol=bad)


def test_write_protocol_comes_from_the_environment_else_2(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("TOOLNEXUS_WRITE_PROTOCOL", raising=False)
    assert RedisSettings().write_protocol == PROTOCOL == 2
    monkeypatch.setenv("TOOLNEXUS_WRITE_PROTOCOL", "1")
    assert RedisSettings().write_protocol == 1
    broker = toolnexus.connect("redis://127.0.0.1:6379/0")
    assert isinstance(broker, RedisBroker) and broker.codec.protocol == 1
    assert RedisSettings(write_protocol=2).write_protocol == 2
    assert toolnexus.connect("memory://", write_protocol=1) is not None
    monkeypatch.setenv("TOOLNEXUS_WRITE_PROTOCOL", "9")
    with pytest.raises(ConfigurationError, match=r"TOOLNEXUS_WRITE_PROTOCOL='9' .* give 1 or 2"):
        RedisSettings()


async def _run(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TOOLNEXUS_")}
    process = await asyncio.create_subprocess_exec(
        TOOLNEXUS,
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**clean, **(env or {})},
    )
    async with asyncio.timeout(60):
        out, err = await process.communicate()
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def test_a_bad_write_protocol_on_the_command_line_is_named_without_a_traceback(
    redis_url: str, namespace: str
) -> None:
    args = ["--url", redis_url, "--namespace", namespace]
    code, _, err = await _run("ask", "--write-protocol", "3", *args, "Ship it?")
    assert code == 2 and "--write-protocol='3' is not a protocol" in err
    assert "Traceback" not in err
    code, _, err = await _run(
        "ask", *args, "--timeout", "1", "Ship it?", env={"TOOLNEXUS_WRITE_PROTOCOL": "x"}
    )
    assert code != 0 and "TOOLNEXUS_WRITE_PROTOCOL='x' is not a protocol" in err
    assert "Traceback" not in err
    code, out, err = await _run("worker", "auto", "--help")
    assert code == 0 and "--write-protocol" in out, err


# -- status and check ---------------------------------------------------------------------------


async def test_status_shows_versions_and_protocols_and_check_names_who_cannot_talk(
    redis_url: str, namespace: str
) -> None:
    """A responder writing protocol 2 and an agent writing protocol 1 (what a previous
    release's agent looks like): status shows both, check fails naming them and what to
    set. A responder of the previous release (a heartbeat without version) and an agent
    writing 2: check says to upgrade the responder first. Protocol 1 everywhere: ok."""
    args = ["--url", redis_url, "--namespace", namespace]
    common = {"namespace": namespace, **FAST}
    async with (
        toolnexus.connect(redis_url, write_protocol=1, **common) as old_agent,
        toolnexus.connect(redis_url, write_protocol=2, **common) as new_worker,
    ):
        assert isinstance(old_agent, RedisBroker)
        waiting = asyncio.ensure_future(old_agent.wait_for(Request(id=new_id(), kind="x")))
        await new_worker.heartbeat("auto", "c1", ttl_s=60)

        async def marked() -> bool:
            return bool(await old_agent.redis.exists(old_agent.keys.alive(old_agent.waiter_id)))

        await eventually(marked, "the agent's liveness mark")
        code, out, _ = await _run("status", "--json", *args)
        assert code == 0
        shown = json.loads(out)
        assert shown["waiters"] == [{"version": "previous", "writes": 1, "alive": 1}]
        (consumer,) = shown["queues"][0]["groups"][0]["consumers"]
        assert (consumer["version"], consumer["reads"], consumer["writes"]) == (
            version(),
            [1, 2],
            2,
        )
        code, out, _ = await _run("status", *args)
        assert "c1: holds 0, idle -, heartbeat" in out and f"{version()} reads 1,2 writes 2" in out
        assert " · 1 previous writing protocol 1" in out.splitlines()[0]
        assert "cannot talk: responder auto/c1" in out
        code, _, err = await _run("check", *args)
        assert code == 1
        assert "responder auto/c1 (" + version() + ") writes protocol 2" in err
        assert "set write_protocol=1 on the responder" in err

        # the same worker writing protocol 1: nothing to say
        async with toolnexus.connect(redis_url, write_protocol=1, **common) as same:
            await same.heartbeat("auto", "c1", ttl_s=60)
        code, out, err = await _run("check", *args)
        assert code == 0, err

        # a responder of the previous release, and an agent writing 2
        previous = msgspec.msgpack.encode(
            [1, Heartbeat("legacy", "c9", 1.0, 4e9, {"worker": "auto"})]
        )
        await old_agent.redis.hset(old_agent.keys.heartbeats(), "legacy/c9", previous)
        async with toolnexus.connect(redis_url, write_protocol=2, **common) as new_agent:
            asked = asyncio.ensure_future(new_agent.wait_for(Request(id=new_id(), kind="x")))
            await asyncio.sleep(0.3)
            code, _, err = await _run("check", *args)
            asked.cancel()
            await asyncio.gather(asked, return_exceptions=True)
        assert code == 1
        assert "responder legacy/c9 (previous) reads protocol 1, but 1 waiting process(es)" in err
        assert "upgrade the responder first, or set write_protocol=1 on those agents" in err
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)


# -- records an agent keeps in its stores -------------------------------------------------------


@pytest.mark.parametrize("protocol", READS)
async def test_a_ledgers_records_carry_their_protocol_and_a_newer_one_counts_as_none(
    protocol: int, caplog: pytest.LogCaptureFixture
) -> None:
    """A tool-call ledger written in protocol 1 is what the previous release wrote (no
    number); in protocol 2 its entries and claims carry it. Either is read; an entry of a
    newer protocol counts as none, and says so."""
    async with toolnexus.connect("memory://", write_protocol=protocol) as broker:
        ledger = Ledger.of(broker)
        assert ledger.protocol == protocol
        approved = tool_call_digest("refund", {"amount": 42})
        await ledger.store.set("r-1", json.dumps({"approved": approved}), ttl_s=60)
        digest = await ledger.executing("r-1", "refund", {"amount": 42})
        claim = json.loads(await ledger.store.get("r-1:executed") or b"")
        assert claim.get("protocol") == (2 if protocol == 2 else None)
        assert await ledger.get("r-1") == {"approved": approved, "executed": digest}
        for number in ("1", "2"):
            entry = {"approved": "x", "protocol": number}
            await ledger.store.set(f"e-{number}", json.dumps(entry), ttl_s=60)
            assert await ledger.get(f"e-{number}") == {"approved": "x"}
        await ledger.store.set("e-3", json.dumps({"approved": "x", "protocol": "3"}), ttl_s=60)
        assert await ledger.get("e-3") == {}
        assert NEWER in caplog.text


async def test_a_heartbeat_of_a_newer_protocol_is_left_for_newer_readers(
    redis_url: str, namespace: str
) -> None:
    """Reading heartbeats deletes stale and unreadable ones, not one of a newer protocol
    (the previous release deleted those: a newer worker's heartbeat must outlive this
    release's readers)."""
    async with toolnexus.connect(redis_url, namespace=namespace, **FAST) as broker:
        assert isinstance(broker, RedisBroker)
        key = broker.keys.heartbeats()
        newer = msgspec.msgpack.encode([3, Heartbeat("next", "c1", 1.0, 4e9, {})])
        await broker.redis.hset(key, mapping={"next/c1": newer, "junk/c2": b"\x92\x01junk"})
        await broker.heartbeat("auto", "c1", ttl_s=60)
        assert [f"{b.group}/{b.consumer}" for b in await broker.heartbeats()] == ["auto/c1"]
        assert sorted(await broker.redis.hkeys(key)) == [b"auto/c1", b"next/c1"]
