"""The protocol page (docs/reference/protocol.md), its test vectors (one file per protocol
this toolnexus reads: docs/reference/protocol-vectors/protocol-1.json and protocol-2.json)
and the code agree:

- every vector is checked both ways: its bytes decode to its meaning, and its meaning
  encodes to exactly its bytes; each signature is exactly what the code's signing makes
  with the test key, verifies with the test key's public half, and fails with one byte
  flipped;
- the real code, on real Redis, with ``write_protocol`` 1 and 2, writes what that
  protocol's vectors show (the same fields, values of the same shapes, decodable as the
  vectors' are, numbered with that protocol);
- every field name the code writes (collected from the code: the layout module's
  constants, every msgspec struct that travels or is stored, the signed layouts) is in a
  table of the page, under its structure's heading.

The vectors are committed; this test never regenerates them (tests/protocol_vectors.py
does, on purpose), so a change of encoding fails here.
"""

from __future__ import annotations

import ast
import asyncio
import base64
import hashlib
import importlib
import importlib.util
import json
import pkgutil
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import redis.asyncio as aioredis
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

import protocol_vectors as pv
import toolnexus
from helpers import ask, eventually, opened
from toolnexus import models
from toolnexus.codec import JSON, MSGPACK
from toolnexus.errors import SignatureError
from toolnexus.frameworks import _tool_call, claude_agent_sdk
from toolnexus.mcp import _tasks
from toolnexus.models import Answer, Heartbeat, Request, Signature
from toolnexus.protocol import PREVIOUS_PROTOCOL, PREVIOUS_RELEASE, PROTOCOL, READS, version
from toolnexus.redis_broker import RedisBroker, _layout
from toolnexus.redis_broker._escalation import parse_queues_field
from toolnexus.redis_broker._layout import (
    REFUSAL_FIELDS,
    entry_protocol,
    liveness_value,
    parse_liveness,
    parse_route,
    route_value,
)
from toolnexus.security import Keyring
from toolnexus.security import _audit as audit
from toolnexus.security._signing import (
    request_digest,
    sign_answer,
    sign_own,
    sign_refusal,
    verify_answer,
    verify_own,
    verify_refusal,
    verify_request,
)
from toolnexus_workers import links

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "reference" / "protocol.md"
ALL: dict[int, dict[str, Any]] = {p: json.loads(pv.path(p).read_text()) for p in pv.PROTOCOLS}
"""The committed vectors, by protocol."""
VECTORS = ALL[PROTOCOL]
KEY = pv.test_key()
KEYRING = Keyring.of(KEY)
CLASSES: dict[str, type[Any]] = {
    name: value
    for name, value in vars(models).items()
    if isinstance(value, type) and issubclass(value, msgspec.Struct)
}


def named(section: str, protocol: int = PROTOCOL) -> dict[str, dict[str, Any]]:
    return {vector["name"]: vector for vector in ALL[protocol][section]}


def flipped(data: bytes, at: int = -1) -> bytes:
    """``data`` with one bit of the byte at ``at`` flipped."""
    out = bytearray(data)
    out[at] ^= 0x01
    return bytes(out)


def public_verifies(sig: bytes, message: bytes) -> bool:
    """Whether the test key's published public half verifies ``sig`` over ``message``
    (with ``cryptography``, not the code's own verifier)."""
    public = Ed25519PublicKey.from_public_bytes(base64.b64decode(VECTORS["test_key"]["public"]))
    try:
        public.verify(sig, message)
    except InvalidSignature:
        return False
    return True


def message(name: str, protocol: int = PROTOCOL) -> Any:
    vector = named("messages", protocol)[name]
    return msgspec.convert(vector["meaning"], CLASSES[vector["type"]])


# -- the test key ------------------------------------------------------------------------


PROTOCOLS = pytest.mark.parametrize("protocol", pv.PROTOCOLS)


@PROTOCOLS
def test_the_test_key_is_the_committed_seed_and_is_marked_test_only(protocol: int) -> None:
    key = ALL[protocol]["test_key"]
    assert bytes.fromhex(key["seed"]) == pv.TEST_SEED
    assert KEY.public_line() == f"{key['name']} {key['public']}"
    assert "TEST ONLY" in key["warning"]
    assert ALL[protocol]["protocol"] == ALL[protocol]["envelope"]["version"] == protocol


def test_there_are_vectors_for_every_protocol_read_and_the_same_links_in_each() -> None:
    """A link is not numbered: the same in both protocols (its ``d`` over ``[1, {...}]``),
    so a link one release made is read by another."""
    assert pv.PROTOCOLS == READS == (1, 2) and sorted(ALL) == [1, 2]
    assert ALL[PROTOCOL]["links"] == ALL[PREVIOUS_PROTOCOL]["links"]


@PROTOCOLS
def test_the_committed_vectors_are_what_the_generator_makes(protocol: int) -> None:
    """The script regenerates exactly the file (so it stays the way to extend it)."""
    assert pv.rendered(protocol) == pv.path(protocol).read_text(), (
        f"the protocol-{protocol} vectors changed: if on purpose, run .venv/bin/python "
        "tests/protocol_vectors.py and document the change in docs/reference/protocol.md"
    )


