"""The §10 contract: every suspension is one :class:`Request` resolved by one :class:`Answer`.

Both are ``msgspec.Struct`` values. Schema-evolution rule: a field added later
always has a default, and a reader ignores fields it does not know, so peers of
different versions interoperate. The wire encoding lives in :mod:`toolnexus.codec`.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, ClassVar, Final, Literal, TypeAlias

import msgspec

from ._numeric import check_number
from .errors import InvalidRequest
from .lifecycle import EventType, Reason, Status
from .protocol import PREVIOUS_PROTOCOL, PREVIOUS_RELEASE, READS, version

# Reasons an Answer with ok=False carries (see :class:`toolnexus.lifecycle.Reason`).
DECLINED: Final = Reason.DECLINED
DISMISSED: Final = Reason.DISMISSED
EXPIRED: Final = Reason.EXPIRED
WITHDRAWN: Final = Reason.WITHDRAWN
UNAVAILABLE: Final = Reason.UNAVAILABLE


def new_id(prefix: str = "req") -> str:
    """A fresh request id: ``<prefix>-<32 hex digits>``."""
    return f"{prefix}-{uuid.uuid4().hex}"


class Source(msgspec.Struct, omit_defaults=True, frozen=True):
    """Who asks: the MCP server and tool, and the agent, where known."""

    server: str | None = None
    tool: str | None = None
    agent: str | None = None


class Signature(msgspec.Struct, omit_defaults=True, frozen=True):
    """An Ed25519 signature by the key named ``key`` (see :mod:`toolnexus.security._signing`).

    On an answer, ``digest`` is the digest of the exact request it answers.
    """

    key: str
    sig: bytes
    digest: bytes | None = None


MAX_VOTERS: Final = 10_000
"""The largest :attr:`Quorum.need`: more persons than any approval gathers."""


class Quorum(msgspec.Struct, omit_defaults=True, frozen=True):
    """A request that needs ``need`` accepting answers from distinct persons (by verified
    voter: the person named, else the responder key name; see :mod:`toolnexus.security._voting`)
    before it resolves. ``decline="veto"``: any decline resolves it declined;
    ``"count"``: declines are counted too, and whichever of accepts and declines reaches
    ``need`` first decides (SPEC §14)."""

    need: int
    decline: Literal["veto", "count"] = "veto"

    def __post_init__(self) -> None:
        """Refuse a quorum nobody could reach or everybody already has (msgspec runs this
        on decoding too, where the error becomes a ``DecodeError``).

        Raises:
            InvalidRequest: ``need`` is not an integer of at least 1, or ``decline`` is
                neither ``"veto"`` nor ``"count"``.
        """
        check_number(
            "quorum need",
            self.need,
            error=InvalidRequest,
            integer=True,
            minimum=1,
            inclusive=True,
            maximum=MAX_VOTERS,
        )
        if self.decline not in ("veto", "count"):
            raise InvalidRequest(f"quorum decline={self.decline!r} must be 'veto' or 'count'")


class Hop(msgspec.Struct, omit_defaults=True, frozen=True):
    """One step of an escalation: unanswered ``after_s`` seconds after the request was
    created, it is published to queue ``queue`` as well (SPEC §14)."""

    after_s: float
    queue: str


class OnExpiry(msgspec.Struct, omit_defaults=True, frozen=True):
    """What a request's waiter receives when nobody answers in time: accept (``ok=True``)
    with ``data``, or with the form's defaults when ``data`` is None; or decline
    (``ok=False``). The answer says so: ``reason="expired"`` and ``defaulted=True``."""

    ok: bool = False
    data: Any = None


class Request(msgspec.Struct, tag="request", tag_field="type", omit_defaults=True):
    """Something that suspends an agent until a person (or a bot) answers it.

    ``kind`` is ``"input"`` (``data["schema"]`` is a JSON Schema for the answer),
    ``"authorization"`` (go to ``url``), ``"approval"``, or anything else agreed on.
    ``expires_at`` is a Unix time in seconds; ``None`` lets the waiter pick the deadline.
    ``reply_to`` is routing set by the broker that published it. ``allow`` names who may
    answer (responder key names and persons, ``*`` patterns; ``None``: anyone), and
    ``signature`` is the asking agent's (:func:`toolnexus.security._signing.sign_request`).
    ``quorum``, ``escalate``, ``on_expiry`` and ``durable`` go beyond a single answer
    (SPEC §14): see :class:`Quorum`, :class:`Hop`, :class:`OnExpiry`; a durable request
    outlives its waiting process, and waiting again with its id attaches to it.
    """

    id: str
    kind: str
    prompt: str = ""
    data: Any = None
    url: str | None = None
    source: Source = Source()
    created_at: float = msgspec.field(default_factory=time.time)
    expires_at: float | None = None
    reply_to: str | None = None
    trace: dict[str, str] | None = None
    meta: dict[str, Any] = msgspec.field(default_factory=dict)
    allow: list[str] | None = None
    signature: Signature | None = None
    quorum: Quorum | None = None
    escalate: list[Hop] | None = None
    on_expiry: OnExpiry | None = None
    durable: bool = False

    @property
    def schema(self) -> dict[str, Any] | None:
        """The JSON Schema a form answer must satisfy, if this request carries one."""
        if isinstance(self.data, dict):
            schema = self.data.get("schema")
            if isinstance(schema, dict):
                return schema
        return None


class Answer(msgspec.Struct, tag="answer", tag_field="type", omit_defaults=True):
    """The resolution of a :class:`Request`, correlated by ``id``.

    ``ok=True`` accepts (with ``data`` for a form); ``ok=False`` carries a
    ``reason``: ``"declined"``, ``"dismissed"``, ``"expired"``, ``"withdrawn"``,
    ``"unavailable"``, or another a responder chose. ``responder`` names the responder
    (a consumer, or a verified key name); ``person`` who answered behind it, if known.
    ``signature`` is the responder's, bound to the request's digest
    (:func:`toolnexus.security._signing.sign_answer`). ``defaulted`` marks the outcome the request's
    :class:`OnExpiry` gave when nobody answered (``reason="expired"``): no person's answer.
    ``approvals`` lists, for a :class:`Quorum`, every accepting answer that was counted.
    """

    id: str
    ok: bool
    data: Any = None
    reason: str | None = None
    responder: str | None = None
    person: str | None = None
    answered_at: float = msgspec.field(default_factory=time.time)
    meta: dict[str, Any] = msgspec.field(default_factory=dict)
    signature: Signature | None = None
    defaulted: bool = False  # the request's OnExpiry, applied by the broker: no person's
    approvals: list[Approval] | None = None  # a quorum's: every accepting answer counted

    @property
    def answered_by(self) -> str | None:
        """Who answered, as shown to people: ``"ops-bot / slack:U123"`` (key name and
        person), or whichever of the two is known."""
        return " / ".join(name for name in (self.responder, self.person) if name) or None


class Approval(msgspec.Struct, omit_defaults=True, frozen=True):
    """One accepting answer counted towards a :class:`Quorum`: who gave it, and when."""

    responder: str | None
    person: str | None
    at: float


class _Event(msgspec.Struct, tag_field="type", omit_defaults=True, kw_only=True):
    """What happened to request ``id`` at ``at``, for responders that show it (UIs remove
    answered ones). One struct per :class:`~toolnexus.lifecycle.EventType`, tagged with it
    on the wire (``"type": "answered"``); :data:`Event` is their union: branch on it with
    ``match``."""

    kind: ClassVar[EventType]
    id: str
    at: float = msgspec.field(default_factory=time.time)

    @property
    def event(self) -> EventType:
        """This event's type (its tag)."""
        return self.kind


