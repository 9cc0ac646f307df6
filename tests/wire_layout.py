"""What a round trip leaves in Redis, in a form that compares across releases: the
scenario :func:`round_trip` (a plain request answered, a durable one answered, a quorum's
two votes, an unsigned request refused by a responder that requires signatures, a
heartbeat) and :func:`dump`, every key of a namespace with what varies from run to run
(times, entry ids, the waiter's random part, signatures) replaced by a placeholder.

``tests/data/protocol1_layout.json`` is :func:`dump` of :func:`round_trip` run on the
previous release (56a6318, before the protocol had a number); ``test_protocol.py`` checks
that this release with ``write_protocol=1`` leaves the same."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import msgspec
import redis.asyncio as aioredis

import toolnexus
from toolnexus.models import Answer, Quorum, Request, Source
from toolnexus.security import Keyring, SigningKey

TIMES = frozenset({"created_at", "answered_at", "at", "expires_at", "resolved_at"})
"""Fields of a message that hold a time (replaced by ``<t>``)."""

VARYING = frozenset({"sig", "digest", "pid", "host"})
"""Fields that vary from run to run otherwise (signatures, digests of bytes with times)."""


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {
            k: "<t>" if k in TIMES else "<v>" if k in VARYING else _plain(v)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, bytes):
        return _bytes(value)
    return value


def _bytes(raw: bytes) -> Any:
    """A value from Redis: an encoded message as its envelope's first bytes and its
    decoded content, else its text."""
    if raw[:1] in (b"\x92", b"["):
        try:
            decoded = (msgspec.json if raw[:1] == b"[" else msgspec.msgpack).decode(raw)
        except msgspec.DecodeError:
            decoded = None
        if isinstance(decoded, list) and len(decoded) == 2:
            return {"envelope": raw[:2].hex(), "message": _plain(decoded)}
    try:
        return raw.decode()
    except UnicodeDecodeError:
        return f"<{len(raw)} bytes>"


class _Names:
    """Replaces what varies in names and values: entry ids, waiter ids, Unix ms."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self.entries: dict[str, str] = {}
        self.waiters: dict[str, str] = {}

    def text(self, value: str) -> str:
        value = value.replace(self.namespace, "<ns>")

        def waiter(match: re.Match[str]) -> str:
            return self.waiters.setdefault(match.group(0), f"<waiter{len(self.waiters)}>")

        def entry(match: re.Match[str]) -> str:
            return self.entries.setdefault(match.group(0), f"<entry{len(self.entries)}>")

        value = re.sub(r"agent-1\.[0-9a-f]{16}", waiter, value)
        value = re.sub(r"\b1\d{12}-\d+\b", entry, value)
        return re.sub(r"^1\d{12}$", "<ms>", value)

    def value(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {self.text(k): self.value(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.value(v) for v in value]
        return value


def is_audit(key: str) -> bool:
    """Whether ``key`` is an audit stream: the queue's (the previous release's one home of
    the records), the responders' or an agent's own (where this release keeps them)."""
    return key.endswith("}:audit") or key.endswith("}:audit:responders")


async def dump(url: str, namespace: str, *, audits: bool = True) -> dict[str, Any]:
    """Every key of ``namespace``: its type and content, what varies replaced; without
    the audit streams (:func:`is_audit`) unless ``audits``."""
    client = aioredis.Redis.from_url(url)
    names = _Names(namespace)
    found: dict[str, Any] = {}
    try:
        keys = sorted([k async for k in client.scan_iter(match=f"*{namespace}*", count=10_000)])
        keys = [k for k in keys if audits or not is_audit(k.decode())]
        for key in keys:
            kind = (await client.type(key)).decode()
            content: Any
            if kind == "string":
                content = _bytes(await client.get(key))
            elif kind == "hash":
                raw = await client.hgetall(key)
                content = {k.decode(): _bytes(v) for k, v in raw.items()}
            elif kind == "stream":
                entries = await client.xrange(key)
                content = [
                    [[k.decode(), _bytes(v)] for k, v in fields.items()] for _, fields in entries
                ]
            else:
                content = kind
            found[key.decode()] = (kind, content)
    finally:
        await client.aclose()
    named = names.value(dict(sorted(found.items())))
    assert isinstance(named, dict)
    return dict(sorted(named.items()))


def _request(request_id: str, **fields: Any) -> Request:
    return Request(
        id=request_id,
        kind="approval",
        prompt="Refund 42 EUR?",
        data={"amount": 42},
        source=Source(server="shop", tool="refund", agent="agent-1"),
        **fields,
    )


async def round_trip(
    url: str, namespace: str, *, audits: bool = True, **options: Any
) -> dict[str, Any]:
    """The scenario (``options`` go to every broker: ``write_protocol=1``...); returns its
    :func:`dump` (``audits`` passed on), taken before the brokers close (their liveness
    marks and heartbeat are still there)."""
    fast = {"namespace": namespace, "block_ms": 100, "lease_ms": 600, "agent": "agent-1"}
    key = SigningKey.generate("resp-1")
    agent = toolnexus.connect(url, **fast, **options)
    responder_broker = toolnexus.connect(url, **fast, **options)
    strict = toolnexus.connect(
        url,
        **{**fast, "queue": "strict"},
        signing_key=key,
        trusted_keys=Keyring.of(key),
        require_signatures=True,
        **options,
    )
    strict_agent = toolnexus.connect(url, **{**fast, "queue": "strict"}, **options)
    async with agent, responder_broker, strict, strict_agent:
        responder = responder_broker.responder("staff", "alice")

        async def answer_all(count: int) -> None:
            answered = 0
            async for pending in responder:
                voters = ["p0", "p1"] if pending.request.quorum else ["alice"]
                for voter in voters:
                    await pending.answer(
                        Answer(id=pending.request.id, ok=True, data={"x": 1}, person=voter)
                    )
                answered += 1
                if answered == count:
                    return

        answering = asyncio.ensure_future(answer_all(3))
        plain = await agent.wait_for(_request("plain-1"), timeout_s=60)
        durable = await agent.wait_for(_request("durable-1"), timeout_s=60, durable=True)
        quorum = await agent.wait_for(
            _request("quorum-1", quorum=Quorum(need=2)), timeout_s=60, durable=False
        )
        await answering
        assert plain.ok and durable.ok and quorum.ok, (plain, durable, quorum)
        strict_responder = strict.responder("strict", "bob")
        refused = strict_agent.refusal("refused-1")
        waiting = asyncio.ensure_future(strict_agent.wait_for(_request("refused-1"), timeout_s=60))
        reading = asyncio.ensure_future(strict_responder.__anext__())
        await asyncio.wait_for(refused, 30)
        reading.cancel()
        waiting.cancel()
        await asyncio.gather(reading, waiting, return_exceptions=True)
        await asyncio.sleep(0.2)  # the settling scripts' last writes
        return await dump(url, namespace, audits=audits)
