"""The broker interface both backends implement, and :func:`connect`, which picks one.

Delivery to responders is **at least once**: a request can reach a responder
again (after a crash, a reconnect, or a lease that lapsed), so responders must be
idempotent. Resolution is **exactly once**: the first valid answer wins, and every
later answer is refused with :class:`~toolnexus.AlreadyResolved`.
"""

from __future__ import annotations

import abc
import asyncio
import logging
import math
import os
import re
import socket
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from types import TracebackType
from typing import Any, Self
from urllib.parse import urlsplit, urlunsplit

from ._numeric import MAX_COUNT, check_number
from ._wire10 import Request10
from .errors import BrokerClosed, ConfigurationError, InvalidRequest, ToolnexusError
from .models import DECLINED, DISMISSED, Answer, ApprovedEvent, Event, Heartbeat, Request
from .protocol import PROTOCOL
from .security._audit import AuditRecord
from .security._signing import SigningKey
from .settings import RedisSettings, default_url

REDIS_SCHEMES = frozenset(
    {
        "redis",
        "rediss",
        "unix",
        "redis+cluster",
        "rediss+cluster",
        "redis+sentinel",
        "rediss+sentinel",
    }
)
"""URL schemes of the Redis broker: one server, a Cluster, a Sentinel-watched master."""

DEFAULT_TIMEOUT_S = 600.0
"""How long :meth:`Broker.wait_for` waits when neither the call nor the request says."""

RETENTION_S = 24 * 3600.0
"""How long a resolved request is remembered (so that late answers are refused by name)."""

_USERINFO = re.compile(r"(//[^/@]*?:)[^/@]*@")


