"""What ``toolnexus status``, ``toolnexus check`` and ``toolnexus audit`` read and print.

:func:`read_status` looks inside Redis (through :attr:`RedisBroker.redis
<toolnexus.redis_broker.RedisBroker.redis>` and the key names of :mod:`toolnexus.keys`)
and returns a :class:`Status`; ``Status.to_json()`` is the stable shape ``status --json``
prints (its field names are documented in the README and in each dataclass here).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import re
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

import msgspec
import redis.exceptions

from . import lifecycle
from .audit import AuditRecord
from .broker import connect, redacted
from .codec import JSON, MSGPACK
from .errors import BrokerUnavailable, ConfigurationError, DecodeError
from .keys import WAITER_ID, Keys
from .models import Answer, Heartbeat, Request
from .redis_broker import RedisBroker
from .redis_broker.escalation import parse_queues_field

_OPEN = lifecycle.Status.OPEN.encode()  # a state's status field (s) of an open request

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class ConsumerStatus:
    """One consumer of a group. ``unacknowledged``: requests it holds; ``idle_s``: since it
    last read or claimed (None: it has a heartbeat but never read); ``heartbeat_age_s``:
    since its last heartbeat (None: none that has not expired); ``alive``: it has one."""

    consumer: str
    unacknowledged: int
    idle_s: float | None
    heartbeat_age_s: float | None
    alive: bool


@dataclass(frozen=True, slots=True)
class GroupStatus:
    """One consumer group (a responder channel). ``unacknowledged``: delivered, not yet
    resolved or skipped; ``undelivered``: entries no consumer of it has read yet (counted
    up to 10,000; None for a group with heartbeats but no group in Redis yet);
    ``oldest_unacknowledged_s``: age of the oldest entry it holds."""

    group: str
    unacknowledged: int
    undelivered: int | None
    oldest_unacknowledged_s: float | None
    consumers: list[ConsumerStatus] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class QuorumStatus:
    """An open request that needs a quorum (SPEC §14): ``need`` votes, ``decline``
    ``veto`` or ``count``; the ``accepts`` and ``declines`` counted so far (as Redis counts
    them, by claimed identity: the waiter verifies each), and the ``approvers``."""

    id: str
    prompt: str
    need: int
    decline: str
    accepts: int
    declines: int
    approvers: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class EscalationStatus:
    """An open request that escalated (SPEC §14): ``queues`` it was published to, the one
    it was asked on first."""

    id: str
    queues: list[str]


@dataclass(frozen=True, slots=True)
class QueueStatus:
    """One queue. ``open_requests``: entries in its request stream (a resolved request's entry
    is deleted, so these are unresolved, or past their deadline with no responder running to
    expire them); ``oldest_waiting_s``: age of the oldest; ``dead_letters``: entries in its
    dead-letter stream; ``durable_open``: durable requests still open (SPEC §14: they stay
    open while no process waits for them; counted up to 10,000). ``escalated``: open
    requests here that escalated, onward from here or to here (among the first
    :data:`ESCALATIONS_LOOKED_AT` entries), ``escalations`` each. ``quorums``: the open
    requests (of the oldest ``QUORUM_SCAN_MAX``) that need a quorum, with their votes."""

    queue: str
    open_requests: int
    oldest_waiting_s: float | None
    dead_letters: int
    groups: list[GroupStatus] = field(default_factory=list)
    quorums: list[QuorumStatus] = field(default_factory=list)
    durable_open: int = 0
    escalated: int = 0
    escalations: list[EscalationStatus] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Status:
    """A namespace at time ``at`` (Unix s): ``waiters_alive`` counts the agent processes whose
    liveness mark is in Redis (for every queue), ``queues`` the queues looked at."""

    namespace: str
    at: float
    waiters_alive: int
    queues: list[QueueStatus]

    def to_json(self) -> dict[str, Any]:
        """The shape ``toolnexus status --json`` prints."""
        return asdict(self)


def scrubbed(message: object, url: str) -> str:
    """``message`` as one line, with ``url``'s password replaced by ``***`` (errors quote
    the URL, and a health check's output is kept by the container engine)."""
    return " ".join(str(message).replace(url, redacted(url)).split())


