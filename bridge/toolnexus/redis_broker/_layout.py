"""The Redis broker's data layout: the fields of a request's state hash and of the stream
entries, named once. The waiter, the responders, quorum counting, the Lua scripts (through
:data:`LUA_FIELDS`) and :mod:`._inspect` all read and write them by these names.

A request's state (:meth:`Keys.state <toolnexus.keys.Keys.state>`) is one hash::

    s    STATUS       open, or how it was resolved (answered, expired, withdrawn, ...)
    a    ANSWER       the stored answer (absent while open)
    x    DEADLINE     the deadline, Unix ms
    req  REQUEST      the request as published (until its wait ended, if large)
    d    DURABLE      '1' for a durable request
    w    WHY          why the waiter last refused an answer and opened it again
    q    QUEUES       the queues an escalating request reached (see escalation.py)
    ex   EXCERPT      a large request's excerpt, once its wait ended
    dg   DIGEST       that request's digest
    c:…  CONTESTED    an answer contested with the stored one (by its SHA-1)
    y:…  ACCEPT_VOTE  a quorum's accepting vote (by voter)
    n:…  DECLINE_VOTE a quorum's declining vote (by voter)
"""

from __future__ import annotations

from typing import Final

from ..lifecycle import Status

STATUS: Final = "s"
ANSWER: Final = "a"
DEADLINE: Final = "x"
REQUEST: Final = "req"
DURABLE: Final = "d"
WHY: Final = "w"
QUEUES: Final = "q"
EXCERPT: Final = "ex"
DIGEST: Final = "dg"
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

# The same as bytes, for what redis-py returns.
STATUS_B, ANSWER_B, OPEN_B = STATUS.encode(), ANSWER.encode(), OPEN.encode()
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
    "F_WHY": WHY,
    "F_QUEUES": QUEUES,
    "F_EXCERPT": EXCERPT,
    "F_DIGEST": DIGEST,
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
}

LUA_FIELDS: Final = (
    f"local {', '.join(_LUA_NAMES)} = {', '.join(repr(v) for v in _LUA_NAMES.values())}\n"
)
"""The same names as Lua locals (``F_STATUS`` for :data:`STATUS`, ... ``S_OPEN``), which
every script of :mod:`._scripts` starts with."""
