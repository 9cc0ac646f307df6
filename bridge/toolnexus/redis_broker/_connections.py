"""How the Redis broker reaches Redis, chosen by the URL scheme:

- ``redis://``, ``rediss://``, ``unix://``: one server (redis-py's URL syntax and options).
- ``redis+cluster://[user:password@]host:port[,host:port...]``: a Redis Cluster through
  redis-py's asyncio ``RedisCluster``; the addresses are startup nodes (any reachable one
  is enough), the topology is discovered and followed (``MOVED``/``ASK``, failovers).
  ``rediss+cluster://`` speaks TLS to every node.
- ``redis+sentinel://[user:password@]host:port[,host:port...]/master-name[/db]``: the
  master that the Sentinels at these addresses name ``master-name``, found again after a
  failover. ``rediss+sentinel://`` speaks TLS to the Sentinels and the master; the
  credentials are the master's, the options ``sentinel_username``/``sentinel_password``
  the Sentinels' own.

Through Sentinels, a watch (:class:`~._redispy.SentinelWatch`) asks them every
:data:`~._redispy.SENTINEL_WATCH_S` which server is the master; when it changes, every connection
to the old one is closed, in use or not, so that a command or read waiting on it fails
at once and is retried on the new master (instead of waiting out its command timeout
against a master that a partition hides: issue 40 measured 24 s after a switch at 2.4 s).

Command clients are pools shared by the whole broker. Every blocking reader gets a
client of its own (for a Cluster, a connection to the node holding the stream it reads),
with no socket timeout: :class:`BlockingReader` bounds each read itself (its block and
then some). On one server its reads go straight to that client's one connection, unless
the public-API-only mode is on (see :mod:`._redispy`, the one module that uses redis-py
beyond its documented API); on a Cluster, in both modes, to the node that holds the
stream, named to redis-py (which would otherwise ask a node for the keys of every read).
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeAlias
from urllib.parse import SplitResult, parse_qs, unquote, urlsplit

import redis.asyncio as aioredis
import redis.exceptions
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.sentinel import Sentinel

from .._broker import redacted
from .._timers import Bound
from ..errors import ConfigurationError
from ..settings import SENTINEL_OPTIONS
from ._redispy import (
    BlockingSentinelPool,
    ClosingCluster,
    Direct,
    SentinelWatch,
    direct,
    packing,
)

Client = aioredis.Redis | RedisCluster
"""A command or blocking client: a server's (or a Sentinel master's) or a Cluster's."""

Entries: TypeAlias = list[tuple[bytes, dict[bytes, bytes] | None]]
"""The entries of one stream as a read returns them: id and fields (``None``: an entry
pending for a group but deleted since)."""

CLUSTER_SCHEMES = frozenset({"redis+cluster", "rediss+cluster"})
SENTINEL_SCHEMES = frozenset({"redis+sentinel", "rediss+sentinel"})


_RETRIED_FAULTS = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    redis.exceptions.ClusterDownError,
    redis.exceptions.SlotNotCoveredError,
    # what a command with its targets given raises for the first two while the last
    # topology refresh reached no node; redis-py would have retried after a new one
    redis.exceptions.RedisClusterUnreachableError,
)
"""The faults after which redis-py's ``RedisCluster`` retries a command, unless the
command names its target nodes: of these exact types, as it checks them (an
``AuthenticationError``, a ``ConnectionError`` too, is not retried)."""

_CLUSTER_PARAMETERS = frozenset(inspect.signature(RedisCluster.__init__).parameters)


@dataclass(frozen=True, slots=True)
class Address:
    host: str
    port: int


def split_addresses(url: str, netloc: str) -> tuple[str | None, str | None, list[Address]]:
    """The user, password and ``host:port`` addresses of a multi-host URL's netloc.

    Raises:
        ConfigurationError: no address, or one without a valid port.
    """
    user = password = None
    if "@" in netloc:
        credentials, netloc = netloc.rsplit("@", 1)
        user, _, secret = credentials.partition(":")
        user, password = unquote(user) or None, unquote(secret) or None
    addresses = []
    for part in netloc.split(","):
        host, _, port = part.strip().rpartition(":")
        host = host.strip("[]")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigurationError(
                f"bad address {part!r} in {url!r}: every address must be host:port"
            )
        addresses.append(Address(host, int(port)))
    return user, password, addresses


