"""What a queue of the Redis broker holds, read and typed in one place: the one reader of
the broker's state layout (:mod:`._layout`) outside the waiter and the responders.

:meth:`RedisBroker.inspect <toolnexus.redis_broker.RedisBroker.inspect>` returns a
:class:`QueueStatus` (its groups and their consumers, open requests, quorums, escalations,
durable waits, dead letters counted); :meth:`RedisBroker.dead_letters
<toolnexus.redis_broker.RedisBroker.dead_letters>` the :class:`DeadLetter` entries.
``toolnexus status``, ``check`` and ``dead-letters`` only format these (:mod:`toolnexus.cli._ops`).
Every struct here converts to the JSON those commands print with ``msgspec.to_builtins``.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

import msgspec
import redis.exceptions

from ..errors import BrokerUnavailable, DecodeError
from ..keys import WAITER_ID
from ..models import Heartbeat, Request
from . import _layout as layout
from ._core import Core, boundary
from ._escalation import parse_queues_field
from ._heartbeats import DROP_OUT_S, heartbeats


class ConsumerStatus(msgspec.Struct, frozen=True):
    """One consumer of a group. ``unacknowledged``: requests it holds; ``idle_s``: since it
    last read or claimed (None: it has a heartbeat but never read); ``heartbeat_age_s``:
    since its last heartbeat (None: none that has not expired); ``alive``: it has one.
    As its heartbeat says (None without one): its toolnexus ``version`` (``"previous"``:
    the release before versions were written), the protocols it ``reads`` and the one it
    ``writes`` (see :mod:`toolnexus.protocol`)."""

    consumer: str
    unacknowledged: int
    idle_s: float | None
    heartbeat_age_s: float | None
    alive: bool
    version: str | None = None
    reads: list[int] | None = None
    writes: int | None = None


class WaiterVersion(msgspec.Struct, frozen=True):
    """Waiting processes alive (``alive`` of them) of one ``version`` writing protocol
    ``writes``, as their liveness marks say (``"previous"``: marks of the release before
    versions were written, protocol 1)."""

    version: str
    writes: int
    alive: int


class GroupStatus(msgspec.Struct, frozen=True):
    """One consumer group (a responder channel). ``unacknowledged``: delivered, not yet
    resolved or skipped; ``undelivered``: entries no consumer of it has read yet (counted
    up to 10,000; None for a group with heartbeats but no group in Redis yet);
    ``oldest_unacknowledged_s``: age of the oldest entry it holds. ``consumers`` leaves out
    those without a heartbeat that hold nothing and have been idle for
    :data:`~toolnexus.redis_broker._heartbeats.DROP_OUT_S` (stopped workers)."""

    group: str
    unacknowledged: int
    undelivered: int | None
    oldest_unacknowledged_s: float | None
    consumers: list[ConsumerStatus] = msgspec.field(default_factory=list)


class QuorumStatus(msgspec.Struct, frozen=True):
    """An open request that needs a quorum: ``need`` votes, ``decline`` ``veto`` or
    ``count``; the ``accepts`` and ``declines`` counted so far (as Redis counts them, by
    claimed identity: the waiter verifies each), and the ``approvers``."""

    id: str
    prompt: str
    need: int
    decline: str
    accepts: int
    declines: int
    approvers: list[str] = msgspec.field(default_factory=list)


class EscalationStatus(msgspec.Struct, frozen=True):
    """An open request that escalated: ``queues`` it was published to, the one it was
    asked on first."""

    id: str
    queues: list[str]


class QueueStatus(msgspec.Struct, frozen=True):
    """One queue. ``open_requests``: entries in its request stream (a resolved request's
    entry is deleted, so these are unresolved, or past their deadline with no responder
    running to notice); ``oldest_waiting_s``: age of the oldest; ``dead_letters``: entries
    of its dead-letter stream; ``durable_open``: durable requests still open (of every
    agent); ``escalated``: open requests published to more queues than this one."""

    queue: str
    open_requests: int
    oldest_waiting_s: float | None
    dead_letters: int
    groups: list[GroupStatus] = msgspec.field(default_factory=list)
    quorums: list[QuorumStatus] = msgspec.field(default_factory=list)
    durable_open: int = 0
    escalated: int = 0
    escalations: list[EscalationStatus] = msgspec.field(default_factory=list)


class Status(msgspec.Struct, frozen=True):
    """A namespace at time ``at`` (Unix s): ``waiters_alive`` counts the agent processes
    whose liveness mark is in Redis (for every queue), ``waiters`` them by version and
    protocol, ``queues`` the queues looked at."""

    namespace: str
    at: float
    waiters_alive: int
    queues: list[QueueStatus]
    waiters: list[WaiterVersion] = msgspec.field(default_factory=list)

    def mismatches(self) -> list[str]:
        """:func:`mismatches` of the live consumers and waiters this status shows."""
        responders = [
            Responding(f"{g.group}/{c.consumer} on queue {q.queue}", c.version, c.reads, c.writes)
            for q in self.queues
            for g in q.groups
            for c in g.consumers
            if c.alive and c.version is not None and c.reads is not None and c.writes is not None
        ]
        return mismatches(responders, self.waiters)

    def to_json(self) -> dict[str, Any]:
        """The shape ``toolnexus status --json`` prints."""
        shown: dict[str, Any] = msgspec.to_builtins(self)
        return shown


class Responding(NamedTuple):
    """A live responder as its heartbeat says: who, its version, the protocols it reads and
    the one it writes."""

    name: str
    version: str
    reads: list[int]
    writes: int


def mismatches(responders: Sequence[Responding], waiters: Sequence[WaiterVersion]) -> list[str]:
    """The live processes that cannot talk to each other: a waiter writes a protocol a
    responder does not read, or a responder writes one (its heartbeats, dead letters) that
    a waiter does not (a waiter reads what it writes and the protocol before), each with
    which to upgrade first (responders before agents) or which ``write_protocol`` to set
    until then."""
    problems: list[str] = []
    for r in responders:
        for w in waiters:
            if w.writes not in r.reads:
                problems.append(
                    f"responder {r.name} ({r.version}) reads protocol "
                    f"{', '.join(map(str, r.reads))}, but {w.alive} waiting process(es) "
                    f"({w.version}) write protocol {w.writes}: upgrade the responder first, "
                    f"or set write_protocol={max(r.reads)} on those agents until it is"
                )
            if r.writes not in (w.writes, w.writes - 1):
                problems.append(
                    f"responder {r.name} ({r.version}) writes protocol {r.writes}, which "
                    f"{w.alive} waiting process(es) ({w.version}, protocol {w.writes}) do not "
                    f"read: set write_protocol={w.writes} on the responder until those agents "
                    "are upgraded"
                )
    return problems


class DeadLetter(msgspec.Struct, frozen=True):
    """One entry of a queue's dead-letter stream: ``id`` (its entry id there), ``at`` (when,
    Unix s), the ``error`` that put it there, the ``stream`` and ``entry`` id it came from,
    ``raw`` (its original fields as ``name=value`` lines, bounded in size: ``truncated``
    when cut), and what a readable request in it says (``request_id``, ``kind``, ``prompt``;
    None when it holds none). ``requeue_problem``: why it cannot be requeued (None: it can).
    ``group``: the consumer group that could not take the entry (each group that refuses
    an entry of the request stream adds its own dead letter, and the entry stays for the
    others); None for an entry read without a group (events, a reply stream)."""

    id: str
    at: float
    error: str
    stream: str
    entry: str
    raw: bytes
    truncated: bool
    request_id: str | None
    kind: str | None
    prompt: str | None
    requeue_problem: str | None
    group: str | None = None
    request: bytes | None = None  # the request's bytes, when it can be requeued

    def to_json(self) -> dict[str, Any]:
        """The shape ``toolnexus dead-letters --json`` prints: every field, ``raw`` as text
        (bytes that are not UTF-8 as ``\\xNN``), without the request's bytes."""
        shown: dict[str, Any] = msgspec.to_builtins(self)
        shown["raw"] = self.raw.decode(errors="backslashreplace")
        del shown["request"]
        return shown