@contextlib.asynccontextmanager
async def redis_brokers(
    url: str, namespace: str, queues: Sequence[str]
) -> AsyncIterator[list[RedisBroker]]:
    """A connected :class:`RedisBroker` per queue of ``namespace``.

    Raises:
        ConfigurationError: ``url`` is not a Redis URL.
        BrokerUnavailable: Redis cannot be reached.
    """
    async with contextlib.AsyncExitStack() as stack:
        brokers = []
        for queue in queues:
            broker = connect(url, namespace=namespace, queue=queue)
            if not isinstance(broker, RedisBroker):
                await broker.aclose()
                raise ConfigurationError(
                    f"this command looks inside Redis: give a redis:// or rediss:// URL, "
                    f"not {redacted(url)!r} (--url or $TOOLNEXUS_URL)"
                )
            brokers.append(await stack.enter_async_context(broker))
        yield brokers


async def _bounded(broker: RedisBroker, what: str, call: Awaitable[T]) -> T:
    """``call`` within the broker's command timeout; Redis errors become BrokerUnavailable."""
    try:
        async with asyncio.timeout(broker.settings.command_timeout_s):
            return await call
    except (redis.exceptions.RedisError, OSError) as exc:
        raise BrokerUnavailable(f"{what}: {type(exc).__name__}: {exc}") from exc


def _wrong_type(exc: BrokerUnavailable) -> bool:
    """Whether ``exc`` is Redis refusing a command on a key of another type (WRONGTYPE):
    a key toolnexus did not write as it is, not Redis being away."""
    cause = exc.__cause__
    return isinstance(cause, redis.exceptions.ResponseError) and "WRONGTYPE" in str(cause)


async def discover_queues(url: str, namespace: str) -> list[str]:
    """The queues of ``namespace`` that have a request stream, sorted (SCAN, so on Redis
    Cluster only those of the node the URL names).

    Raises:
        BrokerUnavailable: Redis cannot be reached.
    """
    async with redis_brokers(url, namespace, ["default"]) as (broker,):
        keys = broker.keys
        found = await _bounded(
            broker, "listing queues", _scan(broker, keys.requests_pattern(), "stream")
        )
    return sorted({q for key in found if (q := keys.queue_of(key)) is not None})


async def _scan(broker: RedisBroker, pattern: str, kind: str | None = None) -> list[str]:
    """The keys matching ``pattern`` (of type ``kind``, if given), except those whose names
    are not UTF-8: toolnexus names every key it makes with text, so those are somebody
    else's (or junk), as is a key of another type than toolnexus gives it."""
    found = []
    async for key in broker.redis.scan_iter(match=pattern, count=1000, _type=kind):
        try:
            found.append(key.decode() if isinstance(key, bytes) else key)
        except UnicodeDecodeError:
            continue
    return found


def _age_s(entry_id: bytes | str | None, now: float) -> float | None:
    if not entry_id:
        return None
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    return max(0.0, now - int(text.partition("-")[0]) / 1000)


def _name(value: bytes | str) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


async def read_status(url: str, namespace: str, queues: Sequence[str]) -> Status:
    """What ``toolnexus status`` shows for ``queues`` of ``namespace``.

    Raises:
        ConfigurationError: ``url`` is not a Redis URL.
        BrokerUnavailable: Redis cannot be reached.
    """
    async with redis_brokers(url, namespace, list(queues) or ["default"]) as brokers:
        alive = await _bounded(
            brokers[0], "counting waiters", _scan(brokers[0], brokers[0].keys.alive_pattern())
        )
        now = time.time()
        states = [await _queue_status(broker, now) for broker in brokers[: len(queues)]]
    return Status(namespace=namespace, at=now, waiters_alive=len(alive), queues=states)


