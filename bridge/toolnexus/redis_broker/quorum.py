"""Quorum on the Redis broker (SPEC §14): a request that needs ``need`` answers from
distinct persons before it resolves.

A responder's answer to such a request is a *vote*: the ``VOTE`` script stores it in the
request's state once per voter (the identity it claims: key name and person, as
:attr:`Answer.answered_by <toolnexus.Answer.answered_by>`), counts the votes, and resolves
the request with the vote that decides (the ``need``-th accept; any decline with
``decline="veto"``, the ``need``-th decline with ``"count"``). Until then the waiter hears
nothing, and the voting responder publishes an ``approved`` event (count, need, approvers).
Any answer with ``ok=False`` (declined, dismissed) is a decline vote.

Redis counts by *claimed* identity; the waiter decides by *verified* identity: on the
deciding vote it reads every vote, checks each (signatures, allow-list), counts distinct
verified voters, and only then takes one :class:`~toolnexus.Answer`: the deciding vote,
with ``approvals`` listing every accepting vote counted. If refused votes leave the count
short, they are removed and the request is opened again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any, Final

import msgspec
import redis.exceptions

from ..broker import NOT_RESOLVED_REASONS
from ..errors import DecodeError
from ..models import Answer, Approval, Event, Quorum, Request
from ._core import Core, text
from ._scripts import OUTCOMES, UNVOTE, VOTE

log = logging.getLogger("toolnexus.redis")

VOTE_OUTCOMES: Final = OUTCOMES | {"counted", "voted"}
"""What :func:`cast_vote` says: a resolve outcome, ``counted`` (the vote counted, the
request stays open) or ``voted`` (this voter voted before: not counted again)."""

Admit = Callable[[Answer, bytes], Answer | None]
"""The waiter's check of one vote: the vote as it may be taken, or None if refused."""


def voter_of(answer: Answer) -> str:
    """The identity a vote is counted under: key name (or consumer) and person."""
    return answer.answered_by or ""


def _progress(request: Request, reply: list[Any]) -> Event:
    assert request.quorum is not None
    return Event(
        event="approved",
        id=request.id,
        count=int(reply[1]),
        need=request.quorum.need,
        approvers=[text(name) for name in reply[4:]],
    )


async def cast_vote(
    core: Core, request: Request, answer: Answer, payload: bytes
) -> tuple[str, Event | None, bytes | None]:
    """Run the vote script for the checked ``answer`` (encoded as ``payload``): the outcome
    (see :data:`VOTE_OUTCOMES`), the ``approved`` event of a vote counted (or of a voter
    who voted before), and the stored answer of a request already resolved."""
    assert request.quorum is not None and request.reply_to is not None
    keys, waiter = core.keys, request.reply_to
    quorum = request.quorum
    reply = await core.pipeliner.batch(
        VOTE,
        (keys.answers(waiter), keys.alive(waiter)),
        (core.settings.retention_ms,),
        (keys.state(waiter, request.id),),
        (payload, request.id, voter_of(answer), int(answer.ok), quorum.need, quorum.decline),
    )
    outcome = text(reply[0])
    if outcome not in VOTE_OUTCOMES:
        raise redis.exceptions.ResponseError(f"vote script said {outcome!r}")
    if outcome == "voted" and reply[3] == payload:
        return "counted", _progress(request, reply), None  # ours, retried after a lost reply
    if outcome in ("counted", "voted"):
        return outcome, _progress(request, reply), None
    stored: bytes | None = reply[1] if len(reply) > 1 else None
    if outcome in NOT_RESOLVED_REASONS and stored == payload:
        return "ok", None, None  # the deciding vote was ours, retried
    return outcome, None, stored


# -- the waiter's side --------------------------------------------------------------


async def read_votes(core: Core, waiter: str, request_id: str) -> dict[str, bytes]:
    """Every vote the state of ``request_id`` holds: field (``y:``/``n:`` and the voter)
    to the encoded vote."""
    raw: Any = await core.command("HGETALL", core.keys.state(waiter, request_id))
    items = raw.items() if isinstance(raw, dict) else zip(raw[::2], raw[1::2], strict=True)
    votes: dict[str, bytes] = {}
    for field, value in items:
        name = field if isinstance(field, bytes) else field.encode()
        if name[:2] in (b"y:", b"n:"):
            votes[name.decode(errors="replace")] = value
    return votes


