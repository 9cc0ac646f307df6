""":class:`RedisBroker`: the Redis broker's front, putting together the waiter side
(:mod:`._waiter`), the responder side (:mod:`._responder`, :mod:`._answering`,
:mod:`._events`, :mod:`._heartbeats`) and what they share (:mod:`._core`); the
package's docstring tells the architecture.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
import os
import weakref
from collections.abc import Coroutine, Mapping, Sequence
from typing import Any

from .._broker import Broker, check_audit_query, default_consumer_name, redacted
from .._wire10 import Request10
from ..codec import MSGPACK, Codec
from ..errors import BrokerClosed, BrokerUnavailable, DecodeError, Refused
from ..models import Answer, ApprovedEvent, CompletedEvent, Heartbeat, Request
from ..security._audit import AuditRecord, decode_record
from ..security._signatures import Signatures
from ..security._signing import Keyring, SigningKey
from ..settings import RedisSettings
from ._answering import answer_by_id
from ._connections import Client
from ._core import Core, boundary, ms, run_to_completion
from ._events import RedisEvents
from ._heartbeats import heartbeat, heartbeats
from ._inspect import DeadLetter, QueueStatus, dead_letters, entry_order, inspect_queue, scan
from ._responder import RedisPending, RedisResponder
from ._store import RedisStore
from ._waiter import Waiter

__all__ = [
    "REFUSAL_GRACE_S",
    "RedisBroker",
    "RedisEvents",
    "RedisPending",
    "RedisResponder",
    "RedisStore",
    "answer_or_refusal",
]

log = logging.getLogger("toolnexus.redis")


class RedisBroker(Broker):
    """Broker on Redis Streams, as its :class:`~toolnexus.RedisSettings` say (given as
    ``settings``, or field by field as keyword arguments: ``lease_ms=60_000``; redis-py
    connection options such as ``username``, ``password``, ``ssl_ca_certs`` too). Besides:

    - ``codec``: the wire :class:`~toolnexus.Codec` (msgpack).
    - ``signing_key`` (a :class:`~toolnexus.SigningKey` or its file), ``trusted_keys``
      (a :class:`~toolnexus.Keyring`, or a directory or file of public keys) and
      ``require_signatures``: see :mod:`toolnexus.security._signing`; each one not given is read
      from ``TOOLNEXUS_SIGNING_KEY``, ``TOOLNEXUS_TRUSTED_KEYS`` and
      ``TOOLNEXUS_REQUIRE_SIGNATURES``.

    A durable request is found again only by the same ``agent``.

    Raises:
        ConfigurationError: an option neither toolnexus nor redis-py knows, or a bad value.
    """

    def __init__(
        self,
        url: str,
        *,
        settings: RedisSettings | None = None,
        codec: Codec = MSGPACK,
        signing_key: SigningKey | str | os.PathLike[str] | None = None,
        trusted_keys: Keyring | str | os.PathLike[str] | None = None,
        require_signatures: bool | None = None,
        **options: Any,
    ) -> None:
        signatures = Signatures.configure(signing_key, trusted_keys, require_signatures)
        self.url = url
        self.core = Core(url, RedisSettings.of(settings, options), codec, signatures)
        self.keys = self.core.keys
        self.waiter = Waiter(self.core)
        self._responders: weakref.WeakSet[RedisResponder] = weakref.WeakSet()

    @property
    def settings(self) -> RedisSettings:
        """The broker's settings, validated (``agent`` resolved)."""
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
        if self.core.connector.sentinel_watch is not None:
            self.core.connector.sentinel_watch.start()
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

    def refusal(self, request_id: str) -> asyncio.Future[Refused]:
        """A future set to :class:`~toolnexus.errors.Refused` once responders refused
        request ``request_id``, which this broker is waiting for (each dead-lettered it for
        its own group: a missing or bad signature, a key it does not trust, bytes it
        cannot read), and no group that could still take it is alive: every group with a
        live heartbeat on the request's queues refused it (each refusal is logged at once,
        as it comes). With signatures required, only a refusal signed by a trusted key for
        exactly this request counts. The wait itself goes on (an operator may requeue the
        request, a group may start): ``toolnexus ask`` ends it. The future is cancelled
        when the wait ends.
        """
        return self.waiter.refusal(request_id)

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

    async def answer(self, answer: Answer) -> ApprovedEvent | None:
        return await answer_by_id(self.core, answer)

    async def complete(self, request_id: str) -> None:
        if self.core.closed:
            raise BrokerClosed("the broker is closed")
        with boundary(f"completing {request_id}"):
            self.core.settle(CompletedEvent(id=request_id))

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

    async def inspect(self) -> QueueStatus:
        """What this broker's queue holds now: its consumer groups and their consumers (with
        heartbeats), open requests, quorums, escalations, durable waits, dead letters
        counted (see :mod:`toolnexus.redis_broker._inspect`).

        Raises:
            BrokerUnavailable: Redis cannot be reached.
        """
        return await inspect_queue(self.core)

    async def dead_letters(self, entry_id: str | None = None) -> list[DeadLetter]:
        """The dead letters of this broker's queue, oldest first (only the one ``entry_id``,
        or none if there is no such entry).

        Raises:
            BrokerUnavailable: Redis cannot be reached.
        """
        return await dead_letters(self.core, entry_id)

    def store(self, name: str, *, agent: bool = False) -> RedisStore:
        if self.core.closed:
            raise BrokerClosed("the broker is closed")
        return RedisStore(self.core, name, agent=agent)

    @property
    def write_protocol(self) -> int:
        return self.core.protocol

    @property
    def signing_key(self) -> SigningKey | None:
        return self.core.signatures.key

    async def audit(
        self, *, since: float | None = None, request_id: str | None = None, limit: int = 10_000
    ) -> list[AuditRecord]:
        """Audit records from ``since`` (a Unix time; all kept when None), oldest first,
        of one request if ``request_id`` is given; unreadable records are skipped.

        One timeline merged from the queue's audit streams (threat-model line S8): every
        agent's own (:meth:`~toolnexus.keys.Keys.agent_audit`, found by ``SCAN``: the
        ops user may), the responders' and the one releases before wrote (still read
        during a rolling upgrade)."""
        check_audit_query(since, limit)
        start = "-" if since is None else f"{ms(since)}-0"
        keys = self.keys
        with boundary("reading the audit trail"):
            await self.core.bounded(self.core.pipeliner.drain())  # this process's records too
            found = await self.core.bounded(scan(self.core, keys.agent_audits_pattern()))
            streams = sorted(
                {keys.agent_audit(self.core.agent), *filter(keys.is_agent_audit, found)}
            )
            streams += [keys.responder_audit, keys.audit]
            read: Any = await self.core.bounded(
                asyncio.gather(
                    *(self.core.redis.xrange(s, start, "+", count=limit) for s in streams)
                )
            )
        merged = heapq.merge(*read, key=lambda entry: entry_order(entry[0]))
        records = []
        for _entry_id, fields in itertools.islice(merged, limit):
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