REQUESTS_LOOKED_AT = 1000
"""How many of the oldest entries of a request stream are read to find quorums' votes and
escalated requests."""

UNDELIVERED_COUNT_MAX = 10_000
"""``undelivered`` is counted entry by entry up to this many where Redis cannot tell the lag
(a stream with deleted entries, which resolved requests leave); durable requests open are
counted up to this many too."""

_REQUEST = layout.ENTRY_REQUEST.encode()
_STATUS, _OPEN = layout.STATUS, layout.OPEN.encode()


def _name(value: bytes | str) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def _age_s(entry_id: bytes | str | None, now: float) -> float | None:
    if not entry_id:
        return None
    return max(0.0, now - int(_name(entry_id).partition("-")[0]) / 1000)


def _wrong_type(exc: BaseException) -> bool:
    """Whether ``exc`` is Redis refusing a command on a key of another type (WRONGTYPE):
    a key toolnexus did not write as it is, not Redis being away."""
    return isinstance(exc, redis.exceptions.ResponseError) and "WRONGTYPE" in str(exc)


def entry_order(entry_id: bytes | str) -> tuple[int, int]:
    """Where stream entry ``entry_id`` (``<ms>-<seq>``, as Redis names entries) falls in
    time: to merge entries of several streams into one timeline."""
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    at, _, seq = text.partition("-")
    return int(at), int(seq or 0)