def username_of(url: str, options: dict[str, Any]) -> str | None:
    """The Redis user that ``url`` and connection ``options`` log in as, if they name one
    (on one server the URL's user, or its query's ``username``, wins, as in redis-py; on a
    Cluster or through Sentinels the ``username`` option wins, as :class:`Connector`
    passes them). A ``credential_provider``'s user is not known here."""
    parts = urlsplit(url)
    if parts.scheme in CLUSTER_SCHEMES | SENTINEL_SCHEMES:
        credentials = parts.netloc.rpartition("@")[0]
        in_url = unquote(credentials.partition(":")[0]) or None
        return options.get("username") or in_url
    in_query = parse_qs(parts.query).get("username", [""])[0]
    return unquote(parts.username or "") or in_query or options.get("username") or None


class Connector:
    """Makes the command client and the blocking clients for one broker URL.

    Raises:
        ConfigurationError: a malformed URL or an option its kind of Redis does not take.
    """

    def __init__(
        self,
        url: str,
        max_connections: int,
        pool_timeout_s: float,
        *,
        public_api: bool = False,
        **options: Any,
    ):
        self.url = url
        self.public_api = public_api
        parts = urlsplit(url)
        self.scheme = parts.scheme
        multi_host = self.scheme in CLUSTER_SCHEMES | SENTINEL_SCHEMES
        if multi_host and (parts.query or parts.fragment):
            raise ConfigurationError(
                f"{url!r}: a {self.scheme}:// URL takes no query; pass options to connect()"
            )
        sentinel_options = {k: options.pop(k) for k in SENTINEL_OPTIONS if k in options}
        if sentinel_options and self.scheme not in SENTINEL_SCHEMES:
            raise ConfigurationError(
                f"{', '.join(sorted(sentinel_options))}: only for redis+sentinel:// URLs"
            )
        self.options = options
        self._sentinel_manager: Sentinel | None = None
        self.sentinel_watch: SentinelWatch | None = None
        self.command_client: Client
        self._blocking: Callable[[], Client]
        try:
            if self.scheme in CLUSTER_SCHEMES:
                self._cluster(parts.netloc, max_connections)
            elif self.scheme in SENTINEL_SCHEMES:
                self._sentinel(parts, sentinel_options, max_connections, pool_timeout_s)
            else:
                database = parts.path.strip("/")
                if self.scheme != "unix" and database and not database.isdigit():
                    # redis-py would quietly use database 0
                    raise ConfigurationError(
                        f"{redacted(url)!r}: the path names a database by number "
                        f"(/0, /1, ...), not {database!r}"
                    )
                pool = aioredis.BlockingConnectionPool.from_url(
                    url, max_connections=max_connections, timeout=pool_timeout_s, **options
                )
                self.command_client = packing(aioredis.Redis.from_pool(pool), public_api)
                self._blocking = lambda: packing(  # BlockingReader takes one connection
                    aioredis.Redis.from_url(url, **options), public_api
                )
        except (ValueError, TypeError) as exc:
            raise ConfigurationError(f"bad Redis URL or option for {url!r}: {exc}") from exc

    def blocking_client(self) -> Client:
        """A client of its own for blocking reads, with no socket timeout (through
        Sentinels, watched: its connection is closed when the master changes)."""
        client = self._blocking()
        if self.sentinel_watch is not None:
            assert isinstance(client, aioredis.Redis)
            self.sentinel_watch.follow(client)
            self.sentinel_watch.start()  # (a broker used without entering it first)
        return client

    async def aclose(self) -> None:
        """Close the command client (and the connections to the Sentinels)."""
        if self.sentinel_watch is not None:
            await self.sentinel_watch.aclose()
        await self.command_client.aclose()
        if self._sentinel_manager is not None:
            for client in self._sentinel_manager.sentinels:
                await client.aclose()

    # -- Cluster ------------------------------------------------------------------

    def _cluster(self, netloc: str, max_connections: int) -> None:
        unsupported = sorted(set(self.options) - _CLUSTER_PARAMETERS)
        if unsupported:
            raise ConfigurationError(
                f"option{'s' if len(unsupported) > 1 else ''} {', '.join(unsupported)} cannot "
                f"be used with a Redis Cluster ({self.url!r})"
            )
        user, password, addresses = split_addresses(self.url, netloc)
        cluster_options: dict[str, Any] = {
            "ssl": self.scheme == "rediss+cluster",
            "username": user,
            "password": password,
            # While a master fails over, its slots are briefly uncovered: the other
            # slots stay usable, and commands to those slots fail and are retried.
            "require_full_coverage": False,
            **self.options,
        }

        def cluster(connections: int) -> RedisCluster:
            nodes = [ClusterNode(a.host, a.port) for a in addresses]
            return ClosingCluster(
                startup_nodes=nodes, max_connections=connections, **cluster_options
            )

        self.command_client = cluster(max_connections)
        self._blocking = lambda: cluster(2)

    # -- Sentinel -----------------------------------------------------------------

    def _sentinel(
        self,
        parts: SplitResult,
        sentinel_options: dict[str, Any],
        max_connections: int,
        pool_timeout_s: float,
    ) -> None:
        segments = [s for s in parts.path.split("/") if s]
        if not segments or len(segments) > 2 or (len(segments) == 2 and not segments[1].isdigit()):
            raise ConfigurationError(
                f"{self.url!r}: a redis+sentinel:// URL ends in /master-name or /master-name/db"
            )
        master_name = unquote(segments[0])
        user, password, addresses = split_addresses(self.url, parts.netloc)
        tls = self.scheme == "rediss+sentinel"
        ssl_options = {k: v for k, v in self.options.items() if k.startswith("ssl_")}
        sentinel_kwargs: dict[str, Any] = {
            "socket_connect_timeout": self.options.get("socket_connect_timeout"),
            "socket_timeout": self.options.get("socket_connect_timeout"),
            "username": sentinel_options.get("sentinel_username"),
            "password": sentinel_options.get("sentinel_password"),
            **({"ssl": True, **ssl_options} if tls else {}),
        }
        master_options: dict[str, Any] = {
            "username": user,
            "password": password,
            "db": int(segments[1]) if len(segments) == 2 else 0,
            **({"ssl": True} if tls else {}),
            **self.options,
        }
        sentinel = Sentinel(  # type: ignore[no-untyped-call,unused-ignore]  # typed from redis 8.2
            [(a.host, a.port) for a in addresses], sentinel_kwargs=sentinel_kwargs, **master_options
        )
        master = packing(
            sentinel.master_for(
                master_name,
                connection_pool_class=BlockingSentinelPool,
                max_connections=max_connections,
                timeout=pool_timeout_s,
            ),
            self.public_api,
        )
        self.command_client = master
        self._sentinel_manager = sentinel
        self._blocking = lambda: packing(
            sentinel.master_for(master_name, max_connections=1), self.public_api
        )
        self.sentinel_watch = SentinelWatch(sentinel, master_name)
        self.sentinel_watch.follow(master)


