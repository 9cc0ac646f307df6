"""Answering a request on the Redis broker: the checks an answer passes (the form, the
allow-list, a signature added), and the resolve step with its retries, for a responder
holding the request and for :meth:`RedisBroker.answer` by id alone. A quorum's answer is a
vote (:mod:`.quorum`); a request whose waiter cannot end it is ended here (:func:`finish`).
"""

from __future__ import annotations

import time
from typing import Literal

from ..audit import audit_record
from ..broker import NOT_RESOLVED_REASONS
from ..errors import AlreadyResolved, AlreadyVoted, BrokerUnavailable, NotAllowed, UnknownRequest
from ..keys import WAITER_ID, check_request_id
from ..models import EXPIRED, WITHDRAWN, Answer, Event, Request
from ..outcomes import expired_answer
from ..schema import check_answer
from ..signing import allowed
from ..voting import voter_of
from ._core import CONNECTION_ERRORS, Backoff, Core, boundary, text
from .escalation import settle_reached
from .quorum import cast_vote


def waiter_of(request: Request) -> str:
    assert request.reply_to is not None  # checked when the request was read
    return request.reply_to


async def resolve_answer(
    core: Core,
    request: Request,
    answer: Answer,
    payload: bytes,
    entry: str | None = None,
    group: str | None = None,
    *,
    alone: bool = False,
) -> tuple[Event | None, bool]:
    """Resolve ``request`` (stream entry ``entry``, if known) with the checked ``answer``
    (encoded as ``payload``), retrying while Redis is away for up to ``answer_patience_s``.
    With ``group`` (the consumer group holding ``entry``), the resolve settles the entry
    where it can (see :meth:`Core.resolve`); ``alone`` says the caller expects no company
    this turn. Returns the event to publish, if any, and whether the entry was settled.
    For a request that needs a quorum the answer is a vote (SPEC §14, :mod:`.quorum`):
    a vote counted that does not decide returns the ``approved`` event to publish.

    Raises:
        AlreadyVoted: a quorum's voter voted before, or (``contested``) another vote is
            stored under this voter and the waiter checks both; the request stays open.
        AlreadyResolved: answered, expired or withdrawn first (a dead waiter's request
            is withdrawn here and then refused as such).
        UnknownRequest: the broker no longer knows the request.
        BrokerUnavailable: Redis stayed unreachable; the answer did not get through.
    """
    waiter = waiter_of(request)
    backoff: Backoff | None = None  # made on the first failure: most answers have none
    give_up = time.monotonic() + core.settings.answer_patience_s
    progress: Event | None = None
    settled = False
    settle = (group, entry) if group is not None and entry is not None else None
    while True:
        try:
            outcome: str
            if request.quorum is None:
                outcome, _stored, settled = await core.resolve(
                    waiter, request.id, "answered", payload, settle, alone=alone
                )
            else:
                outcome, progress, _stored = await cast_vote(core, request, answer, payload)
            break
        except CONNECTION_ERRORS as exc:
            if core.closed or time.monotonic() > give_up:
                raise BrokerUnavailable(
                    f"answering {request.id}: Redis unreachable: {type(exc).__name__}: {exc}"
                ) from exc
            backoff = backoff or Backoff(cap_s=0.5)
            await backoff.wait(f"answering {request.id}", exc)
    if outcome == "ok":
        return None, settled
    if outcome == "counted":
        return progress, settled
    if outcome in ("voted", "contested"):
        raise AlreadyVoted(request.id, voter_of(answer), contested=outcome == "contested")
    if outcome == "unknown":
        raise UnknownRequest(request.id)
    if outcome == "late":
        await finish(core, request, EXPIRED, entry)
        raise AlreadyResolved(request.id, "expired")
    if outcome == "gone":
        await finish(core, request, WITHDRAWN, entry)
        raise AlreadyResolved(request.id, "withdrawn")
    raise AlreadyResolved(request.id, NOT_RESOLVED_REASONS[outcome])


async def finish(
    core: Core, request: Request, status: Literal["expired", "withdrawn"], entry: str | None = None
) -> None:
    """Resolve as expired (with the request's default on expiry, if it has one) or
    withdrawn a request whose waiter cannot (it died, or the deadline passed with nobody
    to record it), tell responders, and delete its ``entry``."""
    ending = (
        expired_answer(request)
        if status == EXPIRED
        else Answer(id=request.id, ok=False, reason=status)
    )
    answer = core.signatures.sign_answer(ending, request)
    payload = core.codec.encode(answer)
    outcome, _, _ = await core.resolve(waiter_of(request), request.id, status, payload)
    if outcome == "ok":
        event = Event(event=status, id=request.id, answer=answer)
        await settle_reached(core, request, event, entry)
        core.settle(audit=audit_record(request, status, answer, verified=None, codec=core.codec))


async def answer_by_id(core: Core, answer: Answer) -> Event | None:
    """:meth:`RedisBroker.answer`: find the request by its route, check, resolve."""
    if check_request_id(answer.id) is not None:
        raise UnknownRequest(answer.id[:100])
    with boundary(f"answering {answer.id}"):
        raw_waiter = await core.command("GET", core.keys.route(answer.id))
        try:
            waiter = text(raw_waiter) if raw_waiter is not None else ""
        except UnicodeDecodeError:
            waiter = ""
        if not WAITER_ID.fullmatch(waiter):
            raise UnknownRequest(answer.id)
        raw_request = await core.command("HGET", core.keys.state(waiter, answer.id), "req")
        if raw_request is None:
            raise UnknownRequest(answer.id)
        request = core.codec.decode_as(raw_request, Request)
        core.signatures.admit_request(request)  # with signatures required, only a signed one
        checked = checked_answer(core, request, answer, None)
        payload = core.codec.encode_answer(checked)
        progress, _ = await resolve_answer(core, request, checked, payload)
        if progress is not None:
            core.settle(progress)
        return progress


def checked_answer(core: Core, request: Request, answer: Answer, responder: str | None) -> Answer:
    """``answer`` checked (see :func:`~toolnexus.schema.check_answer`), allowed by the
    request's allow-list, and signed with this process's key if it has one.

    Raises:
        InvalidAnswer: as ``check_answer``.
        NotAllowed: the allow-list names neither this responder nor ``answer.person``.
    """
    signatures = core.signatures
    checked = check_answer(request, answer, responder)
    me = signatures.key.name if signatures.key is not None else checked.responder
    if not allowed(request.allow, me, checked.person):
        raise NotAllowed(request.id)
    return signatures.sign_answer(checked, request)