async def _queue_status(broker: RedisBroker, now: float) -> QueueStatus:
    keys: Keys = broker.keys
    redis_ = broker.redis
    what = f"reading queue {keys.queue!r}"
    length = await _bounded(broker, what, redis_.xlen(keys.requests))
    first = await _bounded(broker, what, redis_.xrange(keys.requests, "-", "+", count=1))
    dead = await _bounded(broker, what, redis_.xlen(keys.dead))
    beats: dict[str, dict[str, Heartbeat]] = {}
    for beat in await broker.heartbeats():
        beats.setdefault(beat.group, {})[beat.consumer] = beat
    groups: list[GroupStatus] = []
    for info in await _bounded(broker, what, _groups(broker)):
        group = _name(info["name"])
        summary = await _bounded(broker, what, redis_.xpending(keys.requests, group))
        consumers = await _bounded(broker, what, redis_.xinfo_consumers(keys.requests, group))
        groups.append(
            GroupStatus(
                group=group,
                unacknowledged=int(info.get("pending") or 0),
                undelivered=await _undelivered(broker, info),
                oldest_unacknowledged_s=_age_s(summary.get("min"), now),
                consumers=_consumers(consumers, beats.pop(group, {}), now),
            )
        )
    for group, rest in sorted(beats.items()):  # workers whose group is not created yet
        groups.append(GroupStatus(group, 0, None, None, _consumers([], rest, now)))
    escalations = await _bounded(broker, what, _escalations(broker))
    return QueueStatus(
        queue=keys.queue,
        open_requests=int(length),
        oldest_waiting_s=_age_s(first[0][0] if first else None, now),
        dead_letters=int(dead),
        groups=sorted(groups, key=lambda g: g.group),
        quorums=await _quorums(broker),
        durable_open=await _bounded(broker, what, _durable_open(broker)),
        escalated=len(escalations),
        escalations=escalations,
    )


QUORUM_SCAN_MAX = 1000
"""How many of the oldest open requests ``status`` looks at for a quorum's votes."""


async def _quorums(broker: RedisBroker) -> list[QuorumStatus]:
    """The open requests among the oldest ``QUORUM_SCAN_MAX`` that need a quorum."""
    keys, redis_ = broker.keys, broker.redis
    what = f"reading the quorums of queue {keys.queue!r}"
    entries = await _bounded(broker, what, redis_.xrange(keys.requests, count=QUORUM_SCAN_MAX))
    found = []
    for _entry_id, fields in entries or ():
        try:
            request = broker.codec.decode_as((fields or {}).get(b"r", b""), Request)
        except DecodeError:
            continue  # garbage: the responders dead-letter it
        waiter = request.reply_to or ""
        if request.quorum is None or not WAITER_ID.fullmatch(waiter):
            continue
        state = keys.state(waiter, request.id)
        try:
            status = await _bounded(broker, what, redis_.hget(state, "s"))
            if status != _OPEN:
                continue
            names = [_name(n) for n in await _bounded(broker, what, redis_.hkeys(state))]
        except BrokerUnavailable as exc:
            if _wrong_type(exc):
                continue  # not a state toolnexus wrote: nothing to show
            raise
        approvers = [n[2:] for n in names if n.startswith("y:")]
        found.append(
            QuorumStatus(
                id=request.id,
                prompt=request.prompt,
                need=request.quorum.need,
                decline=request.quorum.decline,
                accepts=len(approvers),
                declines=sum(n.startswith("n:") for n in names),
                approvers=approvers,
            )
        )
    return found


async def _durable_open(broker: RedisBroker) -> int:
    """How many of the queue's durable requests, of every agent, are open (up to
    ``UNDELIVERED_COUNT_MAX``)."""
    keys = broker.keys
    found = await _scan(broker, keys.durable_states_pattern(), "hash")
    states = [state for state in found if keys.is_durable_state(state)][:UNDELIVERED_COUNT_MAX]
    count = 0
    for start in range(0, len(states), 1000):
        async with broker.redis.pipeline(transaction=False) as pipe:
            for state in states[start : start + 1000]:
                pipe.hget(state, "s")
            # (a key of another type is an error in its place, not an open request)
            count += sum(1 for s in await pipe.execute(raise_on_error=False) if s == _OPEN)
    return count


ESCALATIONS_LOOKED_AT = 1000
"""Entries of a request stream that ``status`` reads to find escalated requests."""


