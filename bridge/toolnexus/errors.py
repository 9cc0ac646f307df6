"""Every error toolnexus raises derives from :class:`ToolnexusError`.

    ToolnexusError
    ├── DecodeError            bytes that are not a valid message (garbage, oversized, wrong shape)
    ├── InvalidRequest         a request or elicitation that cannot be mapped (also a ValueError)
    ├── InvalidAnswer          an answer that fails the request's schema; the request stays open
    ├── NotResolved            an answer that lost: the request was already resolved or is unknown
    │   ├── AlreadyResolved    answered, expired or withdrawn before this answer arrived
    │   ├── UnknownRequest     no such request (never published, or its state has expired)
    │   ├── NotAllowed         the request's allow-list does not name this responder or person
    │   ├── Contested          the request's state held another answer: the waiter decides
    │   └── AlreadyVoted       a quorum request this person voted on already (or contested); open
    ├── SignatureError         a signature that is missing, wrong, untrusted or for another request
    ├── NotConfirmed           an answer Redis took that WAIT did not confirm on enough replicas
    ├── BrokerUnavailable      the broker cannot be reached (Redis down, refused, timed out)
    ├── BrokerClosed           this broker was closed by its owner (not an outage)
    ├── ServerUnavailable      an MCP server cannot be started or reached
    ├── ConfigurationError     a bad URL, option, MCP config, key file or missing extra
    └── McpError               an MCP request failed (toolnexus.mcp_errors; also the SDK's MCPError)
        └── UrlElicitationRequired   -32042 with a URL that was not accepted

Errors of Redis, the OS and the MCP SDK never cross the public API: they are mapped
at the boundary (``raise BrokerUnavailable(...) from exc``), the original kept as
``__cause__``.

Outcomes a person can cause (a decline, no answer before the deadline) are never
errors: they are :class:`~toolnexus.Answer` values with ``ok=False``.
"""

from __future__ import annotations

from .lifecycle import LOST, Status


class ToolnexusError(Exception):
    """Base class of every toolnexus error."""


class DecodeError(ToolnexusError):
    """Bytes that cannot be decoded into a toolnexus message."""


class InvalidRequest(ToolnexusError, ValueError):
    """A request (or MCP elicitation params) that is missing something it needs."""


class InvalidAnswer(ToolnexusError, ValueError):
    """An answer whose data fails the request's schema.

    ``field`` names the offending field (``None`` for the whole form) and ``rule``
    the keyword that failed (``"required"``, ``"maxLength"``, ...).
    """

    def __init__(self, message: str, *, field: str | None = None, rule: str | None = None) -> None:
        super().__init__(message)
        self.field = field
        self.rule = rule


class NotResolved(ToolnexusError):
    """An answer that did not resolve its request. ``status`` is the request's status as
    this answer found it (a :class:`~toolnexus.lifecycle.Status`: what a program acts on);
    ``reason`` says why in words (for people: it may be reworded)."""

    def __init__(self, request_id: str, reason: str, status: Status) -> None:
        super().__init__(f"request {request_id!r} was not answered by this answer: {reason}")
        self.request_id = request_id
        self.reason = reason
        self.status = status


class AlreadyResolved(NotResolved):
    """The request was resolved before this answer: ``status`` is ``answered``,
    ``expired`` or ``withdrawn``, and ``reason`` ``"already answered"``, ``"expired"`` or
    ``"withdrawn"``."""

    def __init__(self, request_id: str, status: Status) -> None:
        super().__init__(request_id, LOST[status], status)


class UnknownRequest(NotResolved):
    """No request with this id is known to the broker (``status`` is ``unknown``)."""

    def __init__(self, request_id: str) -> None:
        super().__init__(request_id, "unknown request", Status.UNKNOWN)


class NotAllowed(NotResolved):
    """The request's allow-list does not name this responder or person; it stays open
    (``status``) for others."""

    def __init__(self, request_id: str) -> None:
        super().__init__(request_id, "not allowed", Status.OPEN)


class Contested(NotResolved):
    """This answer arrived before the deadline, but the request's state in Redis held another
    answer (or none at all) that this responder could not confirm as genuine: an edited
    state, or an answer signed by a key this responder does not trust. The answer was handed
    to the waiter, which checks both and takes the valid one; its verdict did not come
    within ``answer_patience_s`` (a waiter that is not running decides when it attaches)."""

    def __init__(self, request_id: str) -> None:
        super().__init__(
            request_id,
            "contested: the request's state holds another answer; the waiter checks both",
            Status.CONTESTED,
        )


