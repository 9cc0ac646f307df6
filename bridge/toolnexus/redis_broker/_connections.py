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

Command clients are pools shared by the whole broker. Every blocking reader gets a
client of its own (for a Cluster, a connection to the node holding the stream it reads),
with no socket timeout: :class:`BlockingReader` bounds each read itself (its block and
then some). On one server its reads go straight to that client's one connection.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeAlias
from urllib.parse import SplitResult, parse_qs, unquote, urlsplit

import redis.asyncio as aioredis
import redis.exceptions
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool

from ..broker import redacted
from ..errors import ConfigurationError
from ..settings import SENTINEL_OPTIONS
from ..timers import Bound
from ._packing import hiredis_packing

Client = aioredis.Redis | RedisCluster
"""A command or blocking client: a server's (or a Sentinel master's) or a Cluster's."""

Entries: TypeAlias = list[tuple[bytes, dict[bytes, bytes] | None]]
"""The entries of one stream as a read returns them: id and fields (``None``: an entry
pending for a group but deleted since)."""

Carried = tuple[list[tuple[Any, ...]], Callable[[list[Any] | BaseException], None]]
"""Commands carried by a blocking read, written ahead of it (the pipeliner's lazy items,
:meth:`Pipeliner.take_lazy <toolnexus.redis_broker._pipeliner.Pipeliner.take_lazy>`), and
what to call with their replies once read: a list (error replies in place), or the
exception that stopped the read (:class:`NotSent` if they were never written)."""


class NotSent(ConnectionError):
    """Carried commands that were never written: whoever gave them may send them again."""


CLUSTER_SCHEMES = frozenset({"redis+cluster", "rediss+cluster"})
SENTINEL_SCHEMES = frozenset({"redis+sentinel", "rediss+sentinel"})


_CLUSTER_PARAMETERS = frozenset(inspect.signature(RedisCluster.__init__).parameters)


class _Cluster(RedisCluster):
    """A ``RedisCluster`` whose ``aclose`` closes every node's connections even after a
    failed command (redis-py's own skips them once a fault marked it for re-discovery)."""

    async def aclose(self) -> None:
        try:
            await super().aclose()
        finally:
            await self.nodes_manager.aclose()
            await self.nodes_manager.aclose("startup_nodes")


class _BlockingSentinelPool(SentinelConnectionPool, aioredis.BlockingConnectionPool):
    """A Sentinel-managed pool that waits for a free connection instead of refusing."""


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

    def __init__(self, url: str, max_connections: int, pool_timeout_s: float, **options: Any):
        self.url = url
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
                pool.connection_class = hiredis_packing(pool.connection_class)
                self.command_client = aioredis.Redis.from_pool(pool)
                self._blocking = lambda: _fast(
                    aioredis.Redis.from_url(url, **options)  # BlockingReader takes one
                )
        except (ValueError, TypeError) as exc:
            raise ConfigurationError(f"bad Redis URL or option for {url!r}: {exc}") from exc

    def blocking_client(self) -> Client:
        """A client of its own for blocking reads, with no socket timeout."""
        return self._blocking()

    async def aclose(self) -> None:
        """Close the command client (and the connections to the Sentinels)."""
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
            return _Cluster(startup_nodes=nodes, max_connections=connections, **cluster_options)

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
        sentinel = Sentinel(  # type: ignore[no-untyped-call]
            [(a.host, a.port) for a in addresses], sentinel_kwargs=sentinel_kwargs, **master_options
        )
        self.command_client = _fast(
            sentinel.master_for(
                master_name,
                connection_pool_class=_BlockingSentinelPool,
                max_connections=max_connections,
                timeout=pool_timeout_s,
            )
        )
        self._sentinel_manager = sentinel
        self._blocking = lambda: _fast(sentinel.master_for(master_name, max_connections=1))


def _fast(client: aioredis.Redis) -> aioredis.Redis:
    """``client``, whose connections (made when first used) pack commands with hiredis
    (see :mod:`._packing`)."""
    pool = client.connection_pool
    pool.connection_class = hiredis_packing(pool.connection_class)
    return client