REFUSAL_GRACE_S = 2.0
"""After responders refused a request for good (:meth:`RedisBroker.refusal`), how long
:func:`answer_or_refusal` still waits for an answer that was on its way before it ends the
wait."""


async def answer_or_refusal(
    broker: Broker,
    request_id: str,
    waiting: Coroutine[Any, Any, Answer],
    *,
    grace_s: float = REFUSAL_GRACE_S,
) -> Answer | Refused:
    """The answer ``waiting`` (a wait for request ``request_id``) gives, or the final
    refusal of the request (:meth:`RedisBroker.refusal`: every live group refused it) if
    no answer comes within ``grace_s`` after it: the wait is then cancelled, which withdraws
    the request (a durable one stays open). The one rule of ``toolnexus ask`` and the wait
    gateway; on a broker other than Redis (which refuses nothing) it is ``await waiting``."""
    wait = asyncio.ensure_future(waiting)
    if not isinstance(broker, RedisBroker):
        return await wait
    refused = broker.refusal(request_id)
    try:
        either: list[asyncio.Future[Any]] = [wait, refused]
        await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        if not wait.done():
            with contextlib.suppress(TimeoutError):
                return await asyncio.wait_for(asyncio.shield(wait), grace_s)
            return refused.result()
        return wait.result()
    finally:
        if not wait.done():
            wait.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await wait