class BlockingReader:
    """Blocking reads (``XREAD``, ``XREADGROUP``) of one stream on a client of their own.

    On one server (or a Sentinel's master) each read is written to, and its reply read
    from, one connection taken from the client once (:class:`~._redispy.Direct`):
    redis-py's command path around that (a pool checkout that checks the socket,
    response callbacks, redis-py 8's streaming-lag observability) costs CPU on both
    sides of a sequential round trip (docs/explanation/performance.md). A read that
    fails or is cancelled mid-reply closes the connection, which is never read again
    (the next read connects afresh). A Cluster's reads go through redis-py's
    ``execute_command`` to the node holding the stream (:meth:`_cluster_read`), in both
    modes; every other read in the public-API-only mode (``public_api``; see
    :mod:`._redispy`) through its ``xread``/``xreadgroup``.

    A read that takes ``patience_s`` longer than its block raises ``TimeoutError`` (a
    peer that never replies is a fault); one timer bounds them all (:class:`Bound`).
    """

    def __init__(
        self,
        client: Client,
        *,
        patience_s: float,
        public_api: bool = False,
    ) -> None:
        self.client = client
        self._direct = direct(client, public_api)
        self._patience_s = patience_s
        self._bound = Bound()

    async def xread(self, stream: str, last_id: str, count: int, block: int) -> Entries:
        """The entries of ``stream`` after ``last_id`` (at most ``count``; waiting up to
        ``block`` ms for one)."""
        with self._bound(block / 1000 + self._patience_s):
            command = ("XREAD", "COUNT", count, "BLOCK", block, "STREAMS", stream, last_id)
            if isinstance(self.client, RedisCluster):
                return await self._cluster_read(
                    self.client,
                    stream,
                    command,
                    lambda: self.client.xread({stream: last_id}, count=count, block=block),
                )
            if self._direct is None:
                reply: Any = await self.client.xread({stream: last_id}, count=count, block=block)
                return _parsed_entries(reply)
            return await self._read(self._direct, command)

    async def xreadgroup(
        self, group: str, consumer: str, stream: str, from_id: str, count: int, block: int | None
    ) -> Entries:
        """Entries of ``stream`` for ``consumer`` of ``group``: new ones (``from_id`` ``>``,
        waiting up to ``block`` ms unless it is None), or its own pending ones from
        ``from_id``."""
        with self._bound((block or 0) / 1000 + self._patience_s):
            blocking = () if block is None else ("BLOCK", block)
            command = (
                "XREADGROUP", "GROUP", group, consumer, "COUNT", count, *blocking,
                "STREAMS", stream, from_id,
            )  # fmt: skip
            if isinstance(self.client, RedisCluster):
                return await self._cluster_read(
                    self.client,
                    stream,
                    command,
                    lambda: self.client.xreadgroup(
                        group, consumer, {stream: from_id}, count=count, block=block
                    ),
                )
            if self._direct is None:
                reply: Any = await self.client.xreadgroup(
                    group, consumer, {stream: from_id}, count=count, block=block
                )
                return _parsed_entries(reply)
            return await self._read(self._direct, command)

    @staticmethod
    async def _cluster_read(
        client: RedisCluster,
        stream: str,
        command: tuple[Any, ...],
        routed: Callable[[], Awaitable[Any]],
    ) -> Entries:
        """``command`` sent to the node that holds ``stream`` (redis-py's documented
        ``get_node_from_key`` and ``execute_command(..., target_nodes=...)``), not routed
        by redis-py: it finds the slot of ``XREAD``/``XREADGROUP`` by asking a node
        ``COMMAND GETKEYS`` first (their keys follow the ``STREAMS`` keyword, which its
        key-spec compiler does not follow), a call and ~40 µs of that node's CPU per read.

        With its targets given, redis-py still follows ``MOVED`` (patching its slot map)
        and ``ASK`` to the node they name and waits ``TRYAGAIN`` out, but retries nothing
        else. So a fault it would have retried (:data:`_RETRIED_FAULTS`: the node gone or
        unreachable, ``CLUSTERDOWN``, a slot without a master) makes the read again at
        once the routed way (``routed``: redis-py's ``xread``/``xreadgroup``, which refresh
        the topology the fault asked for, find the node again and retry as before); what
        that raises is the callers' to handle, as it was. ``initialize`` first, as
        redis-py's command path does: a new client learns the topology, one a fault
        marked refreshes it (when due), before the stream's node is looked up."""
        await client.initialize()  # raises as redis-py's own xread would
        try:
            node = client.get_node_from_key(stream)
            reply: Any = await client.execute_command(*command, target_nodes=node)
        except _RETRIED_FAULTS as exc:
            if type(exc) not in _RETRIED_FAULTS:  # e.g. an AuthenticationError: raised
                raise
            reply = await routed()
        return _parsed_entries(reply)

    async def _read(self, connection: Direct, command: tuple[Any, ...]) -> Entries:
        try:
            await connection.write([command])
            reply: Any = await connection.reply()
        except BaseException:
            await connection.abandon()
            raise
        if not reply:  # nothing within the block
            return []
        streams = reply.values() if isinstance(reply, dict) else (s[1] for s in reply)  # RESP3
        entries: Entries = []
        for stream_entries in streams:
            for entry_id, fields in stream_entries:
                entries.append((entry_id, None if fields is None else _pairs(fields)))
        return entries

    async def aclose(self) -> None:
        self._bound.close()
        if self._direct is not None:
            await self._direct.release()
        await self.client.aclose()


def _pairs(fields: list[bytes] | dict[bytes, bytes]) -> dict[bytes, bytes]:
    if isinstance(fields, dict):
        return fields
    it = iter(fields)
    return dict(zip(it, it, strict=True))


def _parsed_entries(reply: Any) -> Entries:
    """The entries in redis-py's parsed ``XREAD``/``XREADGROUP`` reply: ``[[stream,
    entries]]`` (RESP2, and RESP3 unless the option ``protocol=3`` asks for RESP3's own
    shapes), or ``{stream: [entries]}`` (with ``protocol=3``). Entries have fields (Redis
    refuses ``XADD`` without): empty ones are those of an entry deleted while pending."""
    if not reply:
        return []
    streams = (v[0] for v in reply.values()) if isinstance(reply, dict) else (s[1] for s in reply)
    return [  # an entry deleted while pending comes back with no fields: {} here
        (entry_id, fields or None)
        for stream_entries in streams
        for entry_id, fields in stream_entries
    ]