class AnsweredEvent(_Event, tag=EventType.ANSWERED.value, kw_only=True):
    """The request was answered; ``answer`` is the outcome (None: a responder only knows
    that it lost to some answer)."""

    kind: ClassVar[EventType] = EventType.ANSWERED
    answer: Answer | None = None


class ExpiredEvent(_Event, tag=EventType.EXPIRED.value, kw_only=True):
    """The request's deadline passed; ``answer``: the outcome (a default on expiry is
    marked ``defaulted``), if known."""

    kind: ClassVar[EventType] = EventType.EXPIRED
    answer: Answer | None = None


class WithdrawnEvent(_Event, tag=EventType.WITHDRAWN.value, kw_only=True):
    """The request's waiter left; ``answer``: the withdrawal, if known."""

    kind: ClassVar[EventType] = EventType.WITHDRAWN
    answer: Answer | None = None


class CompletedEvent(_Event, tag=EventType.COMPLETED.value, kw_only=True):
    """The agent's tool call that asked the request finished."""

    kind: ClassVar[EventType] = EventType.COMPLETED


class ApprovedEvent(_Event, tag=EventType.APPROVED.value, kw_only=True):
    """A quorum's vote counted without deciding (SPEC §14): ``count`` accepting answers of
    the ``need``, by ``approvers`` (their voters)."""

    kind: ClassVar[EventType] = EventType.APPROVED
    count: int
    need: int
    approvers: list[str] = msgspec.field(default_factory=list)