async def scan(core: Core, pattern: str, kind: str | None = None) -> list[str]:
    """The keys matching ``pattern`` (of type ``kind``, if given), except those whose names
    are not UTF-8: toolnexus names every key it makes with text, so those are somebody
    else's (or junk). On a Cluster, only those of the node the URL names."""
    found = []
    with boundary(f"listing keys {pattern!r}"):
        async for key in core.redis.scan_iter(match=pattern, count=1000, _type=kind):
            try:
                found.append(key.decode() if isinstance(key, bytes) else key)
            except UnicodeDecodeError:
                continue
    return found


async def queues(core: Core) -> list[str]:
    """The queues of the namespace that have a request stream, sorted."""
    keys = core.keys
    found = await scan(core, keys.requests_pattern(), "stream")
    return sorted({q for key in found if (q := keys.queue_of(key)) is not None})


async def waiters_alive(core: Core) -> tuple[int, list[WaiterVersion]]:
    """How many waiters of the namespace (of every queue) have their liveness mark, and
    them by version and protocol (marks read in batches of :data:`MARKS_READ`; a mark
    that is not one is counted as alive, by no version)."""
    marks = await scan(core, core.keys.alive_pattern())
    counted: dict[tuple[str, int], int] = {}
    for start in range(0, len(marks), MARKS_READ):
        batch = marks[start : start + MARKS_READ]
        values = await core.bounded(
            asyncio.gather(*(core.pipeliner.call("GET", key) for key in batch))
        )
        for value in values:
            parsed = layout.parse_liveness(value)
            if parsed is not None:
                key = (parsed[1], parsed[0])
                counted[key] = counted.get(key, 0) + 1
    versions = [WaiterVersion(v, p, n) for (v, p), n in sorted(counted.items())]
    return len(marks), versions


MARKS_READ = 1000
"""Liveness marks read at once by :func:`waiters_alive` (one pipelined ``GET`` each)."""


async def inspect_queue(core: Core) -> QueueStatus:
    """:meth:`RedisBroker.inspect`: what the broker's queue holds now.

    Raises:
        BrokerUnavailable: Redis cannot be reached.
    """
    keys, redis_ = core.keys, core.redis
    now = time.time()
    with boundary(f"reading queue {keys.queue!r}"):
        length = await core.bounded(redis_.xlen(keys.requests))
        first = await core.bounded(redis_.xrange(keys.requests, "-", "+", count=1))
        dead = await core.bounded(redis_.xlen(keys.dead))
        beats: dict[str, dict[str, Heartbeat]] = {}
        for beat in await heartbeats(core):
            beats.setdefault(beat.group, {})[beat.consumer] = beat
        groups: list[GroupStatus] = []
        for info in await core.bounded(_groups(core)):
            group = _name(info["name"])
            summary = await core.bounded(redis_.xpending(keys.requests, group))
            consumers = await core.bounded(redis_.xinfo_consumers(keys.requests, group))
            groups.append(
                GroupStatus(
                    group=group,
                    unacknowledged=int(info.get("pending") or 0),
                    undelivered=await _undelivered(core, info),
                    oldest_unacknowledged_s=_age_s(summary.get("min"), now),
                    consumers=_consumers(consumers, beats.pop(group, {}), now),
                )
            )
        for group, rest in sorted(beats.items()):  # workers whose group is not created yet
            groups.append(GroupStatus(group, 0, None, None, _consumers([], rest, now)))
        entries: Any = await core.bounded(
            redis_.xrange(keys.requests, "-", "+", count=REQUESTS_LOOKED_AT)
        )
        requests = _requests(core, entries)
        escalations = await _escalations(core, requests)
        return QueueStatus(
            queue=keys.queue,
            open_requests=int(length),
            oldest_waiting_s=_age_s(first[0][0] if first else None, now),
            dead_letters=int(dead),
            groups=sorted(groups, key=lambda g: g.group),
            quorums=await _quorums(core, requests),
            durable_open=await _durable_open(core),
            escalated=len(escalations),
            escalations=escalations,
        )