# -- messages ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("protocol", "name"), [(p, v["name"]) for p in pv.PROTOCOLS for v in ALL[p]["messages"]]
)
def test_a_message_decodes_to_its_meaning_and_encodes_to_its_bytes(
    protocol: int, name: str
) -> None:
    vector = named("messages", protocol)[name]
    meaning = msgspec.convert(vector["meaning"], CLASSES[vector["type"]])
    packed, text = bytes.fromhex(vector["msgpack"]), vector["json"]
    assert MSGPACK.decode_with_protocol(packed) == (protocol, meaning)
    assert JSON.decode_with_protocol(text) == (protocol, meaning)
    assert MSGPACK.encode(meaning, protocol) == packed
    assert JSON.encode(meaning, protocol).decode() == text
    assert MSGPACK.writing(protocol).encode(meaning) == packed
    # the envelope: [protocol, message], the message's tag under "type"
    raw_packed, raw_json = msgspec.msgpack.decode(packed), json.loads(text)
    for raw in (raw_packed, raw_json):
        assert isinstance(raw, list) and len(raw) == 2 and raw[0] == protocol
        assert raw[1]["type"] == vector["meaning"]["type"]
    assert msgspec.to_builtins(raw_packed[1]) == vector["meaning"]
    assert raw_json[1] == vector["meaning"]


@PROTOCOLS
def test_every_message_type_has_a_vector(protocol: int) -> None:
    tagged = {
        cls.__name__
        for cls in CLASSES.values()
        if cls.__struct_config__.tag is not None and not cls.__name__.startswith("_")
    }
    assert tagged == {v["type"] for v in ALL[protocol]["messages"]}


def test_the_protocols_messages_differ_only_in_the_envelope_and_the_heartbeats_writes() -> None:
    """Every message body is the same in both protocols; a heartbeat says the protocol
    its process writes."""
    for one, two in zip(ALL[1]["messages"], ALL[2]["messages"], strict=True):
        packed_1, packed_2 = bytes.fromhex(one["msgpack"]), bytes.fromhex(two["msgpack"])
        assert packed_1[:2] == bytes([0x92, 1]) and packed_2[:2] == bytes([0x92, 2])
        assert one["json"].startswith("[1,") and two["json"].startswith("[2,")
        if one["name"] == "heartbeat":
            assert (one["meaning"]["writes"], two["meaning"]["writes"]) == (1, 2)
            assert one["meaning"] | {"writes": 2} == two["meaning"]
        else:
            assert packed_1[2:] == packed_2[2:] and one["json"][3:] == two["json"][3:]


# -- signatures --------------------------------------------------------------------------


def _canonical_matches(vector: dict[str, Any]) -> bytes:
    """The vector's canonical bytes, checked both ways against its fields."""
    canonical = bytes.fromhex(vector["canonical"])
    assert msgspec.to_builtins(msgspec.msgpack.decode(canonical)) == vector["fields"]
    decoded = msgspec.msgpack.decode(canonical)
    assert pv.CANONICAL.encode(decoded) == canonical
    return canonical


@PROTOCOLS
@pytest.mark.parametrize("name", ["request-published", "request-full"])
def test_the_request_digest_and_signature_are_the_documented_bytes(
    protocol: int, name: str
) -> None:
    vector = named("signatures", protocol)[f"request-digest-and-signature:{name}"]
    assert vector == named("signatures", PROTOCOL)[vector["name"]]  # not numbered
    request: Request = message(name, protocol)
    canonical = _canonical_matches(vector)
    hashed = bytes.fromhex(vector["hashed"])
    assert hashed == pv.REQUEST_DIGEST + canonical
    digest = bytes.fromhex(vector["digest"])
    assert hashlib.sha256(hashed).digest() == digest == request_digest(request)
    signed, sig = bytes.fromhex(vector["signed"]), bytes.fromhex(vector["signature"])
    assert signed == pv.REQUEST_SIGNATURE + digest
    assert request.signature is not None and request.signature.sig == sig
    assert KEY.sign(signed) == sig  # Ed25519 is deterministic
    assert public_verifies(sig, signed) and not public_verifies(sig, flipped(signed))
    assert verify_request(request, KEYRING) == KEY.name
    tampered = msgspec.structs.replace(request, prompt=request.prompt + " ")
    with pytest.raises(SignatureError, match="bad signature"):
        verify_request(tampered, KEYRING)
    forged = Signature(key=KEY.name, sig=flipped(sig, 0))
    with pytest.raises(SignatureError, match="bad signature"):
        verify_request(msgspec.structs.replace(request, signature=forged), KEYRING)


@PROTOCOLS
def test_the_answer_signature_is_the_documented_bytes(protocol: int) -> None:
    vector = named("signatures", protocol)["answer-signature:answer-signed"]
    assert vector == named("signatures", PROTOCOL)[vector["name"]]  # not numbered
    answer: Answer = message("answer-signed", protocol)
    request: Request = message("request-full", protocol)
    canonical = _canonical_matches(vector)
    signed, sig = bytes.fromhex(vector["signed"]), bytes.fromhex(vector["signature"])
    assert signed == pv.ANSWER_SIGNATURE + canonical
    unsigned = msgspec.structs.replace(answer, responder=None, signature=None)
    made = sign_answer(unsigned, request, KEY)
    assert made == answer and made.signature is not None
    assert made.signature.sig == sig == KEY.sign(signed)
    assert made.signature.digest == request_digest(request)
    assert public_verifies(sig, signed) and not public_verifies(sig, flipped(signed))
    assert verify_answer(answer, request, KEYRING) == KEY.name
    with pytest.raises(SignatureError, match="bad signature"):
        verify_answer(msgspec.structs.replace(answer, ok=False), request, KEYRING)


