"""Quorum on the Redis broker (SPEC §14): a request that needs ``need`` answers from
distinct persons before it resolves.

A responder's answer to such a request is a *vote*: the ``VOTE`` script stores it in the
request's state once per voter (the person it names, else its responder: see
:mod:`toolnexus.security._voting`), counts the votes, and resolves the request with the vote that
decides (the ``need``-th accept; any decline with ``decline="veto"``, the ``need``-th
decline with ``"count"``). Until then the waiter hears nothing, and the voting responder
publishes an ``approved`` event (count, need, approvers). Any answer with ``ok=False``
(declined, dismissed) is a decline vote.

Redis counts by *claimed* voter; the waiter decides by *verified* voter. On the deciding
vote it reads every vote, checks each (signatures, allow-list, stored in its own voter's
slot, that voter's first), counts distinct verified voters, and only then takes one
:class:`~toolnexus.Answer`: the deciding vote, with ``approvals`` listing every accepting
vote counted. Refused votes are audited and removed; if that leaves the count short the
request is opened again.

A voter's slot can hold a forgery (anyone who may write the state can fill it), which
would block that person. So a vote that finds *another* vote stored under its voter is
*contested*: the script sends it to the waiter, which checks every stored vote, removes
and audits the refused ones, and casts the contested vote itself in the refused one's
place. The person votes once. Unless the stored vote looks like that voter's genuine
earlier one (then: :class:`~toolnexus.AlreadyVoted`), the responder waits for the
waiter's verdict and is told it: counted, or deciding (or, none in time, ``AlreadyVoted``
with ``contested``: it may still count).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

import msgspec
import redis.exceptions

from ..errors import AlreadyVoted, DecodeError, NotConfirmed, SignatureError
from ..lifecycle import RESOLUTIONS, RESOLVED, Outcome, Status
from ..models import EXPIRED, WITHDRAWN, Answer, ApprovedEvent, Quorum, Request
from ..security._audit import Refusal
from ..security._signing import Keyring, request_digest, verify_answer
from ..security._voting import approvals_of, decides, voter_of
from ._core import CONNECTION_ERRORS, Core, ms, text
from ._layout import ACCEPT_VOTE_B, ANSWER, ANSWER_B, DECLINE_VOTE_B, OPEN_B, STATUS, STATUS_B
from ._pipeliner import Unconfirmed
from ._scripts import OUTCOMES, UNVOTE, VOTE
from ._wait import Wait

log = logging.getLogger("toolnexus.redis")

VOTE_OUTCOMES: Final = OUTCOMES | {Outcome.COUNTED}
"""What :func:`cast_vote` says: a resolve outcome, or ``counted`` (the vote counted, or
was counted before: the request stays open)."""

VERDICT_POLL_S = 0.05
"""How often a responder whose vote was contested looks whether the waiter cast it."""

Admit = Callable[[Answer, bytes], Answer | None]
"""The waiter's check of one vote: the vote as it may be taken (``responder`` the verified
key name), or None if refused (the waiter records why)."""


def slot_of(vote: Answer) -> bytes:
    """The field of a request's state that holds ``vote``: ``y:`` (an accept) or ``n:`` (a
    decline) and its voter (see :func:`toolnexus.security.voter_of`)."""
    return (ACCEPT_VOTE_B if vote.ok else DECLINE_VOTE_B) + voter_of(vote).encode(
        errors="surrogatepass"
    )


def _said(reply: list[Any]) -> str:
    """What the vote script said of a vote (a status copied from an edited state may be any
    bytes: then it is no outcome this module knows)."""
    said = reply[0]
    return said.decode("latin-1") if isinstance(said, bytes) else str(said)


def _progress(request: Request, reply: list[Any]) -> ApprovedEvent:
    assert request.quorum is not None
    return ApprovedEvent(
        id=request.id,
        count=int(reply[1]),
        need=request.quorum.need,
        approvers=[text(name) for name in reply[3:]],
    )


def _vote(
    core: Core,
    request: Request,
    answer: Answer,
    payload: bytes,
    replaces: bytes = b"",
    *,
    confirm: bool = False,
) -> asyncio.Future[Any]:
    """The vote script's reply for ``answer`` (encoded as ``payload``) cast on ``request``;
    ``replaces``: a stored vote of its voter to remove first, if it is still there.
    ``confirm``: as for :meth:`Core.resolve` (the reply comes as :class:`Unconfirmed`)."""
    assert request.quorum is not None and request.reply_to is not None
    keys, waiter, quorum = core.keys, request.reply_to, request.quorum
    vote = (payload, request.id, voter_of(answer), int(answer.ok), quorum.need, quorum.decline)
    deadline = ms(request.expires_at) if request.expires_at else 0  # the signed one
    return core.pipeliner.batch(
        VOTE,
        (keys.answers(waiter), keys.alive(waiter)),
        (core.settings.retention_ms,),
        (keys.state(waiter, request.id),),
        (*vote, replaces, deadline),
        confirm=confirm,
    )


async def cast_vote(
    core: Core, request: Request, answer: Answer, payload: bytes
) -> tuple[Outcome, ApprovedEvent | None, bytes | None]:
    """Run the vote script for the checked ``answer`` (encoded as ``payload``): the outcome
    (see :data:`VOTE_OUTCOMES`), the ``approved`` event of a vote counted, and the stored
    answer of a request already resolved.

    A vote *contested* (another vote is stored under its voter) went to the waiter: unless
    the stored vote looks like this voter's genuine earlier one, this waits (up to
    ``answer_patience_s``) to see what the waiter made of it: cast (then counted, or
    deciding), or the request resolved meanwhile.

    With ``durability="wait"``, a vote counted or deciding that ``WAIT`` did not confirm
    on ``wait_replicas`` replicas is not acknowledged: a failover may drop it (a deciding
    vote is then an answer lost after it was acknowledged), so the voter is told
    :class:`~toolnexus.errors.NotConfirmed` and the waiter's own view decides.

    Raises:
        AlreadyVoted: the stored vote looks genuine (a second vote), or (``contested``)
            the waiter did not cast this one in time (it may yet).
        NotConfirmed: the vote was counted (or decided) on the master, ``WAIT`` fell short.
    """
    unconfirmed: Unconfirmed | None = None
    try:
        reply = await _vote(core, request, answer, payload, confirm=True)
    except Unconfirmed as exc:
        reply, unconfirmed = exc.reply, exc
    if _said(reply) == Outcome.CONTESTED:
        if _looks_genuine(core, request, answer, reply[1]):
            raise AlreadyVoted(request.id, voter_of(answer))
        unconfirmed = None  # (this vote was not written: the waiter's cast decides)
        reply = await _verdict(core, request, answer, payload)
    said = _said(reply)
    if said not in VOTE_OUTCOMES:
        raise redis.exceptions.ResponseError(f"vote script said {said!r}")
    outcome = Outcome(said)
    stored: bytes | None = reply[1] if len(reply) > 1 else None
    if outcome in RESOLVED and stored == payload:
        outcome = Outcome.OK  # the deciding vote was ours (retried, or cast by the waiter)
    if unconfirmed is not None and outcome in (Outcome.COUNTED, Outcome.OK):
        raise NotConfirmed(request.id, unconfirmed.replicas, unconfirmed.required)
    if outcome == Outcome.COUNTED:
        return outcome, _progress(request, reply), None
    if outcome == Outcome.OK:
        return Outcome.OK, None, None
    return outcome, None, stored


def _looks_genuine(core: Core, request: Request, answer: Answer, stored: bytes) -> bool:
    """Whether ``stored``, the vote found under the voter of ``answer``, looks like that
    voter's genuine earlier vote, as far as this responder can tell: signed for exactly
    this request (verified if by this process's key or one it trusts; by a key it does
    not know, taken at its word: the waiter decides, and counts this vote if that one is
    not genuine), or, for a request nobody signed, any readable vote of that voter.
    Anything else (unreadable, unsigned where signatures are in use, badly signed) is a
    forgery as far as this responder can tell: it waits for the waiter's verdict."""
    try:
        vote = core.codec.decode_as(stored, Answer)
    except DecodeError:
        return False
    if vote.id != request.id or voter_of(vote) != voter_of(answer):
        return False
    signatures = core.signatures
    if vote.signature is None:
        return request.signature is None and not signatures.required
    if vote.signature.digest != request_digest(request):
        return False
    own = signatures.key
    keyring = (
        Keyring.of(own)
        if own is not None and vote.signature.key == own.name
        else signatures.keyring
    )
    if vote.signature.key in keyring:
        try:
            verify_answer(vote, request, keyring)
        except SignatureError:
            return False
    return True


