"""The Redis Streams broker (SPEC §11): ``connect("redis://…")``.

Three modules tell the architecture: :mod:`.waiter` (publish a request, wait for its
answer), :mod:`.responder` (consumer groups, answering, heartbeats; :mod:`.events`
follows what happens) and
:mod:`toolnexus.keys` (every key name). They meet only in :mod:`._core` (settings,
connections, the pipeliner, the shared steps), :mod:`._scripts` (the Lua scripts) and
:mod:`.quorum` (a quorum's votes, SPEC §14: cast by responders, checked by the waiter).

Resolution (an answer, the deadline, a withdrawal) is one Lua script on the request's
slot: the first wins, the rest are told why they lost.
"""

from __future__ import annotations

import asyncio
import logging
import os
import weakref
from collections.abc import Coroutine, Mapping, Sequence
from typing import Any

from ..audit import AuditRecord, decode_record
from ..broker import Broker, check_audit_query, default_consumer_name, redacted
from ..codec import MSGPACK, Codec
from ..errors import BrokerClosed, BrokerUnavailable, ConfigurationError, DecodeError
from ..models import Answer, Event, Heartbeat, Request
from ..signatures import SIGNING_OPTIONS, Signatures
from ..signing import Keyring, SigningKey
from ..wire10 import Request10
from ._connections import Client
from ._core import REDIS_OPTIONS, Core, Settings, boundary, default_agent, ms, run_to_completion
from .answering import answer_by_id
from .events import RedisEvents
from .heartbeats import heartbeat, heartbeats
from .responder import RedisPending, RedisResponder
from .waiter import Waiter

__all__ = ["RedisBroker", "RedisEvents", "RedisPending", "RedisResponder"]

log = logging.getLogger("toolnexus.redis")

OWN_OPTIONS = frozenset({"codec", *SIGNING_OPTIONS})
"""The options :class:`RedisBroker` takes besides its :class:`Settings`."""