@PROTOCOLS
def test_the_refusal_signature_is_the_documented_bytes(protocol: int) -> None:
    """Bound to the request's bytes, envelope number included: a refusal of the same
    request in the other protocol has another payload digest and signature."""
    vector = named("signatures", protocol)["refusal-signature"]
    other = named("signatures", 3 - protocol)["refusal-signature"]
    assert vector["payload_digest"] != other["payload_digest"]
    canonical = _canonical_matches(vector)
    payload = bytes.fromhex(vector["payload"])
    assert MSGPACK.decode_with_protocol(payload) == (protocol, message("request-full"))
    hashed = bytes.fromhex(vector["payload_hashed"])
    assert hashed == pv.REQUEST_BYTES + payload
    digest = bytes.fromhex(vector["payload_digest"])
    assert hashlib.sha256(hashed).digest() == digest
    signed, sig = bytes.fromhex(vector["signed"]), bytes.fromhex(vector["signature"])
    assert signed == pv.REFUSAL_SIGNATURE + canonical
    made = sign_refusal(pv.REQUEST_ID, payload, vector["reason"], KEY)
    assert (made.key, made.sig, made.digest) == (KEY.name, sig, digest)
    assert KEY.sign(signed) == sig
    assert public_verifies(sig, signed) and not public_verifies(sig, flipped(signed))
    reason = vector["reason"]
    assert verify_refusal(pv.REQUEST_ID, payload, reason, made, KEYRING) == KEY.name
    with pytest.raises(SignatureError, match="signed for another request"):
        verify_refusal(pv.REQUEST_ID, flipped(payload), reason, made, KEYRING)
    with pytest.raises(SignatureError, match="bad signature"):
        verify_refusal(pv.REQUEST_ID, payload, reason + ".", made, KEYRING)


@PROTOCOLS
@pytest.mark.parametrize("kind", ["mcp-tasks", "tool-call-claim"])
def test_an_own_record_signature_is_the_documented_bytes(protocol: int, kind: str) -> None:
    vector = named("signatures", protocol)[f"own-record-signature:{kind}"]
    canonical = _canonical_matches(vector)
    signed, sig = bytes.fromhex(vector["signed"]), bytes.fromhex(vector["signature"])
    assert signed == pv.OWN_SIGNATURE + canonical
    fields = vector["fields"]["fields"]
    assert vector["fields"] == {"kind": kind, "fields": fields, "key": KEY.name}
    made = sign_own(kind, fields, KEY)
    assert made.sig == sig == KEY.sign(signed)
    assert public_verifies(sig, signed) and not public_verifies(sig, flipped(signed))
    verify_own(kind, fields, made, KEY, "the vector")
    with pytest.raises(SignatureError, match="bad signature"):
        verify_own(kind, {**fields, "digest": "x"}, made, KEY, "the vector")


@PROTOCOLS
def test_the_store_records_signatures_are_over_what_the_code_signs(protocol: int) -> None:
    """The signed fields of the two signed store records are what their own ``signed``
    methods give (not their protocol), and the JSON records carry those signatures."""
    stores = named("stores", protocol)
    task = msgspec.json.decode(stores["mcp-task-record"]["json"], type=_tasks._Record)
    claim = msgspec.json.decode(stores["tool-call-claim"]["json"], type=_tool_call._Claim)
    own = dict(pv.own_records())
    assert task.signed(pv.MCP_TASK_KEY) == own["mcp-tasks"]
    assert claim.signed(pv.REQUEST_ID) == own["tool-call-claim"]
    verify_own(_tasks.STORE_NAME, task.signed(pv.MCP_TASK_KEY), task.signature, KEY, "task")
    verify_own(_tool_call.CLAIM_KIND, claim.signed(pv.REQUEST_ID), claim.signature, KEY, "claim")
    assert msgspec.json.encode(task).decode() == stores["mcp-task-record"]["json"]
    assert msgspec.json.encode(claim).decode() == stores["tool-call-claim"]["json"]
    numbered = msgspec.UNSET if protocol == PREVIOUS_PROTOCOL else protocol
    assert (task.protocol, claim.protocol) == (numbered, numbered)
    entry = json.loads(stores["tool-call-ledger-entry"]["json"])
    assert entry.get(_tool_call.PROTOCOL_KEY) == (None if numbered is msgspec.UNSET else "2")
    session = stores["claude-agent-sdk-session"]["json"]
    state = msgspec.json.decode(session, type=claude_agent_sdk._State)
    assert JSON.decode_with_protocol(state.request) == (protocol, message("request-minimal"))
    assert msgspec.json.encode(state).decode() == session


# -- the audit record --------------------------------------------------------------------