async def _verdict(core: Core, request: Request, answer: Answer, payload: bytes) -> list[Any]:
    """What the waiter made of the contested vote ``payload``, as the vote script says it:
    once the voter's slot holds it (the waiter cast it), the reply to the same vote sent
    again (counted, or resolved by it); once the request is resolved, its status and
    stored answer.

    Raises:
        AlreadyVoted: (``contested``) nothing of the kind within ``answer_patience_s``.
    """
    assert request.reply_to is not None
    state = core.keys.state(request.reply_to, request.id)
    slot = slot_of(answer)
    slots = (ACCEPT_VOTE_B + slot[2:], DECLINE_VOTE_B + slot[2:])
    give_up = time.monotonic() + core.settings.answer_patience_s
    while time.monotonic() < give_up:
        await asyncio.sleep(VERDICT_POLL_S)
        try:
            status, stored, *mine = await core.command("HMGET", state, STATUS, ANSWER, *slots)
        except CONNECTION_ERRORS:
            continue
        if status is None:
            return [Outcome.UNKNOWN.value]
        resolved = status.decode("latin-1")  # (an edited state may hold any bytes)
        if resolved in RESOLUTIONS:
            return [resolved, stored]
        if payload in mine:  # cast by the waiter: sent again, it says the count (or "ok")
            reply: list[Any] = await _vote(core, request, answer, payload)
            if _said(reply) != Outcome.CONTESTED:  # (else written over again: wait on)
                return reply
    raise AlreadyVoted(request.id, voter_of(answer), contested=True)


