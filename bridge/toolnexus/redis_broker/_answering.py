"""Answering a request on the Redis broker: the checks an answer passes (the form, the
allow-list, a signature added), and the resolve step with its retries, for a responder
holding the request and for :meth:`RedisBroker.answer` by id alone. A quorum's answer is a
vote (:mod:`._quorum`); a request whose waiter cannot end it is ended here (:func:`finish`).
"""

from __future__ import annotations

import asyncio
import time
from typing import Literal

import redis.exceptions

from .._outcomes import expired_answer
from .._schema import check_answer
from ..errors import (
    AlreadyResolved,
    BrokerUnavailable,
    Contested,
    DecodeError,
    NotAllowed,
    SignatureError,
    UnknownRequest,
)
from ..keys import check_request_id
from ..lifecycle import RESOLUTIONS, Outcome, Status
from ..models import EXPIRED, WITHDRAWN, Answer, ApprovedEvent, Request, ended_event
from ..security._audit import audit_record
from ..security._signing import allowed, request_digest, verify_answer
from ._core import CONNECTION_ERRORS, Backoff, Core, boundary
from ._escalation import settle_reached
from ._layout import ANSWER, ENTRY_REQUEST_B, OPEN_B, REQUEST, STATUS, parse_route
from ._quorum import cast_vote


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
    protocol: int,
    alone: bool = False,
) -> tuple[ApprovedEvent | None, bool]:
    """Resolve ``request`` (written in ``protocol``; stream entry ``entry``, if known) with
    the checked ``answer`` (encoded as ``payload`` in that protocol), retrying while Redis
    is away for up to ``answer_patience_s``.
    With ``group`` (the consumer group holding ``entry``), the resolve settles the entry
    where it can (see :meth:`Core.resolve`); ``alone`` says the caller expects no company
    this turn. Returns the event to publish, if any, and whether the entry was settled.
    For a request that needs a quorum the answer is a vote (SPEC §14, :mod:`._quorum`):
    a vote counted that does not decide returns the ``approved`` event to publish.

    Raises:
        AlreadyVoted: a quorum's voter voted before, or (``contested``) another vote is
            stored under this voter and the waiter did not cast this one in time (it may
            yet); the request stays open.
        Contested: the state held another answer this process cannot confirm, and the
            waiter did not take this one in time (it may yet: it checks both).
        AlreadyResolved: answered, expired or withdrawn first (a dead waiter's request
            is withdrawn here and then refused as such).
        UnknownRequest: the broker no longer knows the request.
        NotConfirmed: with ``durability="wait"``, the answer won on the master (or the
            vote was counted there) but ``WAIT`` did not confirm it on enough replicas:
            not acknowledged, the waiter decides.
        BrokerUnavailable: Redis stayed unreachable; the answer did not get through.
    """
    waiter = waiter_of(request)
    stored: bytes | None = None
    backoff: Backoff | None = None  # made on the first failure: most answers have none
    give_up = time.monotonic() + core.settings.answer_patience_s
    progress: ApprovedEvent | None = None
    settled = False
    settle = (group, entry) if group is not None and entry is not None else None
    while True:
        try:
            outcome: Outcome
            if request.quorum is None:
                outcome, stored, settled = await core.resolve(
                    waiter,
                    request.id,
                    Status.ANSWERED,
                    payload,
                    settle,
                    deadline=request.expires_at,
                    alone=alone,
                    confirm=True,
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
    match outcome:
        case Outcome.OK:
            return None, settled
        case Outcome.CONTESTED:
            first = genuine(core, request, stored) if stored is not None else None
            if first is not None:
                raise AlreadyResolved(request.id, lost_to(first))
            ended = await _plain_end(core, request) if stored is None else None
            if ended is not None:
                raise AlreadyResolved(request.id, ended)
            verdict = await _verdict(core, request, payload)
            if verdict is True:
                return None, settled
            if verdict is None:
                raise Contested(request.id)
            raise AlreadyResolved(request.id, lost_to(verdict))
        case Outcome.COUNTED:
            return progress, settled
        case Outcome.UNKNOWN:
            raise UnknownRequest(request.id)
        case Outcome.LATE:
            await finish(core, request, Status.EXPIRED, entry, protocol)
            raise AlreadyResolved(request.id, Status.EXPIRED)
        case Outcome.GONE:
            await finish(core, request, Status.WITHDRAWN, entry, protocol)
            raise AlreadyResolved(request.id, Status.WITHDRAWN)
        case Outcome.ANSWERED | Outcome.EXPIRED | Outcome.WITHDRAWN:
            raise AlreadyResolved(request.id, Status(outcome.value))
    raise AssertionError(f"no answer says {outcome!r}")  # (early: only for an expiry)


def lost_to(answer: Answer) -> Status:
    """The status an answer that lost to ``answer`` is told."""
    if answer.reason == EXPIRED:
        return Status.EXPIRED
    if answer.reason == WITHDRAWN:
        return Status.WITHDRAWN
    return Status.ANSWERED


def genuine(core: Core, request: Request, stored: bytes) -> Answer | None:
    """Whether the answer ``stored`` in the state of ``request`` looks like the one that won,
    as far as this process can tell: signed for exactly this request (by a key it trusts,
    verified; by a key it does not know, taken at its word: only the waiter can tell, and
    its outcome does not depend on this), or, for a request nobody signed, any readable
    answer to it (nothing is checked then). Anything else is an edited state, which the
    waiter refuses. The answer, if it looks genuine; else None."""
    try:
        answer = core.codec.decode_as(stored, Answer)
    except DecodeError:
        return None
    if answer.id != request.id:
        return None
    signature = answer.signature
    if signature is None:
        unchecked = request.signature is None and not core.signatures.required
        return answer if unchecked else None
    if signature.digest != request_digest(request):
        return None
    if signature.key in core.signatures.keyring:
        try:
            verify_answer(answer, request, core.signatures.keyring)
        except SignatureError:
            return None
    return answer


async def _plain_end(core: Core, request: Request) -> Status | None:
    """How the state of ``request``, which holds no answer, says it ended, if that is a
    waiter's plain end (expired or withdrawn, stored without an answer: see the RESOLVE
    script) and nothing is checked here (an unsigned request, signatures not required:
    then any readable stored answer would count as well, :func:`genuine`, so the status
    alone proves no less). Anything else, or a state that cannot be read: None, and the
    contested answer waits for the waiter's verdict as before."""
    if request.signature is not None or core.signatures.required:
        return None  # a signed request's waiter stores its signed end
    try:
        status = await core.command("HGET", core.keys.state(waiter_of(request), request.id), STATUS)
    except CONNECTION_ERRORS:
        return None
    if status == Status.EXPIRED.encode():
        return Status.EXPIRED
    if status == Status.WITHDRAWN.encode():
        return Status.WITHDRAWN
    return None


VERDICT_POLL_S = 0.05


async def _verdict(core: Core, request: Request, payload: bytes) -> Literal[True] | Answer | None:
    """What the waiter made of ``payload``, a contested answer: True if it took it (it
    records the answer it takes in the state, the ``TAKE`` script), the answer it took
    instead if that looks genuine, or None if nothing was seen within ``answer_patience_s``."""
    state = core.keys.state(waiter_of(request), request.id)
    give_up = time.monotonic() + core.settings.answer_patience_s
    while time.monotonic() < give_up:
        await asyncio.sleep(VERDICT_POLL_S)
        try:
            status, stored = await core.command("HMGET", state, STATUS, ANSWER)
        except CONNECTION_ERRORS:
            continue
        if stored == payload and status == Status.ANSWERED.encode():
            return True
        winner = genuine(core, request, stored) if stored is not None else None
        if winner is not None:
            return winner
    return None


async def finish(
    core: Core,
    request: Request,
    status: Literal[Status.EXPIRED, Status.WITHDRAWN],
    entry: str | None,
    protocol: int,
) -> bool:
    """Resolve as expired (with the request's default on expiry, if it has one) or
    withdrawn a request whose waiter cannot (it died, or the deadline passed with nobody
    to record it), tell responders, and delete its ``entry``. An expiry is judged by Redis
    time against the signed deadline: before it, nothing happens. If this resolution wins,
    its audit record is written here, once: a waiter that learns of it writes none (see
    :meth:`Waiter._ended <toolnexus.redis_broker.waiter.Waiter._ended>`). Whether the
    request is no longer open (False: still open, its deadline not reached). What it
    writes is in ``protocol``, the request's."""
    ending = (
        expired_answer(request)
        if status == Status.EXPIRED
        else Answer(id=request.id, ok=False, reason=WITHDRAWN)
    )
    answer = core.signatures.sign_answer(ending, request)
    payload = core.codec.encode(answer, protocol)
    deadline = request.expires_at if status == Status.EXPIRED else None
    outcome, _, _ = await core.resolve(
        waiter_of(request), request.id, status, payload, deadline=deadline
    )
    if outcome == Outcome.EARLY:
        return False
    if outcome == Outcome.OK:
        event = ended_event(status, request.id, answer)
        await settle_reached(core, request, event, entry, protocol)
        digest = answer.signature.digest if answer.signature is not None else None
        codec = core.codec.writing(protocol)
        record = audit_record(request, status, answer, verified=None, codec=codec, digest=digest)
        core.settle(audit=record)
    return True


async def answer_by_id(core: Core, answer: Answer) -> ApprovedEvent | None:
    """:meth:`RedisBroker.answer`: find the request by its route, check, resolve.

    The route names the waiter and the request's entry in this queue's stream (see
    :func:`~toolnexus.redis_broker._layout.route_value`). A durable request's state holds
    the request; a plain one's is read from its entry while it is open, and must be the
    request named: this id, this waiter's. Anything else (a forged route naming another
    entry or another waiter) is refused as unknown."""
    if check_request_id(answer.id) is not None:
        raise UnknownRequest(answer.id[:100])
    with boundary(f"answering {answer.id}"):
        route = parse_route(await core.command("GET", core.keys.route(answer.id)))
        if route is None:
            raise UnknownRequest(answer.id)
        waiter, entry = route
        state = core.keys.state(waiter, answer.id)
        status, raw_request = await core.command("HMGET", state, STATUS, REQUEST)
        request: Request | None = None
        protocol = core.protocol
        if raw_request is not None:  # a durable request's state holds it
            protocol, request = core.codec.decode_as_with_protocol(raw_request, Request)
        elif status == OPEN_B and entry is not None:
            found = await _entry_request(core, answer.id, waiter, entry)
            protocol, request = found if found is not None else (protocol, None)
            if request is None:  # its entry is gone: resolved meanwhile, or a forgery
                status = await core.command("HGET", state, STATUS)
        if request is None:  # gone, or ended
            said = status.decode("latin-1") if status else None
            if said not in RESOLUTIONS:
                raise UnknownRequest(answer.id)
            raise AlreadyResolved(answer.id, Status(said))
        core.signatures.admit_request(request)  # with signatures required, only a signed one
        checked = checked_answer(core, request, answer, None)
        payload = core.codec.encode_answer(checked, protocol)
        progress, _ = await resolve_answer(core, request, checked, payload, protocol=protocol)
        if progress is not None:
            core.settle(progress, protocol=protocol)
        return progress


async def _entry_request(
    core: Core, request_id: str, waiter: str, entry: str
) -> tuple[int, Request] | None:
    """The protocol and the request in ``entry`` of this queue's request stream, if it is
    request ``request_id`` of ``waiter``; None if the entry is gone.

    Raises:
        UnknownRequest: the entry holds anything else (the route was forged).
    """
    try:
        found = await core.command("XRANGE", core.keys.requests, entry, entry)
    except redis.exceptions.NoPermissionError:
        raise  # (a users.acl of an older release: the responder may not XRANGE)
    except redis.exceptions.ResponseError as exc:  # not an entry id
        raise UnknownRequest(request_id) from exc
    if not found:
        return None
    _, fields = found[0]  # (the pipeline's reply is as sent: the fields a flat list)
    pairs = (
        fields.items() if isinstance(fields, dict) else zip(fields[::2], fields[1::2], strict=False)
    )
    raw = dict(pairs).get(ENTRY_REQUEST_B)
    try:
        read = core.codec.decode_as_with_protocol(raw, Request) if isinstance(raw, bytes) else None
    except DecodeError:
        read = None
    if read is None or read[1].id != request_id or read[1].reply_to != waiter:
        raise UnknownRequest(request_id)
    return read


def checked_answer(core: Core, request: Request, answer: Answer, responder: str | None) -> Answer:
    """``answer`` checked (see :func:`~toolnexus._schema.check_answer`), allowed by the
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