def decide(
    quorum: Quorum, deciding_raw: bytes, admitted: Iterable[tuple[bytes, Answer]]
) -> Answer | None:
    """The outcome of a quorum, from the votes the waiter ``admitted`` (encoded, and as
    checked: ``responder`` the verified key name), if the deciding vote is among them and
    distinct verified voters are enough; else None.

    The outcome is the deciding vote (for an accept, the ``need``-th: its ``data`` is the
    answer's) with ``approvals``: every accepting vote, one per voter, oldest first.
    """
    accepts: dict[str, Answer] = {}
    declines: dict[str, Answer] = {}
    deciding: Answer | None = None
    for raw, vote in admitted:
        (accepts if vote.ok else declines).setdefault(voter_of(vote), vote)
        if raw == deciding_raw:
            deciding = vote
    if deciding is None:
        return None
    if deciding.ok:
        decided = len(accepts) >= quorum.need
    else:
        decided = quorum.decline == "veto" or len(declines) >= quorum.need
    if not decided:
        return None
    approvals = sorted(
        (Approval(vote.responder, vote.person, vote.answered_at) for vote in accepts.values()),
        key=lambda approval: approval.at,
    )
    return msgspec.structs.replace(deciding, approvals=approvals)


async def take_quorum(
    core: Core,
    waiter: str,
    request: Request,
    deciding: bytes,
    admit: Admit,
) -> tuple[Answer | None, list[bytes]]:
    """Check the votes of a quorum ``request`` that the vote ``deciding`` resolved: the
    outcome the waiter takes (see :func:`decide`), or None when the votes ``admit`` refused
    (or that are unreadable) leave it short; and every vote admitted."""
    assert request.quorum is not None
    votes = await read_votes(core, waiter, request.id)
    admitted: list[tuple[bytes, Answer]] = []
    for raw in votes.values():
        try:
            vote = core.codec.decode_as(raw, Answer)
        except DecodeError:  # garbage written into the state: removed if it matters
            continue
        taken = admit(vote, raw) if vote.id == request.id else None
        if taken is not None:
            admitted.append((raw, taken))
    return decide(request.quorum, deciding, admitted), [raw for raw, _ in admitted]


async def reopen(
    core: Core, waiter: str, request_id: str, deciding: bytes, kept: list[bytes]
) -> bool:
    """Remove every vote of ``request_id`` not in ``kept`` (the votes the waiter refused),
    and open the request again if the vote ``deciding`` still resolves it: whether it did."""
    votes = await read_votes(core, waiter, request_id)
    refused = [(field, raw) for field, raw in votes.items() if raw not in kept] or [("", b"")]
    keys = core.keys
    replies = [
        core.pipeliner.batch(
            UNVOTE,
            (keys.answers(waiter), keys.alive(waiter)),
            (),
            (keys.state(waiter, request_id),),
            (field, raw, deciding),
        )
        for field, raw in refused
    ]
    reopened = False
    for reply in replies:
        reopened = bool(await reply) or reopened
    return reopened


async def outcome(
    core: Core,
    waiter: str,
    request: Request,
    deciding: bytes,
    admit: Admit,
    done: Callable[[], bool],
    republish: Callable[[], None] | None,
) -> tuple[Answer | None, list[bytes]]:
    """The waiter's step on a quorum ``request`` resolved by the vote ``deciding``: the
    outcome and the votes admitted (see :func:`take_quorum`). If refused votes leave it
    short, then with ``republish`` they are removed, the request opened again and
    ``republish()`` called, unless the wait is ``done()``."""
    taken, kept = await take_quorum(core, waiter, request, deciding, admit)
    if (
        taken is None
        and republish is not None
        and await reopen(core, waiter, request.id, deciding, kept)
    ):
        log.warning("request %s opened again: its quorum is short", request.id)
        if not done():
            republish()
    return taken, kept
