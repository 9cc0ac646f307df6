"""The Redis Streams broker (SPEC §11): ``connect("redis://…")``.

Three modules tell the architecture:

- :mod:`toolnexus.redis_broker._waiter`, **the waiter side**: publish a request (and
  escalate it hop by hop), wait on this process's reply stream, check what arrives,
  withdraw what is abandoned;
- :mod:`toolnexus.redis_broker._responder`, **the responder side**: consumer groups,
  leases, answering (:mod:`._answering`), heartbeats, and the event stream
  (:mod:`._events`) that follows what happens;
- :mod:`toolnexus.keys`, **the key names**: every key and stream both sides use.

They meet only in :mod:`._layout` (the state layout: every field of a request's state
and of a stream entry, and their Lua locals), :mod:`._core` (settings, connections, the
pipeliner, the shared steps), :mod:`._scripts` (the Lua scripts) and :mod:`._quorum` (a
quorum's votes, SPEC §14: cast by responders, checked by the waiter).
:class:`RedisBroker` (:mod:`._broker`) puts them together; :mod:`._inspect` reads the
layout back for operators (:meth:`RedisBroker.inspect`, a :class:`QueueStatus`).

Resolution (an answer, the deadline, a withdrawal) is one Lua script on the request's
slot: the first wins, the rest are told why they lost.
"""

from typing import Any

from ._broker import REFUSAL_GRACE_S, RedisBroker, answer_or_refusal
from ._events import RedisEvents
from ._inspect import (
    ConsumerStatus,
    DeadLetter,
    EscalationStatus,
    GroupStatus,
    QueueStatus,
    QuorumStatus,
    Status,
    WaiterVersion,
)
from ._responder import RedisPending, RedisResponder
from ._store import RedisStore

__all__ = [
    "REFUSAL_GRACE_S",
    "ConsumerStatus",
    "DeadLetter",
    "EscalationStatus",
    "GroupStatus",
    "QueueStatus",
    "QuorumStatus",
    "RedisBroker",
    "RedisEvents",
    "RedisPending",
    "RedisResponder",
    "RedisStore",
    "Status",
    "WaiterVersion",
    "answer_or_refusal",
]


def __getattr__(name: str) -> Any:
    from .._compat import forward

    return forward(__name__, f"{__name__}._broker", name)