class Refused(NotResolved):
    """A responder refused the request itself (it dead-lettered it): a missing or bad
    signature, a key it does not trust, bytes it cannot read. ``reason`` says why, as the
    responder said it; ``responder`` names it (its verified key name when ``verified``).
    :meth:`RedisBroker.refusal <toolnexus.redis_broker.RedisBroker.refusal>` gives it, while
    the wait goes on, once no live group that could still take the request is left;
    ``toolnexus ask`` ends with it. With signatures required, only a
    refusal signed by a trusted responder key for exactly that request counts. ``status``
    is ``open``: the request stays open until its waiter withdraws it."""

    def __init__(
        self, request_id: str, reason: str, responder: str | None = None, verified: bool = False
    ) -> None:
        NotResolved.__init__(self, request_id, reason, Status.OPEN)
        by = f" by {responder}" if responder else ""
        self.args = (f"request {request_id!r} was refused{by}: {reason}",)
        self.responder = responder
        self.verified = verified


class AlreadyVoted(NotResolved):
    """A vote on a request that needs a quorum (SPEC §14) that found a vote of the same
    ``voter`` (the person, else the responder: :func:`toolnexus.security.voter_of`) stored.
    It was not counted now; the request stays open for other voters.

    ``contested``: the stored vote did not look genuine (it may be a forgery), so this
    vote went to the waiter, which checks both and, if the stored one is refused, removes
    it and casts this one; the waiter's verdict did not come within ``answer_patience_s``
    (a waiter that is not running acts when a process waits again). The vote may still
    count, with nothing more to do."""

    def __init__(self, request_id: str, voter: str, *, contested: bool = False) -> None:
        reason = (
            f"contested: another vote by {voter} is stored; the waiter checks both, and "
            "counts this one if that one is not genuine"
            if contested
            else f"already voted by {voter}"
        )
        super().__init__(request_id, reason, Status.OPEN)
        self.voter = voter
        self.contested = contested


class SignatureError(ToolnexusError):
    """A request or answer refused by signature checks. ``reason`` says why, in words:
    ``"missing signature"``, ``"unknown key 'x'"``, ``"bad signature"``, ``"signed for
    another request"``, ``"responder name does not match key"`` or ``"not allowed"``."""

    def __init__(self, what: str, reason: str) -> None:
        super().__init__(f"{what} refused: {reason}")
        self.reason = reason


class NotConfirmed(ToolnexusError):
    """With ``durability="wait"``: the master took this answer (it resolved the request
    there), but ``WAIT`` counted ``replicas`` of the ``required`` replicas within
    ``wait_timeout_ms``, so a failover may still lose it (a partition hides the master, a
    replica without it is promoted). It is not acknowledged: the waiter's own view
    decides. It may return this answer, or the request may reopen and be answered
    again, by this responder or another. An answer that is not confirmed is not
    retried: a failover that kept it makes any retry ``already answered``. A quorum's
    vote (SPEC §14), counted or deciding, gets the same when ``WAIT`` falls short."""

    def __init__(self, request_id: str, replicas: int, required: int) -> None:
        super().__init__(
            f"request {request_id!r}: the answer was taken by the master, but WAIT confirmed "
            f"it on {replicas} of {required} replicas: it may be lost in a failover; the "
            "waiter decides"
        )
        self.request_id = request_id
        self.replicas = replicas
        self.required = required


class BrokerUnavailable(ToolnexusError):
    """The broker (Redis) cannot be reached, refused the command, or did not reply in time."""


class BrokerClosed(ToolnexusError):
    """The broker was closed (by its owner) while this call was in progress or after."""


class ServerUnavailable(ToolnexusError, ConnectionError):
    """An MCP server could not be started or reached; ``server`` names it."""

    def __init__(self, server: str | None, reason: str) -> None:
        super().__init__(f"MCP server {server!r} is unavailable: {reason}")
        self.server = server
        self.reason = reason


class ConfigurationError(ToolnexusError, ValueError):
    """A bad URL, option or key file, or an optional extra that is not installed."""


__all__ = [
    "AlreadyResolved",
    "AlreadyVoted",
    "BrokerClosed",
    "BrokerUnavailable",
    "ConfigurationError",
    "Contested",
    "DecodeError",
    "InvalidAnswer",
    "InvalidRequest",
    "NotAllowed",
    "NotConfirmed",
    "NotResolved",
    "Refused",
    "ServerUnavailable",
    "SignatureError",
    "ToolnexusError",
    "UnknownRequest",
]