class EscalatedEvent(_Event, tag=EventType.ESCALATED.value, kw_only=True):
    """The request, still open, was published to queue ``queue`` as well (SPEC §14)."""

    kind: ClassVar[EventType] = EventType.ESCALATED
    queue: str


EndedEvent: TypeAlias = AnsweredEvent | ExpiredEvent | WithdrawnEvent
"""The events that end a request."""

Event: TypeAlias = (
    AnsweredEvent | ExpiredEvent | WithdrawnEvent | CompletedEvent | ApprovedEvent | EscalatedEvent
)
"""Any event: a union of tagged structs, one per :class:`~toolnexus.lifecycle.EventType`."""

EVENTS: Final = (
    AnsweredEvent,
    ExpiredEvent,
    WithdrawnEvent,
    CompletedEvent,
    ApprovedEvent,
    EscalatedEvent,
)
"""The event structs (for ``isinstance``)."""


def ended_event(status: Status, request_id: str, answer: Answer | None = None) -> EndedEvent:
    """The event that says request ``request_id`` ended with ``status`` (a resolution)
    and, if known, ``answer``."""
    match status:
        case Status.ANSWERED:
            return AnsweredEvent(id=request_id, answer=answer)
        case Status.EXPIRED:
            return ExpiredEvent(id=request_id, answer=answer)
        case Status.WITHDRAWN:
            return WithdrawnEvent(id=request_id, answer=answer)
    raise ValueError(f"{status!r} does not end a request")


class Heartbeat(msgspec.Struct, tag="heartbeat", tag_field="type", omit_defaults=True):
    """A responder worker saying it is alive: consumer ``consumer`` of group ``group``.

    ``at`` and ``expires_at`` are Unix times in seconds; past ``expires_at`` the worker
    counts as gone. ``info`` holds what the worker chose to tell (its counters, pid, ...).
    ``version`` is its toolnexus's version, ``reads`` the protocols it reads and ``writes``
    the one it writes (see :mod:`toolnexus.protocol`); a heartbeat without them is from the
    previous release, which reads and writes protocol 1 (:meth:`protocols`).
    """

    group: str
    consumer: str
    at: float
    expires_at: float
    info: dict[str, str | int | float] = msgspec.field(default_factory=dict)
    version: str | None = None
    reads: list[int] | None = None
    writes: int | None = None

    @classmethod
    def fresh(
        cls,
        group: str,
        consumer: str,
        ttl_s: float,
        info: Mapping[str, str | int | float] | None,
        *,
        writes: int,
    ) -> Heartbeat:
        """The heartbeat this process gives now for ``ttl_s`` seconds: with this
        toolnexus's version, the protocols it reads and ``writes``, the one it writes."""
        now = time.time()
        return cls(
            group,
            consumer,
            now,
            now + ttl_s,
            dict(info or {}),
            version=version(),
            reads=list(READS),
            writes=writes,
        )

    def protocols(self) -> tuple[str, list[int], int]:
        """The worker's version, the protocols it reads and the one it writes, as its
        heartbeat says (the previous release's, which says none: ``"previous"``,
        ``[1]``, ``1``)."""
        return (
            self.version or PREVIOUS_RELEASE,
            list(self.reads) if self.reads else [PREVIOUS_PROTOCOL],
            self.writes or PREVIOUS_PROTOCOL,
        )


Message: TypeAlias = (
    Request
    | Answer
    | AnsweredEvent
    | ExpiredEvent
    | WithdrawnEvent
    | CompletedEvent
    | ApprovedEvent
    | EscalatedEvent
    | Heartbeat
)

WaitFor: TypeAlias = Callable[[Request], Awaitable[Answer]]
"""Anything that suspends until a request is answered: ``async (Request) -> Answer``."""


__all__ = [
    "DECLINED",
    "DISMISSED",
    "EVENTS",
    "EXPIRED",
    "MAX_VOTERS",
    "UNAVAILABLE",
    "WITHDRAWN",
    "Answer",
    "AnsweredEvent",
    "Approval",
    "ApprovedEvent",
    "CompletedEvent",
    "EndedEvent",
    "EscalatedEvent",
    "Event",
    "ExpiredEvent",
    "Heartbeat",
    "Hop",
    "Message",
    "OnExpiry",
    "Quorum",
    "Request",
    "Signature",
    "Source",
    "WaitFor",
    "WithdrawnEvent",
    "ended_event",
    "new_id",
]
