"""The Redis broker's data layout: the fields of a request's state hash and of the stream
entries, named once. The waiter, the responders, quorum counting, the Lua scripts (through
:data:`LUA_FIELDS`) and :mod:`._inspect` all read and write them by these names.

Each layout has a protocol number (:mod:`toolnexus.protocol`): protocol 2 writes it
(field ``p``, or a route's third part), protocol 1 (the previous release's layout) does
not, so that its absence means 1. A request's state (:meth:`Keys.state
<toolnexus.keys.Keys.state>`) is one hash::

    s    STATUS       open, or how it was resolved (answered, expired, withdrawn, ...)
    a    ANSWER       the stored answer (absent while open)
    x    DEADLINE     the deadline, Unix ms
    req  REQUEST      a durable request as published (a plain request's one home while
                      it is open is its request-stream entry, which its route names)
    d    DURABLE      '1' for a durable request
    entry ENTRY       a durable request's entry id in its queue's request stream,
                      recorded by the script that added it (see _scripts.OPEN_PUBLISH;
                      the name means what it means in a dead letter)
    w    WHY          why the waiter last refused an answer and opened it again
    q    QUEUES       the queues an escalating request reached (see escalation.py)
    p    PROTOCOL     '2' in protocol 2 (set when the state is opened); absent: 1
    c:…  CONTESTED    an answer contested with the stored one (by its SHA-1)
    y:…  ACCEPT_VOTE  a quorum's accepting vote (by voter)
    n:…  DECLINE_VOTE a quorum's declining vote (by voter)

Every field name, and the one thing it means wherever protocol 2 writes it (protocol 1,
the previous release's, also wrote ``x``, ``s`` and ``d`` with other meanings in a
refusal: its reason, signature and digest, see :data:`REFUSAL_FIELDS`)::

    s      state: status                 a      state, reply entry: an encoded answer
    x      state: deadline (Unix ms)     req    state: a durable request, encoded
    d      state: durable ('1')          w      state, refusal: why (text)
    q      state: queues reached         p      state, reply entry, dead letter: protocol
    c:…    state: a contested answer     c      reply entry: '1', a contested answer
    y:…    state: an accepting vote      n:…    state: a declining vote
    id     reply entry: the request id   b      refusal: by (the consumer refusing)
    k      refusal: signing key name     sig    refusal: signature bytes
    h      refusal: digest of the request's bytes (SHA-256, what the signature binds)
    r      request, audit entry: the encoded request (record)
    e      events entry: the encoded event
    error  dead letter: why            stream  dead letter: the stream it came from
    entry  dead letter: its entry id   raw     dead letter: its fields, bounded

A route (:meth:`Keys.route <toolnexus.keys.Keys.route>`) is ``"<waiter> <entry id> 2"``
in protocol 2, ``"<waiter> <entry id>"`` in protocol 1 (:func:`route_value`). A liveness
mark (:meth:`Keys.alive <toolnexus.keys.Keys.alive>`) holds ``"2 <version>"`` in protocol
2 (:func:`liveness_value`), ``"1"`` in protocol 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from ..errors import DecodeError
from ..keys import WAITER_ID
from ..lifecycle import Status
from ..protocol import (
    PREVIOUS_PROTOCOL,
    PREVIOUS_RELEASE,
    PROTOCOL,
    READS,
    check_read,
    version,
)

STATUS: Final = "s"
ANSWER: Final = "a"
DEADLINE: Final = "x"
REQUEST: Final = "req"
DURABLE: Final = "d"
ENTRY: Final = "entry"
WHY: Final = "w"
QUEUES: Final = "q"
PROTOCOL_FIELD: Final = "p"
"""The protocol of a state, a reply entry or a dead letter: ``'2'``; absent in protocol 1."""
CONTESTED: Final = "c:"
ACCEPT_VOTE: Final = "y:"
DECLINE_VOTE: Final = "n:"

OPEN: Final = Status.OPEN.value
"""The status of a request nobody resolved yet (see :class:`toolnexus.lifecycle.Status`)."""

REPLY_ID, REPLY_ANSWER, REPLY_CONTESTED = "id", "a", "c"
"""The fields of a reply-stream entry: the request's id, the encoded answer, and ``'1'`` for
an answer contested with the one its state holds."""


@dataclass(frozen=True)
class RefusalFields:
    """The fields of a reply-stream entry that is a responder's refusal of the request
    (besides its id and, in protocol 2, its protocol): the reason, the consumer that
    refused it, and where it signs, its signature's key name, bytes and digest of the
    request's bytes (see :meth:`.RedisResponder.refuse`). The same as bytes end in ``_b``."""

    reason: str
    by: str
    key: str
    sig: str
    digest: str

    @property
    def reason_b(self) -> bytes:
        return self.reason.encode()

    @property
    def by_b(self) -> bytes:
        return self.by.encode()

    @property
    def key_b(self) -> bytes:
        return self.key.encode()

    @property
    def sig_b(self) -> bytes:
        return self.sig.encode()

    @property
    def digest_b(self) -> bytes:
        return self.digest.encode()


