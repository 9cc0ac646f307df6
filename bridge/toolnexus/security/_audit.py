"""Audit records: what became of each request, kept verifiable offline (SPEC §11).

A record says who asked (server, tool, agent, and the agent's verified key), who
answered (the verified responder key and the person behind it), the outcome and
times, whether signatures verified, and every refused attempt with its reason. It
holds the digest of the published request (the one the answer's signature binds), the
request itself as encoded if it is small (:data:`REQUEST_KEPT_BYTES`) or else an
excerpt of it (:func:`excerpt`: a few KiB of the prompt, data bounded), and the signed
answer as encoded, so that :func:`verify_record` can prove the outcome later with
nothing but the public keys, and a record never holds a large request's bytes.

    record = audit_record(request, "answered", answer, verified=True)
    stored = encode_record(record)                       # what the audit stream holds
    verify_record(decode_record(stored), keyring)        # True: proven by the responder's key
"""

from __future__ import annotations

import time
from typing import Any, Final

import msgspec

from ..codec import JSON, MSGPACK, Codec, Format
from ..errors import DecodeError, SignatureError
from ..models import Answer, Hop, Request, Source
from ..protocol import newer
from ._signing import Keyring, request_digest, verify_answer_digest, verify_request_digest

AUDIT_VERSION: Final = 2
"""2: a record holds the request's ``digest``, and an excerpt of a large request."""

REQUEST_KEPT_BYTES: Final = 8 * 1024
"""A request encoded in at most this many bytes is kept whole in its audit record; a
larger one is kept as its :func:`excerpt`."""

EXCERPT_PROMPT_BYTES: Final = 4 * 1024
"""Bytes of the prompt (UTF-8) an excerpt keeps."""

EXCERPT_VALUE_BYTES: Final = 1024
"""Bytes an excerpt keeps of each other field (data, url, meta, ...), as JSON text."""

EXCERPT_NAME_BYTES: Final = 256
"""Bytes an excerpt keeps of a name (the kind, the source's, an allow-list entry, a queue)."""

EXCERPT_ITEMS: Final = 32
"""Entries an excerpt keeps of a list (the allow-list, the escalation hops)."""


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
    ``digest`` is the request's (:func:`~toolnexus.security._signing.request_digest`), which the
    answer's signature binds; ``request`` the request as encoded in ``format``, or with
    ``cut``, its :func:`excerpt` (the request was over :data:`REQUEST_KEPT_BYTES`);
    ``answer`` the answer as encoded. For a request
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
    digest: bytes | None = None  # None in records of version 1, which hold the whole request
    cut: bool = False


def _cut_text(text: str, limit: int) -> str:
    """``text`` if it is at most ``limit`` bytes in UTF-8, else its first ``limit`` bytes
    and a note of its size."""
    if len(text) * 4 <= limit:  # short enough whatever its characters
        return text
    raw = text.encode("utf-8", "surrogatepass")
    if len(raw) <= limit:
        return text
    return raw[:limit].decode("utf-8", "ignore") + f"... [{len(raw)} bytes in all]"


_JSON_ENCODER = msgspec.json.Encoder()


def _cut_value(value: Any, limit: int) -> Any:
    """``value`` if its JSON is at most ``limit`` bytes, else that JSON text cut short."""
    if value is None or isinstance(value, bool | int | float):
        return value
    try:
        raw = _JSON_ENCODER.encode(value)
    except (TypeError, ValueError, msgspec.EncodeError):
        return "[not JSON]"
    if len(raw) <= limit:
        return value
    return _cut_text(raw.decode("utf-8", "replace"), limit)


def excerpt(request: Request) -> Request:
    """``request`` with its bulky fields cut: the prompt to :data:`EXCERPT_PROMPT_BYTES`,
    names to :data:`EXCERPT_NAME_BYTES`, every other text and value to
    :data:`EXCERPT_VALUE_BYTES` (a value too long becomes its JSON text, cut), lists to
    :data:`EXCERPT_ITEMS` entries: some 16 KiB at most. Still a request, so that tools
    that show one show it; its signature is kept, which verifies against the request's
    digest, not against the excerpt (:func:`check_record`)."""
    limit, name = EXCERPT_VALUE_BYTES, EXCERPT_NAME_BYTES
    meta = _cut_value(request.meta, limit)
    trace = _cut_value(request.trace, limit)
    on_expiry = request.on_expiry
    if on_expiry is not None:
        on_expiry = msgspec.structs.replace(on_expiry, data=_cut_value(on_expiry.data, limit))
    source = [
        None if n is None else _cut_text(n, name) for n in msgspec.structs.astuple(request.source)
    ]
    allow = request.allow
    escalate = request.escalate
    return msgspec.structs.replace(
        request,
        kind=_cut_text(request.kind, name),
        prompt=_cut_text(request.prompt, EXCERPT_PROMPT_BYTES),
        data=_cut_value(request.data, limit),
        url=None if request.url is None else _cut_text(request.url, limit),
        source=Source(*source),
        trace=trace if not isinstance(trace, str) else {"cut": trace},
        meta=meta if not isinstance(meta, str) else {"cut": meta},
        allow=None if allow is None else [_cut_text(n, name) for n in allow[:EXCERPT_ITEMS]],
        escalate=None
        if escalate is None
        else [Hop(hop.after_s, _cut_text(hop.queue, name)) for hop in escalate[:EXCERPT_ITEMS]],
        on_expiry=on_expiry,
    )