def redacted(url: str) -> str:
    """``url`` with its password replaced by ``***`` (for messages), even a malformed one."""
    try:
        parts = urlsplit(url)
    except ValueError:  # e.g. an unclosed IPv6 bracket: hide what stands between : and @
        return _USERINFO.sub(r"\1***@", url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rpartition("@")
    user = (parts.username or "") + ":***"
    return urlunsplit(parts._replace(netloc=f"{user}@{netloc[2]}"))


def default_consumer_name() -> str:
    """A consumer name unique to this process: ``host-pid-random``."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def deadline_of(request: Request, timeout_s: float | None, default_timeout_s: float) -> float:
    """The Unix time a wait ends: the earlier of the request's own expiry and ``timeout_s``.
    With neither, ``default_timeout_s`` from now; for a request that escalates, the end of
    its last hop: that hop's ``after_s`` plus ``default_timeout_s`` from its ``created_at``
    (SPEC §14).

    Raises:
        InvalidRequest: ``timeout_s`` is not a positive finite number of seconds (at most
            :data:`~toolnexus._numeric.MAX_SECONDS`), or a time of the request is not finite.
    """
    now = time.time()
    candidates = []
    if request.expires_at is not None:
        check_number(
            "expires_at", request.expires_at, error=InvalidRequest, minimum=None, maximum=math.inf
        )
        candidates.append(request.expires_at)
    if timeout_s is not None:
        check_number("timeout_s", timeout_s, error=InvalidRequest)
        candidates.append(now + timeout_s)
    if candidates:
        return min(candidates)
    if request.escalate:
        check_number(
            "created_at", request.created_at, error=InvalidRequest, minimum=None, maximum=math.inf
        )
        return request.created_at + request.escalate[-1].after_s + default_timeout_s
    return now + default_timeout_s


def check_audit_query(since: float | None, limit: int) -> None:
    """Refuse an audit query no trail can answer (:meth:`Broker.audit`): ``since`` a Unix
    time (finite, not negative), ``limit`` a positive integer.

    Raises:
        ConfigurationError: naming the argument.
    """
    if since is not None:
        check_number("since", since, inclusive=True, maximum=math.inf)
    check_number("limit", limit, integer=True, maximum=MAX_COUNT)


SAME_QUESTION = ("kind", "prompt", "data", "url", "on_expiry", "quorum", "escalate")
"""What a wait attaching to a stored durable request must share with it: what is asked."""


def check_same_question(
    stored: Request, asked: Request, fields: tuple[str, ...] = SAME_QUESTION
) -> None:
    """Refuse to attach ``asked`` to the durable request ``stored`` if it asks something
    else (see :data:`SAME_QUESTION`; ``fields`` to compare, with ``"allow"`` where
    ``asked`` is as published): a durable request's id names one question.

    Raises:
        InvalidRequest: naming the fields that differ.
    """
    changed = [name for name in fields if getattr(stored, name) != getattr(asked, name)]
    if changed:
        raise InvalidRequest(
            f"durable request {asked.id!r} exists and asks something else "
            f"({', '.join(changed)} differ): a durable request's id names one question"
        )


class Pending(abc.ABC):
    """A request delivered to a responder, waiting for it to answer or skip it."""

    request: Request
    responder_name: str
    signer: str | None = None
    """The name of the trusted key whose signature on the request this responder verified;
    ``None`` when it is unsigned or its signature was not checked (no trusted keys)."""

    @abc.abstractmethod
    async def answer(self, answer: Answer) -> ApprovedEvent | None:
        """Resolve the request with ``answer`` (the first valid answer wins).

        For a request that needs a quorum (SPEC §14) the answer is a vote: one that counted
        without deciding returns the ``approved`` event (``count`` of ``need``,
        ``approvers``), and the request stays held here for other persons to vote on;
        otherwise None.

        Raises:
            AlreadyVoted: this person voted on this quorum request before, or another
                vote in their name is stored and being checked (``contested``: if it is
                not genuine, this vote counts); it stays open.
            InvalidAnswer: the data fails the request's schema; the request stays open.
            AlreadyResolved: another answer, the deadline or a withdrawal came first.
            UnknownRequest: the broker no longer knows the request.
            Contested: the request's state in Redis held another answer that this process
                cannot confirm (an edited state); the waiter decides between them.
            NotAllowed: the request's allow-list names neither this responder nor the
                answer's ``person``; the request stays open for others.
            BrokerUnavailable: the answer did not get through; the request is shown again.
        """

    @abc.abstractmethod
    async def skip(self) -> None:
        """Let this responder group pass on the request without answering it."""

    async def accept(self, data: Any = None, *, person: str | None = None) -> ApprovedEvent | None:
        """Answer yes, with ``data`` for a form (see :meth:`answer` for the result and errors).

        ``person`` names who answered behind this responder (a web login, ``slack:U123``).
        """
        return await self.answer(Answer(id=self.request.id, ok=True, data=data, person=person))

    async def decline(
        self, message: str | None = None, *, person: str | None = None
    ) -> ApprovedEvent | None:
        """Answer an explicit no (see :meth:`answer` for the result and errors).

        ``message`` says why, as the answer's data: a tool approval's denial tells the
        model (:func:`toolnexus.frameworks.decide`).
        """
        answer = Answer(
            id=self.request.id, ok=False, reason=DECLINED, data=message or None, person=person
        )
        return await self.answer(answer)

    async def dismiss(self, *, person: str | None = None) -> ApprovedEvent | None:
        """Close the request without a choice (see :meth:`answer` for the result and errors)."""
        answer = Answer(id=self.request.id, ok=False, reason=DISMISSED, person=person)
        return await self.answer(answer)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.request.id} kind={self.request.kind!r}>"


class _Closing(abc.ABC):
    """Something with ``aclose()`` that is also its own ``async with``."""

    @abc.abstractmethod
    async def aclose(self) -> None: ...

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


HeartbeatInfo = Callable[[], Mapping[str, str | int | float]]
"""What a responder's heartbeat tells operators (counters, host, pid, ...)."""

HEARTBEAT_TTL_S = 30.0
"""How long a responder's heartbeat lasts unrenewed; it is renewed every third of it."""

READER_GRACE_S = 2.0
"""How long after publishing a request a wait looks whether anybody reads its queue (or
halfway to its deadline, if sooner): the time a responder started with it, in the same
process or beside it, has to send its first heartbeat, which it sends on its first read.
Looking at once warned on every run of a program that starts its responder and then asks
(issue #43), before that responder's first heartbeat, which takes a round trip to Redis."""


def reader_look_delay_s(expires_at: float) -> float:
    """How long from now a wait whose deadline is ``expires_at`` (Unix time) waits before
    it looks whether anybody reads its queue: :data:`READER_GRACE_S`, or halfway to its
    deadline if that is sooner, so that a short wait nobody reads is still warned of."""
    return max(0.0, min(READER_GRACE_S, (expires_at - time.time()) / 2))


_log = logging.getLogger("toolnexus")


class Responder(_Closing):
    """An async iterator of the :class:`Pending` requests one consumer of a group should show.

    Several groups each see every request; within a group each request goes to one
    consumer. Use it as ``async with broker.responder("web") as r: async for p in r``.
    ``aclose()`` stops it; requests held and not yet answered go back to the group.

    From its first read until ``aclose()``, it keeps a heartbeat (:meth:`Broker.heartbeat`)
    good for ``heartbeat_ttl_s``, renewed every third of it, telling ``heartbeat_info()``
    (by default its host and pid): ``toolnexus check`` and ``status`` see it alive, and
    waiters publishing to its queue know someone reads it. Set both before its first read.
    """

    group: str
    consumer: str
    heartbeat_ttl_s: float = HEARTBEAT_TTL_S
    heartbeat_info: HeartbeatInfo | None = None

    def heartbeat_details(self) -> Mapping[str, str | int | float]:
        """What this responder's heartbeat says: ``heartbeat_info()``, or its host and pid."""
        if self.heartbeat_info is not None:
            return self.heartbeat_info()
        return {"host": socket.gethostname(), "pid": os.getpid(), "worker": "responder"}

    async def keep_heartbeat(
        self, beat: Callable[[float, Mapping[str, str | int | float]], Awaitable[None]]
    ) -> None:
        """Renew this responder's heartbeat with ``beat(ttl_s, info)`` until cancelled; a
        failure is logged and tried again at the next renewal."""
        while True:
            ttl_s = self.heartbeat_ttl_s
            try:
                await beat(ttl_s, self.heartbeat_details())
            except BrokerClosed:
                return
            except ToolnexusError as exc:
                _log.warning("%s/%s: heartbeat failed: %s", self.group, self.consumer, exc)
            await asyncio.sleep(ttl_s / 3)

    def __aiter__(self) -> Self:
        return self

    @abc.abstractmethod
    async def __anext__(self) -> Pending: ...


class EventStream(_Closing):
    """Events (answered, expired, withdrawn, completed) from the moment it was created."""

    def __aiter__(self) -> Self:
        return self

    @abc.abstractmethod
    async def __anext__(self) -> Event: ...


MAX_STORE_KEY_CHARS = 1000
MAX_STORE_VALUE_BYTES = 64 * 1024
"""The longest key and value a :class:`Store` keeps: it holds a worker's small state
(where a message is), not payloads."""


def check_store_entry(key: str, value: bytes | str | None = None) -> bytes | None:
    """Refuse a :class:`Store` key or value no store keeps; return the value as bytes.

    Raises:
        ConfigurationError: ``key`` is not a string of 1 to :data:`MAX_STORE_KEY_CHARS`
            characters, ``value`` is not bytes or str, is longer than
            :data:`MAX_STORE_VALUE_BYTES`, or either is text that is not Unicode.
    """
    if not isinstance(key, str) or not 0 < len(key) <= MAX_STORE_KEY_CHARS:
        raise ConfigurationError(
            f"a store key must be a string of 1 to {MAX_STORE_KEY_CHARS} characters, "
            f"not {key!r:.80}"
        )
    try:
        key.encode()
    except UnicodeEncodeError as exc:
        raise ConfigurationError(f"store key {key!r:.80}: {exc}") from None
    try:
        if isinstance(value, str):
            value = value.encode()
    except UnicodeEncodeError as exc:
        raise ConfigurationError(f"store value of {key!r:.80}: {exc}") from None
    if value is not None and not isinstance(value, bytes):
        raise ConfigurationError(
            f"a store value must be bytes or str, not {type(value).__name__} (key {key!r:.80})"
        )
    if value is not None and len(value) > MAX_STORE_VALUE_BYTES:
        raise ConfigurationError(
            f"store value of {key!r:.80} has {len(value)} bytes: at most "
            f"{MAX_STORE_VALUE_BYTES} are kept"
        )
    return value


def check_store_replacement(key: str, old: bytes | str, new: bytes | str) -> tuple[bytes, bytes]:
    """:func:`check_store_entry` of ``key`` and ``new``, and ``old`` as bytes: the values of
    :meth:`Store.replace`. ``old`` may be of any length (what a writer of Redis left).

    Raises:
        ConfigurationError: as :func:`check_store_entry`, or ``old`` is not bytes or str.
    """
    data = check_store_entry(key, new)
    assert data is not None  # a value was given
    try:
        if isinstance(old, str):
            old = old.encode()
    except UnicodeEncodeError as exc:
        raise ConfigurationError(f"store value of {key!r:.80}: {exc}") from None
    if not isinstance(old, bytes):
        raise ConfigurationError(
            f"a store value must be bytes or str, not {type(old).__name__} (key {key!r:.80})"
        )
    return old, data


class Store(abc.ABC):
    """A worker's small state kept by the broker: a named map of string keys to bytes
    that expires as a whole (see :meth:`Broker.store`).

    On Redis it is one hash under the broker's namespace and queue
    (:meth:`toolnexus.keys.Keys.store`), so every topology the broker speaks (one server,
    Cluster, Sentinel, TLS, ACL users) holds it, and each call is retried while Redis is
    away as the broker's own answers are (for up to ``answer_patience_s``). Redis is
    shared with everyone who may write there: read what a store returns as untrusted.
    """

    name: str

    @abc.abstractmethod
    async def get(self, key: str) -> bytes | None:
        """The value of ``key``, or None if it has none (or the store expired).

        Raises:
            ConfigurationError: a bad key (:func:`check_store_entry`).
            BrokerUnavailable: the broker stayed unreachable.
            BrokerClosed: the Redis broker was closed.
        """

    @abc.abstractmethod
    async def set(self, key: str, value: bytes | str, *, ttl_s: float) -> None:
        """Keep ``value`` (str is kept as UTF-8) under ``key``, and the whole store for at
        least ``ttl_s`` seconds from now: every write extends the store's life, none
        shortens it; when it lapses, every entry goes with it.

        Raises:
            ConfigurationError: a bad key or value (:func:`check_store_entry`), or
                ``ttl_s`` not a positive number of seconds.
            BrokerUnavailable: the broker stayed unreachable.
            BrokerClosed: the Redis broker was closed.
        """

    @abc.abstractmethod
    async def claim(self, key: str, value: bytes | str, *, ttl_s: float) -> bool:
        """Keep ``value`` under ``key`` only if ``key`` has no value yet, in one atomic
        step (on Redis one transaction): of several callers, in any processes, exactly one
        gets True, and the store lives on as :meth:`set` makes it.

        Give each caller a value of its own (a fresh id in it): a claim retried while Redis
        was away is then still known as this caller's (True), and callers claiming with
        equal values cannot tell each other apart.

        Raises:
            ConfigurationError: as :meth:`set`.
            BrokerUnavailable: the broker stayed unreachable.
            BrokerClosed: the Redis broker was closed.
        """

    @abc.abstractmethod
    async def replace(self, key: str, old: bytes | str, new: bytes | str, *, ttl_s: float) -> bool:
        """Keep ``new`` under ``key`` only if ``key`` holds exactly ``old`` (the bytes a
        :meth:`get` returned), in one atomic step (on Redis one script): of several
        callers replacing the same ``old``, in any processes, exactly one gets True, and
        the store lives on as :meth:`set` makes it. False: ``key`` holds something else, or
        nothing (nothing is written).

        As with :meth:`claim`, give each caller a ``new`` of its own: a replacement retried
        while Redis was away is then still known as this caller's (True).

        Raises:
            ConfigurationError: as :meth:`set`, or ``old`` is neither bytes nor str
                (it may be longer than a value :meth:`set` keeps: what another wrote).
            BrokerUnavailable: the broker stayed unreachable.
            BrokerClosed: the Redis broker was closed.
        """

    @abc.abstractmethod
    async def delete(self, key: str) -> None:
        """Forget ``key`` (nothing happens if it has no value).

        Raises:
            ConfigurationError: a bad key.
            BrokerUnavailable: the broker stayed unreachable.
            BrokerClosed: the Redis broker was closed.
        """

    @abc.abstractmethod
    async def items(self) -> dict[str, bytes]:
        """Every key and value kept (entries whose key is not UTF-8 are left out).

        Raises:
            BrokerUnavailable: the broker stayed unreachable.
            BrokerClosed: the Redis broker was closed.
        """

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"


class Broker(_Closing):
    """Carries requests to responders and answers back to their waiters."""

    url: str

    @abc.abstractmethod
    async def wait_for(
        self,
        request: Request | Request10,
        *,
        timeout_s: float | None = None,
        allow: Sequence[str] | None = None,
        durable: bool = False,
    ) -> Answer:
        """Publish ``request`` and wait for its answer.

        ``request`` is a :class:`~toolnexus.Request` or any object with the toolkit's §10
        attributes (``id``, ``kind``, ``prompt``, ``url``, ``data``, ``expiresAt``; the
        toolkit's own ``Request`` among them), read by :func:`toolnexus.codec.as_request`.

        Never raises for an outcome: the deadline gives ``Answer(ok=False,
        reason="expired")`` (or the request's :class:`~toolnexus.models.OnExpiry` default,
        marked ``defaulted=True``), an unreachable broker ``reason="unavailable"``. If the
        waiting task is cancelled, the request is withdrawn. ``allow`` sets the request's
        allow-list: responder key names and persons (``slack:*`` patterns) who may answer.

        ``durable`` (or ``request.durable``, SPEC §14): the request outlives this wait and
        its process. Cancelling the wait, closing the broker or the process dying does not
        withdraw it; it ends with an answer or at its deadline. Waiting again with the same
        request id, from any process, attaches to it: a stored outcome is returned at once,
        else the wait goes on until the stored deadline; it is never published twice.

        Raises:
            InvalidRequest: a request with this id is already being waited for here, its
                id cannot name a key, a §10 attribute is missing or of the wrong type, its
                default on expiry fails its schema, ``timeout_s`` is not a positive finite
                number, a field cannot be encoded (text that is not Unicode, such as a lone
                surrogate), or (durable) a stored request with this id asks something else.
            BrokerClosed: the broker was closed before or during the wait.
        """

    @abc.abstractmethod
    async def audit(
        self, *, since: float | None = None, request_id: str | None = None, limit: int = 10_000
    ) -> list[AuditRecord]:
        """The audit records of resolved requests from ``since`` (Unix time), oldest first.

        Raises:
            ConfigurationError: ``since`` is not a finite time, or ``limit`` not a positive
                integer (:func:`check_audit_query`).
            BrokerUnavailable: the broker cannot be reached.
        """

    @abc.abstractmethod
    def responder(
        self, group: str, consumer: str | None = None, *, until_idle: bool = False
    ) -> Responder:
        """A :class:`Responder` reading the requests of consumer group ``group``.

        With ``until_idle``, iteration ends once nothing is left to deliver to this
        consumer (arq's burst mode): deterministic for tests and batch jobs.
        """

    @abc.abstractmethod
    async def answer(self, answer: Answer) -> ApprovedEvent | None:
        """Resolve the request ``answer.id`` from anywhere; for a quorum, vote on it (see
        :meth:`Pending.answer`: the ``approved`` event of a vote that did not decide).

        Raises:
            AlreadyVoted: this person voted on this quorum request before (or
                ``contested``: see :meth:`Pending.answer`).
            InvalidAnswer: the data fails the request's schema; the request stays open.
            AlreadyResolved: the request was already answered, expired or withdrawn.
            UnknownRequest: no such request.
        """

    @abc.abstractmethod
    async def complete(self, request_id: str) -> None:
        """Tell responders that the out-of-band step of an authorization request is done."""

    @abc.abstractmethod
    def events(self) -> EventStream:
        """Follow what happens to requests from now on."""

    @abc.abstractmethod
    async def heartbeat(
        self,
        group: str,
        consumer: str,
        *,
        ttl_s: float,
        info: Mapping[str, str | int | float] | None = None,
    ) -> None:
        """Record that consumer ``consumer`` of ``group`` is alive for the next ``ttl_s``.

        Each call replaces that consumer's previous heartbeat; ``ttl_s <= 0`` removes it
        (a worker leaving). ``info`` is shown to operators (counters, pid, ...).

        Raises:
            ConfigurationError: ``ttl_s`` is not a finite number (at most
                :data:`~toolnexus._numeric.MAX_SECONDS`), or ``info`` cannot be encoded.
            BrokerUnavailable: the broker cannot be reached.
        """

    @abc.abstractmethod
    async def heartbeats(self) -> list[Heartbeat]:
        """The heartbeats of this queue's workers that have not expired, in no set order.

        Raises:
            BrokerUnavailable: the broker cannot be reached.
        """

    @abc.abstractmethod
    def store(self, name: str, *, agent: bool = False) -> Store:
        """The :class:`Store` named ``name`` of this broker's namespace and queue (a chat
        bot's messages: ``broker.store("slack")``); stores of one name are the same store,
        from any process of the queue.

        ``agent=True``: the store of this broker's agent alone (the records of its durable
        MCP tasks), from any process of that agent; on Redis it lies among the agent's own
        waiter keys, which the shipped ACL gives that agent's user alone (and ops, to read).

        Raises:
            ConfigurationError: ``name`` is empty or has braces, colons or whitespace.
        """

    @property
    def signing_key(self) -> SigningKey | None:
        """This process's own signing key, if it has one: it signs its requests, and what it
        keeps for itself in a store (a durable MCP task's record)."""
        return None

    @property
    def write_protocol(self) -> int:
        """The protocol this process writes on its own initiative (see
        :mod:`toolnexus.protocol`), its stores' records among it: the ``write_protocol``
        setting."""
        return PROTOCOL

    @abc.abstractmethod
    async def aclose(self) -> None:
        """Stop background readers and close connections (after pending withdrawals)."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {redacted(self.url)}>"


def connect(
    url: str | None = None, *, settings: RedisSettings | None = None, **options: Any
) -> Broker:
    """A broker for ``url``: ``memory://`` (in-process), ``redis://`` / ``rediss://`` (one
    Redis server), ``redis+cluster://host:port,host:port`` (a Redis Cluster, by any of its
    nodes) or ``redis+sentinel://host:port,host:port/master-name`` (the master the
    Sentinels name); ``rediss+cluster://`` and ``rediss+sentinel://`` speak TLS. See
    :mod:`toolnexus.redis_broker._connections`.

    With no URL, ``TOOLNEXUS_URL`` is read, else
    :data:`~toolnexus.settings.DEFAULT_URL` (Redis on this machine) is used. ``settings``
    are the Redis broker's (:class:`~toolnexus.RedisSettings`); ``options`` are keyword
    arguments: each field of those settings by name (``namespace="ops"``,
    ``lease_ms=60_000``), redis-py connection options (``username``, ``ssl_ca_certs``, ...),
    and ``codec``, ``signing_key``, ``trusted_keys``, ``require_signatures``.

    Raises:
        ConfigurationError: the URL scheme is not one toolnexus knows, or an option the
            backend does not know or cannot honour (``memory://`` refuses the Redis
            broker's options, a field of ``settings`` other than its own set to other than
            its default, and every signature setting, ``TOOLNEXUS_REQUIRE_SIGNATURES=1``
            included, rather than run unsigned), or a bad value; the message names it.
    """
    url = url or default_url()
    try:
        scheme = urlsplit(url).scheme
    except ValueError as exc:
        raise ConfigurationError(f"malformed broker URL {redacted(url)!r}: {exc}") from exc
    if scheme == "memory":
        from ._memory import MemoryBroker

        return MemoryBroker(url, settings=settings, **options)
    if scheme in REDIS_SCHEMES:
        from .redis_broker import RedisBroker

        return RedisBroker(url, settings=settings, **options)
    raise ConfigurationError(
        f"unknown broker URL scheme {scheme!r} in {url!r}: use memory://, redis://, rediss://, "
        "redis+cluster://, rediss+cluster://, redis+sentinel:// or rediss+sentinel://"
    )