# -- the waiter's side --------------------------------------------------------------


@dataclass(slots=True)
class _State:
    """A quorum request's state as read: status, stored answer, and every vote stored."""

    status: bytes | None = None
    answer: bytes | None = None
    votes: dict[bytes, bytes] = field(default_factory=dict)  # field to encoded vote


async def _read(core: Core, waiter: str, request_id: str) -> _State:
    raw: Any = await core.command("HGETALL", core.keys.state(waiter, request_id))
    items = raw.items() if isinstance(raw, dict) else zip(raw[::2], raw[1::2], strict=True)
    state = _State()
    for key, value in items:
        name = key if isinstance(key, bytes) else key.encode()
        if name[:2] in (ACCEPT_VOTE_B, DECLINE_VOTE_B):
            state.votes[name] = value
        elif name == STATUS_B:
            state.status = value
        elif name == ANSWER_B:
            state.answer = value
    return state


@dataclass(slots=True)
class _Checked:
    """The stored votes as checked: each voter's vote counted, and those refused."""

    counted: list[tuple[bytes, Answer]] = field(default_factory=list)  # encoded, as taken
    refused: list[tuple[bytes, bytes]] = field(default_factory=list)  # field, encoded

    def voters(self) -> set[str]:
        return {voter_of(vote) for _, vote in self.counted}