@PROTOCOLS
def test_the_audit_record_decodes_to_its_meaning_and_encodes_to_its_bytes(protocol: int) -> None:
    """The record's own version is not the protocol; the request and answer in it are in
    the request's protocol."""
    vector = ALL[protocol]["audit"]
    record = msgspec.convert(vector["meaning"], audit.AuditRecord)
    packed = bytes.fromhex(vector["msgpack"])
    assert audit.decode_record(packed) == record
    assert audit.encode_record(record) == packed
    assert msgspec.msgpack.decode(packed)[0] == vector["version"] == audit.AUDIT_VERSION
    assert audit.check_record(record, KEYRING) == KEY.name
    assert MSGPACK.decode_with_protocol(record.answer or b"") == (
        protocol,
        message("answer-signed"),
    )
    assert MSGPACK.decode_with_protocol(record.request)[0] == protocol
    broken = msgspec.structs.replace(record, answer=flipped(record.answer or b"", -3))
    assert not audit.verify_record(broken, KEYRING)


# -- Redis structures, as the vectors show them -------------------------------------------


def value_of(spec: dict[str, str]) -> bytes:
    return spec["text"].encode() if "text" in spec else bytes.fromhex(spec["hex"])


@PROTOCOLS
def test_the_redis_vectors_values_read_back(protocol: int) -> None:
    """Each Redis vector's values are what its readers decode: the messages' own vectors,
    in the vectors' protocol, which each structure without an envelope says (field ``p``,
    a route's third part, a liveness mark's first) from protocol 2 on."""
    redis_vectors = named("redis", protocol)
    fields = {
        n: {k: value_of(v) for k, v in r.get("fields", {}).items()}
        for n, r in redis_vectors.items()
    }

    def decoded(data: bytes) -> Any:
        number, found = MSGPACK.decode_with_protocol(data)
        assert number == protocol
        return found

    assert decoded(fields["request-stream-entry"]["r"]) == message("request-published")
    assert decoded(fields["reply-stream-answer"]["a"]) == message("answer-signed")
    assert decoded(fields["events-stream-entry"]["e"]) == message("event-completed")
    numbered = ["reply-stream-answer", "reply-stream-contested-answer", "reply-stream-refusal"]
    numbered += ["dead-letter", *(n for n in fields if n.startswith("state-"))]
    for name in numbered:
        as_bytes = {k.encode(): v for k, v in fields[name].items()}
        assert entry_protocol(as_bytes, name) == protocol, name
    names = REFUSAL_FIELDS[protocol]
    refusal = fields["reply-stream-refusal"]
    assert names.reason in refusal and _layout.REPLY_ANSWER not in refusal
    payload = bytes.fromhex(redis_vectors["reply-stream-refusal"]["payload"])
    assert payload.hex() == named("signatures", protocol)["refusal-signature"]["payload"]
    signature = Signature(refusal[names.key].decode(), refusal[names.sig], refusal[names.digest])
    reason = refusal[names.reason].decode()
    assert verify_refusal(pv.REQUEST_ID, payload, reason, signature, KEYRING) == KEY.name
    raw = fields["dead-letter"]["raw"]
    assert raw.startswith(b"r=") and decoded(raw[2:]) == message("request-full")
    record = audit.decode_record(fields["audit-stream-entry"]["r"])
    assert audit.check_record(record, KEYRING) == KEY.name
    assert decoded(record.answer or b"") == message("answer-signed")
    durable = fields["state-open-durable-escalated"]
    assert decoded(durable["req"]) == message("request-full")
    assert parse_queues_field(durable["q"]) == [(pv.QUEUE, pv.ENTRY), ("oncall", None)]
    contested = fields["state-contested"]
    answer = contested["a"]
    assert contested["c:" + hashlib.sha1(answer).hexdigest()] == answer
    route = redis_vectors["route"]["value"]["text"]
    assert route == route_value(pv.WAITER, pv.ENTRY, protocol)
    assert parse_route(route) == (pv.WAITER, pv.ENTRY)
    mark = redis_vectors["liveness-mark"]["value"]["text"]
    expected = (1, PREVIOUS_RELEASE) if protocol == PREVIOUS_PROTOCOL else (2, pv.VERSION)
    assert parse_liveness(mark) == expected
    assert mark == liveness_value(protocol).replace(version(), pv.VERSION)
    beat = MSGPACK.decode_as_with_protocol(fields["heartbeat"]["ops/web-1"], Heartbeat)
    assert beat == (protocol, message("heartbeat", protocol))
    assert beat[1].protocols() == (pv.VERSION, [1, 2], protocol)


# -- the page names every field the code writes --------------------------------------------

NOT_PROTOCOL = {
    "toolnexus.redis_broker._inspect": "what toolnexus status --json prints (status-json.md)",
    "toolnexus.redis_broker._responder": "a lenient reader's view of a request, never written",
}
"""Modules whose msgspec structs nobody writes for another process to read."""


def sections() -> dict[str, str]:
    """The page's sections: heading text -> the text up to the next heading."""
    out: dict[str, str] = {}
    heading = ""
    for line in PAGE.read_text().splitlines():
        if line.startswith("#"):
            heading = line.lstrip("#").strip()
            out[heading] = ""
        else:
            out[heading] = out.get(heading, "") + line + "\n"
    return out