async def _escalations(broker: RedisBroker) -> list[EscalationStatus]:
    """The open requests of the queue that escalated: those of its first entries whose
    request has hops and whose state records another queue reached."""
    keys = broker.keys
    entries: Any = await broker.redis.xrange(keys.requests, "-", "+", count=ESCALATIONS_LOOKED_AT)
    escalating: list[Request] = []
    for _entry_id, fields in entries or ():
        try:
            request = broker.codec.decode_as(fields.get(b"r", b""), Request)
        except DecodeError:
            continue  # a responder dead-letters it
        if request.escalate and request.reply_to and WAITER_ID.fullmatch(request.reply_to):
            escalating.append(request)
    if not escalating:
        return []
    async with broker.redis.pipeline(transaction=False) as pipe:
        for request in escalating:
            assert request.reply_to is not None
            pipe.hget(keys.state(request.reply_to, request.id), "q")
        reached = await pipe.execute(raise_on_error=False)
    found = []
    for request, value in zip(escalating, reached, strict=True):
        readable = value if isinstance(value, bytes | str) else None  # else a wrong type
        queues = [queue for queue, _entry in parse_queues_field(readable)]
        if len(queues) > 1:
            found.append(EscalationStatus(id=request.id, queues=queues))
    return found


UNDELIVERED_COUNT_MAX = 10_000
"""``undelivered`` is counted entry by entry up to this many where Redis cannot tell the lag
(a stream with deleted entries, which resolved requests leave)."""


async def _undelivered(broker: RedisBroker, info: dict[str, Any]) -> int:
    if info.get("lag") is not None:
        return int(info["lag"])
    last = _name(info.get("last-delivered-id") or b"0-0")
    entries = await _bounded(
        broker,
        f"reading queue {broker.keys.queue!r}",
        broker.redis.xrange(broker.keys.requests, f"({last}", "+", count=UNDELIVERED_COUNT_MAX),
    )
    return len(entries or [])


async def _groups(broker: RedisBroker) -> list[dict[str, Any]]:
    """XINFO GROUPS of the request stream; none when the stream does not exist yet."""
    try:
        groups: list[dict[str, Any]] = await broker.redis.xinfo_groups(broker.keys.requests)
    except redis.exceptions.ResponseError as exc:
        if "no such key" in str(exc):
            return []
        raise
    return groups


def _consumers(
    infos: list[dict[str, Any]], beats: dict[str, Heartbeat], now: float
) -> list[ConsumerStatus]:
    result = []
    for info in infos:
        name = _name(info["name"])
        beat = beats.pop(name, None)
        result.append(
            ConsumerStatus(
                consumer=name,
                unacknowledged=int(info.get("pending") or 0),
                idle_s=int(info.get("idle") or 0) / 1000,
                heartbeat_age_s=None if beat is None else max(0.0, now - beat.at),
                alive=beat is not None,
            )
        )
    for name, beat in beats.items():
        result.append(ConsumerStatus(name, 0, None, max(0.0, now - beat.at), True))
    return sorted(result, key=lambda c: c.consumer)


def duration_text(seconds: float | None) -> str:
    """``seconds`` for people: ``850ms``, ``12s``, ``4m05s``, ``3h12m``, ``2d04h``; ``-``
    for None, ``?`` for what is not a number of seconds (NaN, infinite: Redis held it)."""
    if seconds is None:
        return "-"
    if not math.isfinite(seconds):
        return "?"
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    whole = int(seconds)
    for unit, size, sub, sub_size in (("d", 86400, "h", 3600), ("h", 3600, "m", 60)):
        if whole >= size:
            return f"{whole // size}{unit}{(whole % size) // sub_size:02d}{sub}"
    if whole >= 60:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{seconds:.0f}s"


def utc_text(at: float, form: str = "%Y-%m-%dT%H:%M:%SZ") -> str:
    """The Unix time ``at`` as UTC in ``form``; ``?`` for one no calendar holds (NaN,
    infinite, beyond year 9999: an audit record or heartbeat in Redis may say anything)."""
    try:
        return time.strftime(form, time.gmtime(at))
    except (OverflowError, ValueError, OSError):
        return "?"