REFUSAL_FIELDS: Final = {
    PREVIOUS_PROTOCOL: RefusalFields("x", "b", "k", "s", "d"),
    PROTOCOL: RefusalFields(WHY, "b", "k", "sig", "h"),
}
"""A refusal's field names in each protocol: protocol 2's mean one thing everywhere
(``w`` is why, as in a state); protocol 1's ``x``, ``s`` and ``d`` meant the deadline,
the status and durable in a state."""


def entry_protocol(fields: dict[bytes, bytes], what: str) -> int:
    """The protocol of a reply entry or a state, by its field ``p`` (absent: 1).

    Raises:
        DecodeError: a protocol newer than this toolnexus reads, or not a number.
    """
    raw = fields.get(PROTOCOL_B)
    if raw is None:
        return PREVIOUS_PROTOCOL
    if not raw.isdigit():
        raise DecodeError(f"{what}: {raw[:20]!r} is not a protocol number")
    return check_read(int(raw), what)


def protocol_fields(protocol: int) -> list[str]:
    """The field that says ``protocol`` in a state, a reply entry or a dead letter: none
    in protocol 1, ``['p', '2']`` in protocol 2."""
    return [] if protocol == PREVIOUS_PROTOCOL else [PROTOCOL_FIELD, str(protocol)]


ENTRY_REQUEST: Final = "r"
"""The one field of a request-stream entry (and of an audit-stream entry): the encoded
request (record)."""

ENTRY_EVENT: Final = "e"
"""The one field of an events-stream entry: the encoded event."""

DEAD_RAW, DEAD_ERROR, DEAD_STREAM, DEAD_ENTRY = "raw", "error", "stream", "entry"
"""The fields of a dead-letter entry: the original fields (``name=value`` lines, bounded),
the error that put it there, the stream and entry id it came from."""

DEAD_GROUP: Final = "group"
"""The field of a dead letter of the request stream naming the consumer group that could
not take the entry: each group that refuses an entry settles it for itself only (its own
dead letter, its own ``XACK``), and the entry stays in the stream for every other group.
Absent from the dead letters of streams read without a group (events, reply streams)."""

# The same as bytes, for what redis-py returns.
STATUS_B, ANSWER_B, OPEN_B = STATUS.encode(), ANSWER.encode(), OPEN.encode()
ENTRY_REQUEST_B = ENTRY_REQUEST.encode()
CONTESTED_B, ACCEPT_VOTE_B = CONTESTED.encode(), ACCEPT_VOTE.encode()
DECLINE_VOTE_B = DECLINE_VOTE.encode()
REPLY_ID_B, REPLY_ANSWER_B = REPLY_ID.encode(), REPLY_ANSWER.encode()
REPLY_CONTESTED_B = REPLY_CONTESTED.encode()
PROTOCOL_B = PROTOCOL_FIELD.encode()

_LUA_NAMES: Final = {
    "F_STATUS": STATUS,
    "F_ANSWER": ANSWER,
    "F_DEADLINE": DEADLINE,
    "F_REQUEST": REQUEST,
    "F_DURABLE": DURABLE,
    "F_ENTRY": ENTRY,
    "F_WHY": WHY,
    "F_QUEUES": QUEUES,
    "F_PROTOCOL": PROTOCOL_FIELD,
    "F_CONTESTED": CONTESTED,
    "F_YES": ACCEPT_VOTE,
    "F_NO": DECLINE_VOTE,
    "S_OPEN": OPEN,
    "E_REQUEST": ENTRY_REQUEST,
    "E_EVENT": ENTRY_EVENT,
    "R_ID": REPLY_ID,
    "R_ANSWER": REPLY_ANSWER,
    "R_CONTESTED": REPLY_CONTESTED,
    "D_RAW": DEAD_RAW,
    "D_ERROR": DEAD_ERROR,
    "D_STREAM": DEAD_STREAM,
    "D_ENTRY": DEAD_ENTRY,
    "D_GROUP": DEAD_GROUP,
}