def table_names(text: str) -> set[str]:
    """The names in backticks in the first cell of each table row of ``text``."""
    names: set[str] = set()
    for line in text.splitlines():
        if line.startswith("|") and not line.startswith("|---"):
            names.update(re.findall(r"`([^`]+)`", line.split("|")[1]))
    return names


def table_rows(text: str) -> Iterator[list[str]]:
    for line in text.splitlines():
        if line.startswith("|") and not line.startswith("|---"):
            yield [cell.strip() for cell in line.strip().strip("|").split("|")]


def section_of(title: str) -> str:
    found = [text for heading, text in sections().items() if f"`{title}`" in heading]
    assert len(found) == 1, f"protocol.md needs one section headed `{title}`, found {len(found)}"
    return found[0]


class Written(msgspec.Struct):
    """One struct of the code: where, its field names on the wire, its tag."""

    module: str
    name: str
    fields: list[str]
    tag: str | None = None


def _ast_structs(path: Path, module: str) -> Iterator[Written]:
    """The structs of a module that cannot be imported here (its framework is not
    installed), read from its source: every class with a base ``msgspec.Struct``."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ClassDef) and any(
            ast.unparse(base) == "msgspec.Struct" for base in node.bases
        ):
            fields = [
                item.target.id
                for item in node.body
                if isinstance(item, ast.AnnAssign)
                and isinstance(item.target, ast.Name)
                and "ClassVar" not in ast.unparse(item.annotation)
            ]
            yield Written(module, node.name, fields)


def written_structs() -> list[Written]:
    """Every msgspec struct defined in the toolnexus package (but :data:`NOT_PROTOCOL`'s):
    each travels in a message or is kept in Redis. Abstract bases (with subclasses) are
    left out; their fields are their subclasses'."""
    out: list[Written] = []
    for info in pkgutil.walk_packages(toolnexus.__path__, "toolnexus."):
        if info.ispkg or info.name in NOT_PROTOCOL or info.name.endswith(".__main__"):
            continue
        try:
            module = importlib.import_module(info.name)
        except (ImportError, toolnexus.ConfigurationError):
            spec = importlib.util.find_spec(info.name)
            assert spec is not None and spec.origin is not None
            out.extend(_ast_structs(Path(spec.origin), info.name))
            continue
        for value in vars(module).values():
            if (
                isinstance(value, type)
                and issubclass(value, msgspec.Struct)
                and value.__module__ == info.name
                and not value.__subclasses__()
            ):
                config = value.__struct_config__
                names = [f.encode_name for f in msgspec.structs.fields(value)]
                tag = config.tag if isinstance(config.tag, str) else None
                if config.tag_field is not None:
                    names.insert(0, config.tag_field)
                out.append(Written(info.name, value.__name__, names, tag))
    return out


def test_the_struct_collection_finds_what_the_code_writes() -> None:
    """The collection itself: it finds the messages, the audit record and the store
    records (a collection that found nothing would let every check below pass)."""
    found = {(w.module.rsplit(".", 1)[-1], w.name) for w in written_structs()}
    for expected in [
        ("models", "Request"),
        ("models", "EscalatedEvent"),
        ("models", "Heartbeat"),
        ("_audit", "AuditRecord"),
        ("_tasks", "_Record"),
        ("_tool_call", "_Claim"),
        ("google_adk", "_State"),
    ]:
        assert expected in found


def test_every_field_the_code_writes_is_on_the_page() -> None:
    """Each struct has a section headed by its name in backticks (module-qualified where two
    share a name), with a table row for each of its wire fields; a tagged one names its tag."""
    structs = written_structs()
    counts: dict[str, int] = {}
    for w in structs:
        counts[w.name] = counts.get(w.name, 0) + 1
    missing: list[str] = []
    for w in structs:
        title = w.name if counts[w.name] == 1 else f"{w.module.rsplit('.', 1)[-1]}.{w.name}"
        try:
            text = section_of(title)
        except AssertionError as exc:
            missing.append(str(exc))
            continue
        documented = table_names(text)
        missing += [f"`{title}`: field `{f}`" for f in w.fields if f not in documented]
        if w.tag is not None and f"`{w.tag}`" not in text:
            missing.append(f"`{title}`: its tag `{w.tag}`")
    assert not missing, "protocol.md does not document:\n" + "\n".join(missing)


def layout_constants() -> dict[str, tuple[str, set[int]]]:
    """Every field name :mod:`toolnexus.redis_broker._layout` defines (its text constants,
    but the status value ``OPEN``, the route's separator, the Lua prelude and what it
    imports; and each protocol's refusal fields, as ``REFUSAL_FIELDS[1].reason``), with
    the protocols that write it (a refusal's: its own; ``p``: 2; the rest: both)."""
    imported = {name for name in vars(_layout) if getattr(toolnexus.protocol, name, None)}
    out = {
        name: (value, {PROTOCOL} if name == "PROTOCOL_FIELD" else set(READS))
        for name, value in vars(_layout).items()
        if name.isupper()
        and not name.startswith("_")
        and isinstance(value, str)
        and name not in ("OPEN", "ROUTE_SEPARATOR", "LUA_FIELDS")
        and name not in imported
    }
    for protocol, names in REFUSAL_FIELDS.items():
        for part in ("reason", "by", "key", "sig", "digest"):
            out[f"REFUSAL_FIELDS[{protocol}].{part}"] = (getattr(names, part), {protocol})
    return out


def row_protocols(cell: str) -> set[int]:
    """The protocols a table row's Protocol cell names: ``1``, ``2``, ``1, 2``."""
    return {int(n) for n in re.findall(r"\d+", cell)}


def test_every_redis_field_name_is_on_the_page_with_its_constant_and_protocols() -> None:
    """Each field name of the layout has a row naming its constant, and the protocols
    that write it under that name (a row may name one constant in several protocols)."""
    constants = layout_constants()
    assert {"STATUS", "REPLY_ANSWER", "PROTOCOL_FIELD", "DEAD_RAW", "DEAD_GROUP"} <= set(constants)
    assert "REFUSAL_FIELDS[2].sig" in constants and "ENTRY_EVENT" in constants
    rows = [row for text in sections().values() for row in table_rows(text)]
    missing = []
    for name, (value, protocols) in constants.items():
        found: set[int] = set()
        for row in rows:
            if (
                len(row) > 2
                and f"`{name}`" in row[1]
                and re.fullmatch(rf"`{re.escape(value)}[^`]*`", row[0])
            ):
                found |= row_protocols(row[2])
        if found != protocols:
            missing.append(
                f"{name} = {value!r} (protocols {sorted(protocols)}, found {sorted(found)})"
            )
    assert not missing, "protocol.md has no right table row for: " + ", ".join(missing)


SIGNED_SECTIONS = {
    "request-digest-and-signature": "The request digest",
    "answer-signature": "The answer signature",
    "refusal-signature": "The refusal signature",
    "own-record-signature": "Own records",
}


def test_every_signed_field_and_prefix_is_on_the_page() -> None:
    """The fields of each signed layout (the vectors', which the tests above prove are the
    code's) are rows of their section; an own record's signed fields are named in its
    section; every purpose prefix is in the prefix table."""
    page = sections()
    missing = []
    for vector in VECTORS["signatures"]:
        heading = SIGNED_SECTIONS[vector["name"].split(":")[0]]
        text = page[heading]
        documented = table_names(text)
        missing += [f"{heading}: `{f}`" for f in vector["fields"] if f not in documented]
        if heading == "Own records":
            missing += [
                f"{heading}: `{f}`" for f in vector["fields"]["fields"] if f"`{f}`" not in text
            ]
    prefixes = table_names(page["Signed bytes"])
    for prefix in (
        pv.REQUEST_DIGEST,
        pv.REQUEST_SIGNATURE,
        pv.ANSWER_SIGNATURE,
        pv.REQUEST_BYTES,
        pv.REFUSAL_SIGNATURE,
        pv.OWN_SIGNATURE,
    ):
        if prefix.decode().replace("\n", "\\n") not in prefixes:
            missing.append(f"prefix {prefix!r}")
    assert not missing, "protocol.md does not document:\n" + "\n".join(missing)


# -- the real code on real Redis writes what the vectors show -------------------------------


def layout_of(name: str, protocol: int) -> set[str]:
    """The field names of Redis vector ``name`` of ``protocol``."""
    return set(named("redis", protocol)[name]["fields"])


def documented_names() -> set[str]:
    return {name for text in sections().values() for name in table_names(text)}


async def stream(client: aioredis.Redis, key: str) -> list[tuple[str, dict[str, bytes]]]:
    return [
        (entry.decode(), {k.decode(): v for k, v in fields.items()})
        for entry, fields in await client.xrange(key)
    ]


async def hash_of(client: aioredis.Redis, key: str) -> dict[str, bytes]:
    return {k.decode(): v for k, v in (await client.hgetall(key)).items()}


def connect(url: str, namespace: str, **options: Any) -> RedisBroker:
    broker = toolnexus.connect(
        url, namespace=namespace, agent="agent-7", block_ms=100, lease_ms=600, **options
    )
    assert isinstance(broker, RedisBroker)
    return broker


@pytest.mark.redis
@PROTOCOLS
async def test_a_request_answered_on_redis_lands_as_the_vectors_show(
    redis_url: str, namespace: str, protocol: int
) -> None:
    """Publish, heartbeat, answer and settle with the real code (signing with the test
    key), agent and responder with ``write_protocol=protocol``; every stream entry, hash
    and string has the fields of that protocol's vector, each value decodes as the
    vector's does, in that protocol, and encodes back to the same bytes, and every field
    name found is on the page."""
    client = aioredis.Redis.from_url(redis_url)
    options: dict[str, Any] = {
        "signing_key": KEY,
        "trusted_keys": KEYRING,
        "write_protocol": protocol,
    }
    agent = connect(redis_url, namespace, **options)
    bot = connect(redis_url, namespace, **options)

    def layout(name: str) -> set[str]:
        return layout_of(name, protocol)

    def decoded(data: bytes, cls: type[Any]) -> Any:
        number, found = MSGPACK.decode_as_with_protocol(data, cls)
        assert number == protocol
        assert MSGPACK.encode(found, protocol) == data
        return found

    seen: set[str] = set()
    async with agent, bot:
        keys, request = agent.keys, ask("Deploy?")
        wait = asyncio.create_task(agent.wait_for(request, timeout_s=30))
        state_key = await opened(agent, request.id)
        waiter = agent.waiter_id

        [(entry, fields)] = await stream(client, keys.requests)
        assert set(fields) == layout("request-stream-entry")
        payload = fields["r"]
        published = decoded(payload, Request)
        assert (published.id, published.reply_to) == (request.id, waiter)
        assert verify_request(published, KEYRING) == KEY.name

        route = await client.get(keys.route(request.id))
        assert route == route_value(waiter, entry, protocol).encode()
        assert route.count(b" ") == protocol  # protocol 2: a third part, "2"
        assert parse_route(route) == (waiter, entry)

        state = await hash_of(client, state_key)
        assert set(state) == layout("state-open-plain")
        assert entry_protocol({k.encode(): v for k, v in state.items()}, "state") == protocol
        assert state["s"] == b"open" and state["x"].isdigit()
        assert abs(int(state["x"]) - (published.expires_at or 0) * 1000) < 1000

        alive = keys.alive(waiter)
        mark = await client.get(alive)
        assert mark == liveness_value(protocol).encode()
        vector = value_of(named("redis", protocol)["liveness-mark"]["value"])
        assert mark == vector.replace(pv.VERSION.encode(), version().encode())
        assert await client.pttl(alive) > 0

        await bot.heartbeat("ops", "web-1", ttl_s=30, info={"pid": 4242})
        beats = await hash_of(client, keys.heartbeats())
        assert set(beats) == layout("heartbeat")
        beat = decoded(beats["ops/web-1"], Heartbeat)
        assert (beat.group, beat.consumer, beat.info) == ("ops", "web-1", {"pid": 4242})
        assert (beat.version, beat.reads, beat.writes) == (version(), [1, 2], protocol)
        shown = msgspec.to_builtins(beat)
        assert set(shown) == set(named("messages", protocol)["heartbeat"]["meaning"])

        async with bot.responder("ops") as pending, asyncio.timeout(10):
            shown = await anext(pending)
            await shown.accept(person="web:alice@ops.example.com")
        answer = await asyncio.wait_for(wait, 10)
        assert answer.responder == KEY.name

        [(_, reply)] = await stream(client, keys.answers(waiter))
        assert set(reply) == layout("reply-stream-answer")
        stored = decoded(reply["a"], Answer)
        assert verify_answer(stored, published, KEYRING) == KEY.name
        state = await hash_of(client, state_key)
        assert set(state) == layout("state-answered") and state["s"] == b"answered"
        assert state["a"] == reply["a"]

        own_audit = keys.agent_audit(waiter.partition(".")[0])  # the waiter's records

        async def settled() -> bool:
            return bool(await client.xlen(keys.events)) and bool(await client.xlen(own_audit))

        await eventually(settled, "the answered event and the audit record")
        events = await stream(client, keys.events)
        for _, fields in events:
            assert set(fields) == layout("events-stream-entry")
            number, event = MSGPACK.decode_with_protocol(fields["e"])
            assert number == protocol and MSGPACK.encode(event, protocol) == fields["e"]
        [(_, record)] = await stream(client, own_audit)
        assert set(record) == layout("audit-stream-entry")
        kept = audit.decode_record(record["r"])
        assert audit.check_record(kept, KEYRING) == KEY.name
        assert MSGPACK.decode_with_protocol(kept.answer or b"")[0] == protocol
        assert await client.xlen(keys.requests) == 0  # settled: the entry deleted
        for found in (fields, reply, state, record, beats):
            seen.update(found)
    await client.aclose()
    seen.discard("ops/web-1")  # a heartbeat's field is group/consumer
    assert seen <= documented_names()


@pytest.mark.redis
@PROTOCOLS
async def test_a_refusal_and_its_dead_letter_land_as_the_vectors_show(
    redis_url: str, namespace: str, protocol: int
) -> None:
    """A responder that requires signatures refuses an unsigned request of an agent with
    ``write_protocol=protocol``: its signed refusal on the reply stream (in the
    request's protocol, whatever the responder's own ``write_protocol``) and the dead
    letter (in the responder's) have that protocol's vectors' fields, and the refusal
    verifies over the exact bytes published."""
    client = aioredis.Redis.from_url(redis_url)
    agent = connect(redis_url, namespace, write_protocol=protocol)
    strict = connect(
        redis_url,
        namespace,
        signing_key=KEY,
        trusted_keys=KEYRING,
        require_signatures=True,
        write_protocol=protocol,
    )
    async with agent, strict:
        keys, request = agent.keys, ask("Deploy?")
        wait = asyncio.create_task(agent.wait_for(request, timeout_s=30))
        try:
            await opened(agent, request.id)
            [(entry, fields)] = await stream(client, keys.requests)
            payload = fields["r"]

            async def read() -> None:
                async with strict.responder("strict") as pending:
                    async for _ in pending:
                        pass

            reading = asyncio.create_task(read())
            try:
                answers = keys.answers(agent.waiter_id)
                await eventually(lambda: client.xlen(answers), "the refusal")
                await eventually(lambda: client.xlen(keys.dead), "the dead letter")
            finally:
                reading.cancel()
                await asyncio.gather(reading, return_exceptions=True)
        finally:
            wait.cancel()
            await asyncio.gather(wait, return_exceptions=True)
        [(_, refusal)] = await stream(client, answers)
        assert set(refusal) == layout_of("reply-stream-refusal", protocol)
        assert refusal["id"] == request.id.encode()
        assert MSGPACK.decode_with_protocol(payload)[0] == protocol
        names = REFUSAL_FIELDS[protocol]
        signature = Signature(
            refusal[names.key].decode(), refusal[names.sig], refusal[names.digest]
        )
        reason = refusal[names.reason].decode()
        assert reason == "missing signature"
        assert verify_refusal(request.id, payload, reason, signature, KEYRING) == KEY.name
        [(_, dead)] = await stream(client, keys.dead)
        assert set(dead) == layout_of("dead-letter", protocol)
        assert dead["group"] == b"strict"
        assert dead["raw"] == b"r=" + payload
        assert (dead["stream"], dead["entry"]) == (keys.requests.encode(), entry.encode())
    await client.aclose()
    assert set(refusal) | set(dead) <= documented_names()


@pytest.mark.redis
@PROTOCOLS
async def test_the_tool_call_ledger_lands_as_the_vectors_show(
    redis_url: str, namespace: str, protocol: int
) -> None:
    """A tool call decided and claimed by the real ledger with ``write_protocol=protocol``,
    in the agent's own store on Redis: the entry and the signed claim have that
    protocol's vectors' fields, the claim verifies with the test key, and every field
    name found is on the page."""
    client = aioredis.Redis.from_url(redis_url)
    agent = connect(
        redis_url, namespace, signing_key=KEY, trusted_keys=KEYRING, write_protocol=protocol
    )
    async with agent:
        arguments = {"to": "ACME", "amount": 10}
        request = _tool_call.tool_call_request("transfer", arguments, framework="vectors")
        answer = Answer(id=request.id, ok=True)
        decision = _tool_call.checked_decision(request, answer)
        ledger = _tool_call.Ledger.of(agent)
        await ledger.decided(request, decision)
        await ledger.executing(request.id, "transfer", arguments, approved=decision.digest)
        store = await hash_of(client, agent.keys.agent_store("agent-7", _tool_call.LEDGER_STORE))
    await client.aclose()
    stores = named("stores", protocol)
    assert set(store) == {
        stores["tool-call-ledger-entry"]["field"].replace(pv.REQUEST_ID, request.id),
        stores["tool-call-claim"]["field"].replace(pv.REQUEST_ID, request.id),
    }
    entry = json.loads(store[request.id])
    assert set(entry) == set(json.loads(stores["tool-call-ledger-entry"]["json"]))
    assert entry["proposed"] == entry["approved"] == decision.digest
    raw_claim = store[f"{request.id}:executed"]
    assert set(json.loads(raw_claim)) == set(json.loads(stores["tool-call-claim"]["json"]))
    claim = msgspec.json.decode(raw_claim, type=_tool_call._Claim)
    assert msgspec.json.encode(claim) == raw_claim
    verify_own(_tool_call.CLAIM_KIND, claim.signed(request.id), claim.signature, KEY, "claim")
    assert set(entry) | set(json.loads(raw_claim)) <= documented_names()


# -- answer links (between workers, not in Redis) -----------------------------------------


@pytest.mark.parametrize("how", ["ed25519", "hmac"])
def test_an_answer_link_reads_as_its_meaning_and_is_made_as_its_bytes(how: str) -> None:
    vector = named("links")[f"answer-link-{how}"]
    link_key = (
        links.LinkKey(key=KEY)
        if how == "ed25519"
        else links.LinkKey(secret=VECTORS["link_secret"]["secret"])
    )
    payload = vector["payload"]
    claims = link_key.read(vector["token"], now=pv.CREATED)
    assert (claims.queue, claims.request_id, claims.digest, claims.recipient) == (
        payload["q"],
        payload["id"],
        payload["d"],
        payload["to"],
    )
    assert (claims.expires_at, claims.action, claims.nonce) == (
        payload["exp"],
        payload["do"],
        payload["n"],
    )
    assert payload["d"] == links.request_digest(message("request-published"))
    body, _, sig = vector["token"].rpartition(".")
    assert body == vector["signed"]
    with pytest.raises(links.BadLink):
        link_key.read(f"{body}.{'A' if sig[0] != 'A' else 'B'}{sig[1:]}", now=pv.CREATED)
    # made by the code: the same payload text (but its random nonce), the same signature
    minted = link_key.mint(
        payload["q"], message("request-published"), payload["to"], action=payload["do"]
    )
    prefix, text, _ = minted.split(".")
    decoded = json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
    assert list(decoded) == list(payload)
    same = json.dumps({**decoded, "n": payload["n"]}, separators=(",", ":"))
    assert (prefix, same) == ("tnl1", vector["payload_json"])
    if how == "ed25519":
        assert base64.urlsafe_b64encode(KEY.sign(body.encode())).rstrip(b"=").decode() == sig
    assert set(decoded) <= table_names(sections()["Answer links"])