def status_text(status: Status) -> str:
    """``status`` as the lines ``toolnexus status`` prints."""
    at = utc_text(status.at, "%Y-%m-%d %H:%M:%S UTC")
    lines = [f"namespace {status.namespace} · {status.waiters_alive} waiters alive · {at}"]
    if not status.queues:
        lines.append("no queues (nothing has been published in this namespace)")
    for queue in status.queues:
        durable = f", {queue.durable_open} durable open" if queue.durable_open else ""
        escalated = f", {queue.escalated} escalated" if queue.escalated else ""
        lines.append(
            f"queue {queue.queue}: {queue.open_requests} open "
            f"(oldest {duration_text(queue.oldest_waiting_s)}){escalated}, "
            f"{queue.dead_letters} dead letters{durable}"
        )
        for q in queue.quorums:
            who = f": {', '.join(q.approvers)}" if q.approvers else ""
            declines = f", {q.declines} declined ({q.decline})" if q.declines else ""
            lines.append(
                f"  quorum {q.id} {q.prompt[:60]!r}: {q.accepts} of {q.need} approvals"
                f"{who}{declines}"
            )
        if not queue.groups:
            lines.append("  no consumer groups: no responder has read this queue")
        for group in queue.groups:
            undelivered = "?" if group.undelivered is None else str(group.undelivered)
            lines.append(
                f"  group {group.group}: {group.unacknowledged} unacknowledged "
                f"(oldest {duration_text(group.oldest_unacknowledged_s)}), "
                f"{undelivered} undelivered"
            )
            for c in group.consumers:
                beat = (
                    f"heartbeat {duration_text(c.heartbeat_age_s)} ago"
                    if c.alive
                    else "no heartbeat (gone?)"
                )
                lines.append(
                    f"    {c.consumer}: holds {c.unacknowledged}, "
                    f"idle {duration_text(c.idle_s)}, {beat}"
                )
    return "\n".join(lines)


async def check(
    url: str, namespace: str, queue: str, workers: Sequence[str], *, here: bool = False
) -> tuple[bool, str]:
    """Whether Redis is reachable and the ``workers`` (``GROUP`` or ``GROUP/CONSUMER``; all
    when empty, then at least one) have fresh heartbeats, with the line that says so.
    ``here``: only workers whose heartbeat names this host (a container's probe).

    Raises:
        ConfigurationError: ``url`` is not a Redis URL.
    """
    try:
        async with redis_brokers(url, namespace, [queue]) as (broker,):
            beats = await broker.heartbeats()
    except BrokerUnavailable as exc:
        return False, f"Redis is not reachable: {scrubbed(exc, url)}"
    host = socket.gethostname()
    if here:
        beats = [b for b in beats if b.info.get("host") == host]
    where = f"queue {queue!r}" + (f" on host {host}" if here else "")
    names = sorted(f"{b.group}/{b.consumer}" for b in beats)
    if not workers:
        if not names:
            return False, f"no worker has a fresh heartbeat on {where}"
        return True, f"ok: {len(names)} worker(s) with fresh heartbeats on {where}: " + ", ".join(
            names
        )
    missing = [
        w for w in workers if not any(n == w or n.startswith(w.rstrip("/") + "/") for n in names)
    ]
    if missing:
        live = ", ".join(names) or "none"
        return False, f"no fresh heartbeat from {', '.join(missing)} on {where} (fresh: {live})"
    return True, f"ok: {', '.join(workers)} have fresh heartbeats on {where}"


def audit_json(records: Sequence[AuditRecord]) -> str:
    """``records`` as the JSON array ``toolnexus audit --json`` prints: every
    :class:`~toolnexus.audit.AuditRecord` field (``request``/``answer``/``digest`` bytes in
    base64)."""
    return json.dumps(msgspec.to_builtins(list(records)), indent=2)


def audit_text(record: AuditRecord) -> str:
    """One line for ``record``: when, id, outcome, who answered and asked, verification."""
    at = utc_text(record.resolved_at)
    outcome = "accepted" if record.ok else (record.reason or record.status)
    if record.defaulted:  # SPEC §14: nobody answered; the request's default applied
        outcome = f"expired ({'accepted' if record.ok else 'declined'} by default)"
    by = " / ".join(n for n in (record.responder, record.person) if n) or "-"
    source = "/".join(n for n in (record.source.server, record.source.tool) if n)
    asked = record.requester or record.source.agent or "-"
    verified = {True: "verified", False: "NOT verified", None: "unsigned"}[record.verified]
    took = (
        f" after {duration_text(record.resolved_at - record.created_at)}"
        if record.created_at
        else ""
    )
    refused = f", {len(record.refused)} refused" if record.refused else ""
    parts = [at, record.id, record.kind or "-", outcome, f"by {by}", f"asked by {asked}"]
    if record.durable:
        parts.append("durably")
    if source:
        parts.append(f"via {source}")
    if record.votes:
        parts.append(f"votes {', '.join(_voters(record))}")
    return " ".join(parts) + f" ({verified}{took}{refused})"