class RedisBroker(Broker):
    """Broker on Redis Streams. Options:

    - ``namespace`` / ``queue``: where keys live (see :mod:`toolnexus.keys`).
    - ``agent``: the agent this broker waits as; it starts the names of its reply streams,
      states and durable requests, so that the ACL ``toolnexus acl`` writes gives each
      agent's Redis user its own and nobody else's (deploy/README.md). A durable request
      is found again only by the same agent. Default: ``TOOLNEXUS_AGENT``, else the Redis
      user it logs in as, else ``anon``; 1 to 64 letters, digits, ``_`` or ``-``.
    - ``lease_ms``: how long a responder holds a request without renewing (30 s);
      a dead consumer's requests are reclaimed after it.
    - ``liveness_ms``: how long a waiting process's liveness mark lasts unrenewed
      (15 s); the open requests of a process that died are withdrawn within about
      ``liveness_ms + lease_ms / 3`` (25 s) once a responder is running.
    - ``default_timeout_s``: a wait's deadline when none is given (600 s).
    - ``retention_s``: how long resolved state is kept to refuse late answers (24 h).
    - ``stream_retention_s``: requests older than this are trimmed from the request
      stream (7 days); it is also the longest a wait may last.
    - ``max_connections``: size of the command connection pool (16).
    - ``block_ms``: how long a blocking read waits before looking around (1000).
    - ``connect_timeout_s`` (5) and ``command_timeout_s`` (10): bounds on connecting
      and on every command; a blocking read may take ``block_ms`` longer.
    - ``answer_patience_s``: how long an answer is retried while Redis is away (5 s).
    - ``dead_letter_max_entries`` (10,000) and ``dead_letter_max_bytes`` (8 KiB of the
      original bytes kept per dead letter): the dead-letter stream's bounds.
    - ``audit_retention_s`` (30 days) and ``audit_max_entries`` (100,000): the audit
      stream's bounds, by age and by length (approximate: Redis trims whole nodes of up to
      100 entries); each record holds at most some 16 KiB of its request (see
      :mod:`toolnexus.audit`).
    - ``codec``: the wire :class:`~toolnexus.Codec` (msgpack).
    - ``signing_key`` (a :class:`~toolnexus.SigningKey` or its file), ``trusted_keys``
      (a :class:`~toolnexus.Keyring`, or a directory or file of public keys) and
      ``require_signatures``: see :mod:`toolnexus.signing`; each one not given is read
      from ``TOOLNEXUS_SIGNING_KEY``, ``TOOLNEXUS_TRUSTED_KEYS`` and
      ``TOOLNEXUS_REQUIRE_SIGNATURES``.
    - ``durability`` (``"none"``), ``wait_replicas`` (1), ``wait_timeout_ms`` (100): with
      ``"wait"``, every pipeline of writes waits for that many replicas of each master
      it wrote to (``WAIT``), narrowing what a failover can lose (docs/reliability.md).
    - ``redis_public_api``: use only redis-py's documented API, none of the internals
      that make a round trip cheaper (see :mod:`._redispy`); default:
      ``TOOLNEXUS_REDIS_PUBLIC_API=1`` turns it on, else off.
    - redis-py connection options are passed through (``username``, ``password``,
      ``ssl_ca_certs``, ``ssl_certfile``, ``ssl_keyfile``, ...); for Sentinel URLs also
      ``sentinel_username`` and ``sentinel_password`` (see :mod:`._connections`).

    Raises:
        ConfigurationError: an option neither toolnexus nor redis-py knows, or a bad value.
    """

    def __init__(
        self,
        url: str,
        *,
        codec: Codec = MSGPACK,
        signing_key: SigningKey | str | os.PathLike[str] | None = None,
        trusted_keys: Keyring | str | os.PathLike[str] | None = None,
        require_signatures: bool | None = None,
        **options: Any,
    ) -> None:
        signatures = Signatures.configure(signing_key, trusted_keys, require_signatures)
        names = set(Settings.names())
        unknown = sorted(set(options) - names - REDIS_OPTIONS)
        if unknown:
            raise ConfigurationError(
                f"unknown option{'s' if len(unknown) > 1 else ''} {', '.join(unknown)} for the "
                f"Redis broker; its options are {', '.join(sorted(names | OWN_OPTIONS))}, and "
                "redis-py connection options such as username, password, ssl_ca_certs"
            )
        redis_options = {k: v for k, v in options.items() if k in REDIS_OPTIONS}
        if options.get("agent") is None:
            options["agent"] = default_agent(url, redis_options)
        try:
            settings = Settings(**{k: v for k, v in options.items() if k in names})
        except TypeError as exc:
            raise ConfigurationError(f"bad option for the Redis broker: {exc}") from exc
        self.url = url
        self.core = Core(url, settings, codec, signatures, redis_options)
        self.keys = self.core.keys
        self.waiter = Waiter(self.core)
        self._responders: weakref.WeakSet[RedisResponder] = weakref.WeakSet()

    @property
    def settings(self) -> Settings:
        """The broker's options, validated."""
        return self.core.settings

    @property
    def redis(self) -> Client:
        """The command client (a pool, or a Cluster client), for tooling and tests that
        look inside Redis."""
        return self.core.redis

    @property
    def codec(self) -> Codec:
        return self.core.codec

    @property
    def waiter_id(self) -> str:
        """This broker's waiter id: it names its reply stream and liveness mark."""
        return self.waiter.id

    async def __aenter__(self) -> RedisBroker:
        try:
            async with asyncio.timeout(self.settings.connect_timeout_s):
                await self.core.redis.ping()
        except Exception as exc:  # refused, timed out, TLS or auth failure
            await self.core.connector.aclose()
            raise BrokerUnavailable(
                f"cannot reach Redis at {redacted(self.url)} within "
                f"{self.settings.connect_timeout_s} s: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        return self

    def wait_for(
        self,
        request: Request | Request10,
        *,
        timeout_s: float | None = None,
        allow: Sequence[str] | None = None,
        durable: bool = False,
    ) -> Coroutine[Any, Any, Answer]:
        # The waiter's coroutine itself: no frame of this method lives on in every wait.
        return self.waiter.wait_for(request, timeout_s, allow, durable)

    def responder(
        self,
        group: str,
        consumer: str | None = None,
        *,
        until_idle: bool = False,
        count: int = 100,
    ) -> RedisResponder:
        if self.core.closed:
            raise BrokerClosed("the broker is closed")
        responder = RedisResponder(
            self.core,
            group,
            consumer or default_consumer_name(),
            count=count,
            until_idle=until_idle,
        )
        self._responders.add(responder)
        return responder

    async def answer(self, answer: Answer) -> Event | None:
        return await answer_by_id(self.core, answer)

    async def complete(self, request_id: str) -> None:
        if self.core.closed:
            raise BrokerClosed("the broker is closed")
        with boundary(f"completing {request_id}"):
            self.core.settle(Event(event="completed", id=request_id))

    def events(self) -> RedisEvents:
        return RedisEvents(self.core)

    async def heartbeat(
        self,
        group: str,
        consumer: str,
        *,
        ttl_s: float,
        info: Mapping[str, str | int | float] | None = None,
    ) -> None:
        await heartbeat(self.core, group, consumer, ttl_s, info)

    async def heartbeats(self) -> list[Heartbeat]:
        return await heartbeats(self.core)

    async def audit(
        self, *, since: float | None = None, request_id: str | None = None, limit: int = 10_000
    ) -> list[AuditRecord]:
        """Audit records from ``since`` (a Unix time; all kept when None), oldest first,
        of one request if ``request_id`` is given; unreadable records are skipped."""
        check_audit_query(since, limit)
        start = "-" if since is None else f"{ms(since)}-0"
        with boundary("reading the audit trail"):
            await self.core.bounded(self.core.pipeliner.drain())  # this process's records too
            entries: Any = await self.core.bounded(
                self.core.redis.xrange(self.keys.audit, start, "+", count=limit)
            )
        records = []
        for _entry_id, fields in entries:
            try:
                record = decode_record(fields.get(b"r", b""))
            except DecodeError as exc:
                log.warning("skipping an unreadable audit record: %s", exc)
                continue
            if request_id is None or record.id == request_id:
                records.append(record)
        return records

    async def aclose(self) -> None:
        if self.core.closed:
            return
        await run_to_completion(self._close())

    async def _close(self) -> None:
        for responder in list(self._responders):
            await responder.aclose()  # held requests go back to their groups
        await self.waiter.aclose()  # open waits are withdrawn (durable ones stay open)
        await self.core.aclose()

    def statistics(self) -> dict[str, int]:
        """Counters for operators: waits in progress, responders open, reply-stream
        entries that were unreadable, and answers refused by signature or allow-list checks
        (forgeries among them)."""
        return {
            "waiting": len(self.waiter.waits),
            "waiting_durably": sum(1 for w in self.waiter.waits.values() if w.replies.durable),
            "responders": len(self._responders),
            "unreadable_answers": self.waiter.unreadable,
            "refused_answers": self.waiter.refused,
        }
