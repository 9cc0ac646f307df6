"""Audit records: what became of each request, kept verifiable offline (SPEC §11).

A record says who asked (server, tool, agent, and the agent's verified key), who
answered (the verified responder key and the person behind it), the outcome and
times, whether signatures verified, and every refused attempt with its reason. It
holds the published request and the signed answer as they were encoded, so that
:func:`verify_record` can prove the outcome later with nothing but the public keys.

    record = audit_record(request, "answered", answer, verified=True)
    stored = encode_record(record)                       # what the audit stream holds
    verify_record(decode_record(stored), keyring)        # True: proven by the responder's key
"""

from __future__ import annotations

import time
from typing import Final

import msgspec

from .codec import JSON, MSGPACK, Codec, Format
from .errors import DecodeError, SignatureError
from .models import Answer, Hop, Request, Source
from .signing import Keyring, verify_answer, verify_request

AUDIT_VERSION: Final = 1


class Refusal(msgspec.Struct, omit_defaults=True, frozen=True):
    """One answer refused for a request: why, and whom it claimed to come from."""

    reason: str
    responder: str | None = None  # as claimed: unverified
    key: str | None = None  # the key its signature named, if it had one
    person: str | None = None
    at: float = msgspec.field(default_factory=time.time)

    @classmethod
    def of(cls, answer: Answer | None, reason: str) -> Refusal:
        """The refusal of ``answer`` (``None``: an entry that was not even an answer)."""
        if answer is None:
            return cls(reason=reason)
        key = answer.signature.key if answer.signature is not None else None
        return cls(reason=reason, responder=answer.responder, key=key, person=answer.person)


class AuditRecord(msgspec.Struct, tag="audit", tag_field="type", omit_defaults=True):
    """The resolution of one request.

    ``status`` is how it was resolved (``answered``, ``expired``, ``withdrawn``);
    ``ok``/``reason`` the outcome the waiter got. ``requester`` is the verified key
    that signed the request; ``responder`` the verified key that signed the answer.
    ``verified``: ``True`` the answer's signature verified, ``False`` it did not (or
    there was none) with signatures checked, ``None`` signatures were not in use.
    ``request`` and ``answer`` are the messages as encoded in ``format``. For a request
    that needed a quorum (SPEC §14), ``answer`` is the deciding vote and ``votes`` holds
    every vote counted, each signed by its responder, as encoded. ``defaulted``:
    the outcome was the request's default on expiry (``status`` ``expired``), no
    person's answer; ``durable``: the request was waited for durably; ``escalated`` lists
    the hops the request took, each with the seconds after ``created_at`` at which it was
    published to its queue (SPEC §14).
    """

    id: str
    status: str
    kind: str = ""
    source: Source = Source()
    requester: str | None = None
    ok: bool | None = None
    reason: str | None = None
    responder: str | None = None
    person: str | None = None
    created_at: float | None = None
    answered_at: float | None = None
    resolved_at: float = msgspec.field(default_factory=time.time)
    verified: bool | None = None
    refused: list[Refusal] = msgspec.field(default_factory=list)
    escalated: list[Hop] = msgspec.field(default_factory=list)
    format: Format = "msgpack"
    request: bytes | None = None
    answer: bytes | None = None
    votes: list[bytes] = msgspec.field(default_factory=list)
    defaulted: bool = False
    durable: bool = False


def audit_record(
    request: Request,
    status: str,
    answer: Answer | None = None,
    *,
    verified: bool | None,
    requester: str | None = None,
    refused: list[Refusal] | None = None,
    votes: list[bytes] | None = None,
    escalated: list[Hop] | None = None,
    codec: Codec = MSGPACK,
    encoded_request: bytes | None = None,
) -> AuditRecord:
    """The record of ``request`` resolved as ``status`` with ``answer`` (the one the
    waiter got: signed by its responder, or the broker's own for an expiry).

    ``requester`` is the key name :func:`~toolnexus.signing.verify_request` returned;
    ``encoded_request`` is ``request`` as ``codec`` encoded it, if the caller has it;
    ``votes`` the votes of a quorum, as ``codec`` encoded them.
    """
    return AuditRecord(
        id=request.id,
        status=status,
        kind=request.kind,
        source=request.source,
        requester=requester,
        ok=None if answer is None else answer.ok,
        reason=None if answer is None else answer.reason,
        responder=None if answer is None else answer.responder,
        person=None if answer is None else answer.person,
        created_at=request.created_at,
        answered_at=None if answer is None else answer.answered_at,
        verified=verified,
        refused=list(refused or ()),
        escalated=list(escalated or ()),
        format=codec.format,
        request=codec.encode(request) if encoded_request is None else encoded_request,
        answer=None if answer is None else codec.encode(answer),
        votes=list(votes or ()),
        defaulted=answer is not None and answer.defaulted,
        durable=request.durable,
    )


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(tuple[int, AuditRecord])


def encode_record(record: AuditRecord) -> bytes:
    """``record`` as msgpack, behind a version marker (as the audit stream holds it)."""
    data: bytes = _ENCODER.encode((AUDIT_VERSION, record))
    return data


def decode_record(data: bytes | bytearray | memoryview) -> AuditRecord:
    """The record :func:`encode_record` wrote.

    Raises:
        DecodeError: ``data`` is not an audit record.
    """
    try:
        version, record = _DECODER.decode(data)
    except msgspec.DecodeError as exc:
        raise DecodeError(f"not a toolnexus audit record: {exc}") from exc
    if version < 1:
        raise DecodeError(f"invalid audit record version {version}")
    return record


def check_record(record: AuditRecord, keyring: Keyring) -> str:
    """The verified responder of ``record``: its signed answer verifies against its
    request under ``keyring``, and the record says what that answer says. A record
    naming a ``requester`` needs that key to have signed the request too, and every vote
    of a quorum must verify as well.

    Raises:
        SignatureError: ``reason`` says what failed (``"no signed answer"``, ``"bad
            signature"``, ``"record does not match its signed answer"``, ...).
    """
    what = f"audit record {record.id!r}"
    if record.request is None or record.answer is None:
        raise SignatureError(what, "no signed answer")
    codec = MSGPACK if record.format == "msgpack" else JSON
    try:
        request = codec.decode_as(record.request, Request)
        answer = codec.decode_as(record.answer, Answer)
    except DecodeError as exc:
        raise SignatureError(what, f"undecodable: {exc}") from exc
    if request.id != record.id:
        raise SignatureError(what, "signed for another request")
    responder = verify_answer(answer, request, keyring)
    if record.requester is not None and verify_request(request, keyring) != record.requester:
        raise SignatureError(what, "requester name does not match key")
    said = (record.ok, record.reason, record.responder, record.person, record.answered_at)
    signed = (answer.ok, answer.reason, responder, answer.person, answer.answered_at)
    if said != signed:
        raise SignatureError(what, "record does not match its signed answer")
    for vote in record.votes:
        try:
            verify_answer(codec.decode_as(vote, Answer), request, keyring)
        except (DecodeError, SignatureError) as exc:
            raise SignatureError(what, f"a vote does not verify: {exc}") from exc
    return responder


def verify_record(record: AuditRecord, keyring: Keyring) -> bool:
    """Whether ``record``'s outcome is proven by its signed answer (see :func:`check_record`)."""
    try:
        check_record(record, keyring)
    except SignatureError:
        return False
    return True
