"""The protocol's test vectors (docs/reference/protocol.md): every message encoded, every
signed byte layout, every Redis structure and store record, made with a fixed TEST-ONLY
key, so that another implementation can check itself against them.

One file per protocol this toolnexus reads (:data:`toolnexus.protocol.READS`):
``protocol-1.json`` is what a process with ``write_protocol=1`` writes, ``protocol-2.json``
what it writes by default. Regenerate them (after a deliberate protocol change, never to
make a test pass) with::

    .venv/bin/python tests/protocol_vectors.py            # writes protocol-<N>.json
    .venv/bin/python tests/protocol_vectors.py --check    # exit 1 if one would change

``tests/test_protocol.py`` checks the committed files against the code in both directions;
it never regenerates it. The signed byte layouts are built here from the page's tables,
not by the code's private functions: the test proves them equal to what the code signs.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import sys
from pathlib import Path
from typing import Any, Final

import msgspec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from toolnexus.codec import JSON, MSGPACK, Codec
from toolnexus.models import (
    Answer,
    AnsweredEvent,
    Approval,
    ApprovedEvent,
    CompletedEvent,
    EscalatedEvent,
    ExpiredEvent,
    Heartbeat,
    Hop,
    Message,
    OnExpiry,
    Quorum,
    Request,
    Source,
    WithdrawnEvent,
)
from toolnexus.protocol import PREVIOUS_PROTOCOL, READS
from toolnexus.redis_broker._layout import REFUSAL_FIELDS
from toolnexus.security import SigningKey
from toolnexus.security._audit import AUDIT_VERSION, Refusal, audit_record, encode_record
from toolnexus.security._signing import sign_answer, sign_request

PROTOCOLS: Final = READS
"""The protocols with vectors, one file each (the envelope's first element)."""

DIRECTORY: Final = (
    Path(__file__).resolve().parent.parent / "docs" / "reference" / "protocol-vectors"
)


def path(protocol: int) -> Path:
    """The vectors of ``protocol``."""
    return DIRECTORY / f"protocol-{protocol}.json"


VERSION: Final = "0.2.0"
"""The toolnexus version the vectors' heartbeats and liveness marks show (an example: a
process shows its own, :func:`toolnexus.protocol.version`)."""

TEST_SEED: Final = hashlib.sha256(b"toolnexus protocol test vectors: TEST ONLY").digest()
"""The Ed25519 seed of the vectors' key: published, so TEST ONLY (never trust its key)."""
TEST_KEY_NAME: Final = "test-vectors"

# The prefixes of the signed layouts (docs/reference/protocol.md, "Signed bytes").
REQUEST_DIGEST: Final = b"toolnexus request digest v1\n"
REQUEST_SIGNATURE: Final = b"toolnexus request signature v1\n"
ANSWER_SIGNATURE: Final = b"toolnexus answer signature v1\n"
REQUEST_BYTES: Final = b"toolnexus request bytes v1\n"
REFUSAL_SIGNATURE: Final = b"toolnexus refusal signature v1\n"
OWN_SIGNATURE: Final = b"toolnexus own record signature v1\n"

NAMESPACE, QUEUE = "vectors", "ops"
WAITER: Final = "agent-7.0123456789abcdef"
ENTRY: Final = "1800000000500-0"
REQUEST_ID: Final = "req-0123456789abcdef0123456789abcdef"
CREATED, EXPIRES, ANSWERED = 1800000000.5, 1800000600.5, 1800000060.25

AGENT_DURABLE: Final = "agent-7.<16 hex digits of namespace and queue>"
"""The agent's durable waiter id, whose keys hold its own audit stream and stores."""

CANONICAL = msgspec.msgpack.Encoder(order="sorted")


def test_key() -> SigningKey:
    """The vectors' key, from :data:`TEST_SEED`."""
    return SigningKey(TEST_KEY_NAME, Ed25519PrivateKey.from_private_bytes(TEST_SEED))


def minimal_request() -> Request:
    return Request(id=REQUEST_ID, kind="approval", prompt="Deploy?", created_at=CREATED)


def published_request() -> Request:
    """A plain request as a waiter publishes it: deadline and reply stream set, signed."""
    request = msgspec.structs.replace(minimal_request(), expires_at=EXPIRES, reply_to=WAITER)
    return sign_request(request, test_key())


def full_request() -> Request:
    """A request with every field set (SPEC §14 included), signed."""
    request = Request(
        id=REQUEST_ID,
        kind="input",
        prompt="Transfer 10 EUR to ACME?",
        data={"schema": {"type": "object", "properties": {"amount": {"type": "integer"}}}},
        url="https://ops.example.com/runbook",
        source=Source(server="bank", tool="transfer", agent="agent-7"),
        created_at=CREATED,
        expires_at=EXPIRES,
        reply_to=WAITER,
        trace={"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
        meta={"ticket": "OPS-1"},
        allow=["ops-bot", "web:*@ops.example.com"],
        quorum=Quorum(need=2, decline="count"),
        escalate=[Hop(after_s=300.0, queue="oncall")],
        on_expiry=OnExpiry(ok=False),
        durable=True,
    )
    return sign_request(request, test_key())


def signed_answer() -> Answer:
    answer = Answer(
        id=REQUEST_ID,
        ok=True,
        data={"amount": 10},
        person="web:alice@ops.example.com",
        answered_at=ANSWERED,
        meta={"message": "ok"},
    )
    return sign_answer(answer, full_request(), test_key())


def msgpack(protocol: int) -> Codec:
    """The msgpack codec writing ``protocol``."""
    return MSGPACK.writing(protocol)


def heartbeat(protocol: int) -> Heartbeat:
    """A worker's heartbeat, as a process writing ``protocol`` sends it: with its version
    and protocols in both (56a6318's had neither)."""
    return Heartbeat(
        group="ops",
        consumer="web-1",
        at=CREATED,
        expires_at=CREATED + 30,
        info={"pid": 4242, "shown": 3},
        version=VERSION,
        reads=list(READS),
        writes=protocol,
    )


def messages(protocol: int) -> list[tuple[str, Message]]:
    """Every message type, each once (the request and the answer twice: bare and full)."""
    answer = signed_answer()
    return [
        ("request-minimal", minimal_request()),
        ("request-published", published_request()),
        ("request-full", full_request()),
        ("answer-minimal", Answer(id=REQUEST_ID, ok=True, answered_at=ANSWERED)),
        ("answer-signed", answer),
        (
            "answer-quorum-defaulted",
            Answer(
                id=REQUEST_ID,
                ok=False,
                reason="expired",
                responder="toolnexus",
                answered_at=ANSWERED,
                defaulted=True,
                approvals=[Approval(responder="ops-bot", person="slack:U123", at=ANSWERED)],
            ),
        ),
        ("event-answered", AnsweredEvent(id=REQUEST_ID, at=ANSWERED, answer=answer)),
        ("event-expired", ExpiredEvent(id=REQUEST_ID, at=ANSWERED)),
        ("event-withdrawn", WithdrawnEvent(id=REQUEST_ID, at=ANSWERED)),
        ("event-completed", CompletedEvent(id=REQUEST_ID, at=ANSWERED)),
        (
            "event-approved",
            ApprovedEvent(id=REQUEST_ID, at=ANSWERED, count=1, need=2, approvers=["ops-bot"]),
        ),
        ("event-escalated", EscalatedEvent(id=REQUEST_ID, at=ANSWERED, queue="oncall")),
        ("heartbeat", heartbeat(protocol)),
    ]


def builtins(value: Any) -> Any:
    """``value`` as JSON-able builtins (bytes as base64, as msgspec converts them back)."""
    return msgspec.to_builtins(value)


def message_vectors(protocol: int) -> list[dict[str, Any]]:
    return [
        {
            "name": name,
            "type": type(message).__name__,
            "meaning": builtins(message),
            "msgpack": MSGPACK.encode(message, protocol).hex(),
            "json": JSON.encode(message, protocol).decode(),
        }
        for name, message in messages(protocol)
    ]


def _t(value: float | None) -> float | None:
    return None if value is None else float(value)


def digest_fields(request: Request) -> dict[str, Any]:
    """What a request's digest covers (the page's table "The request digest")."""
    source = request.source
    fields: dict[str, Any] = {
        "id": request.id,
        "kind": request.kind,
        "prompt": request.prompt,
        "data": request.data,
        "url": request.url,
        "source": {"server": source.server, "tool": source.tool, "agent": source.agent},
        "expires_at": _t(request.expires_at),
        "allow": request.allow,
        "reply_to": request.reply_to,
    }
    if request.quorum is not None:
        fields["quorum"] = {"need": request.quorum.need, "decline": request.quorum.decline}
    if request.escalate:
        fields["escalate"] = [[float(hop.after_s), hop.queue] for hop in request.escalate]
        fields["created_at"] = _t(request.created_at)
    if request.on_expiry is not None:
        fields["on_expiry"] = {"ok": request.on_expiry.ok, "data": request.on_expiry.data}
    if request.durable:
        fields["durable"] = True
    return fields


def answer_fields(answer: Answer, digest: bytes, key: str) -> dict[str, Any]:
    """What an answer's signature covers (the page's table "The answer signature")."""
    fields: dict[str, Any] = {
        "id": answer.id,
        "ok": answer.ok,
        "data": answer.data,
        "reason": answer.reason,
        "person": answer.person,
        "answered_at": _t(answer.answered_at),
        "request": digest,
        "key": key,
    }
    if answer.meta:
        fields["meta"] = answer.meta
    return fields


def _signed(name: str, covers: str, prefix: bytes, fields: dict[str, Any]) -> dict[str, Any]:
    canonical = CANONICAL.encode(fields)
    message = prefix + canonical
    return {
        "name": name,
        "covers": covers,
        "fields": builtins(fields),
        "canonical": canonical.hex(),
        "signed": message.hex(),
        "signature": test_key().sign(message).hex(),
    }


def signature_vectors(protocol: int) -> list[dict[str, Any]]:
    key = test_key()
    out: list[dict[str, Any]] = []
    for name, request in (
        ("request-published", published_request()),
        ("request-full", full_request()),
    ):
        fields = digest_fields(request)
        canonical = CANONICAL.encode(fields)
        digest = hashlib.sha256(REQUEST_DIGEST + canonical).digest()
        signed = REQUEST_SIGNATURE + digest
        out.append(
            {
                "name": f"request-digest-and-signature:{name}",
                "covers": "the request digest, then the request signature over it",
                "message": name,
                "fields": builtins(fields),
                "canonical": canonical.hex(),
                "hashed": (REQUEST_DIGEST + canonical).hex(),
                "digest": digest.hex(),
                "signed": signed.hex(),
                "signature": key.sign(signed).hex(),
            }
        )
    answer = signed_answer()
    digest = hashlib.sha256(REQUEST_DIGEST + CANONICAL.encode(digest_fields(full_request())))
    vector = _signed(
        "answer-signature:answer-signed",
        "an answer, bound to the digest of the request it answers",
        ANSWER_SIGNATURE,
        answer_fields(answer, digest.digest(), key.name),
    )
    vector["message"] = "answer-signed"
    out.append(vector)
    payload = MSGPACK.encode(full_request(), protocol)
    payload_digest = hashlib.sha256(REQUEST_BYTES + payload).digest()
    reason = "unknown key 'agent-7'"
    vector = _signed(
        "refusal-signature",
        "a refusal, bound to the request's bytes as published",
        REFUSAL_SIGNATURE,
        {"id": REQUEST_ID, "request": payload_digest, "reason": reason, "key": key.name},
    )
    vector.update(
        payload=payload.hex(),
        payload_hashed=(REQUEST_BYTES + payload).hex(),
        payload_digest=payload_digest.hex(),
        reason=reason,
    )
    out.append(vector)
    for kind, fields in own_records():
        vector = _signed(
            f"own-record-signature:{kind}",
            "a record a process keeps for itself in Redis",
            OWN_SIGNATURE,
            {"kind": kind, "fields": fields, "key": key.name},
        )
        vector["kind"] = kind
        out.append(vector)
    return out


MCP_TASK_KEY: Final = "5f0c3e8f2b7a4c1d9e6f0a1b2c3d4e5f"
CLAIM_BY: Final = "run-0123456789abcdef0123456789abcdef"
TOOL_DIGEST: Final = "sha256:" + "ab" * 32


def own_records() -> list[tuple[str, dict[str, Any]]]:
    """What the signatures of the two signed store records cover (kind, fields)."""
    return [
        (
            "mcp-tasks",
            {
                "store_key": MCP_TASK_KEY,
                "call": "0c5f1e2d3c4b5a69788796a5b4c3d2e1",
                "task_id": "task-1",
                "request_state": "opaque-state",
                "answered": ["confirm"],
                "expires_at": EXPIRES,
            },
        ),
        ("tool-call-claim", {"request_id": REQUEST_ID, "digest": TOOL_DIGEST, "by": CLAIM_BY}),
    ]


def _text(value: str) -> dict[str, str]:
    return {"text": value}


def _hex(value: bytes) -> dict[str, str]:
    return {"hex": value.hex()}


def _keys(queue: str = QUEUE) -> dict[str, str]:
    q, w = f"{{{NAMESPACE}:q:{queue}}}", f"{{{NAMESPACE}:w:{WAITER}}}"
    return {
        "requests": f"{q}:requests",
        "events": f"{q}:events",
        "dead": f"{q}:dead",
        "audit": f"{{{NAMESPACE}:w:{AGENT_DURABLE}}}:audit",
        "workers": f"{q}:workers",
        "route": f"{q}:route:{REQUEST_ID}",
        "answers": f"{w}:answers",
        "alive": f"{w}:alive",
        "state": f"{w}:r:{REQUEST_ID}",
    }


def redis_vectors(protocol: int) -> list[dict[str, Any]]:
    """The Redis structures as a process writing ``protocol`` leaves them, each with
    example values (keys in namespace ``vectors``)."""
    keys = _keys()
    key = test_key()
    codec = msgpack(protocol)
    published = codec.encode(published_request())
    full = codec.encode(full_request())
    answer = codec.encode(signed_answer())
    refusal = signature_vectors(protocol)[3]
    deadline = str(int(EXPIRES * 1000))
    names = REFUSAL_FIELDS[protocol]
    # the protocol's field (a state, a reply entry, a dead letter): none in protocol 1
    p = {} if protocol == PREVIOUS_PROTOCOL else {"p": _text(str(protocol))}
    route = f"{WAITER} {ENTRY}" + ("" if protocol == PREVIOUS_PROTOCOL else f" {protocol}")
    alive = "1" if protocol == PREVIOUS_PROTOCOL else f"{protocol} {VERSION}"
    return [
        {
            "name": "request-stream-entry",
            "key": keys["requests"],
            "type": "stream entry",
            "fields": {"r": _hex(published)},
        },
        {
            "name": "events-stream-entry",
            "key": keys["events"],
            "type": "stream entry",
            "fields": {"e": _hex(codec.encode(CompletedEvent(id=REQUEST_ID, at=ANSWERED)))},
        },
        {
            "name": "reply-stream-answer",
            "key": keys["answers"],
            "type": "stream entry",
            "fields": {"id": _text(REQUEST_ID), "a": _hex(answer), **p},
        },
        {
            "name": "reply-stream-contested-answer",
            "key": keys["answers"],
            "type": "stream entry",
            "fields": {"id": _text(REQUEST_ID), "a": _hex(answer), "c": _text("1"), **p},
        },
        {
            "name": "reply-stream-refusal",
            "key": keys["answers"],
            "type": "stream entry",
            "fields": {
                "id": _text(REQUEST_ID),
                names.reason: _text(refusal["reason"]),
                names.by: _text("strict-1"),
                names.key: _text(key.name),
                names.sig: {"hex": refusal["signature"]},
                names.digest: {"hex": refusal["payload_digest"]},
                **p,
            },
            "payload": refusal["payload"],
        },
        {
            "name": "dead-letter",
            "key": keys["dead"],
            "type": "stream entry",
            "fields": {
                "error": _text("unknown key 'agent-7'"),
                "stream": _text(keys["requests"]),
                "entry": _text(ENTRY),
                "group": _text("strict"),
                "raw": _hex(b"r=" + full),
                **p,
            },
        },
        {
            "name": "audit-stream-entry",
            "key": keys["audit"],
            "type": "stream entry",
            "fields": {"r": _hex(encode_record(audit(protocol)))},
        },
        {
            "name": "state-open-plain",
            "key": keys["state"],
            "type": "hash",
            "fields": {"s": _text("open"), "x": _text(deadline), **p},
        },
        {
            "name": "state-open-durable-escalated",
            "key": keys["state"],
            "type": "hash",
            "fields": {
                "s": _text("open"),
                "x": _text(deadline),
                "req": _hex(full),
                "d": _text("1"),
                **p,
                "entry": _text(ENTRY),
                "q": _text(f"{QUEUE} {ENTRY} oncall -"),
            },
        },
        {
            "name": "state-reopened",
            "key": keys["state"],
            "type": "hash",
            "fields": {
                "s": _text("open"),
                "x": _text(deadline),
                **p,
                "w": _text("bad signature"),
            },
        },
        {
            "name": "state-answered",
            "key": keys["state"],
            "type": "hash",
            "fields": {"s": _text("answered"), "x": _text(deadline), **p, "a": _hex(answer)},
        },
        {
            "name": "state-contested",
            "key": keys["state"],
            "type": "hash",
            "fields": {
                "s": _text("answered"),
                "x": _text(deadline),
                **p,
                "a": _hex(answer),
                "c:" + hashlib.sha1(answer).hexdigest(): _hex(answer),
            },
        },
        {
            "name": "state-quorum-votes",
            "key": keys["state"],
            "type": "hash",
            "fields": {
                "s": _text("open"),
                "x": _text(deadline),
                **p,
                "y:ops-bot": _hex(answer),
                "n:intern": _hex(answer),
            },
        },
        {
            "name": "route",
            "key": keys["route"],
            "type": "string",
            "value": _text(route),
        },
        {"name": "liveness-mark", "key": keys["alive"], "type": "string", "value": _text(alive)},
        {
            "name": "heartbeat",
            "key": keys["workers"],
            "type": "hash",
            "fields": {"ops/web-1": _hex(codec.encode(heartbeat(protocol)))},
        },
    ]


def audit(protocol: int) -> Any:
    """The audit record of the full request answered, both written in ``protocol``."""
    record = audit_record(
        full_request(),
        "answered",
        signed_answer(),
        verified=True,
        requester=TEST_KEY_NAME,
        refused=[Refusal(reason="bad signature", responder="mallory", at=ANSWERED)],
        escalated=[Hop(after_s=300.0, queue="oncall")],
        codec=msgpack(protocol),
    )
    return msgspec.structs.replace(record, resolved_at=ANSWERED)


def audit_vector(protocol: int) -> dict[str, Any]:
    record = audit(protocol)
    return {
        "name": "audit-record",
        "version": AUDIT_VERSION,
        "meaning": builtins(record),
        "msgpack": encode_record(record).hex(),
    }


def store_vectors(protocol: int) -> list[dict[str, Any]]:
    """Store records (JSON text), as the code writes them in ``protocol`` (signatures with
    the test key): from protocol 2 on, an agent's records carry the number."""
    key = test_key()
    records = dict(own_records())
    task = records["mcp-tasks"]
    claim = records["tool-call-claim"]
    task_sig = key.sign(
        OWN_SIGNATURE + CANONICAL.encode({"kind": "mcp-tasks", "fields": task, "key": key.name})
    )
    claim_sig = key.sign(
        OWN_SIGNATURE
        + CANONICAL.encode({"kind": "tool-call-claim", "fields": claim, "key": key.name})
    )
    task_record = {
        "task_id": task["task_id"],
        "request_state": task["request_state"],
        "answered": task["answered"],
        "call": task["call"],
        "expires_at": task["expires_at"],
        "signature": {"key": key.name, "sig": _b64(task_sig)},
    }
    entry = {"proposed": TOOL_DIGEST, "approved": TOOL_DIGEST}
    claim_record = {
        "digest": claim["digest"],
        "by": claim["by"],
        "signature": {"key": key.name, "sig": _b64(claim_sig)},
    }
    if protocol != PREVIOUS_PROTOCOL:
        task_record["protocol"] = protocol
        entry["protocol"] = str(protocol)
        claim_record["protocol"] = protocol
    agent_store = f"{{{NAMESPACE}:w:{AGENT_DURABLE}}}:store:"
    return [
        {
            "name": "mcp-task-record",
            "store": "mcp-tasks",
            "key": agent_store + "mcp-tasks",
            "field": MCP_TASK_KEY,
            "json": _compact(task_record),
        },
        {
            "name": "tool-call-ledger-entry",
            "store": "tool-calls",
            "key": agent_store + "tool-calls",
            "field": REQUEST_ID,
            "json": _compact(entry),
        },
        {
            "name": "tool-call-claim",
            "store": "tool-calls",
            "key": agent_store + "tool-calls",
            "field": f"{REQUEST_ID}:executed",
            "json": _compact(claim_record),
        },
        {
            "name": "claude-agent-sdk-session",
            "store": "claude-agent-sdk",
            "key": f"{{{NAMESPACE}:q:{QUEUE}}}:store:claude-agent-sdk",
            "field": "run-42",
            "json": _compact(
                {
                    "session_id": "session-1",
                    "request": _b64(JSON.encode(minimal_request(), protocol)),
                }
            ),
        },
        {
            "name": "chat-message-slack",
            "store": "<group>",
            "key": f"{{{NAMESPACE}:q:{QUEUE}}}:store:ops",
            "field": REQUEST_ID,
            "json": json.dumps({"channel": "C123", "ts": "1800000000.000100"}),
        },
        {
            "name": "chat-message-telegram",
            "store": "<group>",
            "key": f"{{{NAMESPACE}:q:{QUEUE}}}:store:ops",
            "field": REQUEST_ID,
            "json": json.dumps({"chat_id": 42, "message_id": 7}),
        },
    ]


LINK_SECRET: Final = "toolnexus protocol test vectors: TEST ONLY link secret"
"""The HMAC secret of the answer-link vectors: published, so TEST ONLY."""
LINK_NONCE: Final = bytes(range(12))


def _b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def link_vectors() -> list[dict[str, Any]]:
    """Answer-link tokens for the published request (the page's table "Answer links"),
    signed with the test key (Ed25519) and with the test secret (HMAC-SHA256). A link is
    not numbered: its digest is of the request in JSON in protocol 1's envelope
    (``[1, {...}]``, as 56a6318 made it), whatever the process's ``write_protocol``; so the
    links are the same in the vectors of both protocols."""
    digest = hashlib.sha256(JSON.encode(published_request(), PREVIOUS_PROTOCOL)).hexdigest()
    payload = {
        "q": QUEUE,
        "id": REQUEST_ID,
        "d": digest,
        "to": "alice@ops.example.com",
        "exp": EXPIRES,
        "do": "accept",
        "n": _b64url(LINK_NONCE),
    }
    text = json.dumps(payload, separators=(",", ":"))
    body = f"tnl1.{_b64url(text.encode())}"
    mac_key = hmac.digest(LINK_SECRET.encode(), b"toolnexus answer links", "sha256")
    return [
        {
            "name": f"answer-link-{how}",
            "payload": payload,
            "payload_json": text,
            "signed": body,
            "token": f"{body}.{_b64url(sig)}",
        }
        for how, sig in (
            ("ed25519", test_key().sign(body.encode())),
            ("hmac", hmac.digest(mac_key, body.encode(), "sha256")),
        )
    ]


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def _compact(value: Any) -> str:
    return msgspec.json.encode(value).decode()


def vectors(protocol: int) -> dict[str, Any]:
    """The vectors of ``protocol``: what a process with ``write_protocol=protocol``
    writes."""
    key = test_key()
    out: dict[str, Any] = {
        "protocol": protocol,
        "about": "toolnexus protocol test vectors: see docs/reference/protocol.md. "
        "Regenerate with: .venv/bin/python tests/protocol_vectors.py",
        "test_key": {
            "warning": "TEST ONLY: this seed is public; never trust this key anywhere",
            "name": key.name,
            "seed": TEST_SEED.hex(),
            "public": key.public_line().split()[1],
        },
        "envelope": {"version": protocol},
        "messages": message_vectors(protocol),
        "signatures": signature_vectors(protocol),
        "audit": audit_vector(protocol),
        "redis": redis_vectors(protocol),
        "stores": store_vectors(protocol),
    }
    out["links"] = link_vectors()
    out["link_secret"] = {"warning": "TEST ONLY: this secret is public", "secret": LINK_SECRET}
    return out


def rendered(protocol: int) -> str:
    return json.dumps(vectors(protocol), indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str]) -> int:
    changed = 0
    for protocol in PROTOCOLS:
        text, target = rendered(protocol), path(protocol)
        if "--check" in argv:
            same = target.exists() and target.read_text() == text
            print(f"{target}: {'up to date' if same else 'would change'}")
            changed += not same
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        print(f"wrote {target}")
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