def _check(core: Core, wait: Wait, request: Request, state: _State, admit: Admit) -> _Checked:
    """Check every stored vote: readable, for this request, admitted (signature and
    allow-list, by ``admit``), stored in its own verified voter's slot, and that voter's
    first (by its signed time). Each refusal is recorded in ``wait.refusals`` for the
    audit (``admit`` records its own)."""
    checked = _Checked()
    first: dict[str, tuple[bytes, bytes, Answer]] = {}  # by voter: field, encoded, as taken

    def refuse(name: bytes, raw: bytes, vote: Answer | None, reason: str) -> None:
        if wait.refusals is None:
            wait.refusals = []
        wait.refusals.append(Refusal.of(vote, reason))
        checked.refused.append((name, raw))

    for name, raw in state.votes.items():
        try:
            vote = core.codec.decode_as(raw, Answer)
        except DecodeError:
            refuse(name, raw, None, "unreadable vote")
            continue
        if vote.id != request.id:
            refuse(name, raw, vote, "a vote on another request")
            continue
        taken = admit(vote, raw)
        if taken is None:
            checked.refused.append((name, raw))
            continue
        voter = voter_of(taken)
        if name != slot_of(taken):
            refuse(name, raw, vote, "stored under another voter")
            continue
        earlier = first.get(voter)
        if earlier is not None:  # both genuine (copied there): the voter's first counts
            first[voter], later = sorted((earlier, (name, raw, taken)), key=_signed_time)
            refuse(later[0], later[1], later[2], "a second vote by this voter")
        else:
            first[voter] = (name, raw, taken)
    checked.counted = [(raw, vote) for _, raw, vote in first.values()]
    return checked


def _distinct(refusals: list[Refusal]) -> list[Refusal]:
    """``refusals`` with each recorded once: a stored vote refused at two checks (two
    contested votes checked at once, or a removal that failed) is one refusal."""
    seen: set[Refusal] = set()
    distinct = []
    for refusal in refusals:
        same = msgspec.structs.replace(refusal, at=0.0)
        if same not in seen:
            seen.add(same)
            distinct.append(refusal)
    return distinct


def _signed_time(stored: tuple[bytes, bytes, Answer]) -> float:
    return stored[2].answered_at


def decide(
    quorum: Quorum, deciding_raw: bytes, counted: list[tuple[bytes, Answer]]
) -> Answer | None:
    """The outcome of a quorum, from the votes the waiter ``counted`` (encoded, and as
    taken: one per verified voter), if the deciding vote is among them and decides; else
    None. The outcome is the deciding vote (for an accept, the ``need``-th: its ``data`` is
    the answer's) with ``approvals``: every accepting vote counted, oldest first."""
    deciding = next((vote for raw, vote in counted if raw == deciding_raw), None)
    if deciding is None:
        return None
    accepts = [vote for _, vote in counted if vote.ok]
    if not decides(quorum, deciding, len(accepts), len(counted) - len(accepts)):
        return None
    return msgspec.structs.replace(deciding, approvals=approvals_of(accepts))


def _unvote(
    core: Core, waiter: str, request_id: str, name: bytes, raw: bytes, deciding: bytes
) -> asyncio.Future[Any]:
    keys = core.keys
    return core.pipeliner.batch(
        UNVOTE,
        (keys.answers(waiter), keys.alive(waiter)),
        (),
        (keys.state(waiter, request_id),),
        (name, raw, deciding),
    )