def _voters(record: AuditRecord) -> list[str]:
    """Who voted on a quorum's request (SPEC §14), as each signed vote says: ``+`` an
    accept, ``-`` a decline."""
    codec = MSGPACK if record.format == "msgpack" else JSON
    voters = []
    for raw in record.votes:
        try:
            vote = codec.decode_as(raw, Answer)
        except DecodeError:
            voters.append("(unreadable)")
            continue
        voters.append(f"{'+' if vote.ok else '-'}{vote.answered_by or '?'}")
    return voters


# -- dead letters -----------------------------------------------------------------------------

REQUEUE_SCRIPT = """
-- KEYS dead-letter stream, request stream; ARGV dead letter id, request bytes.
-- Whoever deletes the dead letter first puts the request back: its new entry id, or
-- false when the dead letter is gone (requeued or purged meanwhile).
if redis.call('XDEL', KEYS[1], ARGV[1]) == 0 then
  return false
end
return redis.call('XADD', KEYS[2], '*', 'r', ARGV[2])
"""
"""Requeue one dead letter, once however many operators do it at the same time."""

_TRUNCATED = re.compile(rb"\.\.\. \((\d+) bytes in all\)\Z")


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One entry of a queue's dead-letter stream: ``id`` (its entry id there), ``at`` (when,
    Unix s), the ``error`` that put it there, the ``stream`` and ``entry`` id it came from,
    ``raw`` (its original fields as ``name=value`` lines, bounded in size: ``truncated``
    when cut), and what a readable request in it says (``request_id``, ``kind``, ``prompt``;
    None when it holds none). ``requeue_problem``: why it cannot be requeued (None: it can)."""

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
    request: bytes | None = None  # the request's bytes, when it can be requeued

    def to_json(self) -> dict[str, Any]:
        """The shape ``toolnexus dead-letters --json`` prints: every field, ``raw`` as text
        (bytes that are not UTF-8 as ``\\xNN``), without the request's bytes."""
        shown = asdict(self)
        shown["raw"] = self.raw.decode(errors="backslashreplace")
        del shown["request"]
        return shown


def _dead_letter(broker: RedisBroker, entry_id: Any, fields: dict[Any, Any]) -> DeadLetter:
    raw: bytes = fields.get(b"raw", b"")
    stream = _name(fields.get(b"stream", b""))
    cut = _TRUNCATED.search(raw)
    kept, total = (cut.start(), int(cut[1])) if cut else (len(raw), len(raw))
    truncated = total > kept
    request_bytes: bytes | None = None
    problem: str | None = None
    if stream != broker.keys.requests:
        problem = (
            f"it came from {stream!r}, not from the request stream of queue {broker.keys.queue!r}"
        )
    elif truncated:
        problem = (
            f"only the first {kept} of its {total} bytes were "
            "kept (dead_letter_max_bytes): the request cannot be rebuilt"
        )
    elif not raw.startswith(b"r="):
        problem = "it holds no request (a request entry is one field, r)"
    else:
        request_bytes = raw[2:]
    request = None
    if raw.startswith(b"r=") and not truncated:
        with contextlib.suppress(DecodeError):
            request = broker.codec.decode_as(raw[2:], Request)
    return DeadLetter(
        id=_name(entry_id),
        at=int(_name(entry_id).partition("-")[0]) / 1000,
        error=_name(fields.get(b"error", b"")),
        stream=stream,
        entry=_name(fields.get(b"entry", b"")),
        raw=raw,
        truncated=truncated,
        request_id=request.id if request else None,
        kind=request.kind if request else None,
        prompt=request.prompt if request else None,
        requeue_problem=problem,
        request=request_bytes,
    )


async def dead_letters(broker: RedisBroker, entry_id: str | None = None) -> list[DeadLetter]:
    """The dead letters of ``broker``'s queue, oldest first (only the one ``entry_id``, or
    none if it has no such entry).

    Raises:
        BrokerUnavailable: Redis cannot be reached.
    """
    what = f"reading the dead letters of queue {broker.keys.queue!r}"
    start, end = (entry_id, entry_id) if entry_id else ("-", "+")
    try:
        entries = await _bounded(broker, what, broker.redis.xrange(broker.keys.dead, start, end))
    except BrokerUnavailable as exc:
        if entry_id and isinstance(exc.__cause__, redis.exceptions.ResponseError):
            return []  # not a stream entry id: no such dead letter
        raise
    return [_dead_letter(broker, entry, fields or {}) for entry, fields in entries or ()]