def kept_request(
    request: Request, codec: Codec = MSGPACK, encoded: bytes | None = None
) -> tuple[bytes, bool]:
    """What an audit record keeps of ``request`` (``encoded`` its encoding by ``codec``, if
    the caller has it): the encoding if it is at most :data:`REQUEST_KEPT_BYTES`, else its
    :func:`excerpt`'s; and whether it is an excerpt."""
    whole = codec.encode(request) if encoded is None else encoded
    if len(whole) <= REQUEST_KEPT_BYTES:
        return whole, False
    return codec.encode(excerpt(request)), True


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
    digest: bytes | None = None,
) -> AuditRecord:
    """The record of ``request`` resolved as ``status`` with ``answer`` (the one the
    waiter got: signed by its responder, or the broker's own for an expiry).

    ``requester`` is the key name :func:`~toolnexus.security._signing.verify_request` returned;
    ``encoded_request`` is ``request`` as ``codec`` encoded it, and ``digest`` its
    :func:`~toolnexus.security._signing.request_digest`, if the caller has them; ``votes`` the
    votes of a quorum, as ``codec`` encoded them. The record keeps the request whole
    only if it is small (see :func:`kept_request`).
    """
    kept, cut = kept_request(request, codec, encoded_request)
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
        request=kept,
        answer=None if answer is None else codec.encode(answer),
        votes=list(votes or ()),
        defaulted=answer is not None and answer.defaulted,
        durable=request.durable,
        digest=request_digest(request) if digest is None else digest,
        cut=cut,
    )


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(tuple[int, AuditRecord])


def encode_record(record: AuditRecord) -> bytes:
    """``record`` as msgpack, behind a version marker (as the audit stream holds it)."""
    data: bytes = _ENCODER.encode((AUDIT_VERSION, record))
    return data


def decode_record(data: bytes | bytearray | memoryview) -> AuditRecord:
    """The record :func:`encode_record` wrote, of record version 1 or 2 (the same in
    protocols 1 and 2 of :mod:`toolnexus.protocol`: the stream entry is ``[2, record]``
    in both, its request and answer bytes in the request's protocol).

    Raises:
        DecodeError: ``data`` is not an audit record.
    """
    try:
        version, record = _DECODER.decode(data)
    except msgspec.DecodeError as exc:
        raise DecodeError(f"not a toolnexus audit record: {exc}") from exc
    if version > AUDIT_VERSION:
        raise DecodeError(newer(version, "audit record"))
    if version < 1:
        raise DecodeError(f"invalid audit record version {version}")
    return record


def check_record(record: AuditRecord, keyring: Keyring) -> str:
    """The verified responder of ``record``: its signed answer verifies against the
    request's digest under ``keyring``, and the record says what that answer says. A
    record naming a ``requester`` needs that key to have signed the digest too, and every
    vote of a quorum must verify as well. A request kept whole must have that digest; an
    excerpt (``cut``) cannot: what it shows of the request is not proven, the digest is.

    Raises:
        SignatureError: ``reason`` says what failed (``"no signed answer"``, ``"bad
            signature"``, ``"record does not match its signed answer"``, ``"record does
            not match its request"``, ...).
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
    digest = record.digest
    if not record.cut:
        whole = request_digest(request)
        if digest is not None and digest != whole:
            raise SignatureError(what, "record does not match its request")
        digest = whole
    elif digest is None:
        raise SignatureError(what, "no request digest")
    responder = verify_answer_digest(answer, record.id, digest, keyring)
    if record.requester is not None:
        signer = verify_request_digest(record.id, digest, request.signature, keyring)
        if signer != record.requester:
            raise SignatureError(what, "requester name does not match key")
    said = (record.ok, record.reason, record.responder, record.person, record.answered_at)
    signed = (answer.ok, answer.reason, responder, answer.person, answer.answered_at)
    if said != signed:
        raise SignatureError(what, "record does not match its signed answer")
    for vote in record.votes:
        try:
            verify_answer_digest(codec.decode_as(vote, Answer), record.id, digest, keyring)
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
