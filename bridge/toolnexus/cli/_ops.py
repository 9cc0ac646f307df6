"""What ``toolnexus status``, ``check``, ``audit`` and ``dead-letters`` print.

They only format: what a queue holds is read and typed by the Redis broker
(:meth:`RedisBroker.inspect <toolnexus.redis_broker.RedisBroker.inspect>`,
:meth:`RedisBroker.dead_letters <toolnexus.redis_broker.RedisBroker.dead_letters>`,
:mod:`toolnexus.redis_broker._inspect`). ``Status.to_json()`` is the stable shape
``status --json`` prints (its field names are documented in docs/reference/status-json.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import socket
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Iterator, Sequence
from typing import Any, TypeVar

import msgspec
import redis.exceptions

from .._broker import connect, redacted
from ..codec import JSON, MSGPACK
from ..errors import (
    BrokerUnavailable,
    ConfigurationError,
    DecodeError,
    InvalidAnswer,
    InvalidRequest,
)
from ..frameworks import TOOL_CALL, decide
from ..models import Answer, Request
from ..redis_broker import RedisBroker
from ..redis_broker import _inspect as state
from ..redis_broker._inspect import DeadLetter, Status
from ..redis_broker._layout import LUA_FIELDS
from ..rendering import ArgumentChange, argument_changes
from ..security._audit import AuditRecord
from ._exits import one_line

T = TypeVar("T")


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


def _name(value: bytes | str) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


async def discover_queues(url: str, namespace: str) -> list[str]:
    """The queues of ``namespace`` that have a request stream, sorted (SCAN, so on Redis
    Cluster only those of the node the URL names).

    Raises:
        BrokerUnavailable: Redis cannot be reached.
    """
    async with redis_brokers(url, namespace, ["default"]) as (broker,):
        return await state.queues(broker.core)


async def read_status(url: str, namespace: str, queues: Sequence[str]) -> Status:
    """What ``toolnexus status`` shows for ``queues`` of ``namespace``: each queue's
    :meth:`RedisBroker.inspect`.

    Raises:
        ConfigurationError: ``url`` is not a Redis URL.
        BrokerUnavailable: Redis cannot be reached.
    """
    async with redis_brokers(url, namespace, list(queues) or ["default"]) as brokers:
        alive, versions = await state.waiters_alive(brokers[0].core)
        now = time.time()
        queue_states = [await broker.inspect() for broker in brokers[: len(queues)]]
    return Status(
        namespace=namespace, at=now, waiters_alive=alive, queues=queue_states, waiters=versions
    )


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
    if status.waiters:  # (on the first line: the queues' lines keep their places)
        lines[0] += " · " + ", ".join(
            f"{w.alive} {w.version} writing protocol {w.writes}" for w in status.waiters
        )
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
                protocols = (
                    f", {c.version} reads {','.join(map(str, c.reads))} writes {c.writes}"
                    if c.reads is not None
                    else ""
                )
                lines.append(
                    f"    {c.consumer}: holds {c.unacknowledged}, "
                    f"idle {duration_text(c.idle_s)}, {beat}{protocols}"
                )
    lines += [f"cannot talk: {problem}" for problem in status.mismatches()]
    return "\n".join(lines)


async def check(
    url: str, namespace: str, queue: str, workers: Sequence[str], *, here: bool = False
) -> tuple[bool, str]:
    """Whether Redis is reachable, the ``workers`` (``GROUP`` or ``GROUP/CONSUMER``; all
    when empty, then at least one) have fresh heartbeats, and every live worker and waiting
    process can talk to each other (:func:`~toolnexus.redis_broker._inspect.mismatches`:
    one writes a protocol another does not read; only as a user that may list the liveness
    marks, as ``ops`` may), with the line(s) that say so. ``here``:
    only workers whose heartbeat names this host (a container's probe).

    Raises:
        ConfigurationError: ``url`` is not a Redis URL.
    """
    try:
        async with redis_brokers(url, namespace, [queue]) as (broker,):
            beats = await broker.heartbeats()
            try:
                _, waiters = await state.waiters_alive(broker.core)
            except BrokerUnavailable:  # (a responder's ACL user may not list the marks)
                waiters = []
    except BrokerUnavailable as exc:
        return False, f"Redis is not reachable: {one_line(exc, url)}"
    problems = state.mismatches(
        [state.Responding(f"{b.group}/{b.consumer}", *b.protocols()) for b in beats], waiters
    )
    if problems:
        return False, "processes that cannot talk to each other:\n" + "\n".join(problems)
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


def audit_json(records: Sequence[AuditRecord], *, raw: bool = False) -> str:
    """``records`` as the JSON array ``toolnexus audit --json`` prints: one plain object per
    record (:func:`audit_object`); with ``raw``, each also holds the signed bytes
    (``request``, ``answer``, ``votes`` in base64) that ``verify_record`` checks."""
    return json.dumps([audit_object(record, raw=raw) for record in records], indent=2)


def audit_object(record: AuditRecord, *, raw: bool = False) -> dict[str, Any]:
    """``record`` as plain JSON: every field of :class:`~toolnexus.security.AuditRecord` but
    the encoded bytes, plus ``prompt`` (the request's, as kept: an excerpt of a large one),
    ``outcome`` (as the text line says it) and each vote as ``{ok, responder, person}``;
    ``digest`` in hex. With ``raw``, the encoded ``request``, ``answer`` and ``votes`` as
    well (base64, as stored)."""
    signed = ("request", "answer", "votes", "digest")
    shown: dict[str, Any] = {
        f.name: msgspec.to_builtins(getattr(record, f.name))
        for f in msgspec.structs.fields(record)
        if f.name not in signed
    }
    shown["prompt"] = _prompt(record)
    shown["outcome"] = _outcome(record)
    shown["votes"] = [
        {"ok": v.ok, "responder": v.responder, "person": v.person} if v is not None else None
        for v in _votes(record)
    ]
    shown["digest"] = record.digest.hex() if record.digest is not None else None
    call = _tool_call(record)
    if call is not None:
        name, approved, changes = call
        shown["tool_call"] = {
            "name": name,
            "approved": approved,
            "changes": [
                {"argument": c.name, "before": c.before, "after": c.after} for c in changes
            ],
        }
    if raw:
        shown["raw"] = {n: msgspec.to_builtins(getattr(record, n)) for n in signed}
    return shown


AUDIT_PROMPT_CHARS = 60
"""How much of a request's prompt one ``toolnexus audit`` line shows."""


def _codec(record: AuditRecord) -> Any:
    return MSGPACK if record.format == "msgpack" else JSON


def _prompt(record: AuditRecord) -> str | None:
    """The prompt of the request ``record`` kept (None if it kept none readable)."""
    if record.request is None:
        return None
    try:
        return str(_codec(record).decode_as(record.request, Request).prompt)
    except DecodeError:
        return None


def _tool_call(record: AuditRecord) -> tuple[str, dict[str, Any], list[ArgumentChange]] | None:
    """A tool approval's tool, the arguments its answer approved and their changes from
    the proposal, as the record keeps them. None for another request, or a record that
    does not hold the whole request and a readable, approving answer."""
    if record.kind != TOOL_CALL or record.request is None or record.cut or not record.answer:
        return None
    codec = _codec(record)
    try:
        request = codec.decode_as(record.request, Request)
        decision = decide(request, codec.decode_as(record.answer, Answer))
        if decision.arguments is None:
            return None
        changes = argument_changes(request, decision.arguments)
    except (DecodeError, InvalidRequest, InvalidAnswer):
        return None
    return str(request.data["tool_call"]["name"]), decision.arguments, changes


def _outcome(record: AuditRecord) -> str:
    outcome = "accepted" if record.ok else (record.reason or record.status)
    if record.defaulted:  # nobody answered; the request's default applied
        outcome = f"expired ({'accepted' if record.ok else 'declined'} by default)"
    return outcome


def audit_text(record: AuditRecord) -> str:
    """One line for ``record``: when it ended, id, kind, outcome, who answered and who
    asked, where from, verification, how long it took, and the prompt's start."""
    at = utc_text(record.resolved_at)
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
    parts = [at, record.id, record.kind or "-", _outcome(record), f"by {by}", f"asked by {asked}"]
    if record.durable:
        parts.append("durably")
    if source:
        parts.append(f"via {source}")
    if record.votes:
        parts.append(f"votes {', '.join(_voters(record))}")
    call = _tool_call(record)
    if call is not None:
        name, _, changes = call
        edit = f"with changes ({'; '.join(map(str, changes))})" if changes else "as proposed"
        parts.append(f"tool {name} approved {edit}")
    prompt = _prompt(record)
    shown = "" if prompt is None else f": {' '.join(prompt.split())[:AUDIT_PROMPT_CHARS]!r}"
    return " ".join(parts) + f" ({verified}{took}{refused}){shown}"


def _votes(record: AuditRecord) -> list[Answer | None]:
    """The votes of a quorum's request, decoded (None for one that is unreadable)."""
    codec = _codec(record)
    votes: list[Answer | None] = []
    for raw in record.votes:
        try:
            votes.append(codec.decode_as(raw, Answer))
        except DecodeError:
            votes.append(None)
    return votes


def _voters(record: AuditRecord) -> list[str]:
    """Who voted on a quorum's request, as each signed vote says: ``+`` an accept, ``-`` a
    decline."""
    return [
        "(unreadable)" if v is None else f"{'+' if v.ok else '-'}{v.answered_by or '?'}"
        for v in _votes(record)
    ]


@contextlib.contextmanager
def closed_pipe_is_the_end() -> Iterator[None]:
    """Around a command's printing: a reader that closes the pipe (``| head -1``) ends it
    quietly. stdout is pointed at /dev/null, so that Python's own flush at exit does not
    complain either."""
    try:
        yield
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())


# -- dead letters -----------------------------------------------------------------------------

REQUEUE_SCRIPT = (
    LUA_FIELDS
    + """
-- KEYS dead-letter stream, request stream, and the request's route if its id is known;
-- ARGV dead letter id, request bytes, the entry it came from.
-- Whoever deletes the dead letter first puts the request back: its entry id, or false
-- when the dead letter is gone (requeued or purged meanwhile). A dead letter is one
-- group's (the group that could not take the entry), and the entry may still be in the
-- stream for the groups that have not read it yet: it is moved, never copied (deleted,
-- added again at the end), so that every group reads it once from now on, and none
-- twice. A route that names another entry still in the stream (the request requeued
-- already, from another group's dead letter of it) leaves it there: nothing is added.
-- A route that names the old entry names the new one from now on (answering by id
-- reads the request there).
if redis.call('XDEL', KEYS[1], ARGV[1]) == 0 then
  return false
end
local route, ttl, waiter, protocol = false, 0, nil, '1'
if KEYS[3] then
  route = redis.pcall('GET', KEYS[3])
  ttl = redis.call('PTTL', KEYS[3])
  if type(route) == 'string' and ttl > 0 then
    waiter, protocol = route_waiter(route), route_protocol(route)
    local named = route_entry(route)
    if named ~= '' and named ~= ARGV[3] then
      local there = redis.pcall('XRANGE', KEYS[2], named, named)
      if type(there) == 'table' and #there > 0 and not there.err then
        return named
      end
    end
  end
end
redis.pcall('XDEL', KEYS[2], ARGV[3])  -- (an id that is not one is no entry to move)
local added = redis.call('XADD', KEYS[2], '*', E_REQUEST, ARGV[2])
if waiter and route == route_of(waiter, ARGV[3], protocol) then
  redis.call('SET', KEYS[3], route_of(waiter, added, protocol), 'PX', ttl)
end
return added
"""
)
"""Requeue one dead letter, once however many operators do it at the same time."""


async def dead_letters(broker: RedisBroker, entry_id: str | None = None) -> list[DeadLetter]:
    """:meth:`RedisBroker.dead_letters` (kept here for callers of this module)."""
    return await broker.dead_letters(entry_id)


async def requeue(broker: RedisBroker, letter: DeadLetter) -> str | None:
    """Put the request of ``letter`` back on its request stream and delete the dead letter
    (at once, and once): its entry id (moved to the end of the stream if it was still
    there, never copied; the one it is at already if another group's dead letter of it
    was requeued), or None when the dead letter is gone already.

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
    streams = [keys.dead, keys.requests]
    if letter.request_id is not None:
        streams.append(keys.route(letter.request_id))
    added = await _bounded(
        broker,
        f"requeueing dead letter {letter.id} of queue {keys.queue!r}",
        script(keys=streams, args=[letter.id, letter.request, letter.entry]),
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
    """One line for ``toolnexus dead-letters``: id, when, the group that could not take
    it (if read by one), what it held, the error."""
    held = (
        f"{letter.request_id} {letter.kind} {letter.prompt[:40]!r}"
        if letter.request_id is not None and letter.prompt is not None
        else "(no readable request)"
    )
    group = f" group {letter.group}" if letter.group is not None else ""
    return f"{letter.id} {utc_text(letter.at)}{group} {held}: {letter.error}"


def dead_letter_text(letter: DeadLetter) -> str:
    """Every field of ``letter``, for ``toolnexus dead-letters show``."""
    can = "yes" if letter.requeue_problem is None else f"no: {letter.requeue_problem}"
    lines = [
        f"id:       {letter.id}",
        f"at:       {utc_text(letter.at)}",
        f"error:    {letter.error}",
        f"from:     {letter.stream} entry {letter.entry}",
    ]
    if letter.group is not None:
        lines.append(f"group:    {letter.group} (could not take it; other groups still may)")
    if letter.request_id is not None:
        lines.append(f"request:  {letter.request_id} ({letter.kind}) {letter.prompt!r}")
    lines += [
        f"requeue:  {can}",
        f"raw{' (truncated)' if letter.truncated else ''}:",
        letter.raw.decode(errors="backslashreplace"),
    ]
    return "\n".join(lines)


async def stored_answer(broker: RedisBroker, request_id: str) -> tuple[bytes | None, str | None]:
    """What the state of request ``request_id`` says of its answer: the answer it holds
    (None while open, or unknown) and why its waiter last refused one (None if never).

    Raises:
        BrokerUnavailable: Redis cannot be reached.
    """
    return await state.stored_answer(broker.core, request_id)