async def requeue(broker: RedisBroker, letter: DeadLetter) -> str | None:
    """Put the request of ``letter`` back on its request stream and delete the dead letter
    (at once, and once); the new entry id, or None when the dead letter is gone already.

    Raises:
        ConfigurationError: ``letter`` cannot be requeued (its ``requeue_problem``).
        BrokerUnavailable: Redis cannot be reached (or the user may not add requests).
    """
    if letter.request is None:
        raise ConfigurationError(
            f"dead letter {letter.id} cannot be requeued: {letter.requeue_problem}"
        )
    keys = broker.keys
    script = broker.redis.register_script(REQUEUE_SCRIPT)
    added = await _bounded(
        broker,
        f"requeueing dead letter {letter.id} of queue {keys.queue!r}",
        script(keys=[keys.dead, keys.requests], args=[letter.id, letter.request]),
    )
    return None if added is None else _name(added)


async def purge(broker: RedisBroker, entry_id: str | None) -> int:
    """Delete dead letter ``entry_id`` (None: every dead letter of the queue); how many.

    Raises:
        BrokerUnavailable: Redis cannot be reached.
    """
    keys, redis_ = broker.keys, broker.redis
    what = f"purging the dead letters of queue {keys.queue!r}"
    if entry_id is None:
        return int(await _bounded(broker, what, redis_.xtrim(keys.dead, maxlen=0)))
    if not await dead_letters(broker, entry_id):
        return 0  # (also for what is not an entry id, which XDEL refuses)
    return int(await _bounded(broker, what, redis_.xdel(keys.dead, entry_id)))


def dead_letter_line(letter: DeadLetter) -> str:
    """One line for ``toolnexus dead-letters``: id, when, what it held, the error."""
    held = (
        f"{letter.request_id} {letter.kind} {letter.prompt[:40]!r}"
        if letter.request_id is not None and letter.prompt is not None
        else "(no readable request)"
    )
    return f"{letter.id} {utc_text(letter.at)} {held}: {letter.error}"


def dead_letter_text(letter: DeadLetter) -> str:
    """Every field of ``letter``, for ``toolnexus dead-letters show``."""
    can = "yes" if letter.requeue_problem is None else f"no: {letter.requeue_problem}"
    lines = [
        f"id:       {letter.id}",
        f"at:       {utc_text(letter.at)}",
        f"error:    {letter.error}",
        f"from:     {letter.stream} entry {letter.entry}",
    ]
    if letter.request_id is not None:
        lines.append(f"request:  {letter.request_id} ({letter.kind}) {letter.prompt!r}")
    lines += [
        f"requeue:  {can}",
        f"raw{' (truncated)' if letter.truncated else ''}:",
        letter.raw.decode(errors="backslashreplace"),
    ]
    return "\n".join(lines)


async def stored_answer(broker: RedisBroker, request_id: str) -> tuple[bytes | None, str | None]:
    """What the state of request ``request_id`` (found by its route) says of its answer:
    the answer it holds, as stored (None while it is open, or when the broker does not know
    the request), and why its waiter last refused one and opened it again (None if never:
    the ``REOPEN`` script records it).

    Raises:
        BrokerUnavailable: Redis cannot be reached.
    """
    keys, redis_ = broker.keys, broker.redis
    what = f"reading the state of {request_id}"
    waiter = await _bounded(broker, what, redis_.get(keys.route(request_id)))
    if not isinstance(waiter, bytes | str) or not WAITER_ID.fullmatch(_name(waiter)):
        return None, None
    state = keys.state(_name(waiter), request_id)
    try:
        status, answer, why = await _bounded(broker, what, redis_.hmget(state, ["s", "a", "w"]))
    except BrokerUnavailable as exc:
        if _wrong_type(exc):
            return None, None
        raise
    held = answer if status not in (None, _OPEN) and isinstance(answer, bytes) else None
    reason = " ".join(_name(why).split())[:200] if isinstance(why, bytes | str) else None
    return held, reason or None