def _requests(core: Core, entries: Any) -> list[Request]:
    """The readable requests of request-stream ``entries`` whose reply stream is a waiter's
    (garbage is skipped: the responders dead-letter it)."""
    found = []
    for _entry_id, fields in entries or ():
        try:
            request = core.codec.decode_as((fields or {}).get(_REQUEST, b""), Request)
        except DecodeError:
            continue
        if request.reply_to is not None and WAITER_ID.fullmatch(request.reply_to):
            found.append(request)
    return found


async def _quorums(core: Core, requests: list[Request]) -> list[QuorumStatus]:
    """The open ones of ``requests`` that need a quorum, with the votes their states hold."""
    found = []
    for request in requests:
        if request.quorum is None:
            continue
        assert request.reply_to is not None
        state = core.keys.state(request.reply_to, request.id)
        try:
            if await core.bounded(core.redis.hget(state, _STATUS)) != _OPEN:
                continue
            names = [_name(n) for n in await core.bounded(core.redis.hkeys(state))]
        except redis.exceptions.ResponseError as exc:
            if _wrong_type(exc):
                continue  # not a state toolnexus wrote: nothing to show
            raise
        approvers = [n[2:] for n in names if n.startswith(layout.ACCEPT_VOTE)]
        found.append(
            QuorumStatus(
                id=request.id,
                prompt=request.prompt,
                need=request.quorum.need,
                decline=request.quorum.decline,
                accepts=len(approvers),
                declines=sum(n.startswith(layout.DECLINE_VOTE) for n in names),
                approvers=approvers,
            )
        )
    return found


async def _durable_open(core: Core) -> int:
    """How many of the queue's durable requests, of every agent, are open (up to
    ``UNDELIVERED_COUNT_MAX``)."""
    keys = core.keys
    found = await scan(core, keys.durable_states_pattern(), "hash")
    states = [state for state in found if keys.is_durable_state(state)][:UNDELIVERED_COUNT_MAX]
    count = 0
    for start in range(0, len(states), 1000):
        async with core.redis.pipeline(transaction=False) as pipe:
            for state in states[start : start + 1000]:
                pipe.hget(state, _STATUS)
            # (a key of another type is an error in its place, not an open request)
            replies = await core.bounded(pipe.execute(raise_on_error=False))
            count += sum(1 for s in replies if s == _OPEN)
    return count


async def _escalations(core: Core, requests: list[Request]) -> list[EscalationStatus]:
    """The ones of ``requests`` that escalated: with hops, and a state that records another
    queue reached."""
    escalating = [r for r in requests if r.escalate]
    if not escalating:
        return []
    async with core.redis.pipeline(transaction=False) as pipe:
        for request in escalating:
            assert request.reply_to is not None
            pipe.hget(core.keys.state(request.reply_to, request.id), layout.QUEUES)
        reached = await core.bounded(pipe.execute(raise_on_error=False))
    found = []
    for request, value in zip(escalating, reached, strict=True):
        readable = value if isinstance(value, bytes | str) else None  # else a wrong type
        names = [queue for queue, _entry in parse_queues_field(readable)]
        if len(names) > 1:
            found.append(EscalationStatus(id=request.id, queues=names))
    return found


async def _undelivered(core: Core, info: dict[str, Any]) -> int:
    if info.get("lag") is not None:
        return int(info["lag"])
    last = _name(info.get("last-delivered-id") or b"0-0")
    entries = await core.bounded(
        core.redis.xrange(core.keys.requests, f"({last}", "+", count=UNDELIVERED_COUNT_MAX)
    )
    return len(entries or [])


async def _groups(core: Core) -> list[dict[str, Any]]:
    """XINFO GROUPS of the request stream; none when the stream does not exist yet."""
    try:
        groups: list[dict[str, Any]] = await core.redis.xinfo_groups(core.keys.requests)
    except redis.exceptions.ResponseError as exc:
        if "no such key" in str(exc):
            return []
        raise
    return groups


def _protocols(beat: Heartbeat | None) -> dict[str, Any]:
    """What a consumer's heartbeat says of its version and protocols (nothing: none)."""
    if beat is None:
        return {}
    version, reads, writes = beat.protocols()
    return {"version": version, "reads": reads, "writes": writes}


def _consumers(
    infos: list[dict[str, Any]], beats: dict[str, Heartbeat], now: float
) -> list[ConsumerStatus]:
    """The consumers of a group: those Redis knows, and those with only a heartbeat; not
    those without a heartbeat, holding nothing, idle for ``DROP_OUT_S`` (gone)."""
    result = []
    for info in infos:
        name = _name(info["name"])
        beat = beats.pop(name, None)
        held = int(info.get("pending") or 0)
        idle_s = int(info.get("idle") or 0) / 1000
        if beat is None and held == 0 and idle_s >= DROP_OUT_S:
            continue
        result.append(
            ConsumerStatus(
                consumer=name,
                unacknowledged=held,
                idle_s=idle_s,
                heartbeat_age_s=None if beat is None else max(0.0, now - beat.at),
                alive=beat is not None,
                **_protocols(beat),
            )
        )
    for name, beat in beats.items():
        result.append(
            ConsumerStatus(name, 0, None, max(0.0, now - beat.at), True, **_protocols(beat))
        )
    return sorted(result, key=lambda c: c.consumer)


