"""Audit records: encoded as the audit stream holds them, and verifiable offline."""

from __future__ import annotations

import msgspec
import pytest

from toolnexus import (
    JSON,
    MSGPACK,
    Answer,
    AuditRecord,
    Codec,
    DecodeError,
    Keyring,
    Request,
    SignatureError,
    SigningKey,
    Source,
)
from toolnexus.audit import (
    Refusal,
    audit_record,
    check_record,
    decode_record,
    encode_record,
    verify_record,
)
from toolnexus.signing import sign_answer, sign_request

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