async def outcome(
    core: Core,
    wait: Wait,
    request: Request,
    vote: bytes,
    admit: Admit,
    republish: Callable[[], None] | None,
) -> Answer | None:
    """The waiter's step on a quorum ``request`` when its reply stream (or its state)
    brings ``vote``: the outcome the waiter takes, or None. Every stored vote is checked;
    ``wait.votes`` becomes those counted and ``wait.refusals`` gets those refused (both
    for the audit).

    The outcome is taken from the votes counted alone (see :func:`decide`), whatever the
    state says; or it is the end another party recorded (an expiry, a withdrawal), as the
    wait's checks take it. Else, if the request is open, ``vote`` was contested (another vote was
    stored under its voter): the refused votes are removed and, if ``vote`` is admitted
    and its voter has no vote counted, it is cast in their place (it counts, or decides:
    then its entry comes next). If the request is resolved but short, then with
    ``republish`` the refused votes are removed, the request opened again (if ``vote``
    still resolves it) and ``republish()`` called, unless the wait has ended meanwhile.
    """
    assert request.quorum is not None
    waiter = wait.replies.waiter
    state = await _read(core, waiter, request.id)
    checked = _check(core, wait, request, state, admit)
    if wait.refusals:
        wait.refusals = _distinct(wait.refusals)
    taken = decide(request.quorum, vote, checked.counted)
    ended = {Status.EXPIRED.encode(), Status.WITHDRAWN.encode()}
    if taken is None and state.answer == vote and state.status in ended:
        taken = _ended(core, request, vote, admit)  # another party's end, judged as such
    if taken is not None or not wait.answer.done():
        wait.votes = [raw for raw, _ in checked.counted]
    if taken is not None:
        return taken
    if state.status == OPEN_B:
        await _recount(core, wait, request, vote, admit, checked)
        return None
    if republish is None:
        return None
    refused = checked.refused or [(b"", b"")]
    replies = [_unvote(core, waiter, request.id, name, raw, vote) for name, raw in refused]
    reopened = False
    for reply in replies:
        reopened = bool(await reply) or reopened
    if reopened:
        log.warning("request %s opened again: its quorum is short", request.id)
        if not wait.answer.done():
            republish()
    return None


def _ended(core: Core, request: Request, raw: bytes, admit: Admit) -> Answer | None:
    """The end another party recorded (``raw``: a responder's expiry, or withdrawal of a
    request whose waiter it took for dead) as the waiter may take it, if ``admit`` does:
    an expiry only past the signed deadline by the waiter's clock (S1)."""
    try:
        ending = core.codec.decode_as(raw, Answer)
    except DecodeError:
        return None
    if ending.id != request.id or ending.reason not in (EXPIRED, WITHDRAWN):
        return None
    return admit(ending, raw)


async def _recount(
    core: Core, wait: Wait, request: Request, raw: bytes, admit: Admit, checked: _Checked
) -> None:
    """Act on the contested vote ``raw`` of the open quorum ``request`` whose stored votes
    are ``checked``: remove the refused ones, and if ``raw`` is admitted and its voter has
    no vote counted, cast it in their place (replacing the one refused in its voter's slot
    atomically, should that be written again meanwhile). If yet another vote is found in
    the slot then, the script sends ``raw`` here again."""
    waiter = wait.replies.waiter
    removals = [
        _unvote(core, waiter, request.id, name, stored, b"") for name, stored in checked.refused
    ]
    taken: Answer | None = None
    try:
        vote = core.codec.decode_as(raw, Answer)
    except DecodeError:  # (the reader dead-letters an unreadable entry: never here)
        vote = None
    if vote is not None and vote.id == request.id:
        taken = admit(vote, raw)
    cast: asyncio.Future[Any] | None = None
    if taken is not None and voter_of(taken) not in checked.voters():
        voter = voter_of(taken)
        log.warning(
            "request %s: a vote by %r was contested; the waiter casts it", request.id, voter
        )
        mine = slot_of(taken)[2:]  # its voter's slots: y: or n: and this
        replaces = next((stored for name, stored in checked.refused if name[2:] == mine), b"")
        cast = _vote(core, request, taken, raw, replaces)
    for removal in removals:
        await removal
    if cast is not None:
        reply = await cast
        if _said(reply) == Outcome.COUNTED:  # the count, as the voter's own responder tells it
            core.settle(_progress(request, reply), protocol=wait.protocol)