# -- dead letters -----------------------------------------------------------------------------

_TRUNCATED = re.compile(rb"\.\.\. \((\d+) bytes in all\)\Z")
_RAW_REQUEST = _REQUEST + b"="


def _dead_letter(core: Core, entry_id: Any, fields: dict[Any, Any]) -> DeadLetter:
    raw: bytes = fields.get(layout.DEAD_RAW.encode(), b"")
    stream = _name(fields.get(layout.DEAD_STREAM.encode(), b""))
    group = fields.get(layout.DEAD_GROUP.encode())
    cut = _TRUNCATED.search(raw)
    kept, total = (cut.start(), int(cut[1])) if cut else (len(raw), len(raw))
    truncated = total > kept
    request_bytes: bytes | None = None
    problem: str | None = None
    if stream != core.keys.requests:
        problem = (
            f"it came from {stream!r}, not from the request stream of queue {core.keys.queue!r}"
        )
    elif truncated:
        problem = (
            f"only the first {kept} of its {total} bytes were "
            "kept (dead_letter_max_bytes): the request cannot be rebuilt"
        )
    elif not raw.startswith(_RAW_REQUEST):
        problem = "it holds no request (a request entry is one field, r)"
    else:
        request_bytes = raw[len(_RAW_REQUEST) :]
    request = None
    if raw.startswith(_RAW_REQUEST) and not truncated:
        with contextlib.suppress(DecodeError):
            request = core.codec.decode_as(raw[len(_RAW_REQUEST) :], Request)
    return DeadLetter(
        id=_name(entry_id),
        at=int(_name(entry_id).partition("-")[0]) / 1000,
        error=_name(fields.get(layout.DEAD_ERROR.encode(), b"")),
        stream=stream,
        entry=_name(fields.get(layout.DEAD_ENTRY.encode(), b"")),
        raw=raw,
        truncated=truncated,
        request_id=request.id if request else None,
        kind=request.kind if request else None,
        prompt=request.prompt if request else None,
        requeue_problem=problem,
        group=_name(group) if isinstance(group, bytes | str) and group else None,
        request=request_bytes,
    )


async def dead_letters(core: Core, entry_id: str | None = None) -> list[DeadLetter]:
    """:meth:`RedisBroker.dead_letters`: the queue's dead letters, oldest first (only the one
    ``entry_id``, or none if it has no such entry).

    Raises:
        BrokerUnavailable: Redis cannot be reached.
    """
    keys = core.keys
    start, end = (entry_id, entry_id) if entry_id else ("-", "+")
    try:
        with boundary(f"reading the dead letters of queue {keys.queue!r}"):
            entries = await core.bounded(core.redis.xrange(keys.dead, start, end))
    except BrokerUnavailable as exc:
        if entry_id and isinstance(exc.__cause__, redis.exceptions.ResponseError):
            return []  # not a stream entry id: no such dead letter
        raise
    return [_dead_letter(core, entry, fields or {}) for entry, fields in entries or ()]


# -- one request's state ----------------------------------------------------------------------


async def stored_answer(core: Core, request_id: str) -> tuple[bytes | None, str | None]:
    """What the state of request ``request_id`` (found by its route) says of its answer:
    the answer it holds, as stored (None while it is open, or when the broker does not know
    the request), and why its waiter last refused one and opened it again (None if never).

    Raises:
        BrokerUnavailable: Redis cannot be reached.
    """
    keys = core.keys
    with boundary(f"reading the state of {request_id}"):
        route = layout.parse_route(await core.bounded(core.redis.get(keys.route(request_id))))
        if route is None:
            return None, None
        state = keys.state(route[0], request_id)
        try:
            status, answer, why = await core.bounded(
                core.redis.hmget(state, [layout.STATUS, layout.ANSWER, layout.WHY])
            )
        except redis.exceptions.ResponseError as exc:
            if _wrong_type(exc):
                return None, None
            raise
    held = answer if status not in (None, _OPEN) and isinstance(answer, bytes) else None
    reason = " ".join(_name(why).split())[:200] if isinstance(why, bytes | str) else None
    return held, reason or None
