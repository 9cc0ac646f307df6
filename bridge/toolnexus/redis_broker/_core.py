"""What the waiter side and the responder side of the Redis broker share: settings,
connections, the pipeliner, and the steps both take (resolve, settle, dead-letter).

Errors of redis-py and the OS stay inside: :class:`boundary` turns them into
:class:`~toolnexus.BrokerUnavailable` where a public call returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Coroutine
from dataclasses import replace
from typing import Any, TypeVar

import redis.exceptions
from redis.asyncio.cluster import RedisCluster

from ..codec import Codec
from ..errors import (
    BrokerClosed,
    BrokerUnavailable,
    ConfigurationError,
    NotConfirmed,
    ToolnexusError,
)
from ..keys import DEFAULT_AGENT, Keys, agent_problem
from ..lifecycle import RESOLVED, Outcome, Status
from ..models import Event
from ..security._audit import AuditRecord, encode_record
from ..security._signatures import Signatures
from ..settings import RedisSettings
from ._connections import BlockingReader, Client, Connector, username_of
from ._layout import liveness_value, protocol_fields
from ._pipeliner import Pipeliner, Unconfirmed
from ._redispy import public_api_only
from ._scripts import (
    DEAD_LETTER,
    OUTCOMES,
    RECORD,
    RESOLVE,
    SETTLE,
    BatchScript,
)

log = logging.getLogger("toolnexus.redis")

T = TypeVar("T")

CONNECTION_ERRORS = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    OSError,
    redis.exceptions.ClusterError,  # CLUSTERDOWN, MASTERDOWN, redirections exhausted
    redis.exceptions.TryAgainError,  # a slot being migrated
    redis.exceptions.SlotNotCoveredError,  # a master failing over
    redis.exceptions.RedisClusterUnreachableError,  # no node of a Cluster answers
)
"""Faults that mean "Redis is away for now" (``TimeoutError`` is an ``OSError``; for a
Cluster, a master failing over): retried with backoff inside,
:class:`~toolnexus.BrokerUnavailable` outside."""

AGENT_VARIABLE = "TOOLNEXUS_AGENT"


def default_agent(url: str, redis_options: dict[str, Any]) -> str:
    """The agent a broker waits as when the option ``agent`` is not given: the variable
    ``TOOLNEXUS_AGENT``, else the Redis user it logs in as (so that the ACL ``toolnexus acl``
    writes for that user fits), else :data:`~toolnexus.keys.DEFAULT_AGENT`.

    Raises:
        ConfigurationError: the variable, or the user, cannot name an agent.
    """
    named = os.environ.get(AGENT_VARIABLE)
    if named:
        problem = agent_problem(named)
        if problem is not None:
            raise ConfigurationError(f"{AGENT_VARIABLE}={named!r} {problem}")
        return named
    user = username_of(url, redis_options)
    if user is None:
        return DEFAULT_AGENT
    problem = agent_problem(user)
    if problem is not None:
        raise ConfigurationError(
            f"the Redis user {user!r} cannot name the agent (an agent name {problem}): "
            f"pass the option agent=NAME or set {AGENT_VARIABLE}"
        )
    return user


def ms(seconds: float) -> int:
    return int(seconds * 1000)


def text(value: bytes | str) -> str:
    """A Redis reply as text. Raises ``UnicodeDecodeError`` for bytes that are not UTF-8."""
    return value.decode() if isinstance(value, bytes) else value


_REDIS_FAULTS = (redis.exceptions.RedisError, redis.exceptions.RedisClusterException, OSError)


class boundary:  # a class, not a generator: it is entered for every answer
    """``with boundary(what):`` where a public call returns: redis-py and OS errors
    become ``BrokerUnavailable``."""

    __slots__ = ("what",)

    def __init__(self, what: str) -> None:
        self.what = what

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> None:
        if isinstance(exc, _REDIS_FAULTS) and not isinstance(exc, ToolnexusError):
            raise BrokerUnavailable(f"{self.what}: {type(exc).__name__}: {exc}") from exc


async def run_to_completion(coro: Coroutine[Any, Any, None]) -> None:
    """Await ``coro`` as a task of its own that finishes even if this caller is cancelled
    (an anyio cancel scope cancels every await of a closing ``async with``), so that
    cleanup is never cut short."""
    await asyncio.shield(asyncio.ensure_future(coro))


class Backoff:
    """Exponential backoff between reconnect attempts: 0.05 s doubling to ``cap_s``."""

    def __init__(self, cap_s: float = 2.0) -> None:
        self.cap_s, self.delay_s = cap_s, 0.0

    async def wait(self, what: str, exc: BaseException) -> None:
        self.delay_s = min(self.cap_s, self.delay_s * 2 or 0.05)
        log.warning("%s: Redis unavailable (%s); retrying in %.2f s", what, exc, self.delay_s)
        await asyncio.sleep(self.delay_s)

    def reset(self) -> None:
        self.delay_s = 0.0


class Core:
    """Connections and shared steps of one :class:`~toolnexus.redis_broker.RedisBroker`."""

    def __init__(
        self,
        url: str,
        settings: RedisSettings,
        codec: Codec,
        signatures: Signatures,
    ) -> None:
        self.agent = settings.agent or default_agent(url, dict(settings.redis_options))
        """Who this broker waits as (the setting, else :func:`default_agent`)."""
        settings = replace(settings, agent=self.agent)
        self.url, self.settings = url, settings
        self.codec = codec.writing(settings.write_protocol)
        """The wire codec, writing this process's ``write_protocol`` unless told otherwise."""
        self.protocol = settings.write_protocol
        """The protocol this process writes on its own initiative (see
        :mod:`toolnexus.protocol`): its requests' states and routes, liveness marks, dead
        letters, heartbeats."""
        self.liveness_value = liveness_value(self.protocol)
        """What this process's liveness mark holds (:func:`._layout.liveness_value`)."""
        self.signatures = signatures
        self.keys = Keys(settings.namespace, settings.queue)
        # No socket timeout: redis-py enforces it with asyncio.wait_for, which on Python 3.11
        # can swallow a task's cancellation (CPython gh-86296). Every await is bounded with
        # asyncio.timeout instead, and dead peers are found by TCP keepalive.
        self.redis_options: dict[str, Any] = {
            "client_name": f"toolnexus:{settings.namespace}",
            "socket_timeout": None,
            "socket_connect_timeout": settings.connect_timeout_s,
            "socket_keepalive": True,
            "health_check_interval": 30,
            **settings.redis_options,
        }
        self.public_api = public_api_only(settings.redis_public_api)
        """Only redis-py's documented API is used (see :mod:`._redispy`)."""
        connector = Connector(
            url,
            settings.max_connections,
            settings.command_timeout_s,
            public_api=self.public_api,
            **self.redis_options,
        )
        self.connector = connector
        self.redis: Client = connector.command_client
        self.one_server = not isinstance(self.redis, RedisCluster)
        """Every key is on one server (not a Cluster): a script may read keys of any slot."""
        wait = (settings.wait_replicas, settings.wait_timeout_ms)
        self.pipeliner = Pipeliner(
            self.redis,
            timeout_s=settings.command_timeout_s + settings.wait_timeout_ms / 1000,
            wait=wait if settings.durability == "wait" else None,
            public_api=self.public_api,
            demotable=connector.sentinel_watch is not None,
        )
        self.closed = False

    def blocking_reader(self) -> BlockingReader:
        """Blocking reads on a client of their own: one connection, no socket timeout, each
        read bounded by its block plus ``command_timeout_s``."""
        return BlockingReader(
            self.connector.blocking_client(),
            patience_s=self.settings.command_timeout_s,
            public_api=self.public_api,
        )

    async def bounded(self, call: Awaitable[T]) -> T:
        """Await one redis-py call within ``command_timeout_s``."""
        if self.closed:
            if asyncio.iscoroutine(call):
                call.close()
            raise BrokerClosed("the broker is closed")
        async with asyncio.timeout(self.settings.command_timeout_s):
            return await call

    async def command(self, *args: Any) -> Any:
        """One command with the others of this turn, bounded; for callers that await it."""
        if self.closed:
            raise BrokerClosed("the broker is closed")
        return await self.pipeliner.call(*args)

    async def resolve(
        self,
        waiter: str,
        request_id: str,
        status: Status,
        payload: bytes,
        settle: tuple[str, str] | None = None,
        *,
        deadline: float | None = None,
        alone: bool = False,
        confirm: bool = False,
    ) -> tuple[Outcome, bytes | None, bool]:
        """Run the resolve script: the outcome (see :class:`~toolnexus.lifecycle.Outcome`),
        the stored answer and whether the request's entry was settled. An answer
        (``status="answered"``) is late after ``deadline``, the signed request's
        ``expires_at`` (None: the state's, which anyone who can write Redis can edit); an
        expiry with a ``deadline`` (a responder's) is ``early`` before it, by Redis time.
        ``settle=(group, entry)``, on one server only: the same script acknowledges and
        deletes the entry unless the request is still open, so that no group reads it from
        now on (elsewhere it is not settled).
        ``alone``: the caller expects no other commands this turn, so it sends them itself
        (see :meth:`Pipeliner.sending`). An empty ``payload`` is the waiter's own plain end
        (see :data:`~toolnexus.redis_broker._scripts.RESOLVE`): the state records the status
        alone. ``confirm`` (with ``durability="wait"``): a resolution that won but that
        ``WAIT`` did not confirm on ``wait_replicas`` replicas raises
        :class:`~toolnexus.errors.NotConfirmed`."""
        keys = self.keys
        shared_keys: tuple[str, ...] = (keys.answers(waiter), keys.alive(waiter))
        group, entry = settle if settle is not None and self.one_server else ("", "")
        if entry:
            shared_keys += (keys.requests,)
        async with self.pipeliner.sending(alone):
            resolved = self.pipeliner.batch(
                RESOLVE,
                shared_keys,
                (self.settings.retention_ms, 1 if entry else 0),
                (keys.state(waiter, request_id),),
                (status, payload, request_id, group, entry, ms(deadline) if deadline else 0),
                confirm=confirm,
            )
        unconfirmed: Unconfirmed | None = None
        try:
            raw = await resolved
        except Unconfirmed as exc:
            raw, unconfirmed = exc.reply, exc
        said = text(raw[1])
        if said not in OUTCOMES:
            raise redis.exceptions.ResponseError(f"resolve script said {said!r}")
        outcome = Outcome(said)
        stored: bytes | None = raw[2] if len(raw) > 2 else None
        settled = raw[0] == 1
        if outcome in RESOLVED and stored == payload:
            outcome, stored = Outcome.OK, None  # our own write, retried after its reply was lost
        elif not payload and stored is None and outcome.value == status:
            outcome, stored = Outcome.OK, None  # the same for a plain end (see RESOLVE)
        if outcome == Outcome.OK and unconfirmed is not None:
            raise NotConfirmed(request_id, unconfirmed.replicas, unconfirmed.required)
        return outcome, stored, settled

    def settle(
        self,
        event: Event | None = None,
        ack: tuple[str, str] | None = None,
        delete: bytes | str | None = None,
        *,
        keys: Keys | None = None,
        audit: AuditRecord | None = None,
        protocol: int | None = None,
    ) -> None:
        """In the background, with the lazy items, publish ``event``, acknowledge
        ``ack=(group, entry_id)``, delete entry ``delete`` of the request stream and add
        ``audit`` (an end a responder resolved) to the responders' audit stream (trimmed by
        length and by age): this broker's queue's, or that of ``keys`` (another queue an
        escalating request reached). A waiter's records go to its agent's own stream
        (:meth:`record`). The event is written in ``protocol``, its request's (by default
        this process's).

        Events are advisory, and an entry left behind is dropped by whoever reads it
        next, since its request is resolved: so nobody needs to wait for this.
        """
        self.pipeliner.post_batch(
            *self._settling(event, ack, delete, keys or self.keys, audit, protocol)
        )

    def record(self, audit: AuditRecord) -> None:
        """In the background, with the lazy items (the same pipeline as the wait's
        :meth:`settle`: no round trip of its own), add ``audit``, the record of a wait that
        ended, to this broker's agent's audit stream (:meth:`Keys.agent_audit`, trimmed by
        length and by age), which no responder may write."""
        self.pipeliner.post_batch(
            RECORD,
            (self.keys.agent_audit(self.agent),),
            self._audit_bounds(),
            (),
            (encode_record(audit),),
        )

    def _audit_bounds(self) -> tuple[int, int]:
        """The oldest audit entry id kept (ms, rounded down to the second: one batch per
        second) and the most entries kept."""
        now_ms, settings = ms(time.time()), self.settings
        min_audit_ms = max(0, now_ms - ms(settings.audit_retention_s)) // 1000 * 1000
        return min_audit_ms, settings.audit_max_entries

    def settle_now(self, ack: tuple[str, str], delete: str) -> asyncio.Future[Any]:
        """As :meth:`settle` with only ``ack`` and ``delete``, sent with this turn's
        commands; the future says when it is done."""
        return self.pipeliner.batch(*self._settling(None, ack, delete, self.keys, None, None))

    def _settling(
        self,
        event: Event | None,
        ack: tuple[str, str] | None,
        delete: bytes | str | None,
        keys: Keys,
        audit: AuditRecord | None,
        protocol: int | None,
    ) -> tuple[BatchScript, tuple[str, ...], tuple[Any, ...], tuple[()], tuple[Any, ...]]:
        now_ms, settings = ms(time.time()), self.settings
        min_event_ms = max(0, now_ms - settings.retention_ms) // 1000 * 1000
        return (
            SETTLE,
            (keys.events, keys.requests, keys.responder_audit),
            (min_event_ms, settings.retention_ms, *self._audit_bounds()),
            (),
            (
                self.codec.encode(event, protocol) if event else "",
                *(ack or ("", "")),
                delete or "",
                encode_record(audit) if audit else "",
            ),
        )

    def raw_for_dead_letter(self, fields: dict[bytes, bytes]) -> bytes:
        """The original fields of an entry, bounded to ``dead_letter_max_bytes``."""
        raw = b"\n".join(k + b"=" + v for k, v in fields.items())
        limit = self.settings.dead_letter_max_bytes
        if len(raw) > limit:
            raw = raw[:limit] + f"... ({len(raw)} bytes in all)".encode()
        return raw

    def refuse_entry(
        self, stream: str, entry_id: str, fields: dict[bytes, bytes], error: str, group: str
    ) -> None:
        """Settle entry ``entry_id`` of ``stream`` (in the queue's slot), which consumer
        group ``group`` cannot or will not take, for that group only: acknowledged for it,
        with one dead letter naming it (:data:`~toolnexus.redis_broker._scripts.DEAD_LETTER`).
        The entry stays in the stream for every other group."""
        log.error("dead-lettering entry %s of %s for group %s: %s", entry_id, stream, group, error)
        self.pipeliner.post_batch(
            DEAD_LETTER,
            (self.keys.dead, stream),
            (self.settings.dead_letter_max_entries, self.protocol),
            (),
            (entry_id, group, error[:1000], self.raw_for_dead_letter(fields)),
            lazy=False,
        )

    def copy_to_dead_letters(
        self, stream: str, entry_id: str, fields: dict[bytes, bytes], error: str
    ) -> None:
        """Copy an entry of a stream read without a consumer group (a reply stream, the
        events stream) to the dead letters; its reader moves past it and leaves it in place
        for every other reader."""
        log.error("dead-lettering entry %s of %s: %s", entry_id, stream, error)
        self.pipeliner.post(
            "XADD",
            self.keys.dead,
            "MAXLEN",
            "~",
            self.settings.dead_letter_max_entries,
            "*",
            "error",
            error[:1000],
            "stream",
            stream,
            "entry",
            entry_id,
            "raw",
            self.raw_for_dead_letter(fields),
            *protocol_fields(self.protocol),
            lazy=False,
        )

    async def aclose(self) -> None:
        self.closed = True
        with contextlib.suppress(*CONNECTION_ERRORS, BrokerClosed):
            async with asyncio.timeout(self.settings.command_timeout_s):
                await self.pipeliner.drain()  # events and acknowledgements still queued
        self.pipeliner.close()
        await self.connector.aclose()
