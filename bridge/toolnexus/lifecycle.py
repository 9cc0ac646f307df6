"""One lifecycle: a request's statuses, the reasons an answer declines with, the event
types responders see, and the admission rule every broker applies to an incoming item.

The values are the wire's (Redis state fields, encoded answers and events): each is a
``StrEnum``, so a member *is* its string and compares equal to it.

    >>> Status.ANSWERED == "answered", str(EventType.APPROVED)
    (True, 'approved')

The admission rule (:func:`admit`) is the one table both brokers follow: the Redis
broker's ``RESOLVE`` and ``VOTE`` scripts compose one Lua snippet
(``toolnexus.redis_broker._scripts.ADMIT``) that says the same as this function, and the
embedded broker calls it. ``tests/test_admission.py`` runs every (state x item) case on
both and asserts the same outcome.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Final


class Status(StrEnum):
    """A request's status, as its state records it (Redis: field ``s``)."""

    OPEN = "open"
    ANSWERED = "answered"  # by an answer (accepting or declining) or a quorum's deciding vote
    EXPIRED = "expired"  # its deadline passed
    WITHDRAWN = "withdrawn"  # its waiter left
    # Never stored; what an answer that did not resolve the request found
    # (:attr:`toolnexus.NotResolved.status`):
    UNKNOWN = "unknown"  # no state: never published, or forgotten
    CONTESTED = "contested"  # the state held another answer (or none): the waiter decides


RESOLUTIONS: Final = frozenset({Status.ANSWERED, Status.EXPIRED, Status.WITHDRAWN})
"""The statuses that end a request."""


class Reason(StrEnum):
    """Reasons an :class:`~toolnexus.Answer` with ``ok=False`` carries. Open for more: a
    responder may send its own, so ``Answer.reason`` stays a ``str``."""

    DECLINED = "declined"  # an explicit "no"
    DISMISSED = "dismissed"  # closed without a choice
    EXPIRED = "expired"  # no answer before the deadline
    WITHDRAWN = "withdrawn"  # the asker stopped waiting
    UNAVAILABLE = "unavailable"  # no responder or broker reachable


class EventType(StrEnum):
    """What happened to a request, as responders see it: the tag of each event struct
    (:data:`toolnexus.Event`)."""

    ANSWERED = "answered"
    EXPIRED = "expired"
    WITHDRAWN = "withdrawn"
    COMPLETED = "completed"  # the agent's tool call finished
    APPROVED = "approved"  # a quorum's vote counted (SPEC §14)
    ESCALATED = "escalated"  # published to one more queue (SPEC §14)


LOST: Final[dict[Status, str]] = {
    Status.ANSWERED: "already answered",
    Status.EXPIRED: "expired",
    Status.WITHDRAWN: "withdrawn",
}
"""What a losing answer is told (its ``reason``), by the status of the request it tried to
answer."""


class Outcome(StrEnum):
    """What the admission rule (and then the resolve or vote step) says of one item."""

    OK = "ok"  # this resolution won
    UNKNOWN = "unknown"  # no such request
    LATE = "late"  # an answer after the deadline (Redis time)
    GONE = "gone"  # an answer to an open request whose waiter is no longer alive
    CONTESTED = "contested"  # before the deadline, the state holds another answer or none
    EARLY = "early"  # a responder's expiry before the deadline (Redis time): refused
    COUNTED = "counted"  # a quorum's vote counted (or counted before): still open
    ANSWERED = "answered"  # resolved before, as such (the stored answer comes with it)
    EXPIRED = "expired"
    WITHDRAWN = "withdrawn"


RESOLVED: Final = frozenset({Outcome.ANSWERED, Outcome.EXPIRED, Outcome.WITHDRAWN})
"""The outcomes that say the request was resolved before (the stored answer comes along)."""


class Item(StrEnum):
    """What comes in to a request's state."""

    ANSWER = "answer"  # a responder's answer (RESOLVE): contests another stored answer
    VOTE = "vote"  # a quorum's vote (VOTE): its slots are checked by the waiter instead
    EXPIRY = "expiry"  # a responder ending a request at its signed deadline (Redis time)
    END = "end"  # the waiter's own expiry or withdrawal, or a responder's withdrawal


@dataclass(frozen=True, slots=True)
class Admission:
    """The rule's verdict: ``outcome`` None admits the item (the request is open, in time,
    its waiter alive); ``resend``: the stored answer is shown to the waiter again (it
    checks it: an edited state is refused); ``contest``: the item goes to the waiter beside
    the stored answer, which checks both (S4)."""

    outcome: Outcome | None
    resend: bool = False
    contest: bool = False


ADMITTED: Final = Admission(None)


def admit(
    item: Item,
    status: Status | None,
    *,
    stored_same: bool | None,
    now_ms: int,
    deadline_ms: int,
    alive: bool,
    durable: bool,
) -> Admission:
    """The admission rule of one ``item`` that finds a request's state with ``status``
    (None: no state). ``stored_same``: the state's stored answer is the incoming one
    (True), another (False), or there is none (None); ``deadline_ms`` the signed
    request's deadline (else the state's; 0 for none), ``now_ms`` Redis time. The Lua
    snippet ``ADMIT`` says the same, line by line.

        >>> admit(Item.VOTE, Status.OPEN, stored_same=None, now_ms=5, deadline_ms=4,
        ...       alive=True, durable=False).outcome
        <Outcome.LATE: 'late'>
    """
    answering = item in (Item.ANSWER, Item.VOTE)
    contests = item == Item.ANSWER
    before = now_ms < deadline_ms
    if status is None:
        if contests and before:
            return Admission(Outcome.CONTESTED, contest=True)
        return Admission(Outcome.UNKNOWN)
    if status != Status.OPEN:
        resend = answering and stored_same is not None
        if contests and stored_same is not True and before:
            return Admission(Outcome.CONTESTED, resend=resend, contest=True)
        return Admission(Outcome(status.value), resend=resend)
    if item == Item.EXPIRY and before:
        return Admission(Outcome.EARLY)
    if answering and not before:
        return Admission(Outcome.LATE)
    if answering and not alive and not durable:
        return Admission(Outcome.GONE)
    return ADMITTED


__all__ = [
    "ADMITTED",
    "LOST",
    "RESOLUTIONS",
    "RESOLVED",
    "Admission",
    "EventType",
    "Item",
    "Outcome",
    "Reason",
    "Status",
    "admit",
]
