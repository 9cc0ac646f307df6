"""The §10 contract: every suspension is one :class:`Request` resolved by one :class:`Answer`.

Both are ``msgspec.Struct`` values. Schema-evolution rule: a field added later
always has a default, and a reader ignores fields it does not know, so peers of
different versions interoperate. The wire encoding lives in :mod:`toolnexus.codec`.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, Final, Literal, TypeAlias

import msgspec

from .errors import InvalidRequest
from .numeric import check_number

# Reasons an Answer with ok=False carries. Open for more: a responder may send its own.
DECLINED: Final = "declined"  # an explicit "no"
DISMISSED: Final = "dismissed"  # closed without a choice
EXPIRED: Final = "expired"  # no answer before the deadline
WITHDRAWN: Final = "withdrawn"  # the asker stopped waiting
UNAVAILABLE: Final = "unavailable"  # no responder or broker reachable


def new_id(prefix: str = "req") -> str:
    """A fresh request id: ``<prefix>-<32 hex digits>``."""
    return f"{prefix}-{uuid.uuid4().hex}"


class Source(msgspec.Struct, omit_defaults=True, frozen=True):
    """Who asks: the MCP server and tool, and the agent, where known."""

    server: str | None = None
    tool: str | None = None
    agent: str | None = None


class Signature(msgspec.Struct, omit_defaults=True, frozen=True):
    """An Ed25519 signature by the key named ``key`` (see :mod:`toolnexus.signing`).

    On an answer, ``digest`` is the digest of the exact request it answers.
    """

    key: str
    sig: bytes
    digest: bytes | None = None


MAX_VOTERS: Final = 10_000
"""The largest :attr:`Quorum.need`: more persons than any approval gathers."""


class Quorum(msgspec.Struct, omit_defaults=True, frozen=True):
    """A request that needs ``need`` accepting answers from distinct persons (by verified
    voter: the person named, else the responder key name; see :mod:`toolnexus.voting`)
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
    ``signature`` is the asking agent's (:func:`toolnexus.signing.sign_request`).
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
    (:func:`toolnexus.signing.sign_answer`). ``defaulted`` marks the outcome the request's
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


EventType: TypeAlias = Literal[
    "answered", "expired", "withdrawn", "completed", "approved", "escalated"
]


class Event(msgspec.Struct, tag="event", tag_field="type", omit_defaults=True):
    """What happened to a request, for responders that show it (UIs remove answered ones)."""

    event: EventType
    id: str
    answer: Answer | None = None
    at: float = msgspec.field(default_factory=time.time)
    count: int | None = None  # "approved": accepting answers counted so far
    need: int | None = None  # "approved": how many the quorum needs
    approvers: list[str] | None = None  # "approved": who approved so far (their voters)
    queue: str | None = None  # "escalated": the queue the request moved on to


class Heartbeat(msgspec.Struct, tag="heartbeat", tag_field="type", omit_defaults=True):
    """A responder worker saying it is alive: consumer ``consumer`` of group ``group``.

    ``at`` and ``expires_at`` are Unix times in seconds; past ``expires_at`` the worker
    counts as gone. ``info`` holds what the worker chose to tell (its counters, pid, ...).
    """

    group: str
    consumer: str
    at: float
    expires_at: float
    info: dict[str, str | int | float] = msgspec.field(default_factory=dict)


Message: TypeAlias = Request | Answer | Event | Heartbeat

WaitFor: TypeAlias = Callable[[Request], Awaitable[Answer]]
"""Anything that suspends until a request is answered: ``async (Request) -> Answer``."""
