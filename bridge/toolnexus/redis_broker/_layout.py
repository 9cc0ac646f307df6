"""The Redis broker's data layout: the fields of a request's state hash and of the stream
entries, named once. The waiter, the responders, quorum counting, the Lua scripts (through
:data:`LUA_FIELDS`) and :mod:`._inspect` all read and write them by these names.

A request's state (:meth:`Keys.state <toolnexus.keys.Keys.state>`) is one hash::

    s    STATUS       open, or how it was resolved (answered, expired, withdrawn, ...)
    a    ANSWER       the stored answer (absent while open)
    x    DEADLINE     the deadline, Unix ms
    req  REQUEST      a durable request as published (a plain request's one home while
                      it is open is its request-stream entry, which its route names)
    d    DURABLE      '1' for a durable request
    e    ENTRY        a durable request's entry in its queue's request stream, recorded
                      by the script that added it (see _scripts.OPEN_PUBLISH)
    w    WHY          why the waiter last refused an answer and opened it again
    q    QUEUES       the queues an escalating request reached (see escalation.py)
    c:…  CONTESTED    an answer contested with the stored one (by its SHA-1)
    y:…  ACCEPT_VOTE  a quorum's accepting vote (by voter)
    n:…  DECLINE_VOTE a quorum's declining vote (by voter)
"""

from __future__ import annotations

from typing import Final

from ..keys import WAITER_ID
from ..lifecycle import Status

STATUS: Final = "s"
ANSWER: Final = "a"
DEADLINE: Final = "x"
REQUEST: Final = "req"
DURABLE: Final = "d"
ENTRY: Final = "e"
WHY: Final = "w"
QUEUES: Final = "q"
CONTESTED: Final = "c:"
ACCEPT_VOTE: Final = "y:"
DECLINE_VOTE: Final = "n:"

OPEN: Final = Status.OPEN.value
"""The status of a request nobody resolved yet (see :class:`toolnexus.lifecycle.Status`)."""

REPLY_ID, REPLY_ANSWER, REPLY_CONTESTED = "id", "a", "c"
"""The fields of a reply-stream entry: the request's id, the encoded answer, and ``'1'`` for
an answer contested with the one its state holds."""

REFUSAL_REASON, REFUSAL_BY, REFUSAL_KEY, REFUSAL_SIG, REFUSAL_DIGEST = "x", "b", "k", "s", "d"
"""The fields of a reply-stream entry that is a responder's refusal of the request (besides
its id): the reason, the consumer that refused it, and where it signs, its signature's key
name, bytes and digest of the request's bytes (see :meth:`.RedisResponder.refuse`)."""

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
REFUSAL_REASON_B, REFUSAL_BY_B = REFUSAL_REASON.encode(), REFUSAL_BY.encode()
REFUSAL_KEY_B, REFUSAL_SIG_B = REFUSAL_KEY.encode(), REFUSAL_SIG.encode()
REFUSAL_DIGEST_B = REFUSAL_DIGEST.encode()

_LUA_NAMES: Final = {
    "F_STATUS": STATUS,
    "F_ANSWER": ANSWER,
    "F_DEADLINE": DEADLINE,
    "F_REQUEST": REQUEST,
    "F_DURABLE": DURABLE,
    "F_ENTRY": ENTRY,
    "F_WHY": WHY,
    "F_QUEUES": QUEUES,
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
"""Between the two parts of a route's value (see :func:`route_value`)."""


def route_value(waiter: str, entry: bytes | str) -> str:
    """The value of a request's route (:meth:`Keys.route <toolnexus.keys.Keys.route>`, in
    the slot of the queue it was published to): the waiter it belongs to and its entry id
    in that queue's request stream, ``"<waiter> <entry id>"``. The Lua scripts make the
    same value with ``route_of(waiter, entry)`` (:data:`LUA_FIELDS`)."""
    if isinstance(entry, bytes):
        entry = entry.decode()
    return f"{waiter}{ROUTE_SEPARATOR}{entry}"


def parse_route(raw: object) -> tuple[str, str | None] | None:
    """The waiter and the entry id a route's value names (the entry None for a route of
    an older release, the waiter alone), or None if it is not a route at all (missing,
    not text, no waiter id). Unsigned hints, as anything in Redis: a reader checks what
    it finds where they point."""
    if isinstance(raw, bytes):
        try:
            raw = raw.decode()
        except UnicodeDecodeError:
            return None
    if not isinstance(raw, str):
        return None
    waiter, _, entry = raw.partition(ROUTE_SEPARATOR)
    if not WAITER_ID.fullmatch(waiter):
        return None
    return waiter, entry or None


_LUA_ROUTE: Final = f"""
-- A route's value (layout.route_value): the waiter, and the request's entry id in the
-- queue's stream; route_waiter reads the waiter back (a whole older value is one), and
-- route_entry the entry (nil for an older value, the waiter alone).
local function route_of(waiter, entry)
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
  local cut = string.find(value, {ROUTE_SEPARATOR!r}, 1, true)
  if not cut then
    return nil
  end
  local rest = string.sub(value, cut + 1)
  local stop = string.find(rest, {ROUTE_SEPARATOR!r}, 1, true)
  if stop then
    return string.sub(rest, 1, stop - 1)
  end
  return rest
end
"""

LUA_FIELDS: Final = (
    f"local {', '.join(_LUA_NAMES)} = {', '.join(repr(v) for v in _LUA_NAMES.values())}\n"
    + _LUA_ROUTE
)
"""The same names as Lua locals (``F_STATUS`` for :data:`STATUS`, ... ``S_OPEN``), and the
route's functions (``route_of(waiter, entry)``, ``route_waiter(value)``,
``route_entry(value)``), which every
script of :mod:`._scripts` and :mod:`toolnexus.cli._ops` starts with."""
