"""Audit records: encoded as the audit stream holds them, and verifiable offline."""

from __future__ import annotations

import msgspec
import pytest

from toolnexus import Answer, Request, Source
from toolnexus.codec import JSON, MSGPACK, Codec
from toolnexus.errors import DecodeError, SignatureError
from toolnexus.security import AuditRecord, Keyring, SigningKey, verify_record
from toolnexus.security._audit import (
    Refusal,
    audit_record,
    check_record,
    decode_record,
    encode_record,
)
from toolnexus.security._signing import request_digest, sign_answer, sign_request

AGENT = SigningKey.generate("agent-7")
BOT = SigningKey.generate("ops-bot")
OPS = Keyring.of(AGENT, BOT)  # an auditor trusts both sides


def resolved(codec: Codec = MSGPACK) -> AuditRecord:
    request = sign_request(
        Request(
            id="req-1",
            kind="approval",
            prompt="Deploy to production?",
            source=Source(server="deployer", tool="deploy", agent="agent-7"),
            expires_at=1_900_000_000.0,
            reply_to="waiter-1",
            allow=["ops-bot"],
        ),
        AGENT,
    )
    answer = sign_answer(Answer(id="req-1", ok=True, person="slack:U123"), request, BOT)
    forged = Answer(id="req-1", ok=True, responder="alice@ops")
    return audit_record(
        request,
        "answered",
        answer,
        verified=True,
        requester="agent-7",
        refused=[Refusal.of(forged, "missing signature"), Refusal.of(None, "undecodable entry")],
        codec=codec,
    )


@pytest.mark.parametrize("codec", [MSGPACK, JSON], ids=lambda c: c.format)
def test_a_record_survives_encoding_and_verifies_offline(codec: Codec) -> None:
    record = resolved(codec)
    stored = decode_record(encode_record(record))
    assert stored == record
    assert (stored.status, stored.ok, stored.responder, stored.person) == (
        "answered",
        True,
        "ops-bot",
        "slack:U123",
    )
    assert stored.source.tool == "deploy" and stored.requester == "agent-7"
    assert [r.reason for r in stored.refused] == ["missing signature", "undecodable entry"]
    assert stored.refused[0].responder == "alice@ops" and stored.refused[1].responder is None
    assert stored.created_at is not None and stored.answered_at is not None
    assert stored.verified is True and stored.format == codec.format
    assert verify_record(stored, OPS)
    assert check_record(stored, OPS) == "ops-bot"


def test_a_refusal_names_the_key_its_signature_claimed() -> None:
    request = Request(id="req-1", kind="approval")
    by_stranger = sign_answer(Answer(id="req-1", ok=True), request, SigningKey.generate("eve"))
    refusal = Refusal.of(by_stranger, "unknown key 'eve'")
    assert (refusal.key, refusal.responder) == ("eve", "eve")


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"ok": False}, "record does not match its signed answer"),
        ({"responder": "alice@ops"}, "record does not match its signed answer"),
        ({"person": "slack:U999"}, "record does not match its signed answer"),
        ({"requester": "ops-bot"}, "requester name does not match key"),
        ({"id": "req-2"}, "signed for another request"),
        ({"answer": None}, "no signed answer"),
        ({"answer": b"\x92\x01garbage"}, None),
    ],
    ids=lambda v: next(iter(v)) if isinstance(v, dict) else str(v),
)
def test_an_edited_record_does_not_verify(change: dict[str, object], reason: str | None) -> None:
    record = msgspec.structs.replace(resolved(), **change)
    assert not verify_record(record, OPS)
    with pytest.raises(SignatureError) as info:
        check_record(record, OPS)
    if reason is not None:
        assert info.value.reason == reason
    else:
        assert info.value.reason.startswith("undecodable: not a msgpack message")


def test_a_record_does_not_verify_without_the_responder_key() -> None:
    assert not verify_record(resolved(), Keyring.of(AGENT))
    assert verify_record(msgspec.structs.replace(resolved(), requester=None), Keyring.of(BOT))


def test_an_answer_swapped_in_from_another_request_does_not_verify() -> None:
    other = sign_request(Request(id="req-2", kind="approval", reply_to="waiter-1"), AGENT)
    swapped = sign_answer(Answer(id="req-2", ok=True), other, BOT)
    record = msgspec.structs.replace(resolved(), answer=MSGPACK.encode(swapped))
    with pytest.raises(SignatureError, match="signed for another request"):
        check_record(record, OPS)


def test_an_expiry_is_recorded_but_proves_no_responder() -> None:
    request = Request(id="req-1", kind="approval")
    expired = Answer(id="req-1", ok=False, reason="expired")
    record = audit_record(request, "expired", expired, verified=False)
    assert (record.ok, record.reason, record.responder) == (False, "expired", None)
    assert not verify_record(decode_record(encode_record(record)), OPS)
    withdrawn = audit_record(request, "withdrawn", verified=None)
    assert withdrawn.answer is None and withdrawn.ok is None


def test_garbage_is_not_a_record() -> None:
    with pytest.raises(DecodeError, match="not a toolnexus audit record"):
        decode_record(b"\x01\x02")
    with pytest.raises(DecodeError, match="invalid audit record version 0"):
        decode_record(msgspec.msgpack.encode((0, resolved())))


def test_a_record_keeps_a_large_request_as_its_digest_and_an_excerpt() -> None:
    """A request over 8 KiB encoded is kept as an excerpt (a few KiB of the prompt, every
    other field bounded) beside its digest; the record still verifies, through the digest
    the answer's and the request's signatures bind."""
    big = Request(
        id="req-big",
        kind="input",
        prompt="é" * 600_000,
        data={"schema": {"type": "object", "title": "t" * 50_000}},
        url="https://example.com/" + "p" * 10_000,
        meta={"note": "m" * 10_000},
        allow=[f"ops-{i}" for i in range(1000)],
        reply_to="waiter-1",
    )
    request = sign_request(big, AGENT)
    answer = sign_answer(Answer(id="req-big", ok=True, data={}), request, BOT)
    record = decode_record(
        encode_record(audit_record(request, "answered", answer, verified=True, requester="agent-7"))
    )
    assert record.cut and record.digest == request_digest(request)
    assert len(encode_record(record)) < 16 * 1024
    kept = MSGPACK.decode_as(record.request or b"", Request)
    assert kept.prompt.startswith("éé") and len(kept.prompt.encode()) < 4200
    assert isinstance(kept.data, str) and len(kept.data) < 1100  # the data's JSON, cut
    assert len(kept.allow or ()) == 32 and kept.meta.keys() == {"cut"}
    assert kept.signature == request.signature
    assert check_record(record, OPS) == "ops-bot"
    with pytest.raises(SignatureError, match="signed for another request"):
        check_record(msgspec.structs.replace(record, digest=b"\0" * 32), OPS)
    with pytest.raises(SignatureError, match="no request digest"):
        check_record(msgspec.structs.replace(record, digest=None), OPS)


def test_a_small_request_is_kept_whole_and_must_match_its_digest() -> None:
    record = resolved()
    assert not record.cut and record.digest is not None
    other = msgspec.structs.replace(
        MSGPACK.decode_as(record.request or b"", Request), prompt="Deploy to staging?"
    )
    edited = msgspec.structs.replace(record, request=MSGPACK.encode(other))
    with pytest.raises(SignatureError, match="record does not match its request"):
        check_record(edited, OPS)
    # a record written before digests were kept (version 1) verifies from the request
    assert check_record(msgspec.structs.replace(record, digest=None), OPS) == "ops-bot"