ROUTE_SEPARATOR: Final = " "
"""Between the parts of a route's value (see :func:`route_value`)."""


def route_value(waiter: str, entry: bytes | str, protocol: int = PROTOCOL) -> str:
    """The value of a request's route (:meth:`Keys.route <toolnexus.keys.Keys.route>`, in
    the slot of the queue it was published to): the waiter it belongs to and its entry id
    in that queue's request stream, and in protocol 2 the protocol,
    ``"<waiter> <entry id> 2"`` (protocol 1: ``"<waiter> <entry id>"``). The Lua scripts
    make the same value with ``route_of(waiter, entry, protocol)`` (:data:`LUA_FIELDS`)."""
    if isinstance(entry, bytes):
        entry = entry.decode()
    value = f"{waiter}{ROUTE_SEPARATOR}{entry}"
    if protocol != PREVIOUS_PROTOCOL:
        value += f"{ROUTE_SEPARATOR}{protocol}"
    return value


def parse_route(raw: object) -> tuple[str, str | None] | None:
    """The waiter and the entry id a route's value names (the entry None for a route of
    an older release, the waiter alone), in protocol 1 or 2, or None if it is not a route
    this toolnexus reads (missing, not text, no waiter id, a newer protocol). Unsigned
    hints, as anything in Redis: a reader checks what it finds where they point."""
    if isinstance(raw, bytes):
        try:
            raw = raw.decode()
        except UnicodeDecodeError:
            return None
    if not isinstance(raw, str):
        return None
    waiter, _, rest = raw.partition(ROUTE_SEPARATOR)
    entry, _, protocol = rest.partition(ROUTE_SEPARATOR)
    if not WAITER_ID.fullmatch(waiter):
        return None
    if protocol and protocol not in {str(p) for p in READS if p != PREVIOUS_PROTOCOL}:
        return None
    return waiter, entry or None


def liveness_value(protocol: int) -> str:
    """The value of a waiter's liveness mark: ``"1"`` in protocol 1 (what the previous
    release wrote), ``"<protocol> <version>"`` from protocol 2 on (``"2 0.2.0"``)."""
    if protocol == PREVIOUS_PROTOCOL:
        return "1"
    return f"{protocol} {version()}"


def parse_liveness(raw: object) -> tuple[int, str] | None:
    """The protocol a liveness mark's process writes and its version (the previous
    release's mark, ``"1"``: 1 and ``"previous"``), or None if it is not a mark."""
    if isinstance(raw, bytes):
        raw = raw.decode(errors="replace")
    if not isinstance(raw, str):
        return None
    number, _, said = raw.partition(ROUTE_SEPARATOR)
    if not number.isdigit():
        return None
    if int(number) == PREVIOUS_PROTOCOL and not said:
        return PREVIOUS_PROTOCOL, PREVIOUS_RELEASE
    return int(number), said or "unknown"


_LUA_ROUTE: Final = f"""
-- A route's value (layout.route_value): the waiter, the request's entry id in the
-- queue's stream, and from protocol 2 on the protocol ('1' or '2', from the caller);
-- route_waiter reads the waiter back (a whole older value is one), route_entry the entry
-- ('' for a value that names none), route_protocol the
-- protocol ('1' when the value has none).
local function route_of(waiter, entry, protocol)
  if protocol and protocol ~= '1' then
    return waiter .. {ROUTE_SEPARATOR!r} .. entry .. {ROUTE_SEPARATOR!r} .. protocol
  end
  return waiter .. {ROUTE_SEPARATOR!r} .. entry
end
local function route_waiter(value)
  local cut = string.find(value, {ROUTE_SEPARATOR!r}, 1, true)
  if cut then
    return string.sub(value, 1, cut - 1)
  end
  return value
end
local function route_entry(value)
  return string.match(value, '^[^ ]+ ([^ ]+)') or ''
end
local function route_protocol(value)
  local protocol = string.match(value, '^[^ ]+ [^ ]+ ([^ ]+)$')
  return protocol or '1'
end
"""

LUA_FIELDS: Final = (
    f"local {', '.join(_LUA_NAMES)} = {', '.join(repr(v) for v in _LUA_NAMES.values())}\n"
    + _LUA_ROUTE
)
"""The same names as Lua locals (``F_STATUS`` for :data:`STATUS`, ... ``S_OPEN``), and the
route's functions (``route_of(waiter, entry, protocol)``, ``route_waiter(value)``,
``route_entry(value)``, ``route_protocol(value)``), which every script of :mod:`._scripts`
and :mod:`toolnexus.cli._ops` starts with."""
