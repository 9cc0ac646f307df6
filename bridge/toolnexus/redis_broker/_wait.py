"""One wait in progress on the Redis broker's waiter side, and its audit record."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from ..lifecycle import Status
from ..models import EXPIRED, WITHDRAWN, Answer, Request
from ..protocol import PROTOCOL
from ..security._audit import AuditRecord, Refusal, audit_record
from ._core import Core
from ._durable import ReplyStream
from ._escalation import Escalation


@dataclass(eq=False, slots=True)
class Wait:
    """One wait in progress: its answer arrives decoded, or as ``None`` at its deadline.

    The request as published is ``asked`` with ``expires_at``, ``allow`` and the reply
    stream's waiter id (see :meth:`Publisher.published
    <toolnexus.redis_broker.publishing.Publisher.published>`). Its encoding, ``payload``,
    is kept only until it is first published, unless the wait ``keeps`` it (signed,
    checked or durable): a plain wait encodes it again in the rare case it is published
    again, which gives the same bytes, instead of holding them for as long as it waits."""

    request_id: str
    asked: Request  # the caller's request (the caller holds it anyway)
    expires_at: float  # the deadline as published, Unix time
    allow: Sequence[str] | None  # the allow-list as published, if any
    deadline_ms: int  # Unix time
    answer: asyncio.Future[Answer | None]
    checked: bool  # answers are checked (signatures in use, or an allow-list)
    replies: ReplyStream  # where its state and answers live
    payload: bytes | None  # the request as published, encoded (see above)
    keeps: bool  # the payload is kept for the whole wait
    published: bool = False
    entry_id: bytes | None = None  # in the request stream, once published
    verified: bool | None = None  # whether the answer taken verified (None: not checked)
    refusals: list[Refusal] | None = None  # answers refused, for the audit trail
    quorum: bool = False  # answers are votes, counted by quorum.py (SPEC §14)
    votes: list[bytes] | None = None  # a quorum's votes taken, for the audit trail
    escalation: Escalation | None = None  # its hops (SPEC §14), if it escalates
    reached: list[tuple[str, str | None]] | None = None  # attached: the hop record (hints)
    recorded: bool = False  # its end has its audit record (see Waiter._ended)
    republished: bool = False  # published again after its entry was replaced
    # refusals of the request itself that count, by group ('' for one naming none): the
    # reason, who refused it, and whether its signature verified (see Waiter.refusal)
    refused_by: dict[str, tuple[str, str | None, bool]] | None = None
    protocol: int = PROTOCOL  # the protocol its request was published in (see protocol.py)


def expire(wait: Wait) -> None:
    """A wait past its deadline gets ``None`` as its answer."""
    wait.answer.set_result(None)


def ended(wait: Wait) -> bool:
    return wait.answer.done()


def status_of(answer: Answer) -> Status:
    """How a request ended whose waiter got ``answer``, as its audit record says."""
    if answer.reason == EXPIRED:
        return Status.EXPIRED
    if answer.reason == WITHDRAWN:
        return Status.WITHDRAWN
    return Status.ANSWERED


def audit_of(
    core: Core, wait: Wait, published: Request, status: str, answer: Answer
) -> AuditRecord:
    """The audit record of ``wait`` (its request ``published``), which ended as ``status``
    with ``answer``."""
    requester = published.signature.key if published.signature is not None else None
    # An answer the wait verified holds the request's digest, checked: no need to compute it
    signed = answer.signature if wait.verified else None
    return audit_record(
        published,
        status,
        answer,
        verified=wait.verified,
        requester=requester,
        refused=wait.refusals,
        votes=wait.votes,
        escalated=wait.escalation.taken if wait.escalation is not None else None,
        codec=core.codec.writing(wait.protocol),
        encoded_request=wait.payload,
        digest=signed.digest if signed is not None else None,
    )