class BlockingReader:
    """Blocking reads (``XREAD``, ``XREADGROUP``) of one stream on a client of their own.

    On one server (or a Sentinel's master) each read is written to, and its reply read
    from, one connection taken from the client once: redis-py's command path around that
    (a pool checkout that checks the socket, response callbacks, redis-py 8's
    streaming-lag observability) cost about 25 µs of CPU per read (80 → 55 µs), on both
    sides of a sequential round trip. A read that fails or is cancelled mid-reply
    closes the connection, which is never read again (the next read connects afresh).
    A Cluster's reads go through redis-py, which finds the node holding the stream.

    ``carry`` gives commands to write ahead of each read (see :data:`Carried`): Redis runs
    them at once, so the read costs them no write of their own, and they travel apart
    from the commands that wake other processes (which Redis answers only once it has
    run everything it read with them).

    A read that takes ``patience_s`` longer than its block raises ``TimeoutError`` (a
    peer that never replies is a fault); one timer bounds them all (:class:`Bound`).
    """

    def __init__(
        self,
        client: Client,
        carry: Callable[[], Carried | None] | None = None,
        *,
        patience_s: float,
    ) -> None:
        self.client = client
        self._cluster = isinstance(client, RedisCluster)  # (a Protocol: slow to ask each time)
        self._carry = carry
        self._connection: Any = None
        self._patience_s = patience_s
        self._bound = Bound()

    async def xread(self, stream: str, last_id: str, count: int, block: int) -> Entries:
        """The entries of ``stream`` after ``last_id`` (at most ``count``; waiting up to
        ``block`` ms for one)."""
        with self._bound(block / 1000 + self._patience_s):
            if self._cluster:
                reply: Any = await self.client.xread({stream: last_id}, count=count, block=block)
                return _cluster_entries(reply)
            return await self._read(
                "XREAD", "COUNT", count, "BLOCK", block, "STREAMS", stream, last_id
            )

    async def xreadgroup(
        self, group: str, consumer: str, stream: str, from_id: str, count: int, block: int | None
    ) -> Entries:
        """Entries of ``stream`` for ``consumer`` of ``group``: new ones (``from_id`` ``>``,
        waiting up to ``block`` ms unless it is None), or its own pending ones from
        ``from_id``."""
        with self._bound((block or 0) / 1000 + self._patience_s):
            if self._cluster:
                reply: Any = await self.client.xreadgroup(
                    group, consumer, {stream: from_id}, count=count, block=block
                )
                return _cluster_entries(reply)
            blocking = () if block is None else ("BLOCK", block)
            return await self._read(
                "XREADGROUP", "GROUP", group, consumer, "COUNT", count, *blocking,
                "STREAMS", stream, from_id,
            )  # fmt: skip

    async def _read(self, *command: Any) -> Entries:
        assert isinstance(self.client, aioredis.Redis)
        connection = self._connection = await kept_connection(self.client, self._connection)
        carried = self._carry() if self._carry is not None else None
        commands: list[tuple[Any, ...]] = carried[0] if carried is not None else []
        settle = carried[1] if carried is not None else None
        try:
            try:
                await connection.send_packed_command(connection.pack_commands([*commands, command]))
            except BaseException as exc:
                if settle is not None:
                    given_back = settle
                    settle = None
                    given_back(NotSent(f"not written: {exc!r}"))
                raise
            if settle is not None:
                replies = await read_replies(connection, len(commands))
                done = settle
                settle = None
                done(replies)
            reply: Any = await connection.read_response()
        except BaseException as exc:
            if settle is not None:
                settle(exc)
            await connection.disconnect(nowait=True)
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
        if self._connection is not None and isinstance(self.client, aioredis.Redis):
            await self.client.connection_pool.release(self._connection)
            self._connection = None
        await self.client.aclose()


async def kept_connection(client: aioredis.Redis, connection: Any) -> Any:
    """``connection``, a connection of ``client``'s pool kept by its user (taken from the
    pool the first time, when it is None; connected again if it was closed)."""
    if connection is None:  # the client's pool closes it with the client
        return await client.connection_pool.get_connection()  # type: ignore[no-untyped-call]
    if not connection.is_connected:
        await connection.connect()
    return connection


async def read_replies(connection: Any, count: int) -> list[Any]:
    """The next ``count`` replies on ``connection``, an error reply as its exception, in
    its place."""
    replies: list[Any] = []
    for _ in range(count):
        try:
            replies.append(await connection.read_response())
        except redis.exceptions.ResponseError as exc:
            replies.append(exc)
    return replies


def _pairs(fields: list[bytes] | dict[bytes, bytes]) -> dict[bytes, bytes]:
    if isinstance(fields, dict):
        return fields
    it = iter(fields)
    return dict(zip(it, it, strict=True))


def _cluster_entries(reply: Any) -> Entries:
    """The entries in redis-py's parsed ``XREAD``/``XREADGROUP`` reply (RESP2 or 3)."""
    if not reply:
        return []
    streams = reply.values() if isinstance(reply, dict) else (s[1] for s in reply)
    return [(entry_id, fields) for stream_entries in streams for entry_id, fields in stream_entries]
