"""Everything the Redis broker uses of redis-py beyond its documented API, in one place,
and the switch that turns it off.

redis-py documents its clients (``Redis``, ``RedisCluster``, ``Sentinel.master_for``),
their commands, ``execute_command`` and pipelines. Below that, its connection classes,
``send_packed_command``/``read_response`` and its parsers are internals that a minor
release may change. This module is the only one that touches them (``tests/test_redispy.py``
checks it). With the **public-API-only mode** on (the broker's option
``redis_public_api=True``, or the variable ``TOOLNEXUS_REDIS_PUBLIC_API=1``) none of it
is used: the pipeliner sends redis-py pipelines, blocking reads are redis-py's
``xread``/``xreadgroup`` (on a Cluster, in both modes, its ``execute_command`` to the
stream's node), and everything works the same, a little slower
(docs/explanation/performance.md gives the cost). Should a redis-py release break the
internals, that mode is the way out while this module catches up.

What it holds:

- :func:`packing`: commands packed by hiredis (C) instead of by redis-py (Python), on
  every connection of a one-server or Sentinel client.
- :class:`Direct`: commands written to one kept connection of a one-server client, and
  their replies read back as Redis sent them, skipping redis-py's pipeline objects, its
  pool checkout (which checks the socket every time) and its response callbacks. The
  pipeliner's pipelines and the blocking reads use it on one server.
- Three fixes that are not optimizations and stay in both modes: :class:`ClosingCluster`
  (closes every node's connections, which redis-py's ``aclose`` skips after a failed
  command), :class:`BlockingSentinelPool` (a Sentinel pool that waits for a free
  connection instead of refusing, as the one-server pool does) and :class:`SentinelWatch`
  (closes the connections to a master the Sentinels replaced, in use or not).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

import redis.asyncio as aioredis
import redis.exceptions
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool

C = TypeVar("C")

log = logging.getLogger("toolnexus.redis")

SENTINEL_WATCH_S = 0.5
"""How often a Sentinel client asks the Sentinels which server is the master (one
``SENTINEL MASTERS`` to the first Sentinel that answers)."""

PUBLIC_API_VARIABLE = "TOOLNEXUS_REDIS_PUBLIC_API"
"""``1`` turns the public-API-only mode on where the broker's option does not say."""


def public_api_only(asked: bool | None = None) -> bool:
    """Whether to use only redis-py's documented API: ``asked`` if given, else what
    ``TOOLNEXUS_REDIS_PUBLIC_API`` says (on unless empty or ``0``)."""
    if asked is not None:
        return asked
    return os.environ.get(PUBLIC_API_VARIABLE, "") not in ("", "0")


# -- hiredis packing ------------------------------------------------------------------

_pack: Callable[[tuple[Any, ...]], bytes] | None
try:
    from hiredis import pack_command as _pack
except ImportError:  # redis[hiredis] is a dependency; without it, redis-py packs
    _pack = None


class _HiredisPacking:
    """Mixed into a redis-py asyncio connection class ahead of it: commands packed into
    the Redis protocol by hiredis (C) instead of by redis-py (Python, an
    ``Encoder.encode`` and a few ``bytes.join`` per argument; a round trip sends about 45
    arguments from the waiter and 30 from the responder). Same bytes, same refusals: a
    multi-word command name (``"CLIENT SETNAME"``) is split as redis-py splits it, and
    arguments redis-py refuses (``bool``, ``None``) raise ``DataError`` here too. Strings
    are UTF-8, the only encoding toolnexus uses. (redis-py's synchronous client does the
    same when hiredis is installed; its asyncio client does not.)"""

    def pack_command(self, *args: Any) -> list[bytes]:
        if isinstance(args[0], str):
            args = (*args[0].encode().split(), *args[1:])
        elif b" " in args[0]:
            args = (*args[0].split(), *args[1:])
        try:
            assert _pack is not None
            packed = _pack(args)
        except TypeError:
            bad = next((a for a in args if isinstance(a, bool) or a is None), None)
            raise redis.exceptions.DataError(
                f"Invalid input of type: {type(bad).__name__!r}. Convert to a bytes, string, "
                "int or float first."
            ) from None
        return [packed]


_CLASSES: dict[type[Any], type[Any]] = {}


def hiredis_packing(connection_class: type[Any]) -> type[Any]:
    """``connection_class`` packing with hiredis, or itself where hiredis is missing."""
    if _pack is None or issubclass(connection_class, _HiredisPacking):
        return connection_class
    fast = _CLASSES.get(connection_class)
    if fast is None:
        name = connection_class.__name__
        fast = _CLASSES[connection_class] = type(name, (_HiredisPacking, connection_class), {})
    return fast


def packing(client: C, public_api: bool) -> C:
    """``client``, whose connections (made when first used) pack commands with hiredis,
    unless in the public-API-only mode (a Cluster's are left alone)."""
    if not public_api and isinstance(client, aioredis.Redis):
        pool = client.connection_pool
        pool.connection_class = hiredis_packing(pool.connection_class)
    return client


# -- Direct connections -----------------------------------------------------------------


class Direct:
    """One connection of a one-server client's pool, taken once and kept by its user,
    written to and read from directly. A user that fails or is cancelled mid-exchange
    calls :meth:`abandon`: the connection is closed, never read again, and connected
    afresh for the next write."""

    __slots__ = ("_client", "_connection")

    def __init__(self, client: aioredis.Redis) -> None:
        self._client = client
        self._connection: Any = None

    async def write(self, commands: list[tuple[Any, ...]]) -> None:
        """Write ``commands`` at once (connecting first if needed)."""
        connection = self._connection
        if connection is None:  # the client's pool closes it with the client
            pool = self._client.connection_pool
            connection = self._connection = await pool.get_connection()  # type: ignore[no-untyped-call]
        elif not connection.is_connected:
            await connection.connect()
        await connection.send_packed_command(connection.pack_commands(commands))

    async def replies(self, count: int) -> list[Any]:
        """The next ``count`` replies, as Redis sent them; an error reply as its
        exception, in its place."""
        connection = self._connection
        replies: list[Any] = []
        for _ in range(count):
            try:
                replies.append(await connection.read_response())
            except redis.exceptions.ResponseError as exc:
                replies.append(exc)
        return replies

    async def reply(self) -> Any:
        """The next reply; an error reply raises."""
        return await self._connection.read_response()

    async def abandon(self) -> None:
        """Close the connection after a failure or cancellation mid-exchange."""
        if self._connection is not None:
            await self._connection.disconnect(nowait=True)

    async def release(self) -> None:
        """Give the connection back to the client's pool."""
        if self._connection is not None:
            await self._client.connection_pool.release(self._connection)
            self._connection = None


def direct(client: Any, public_api: bool) -> Direct | None:
    """A :class:`Direct` for ``client``, or None: in the public-API-only mode, or for a
    Cluster client (whose commands go where their keys are)."""
    if public_api or isinstance(client, RedisCluster):
        return None
    return Direct(client)


class ClosingCluster(RedisCluster):
    """A ``RedisCluster`` whose ``aclose`` closes every node's connections even after a
    failed command (redis-py's own skips them once a fault marked it for re-discovery)."""

    async def aclose(self) -> None:
        try:
            await super().aclose()
        finally:
            await self.nodes_manager.aclose()
            await self.nodes_manager.aclose("startup_nodes")


class BlockingSentinelPool(SentinelConnectionPool, aioredis.BlockingConnectionPool):
    """A Sentinel-managed pool that waits for a free connection instead of refusing."""


class SentinelWatch:
    """Asks the Sentinels every :data:`SENTINEL_WATCH_S` which server is ``master_name``;
    when the answer changes, closes every connection of the clients it follows (in use
    or idle), so that what waits on the old master fails now and is retried on the new
    one (redis-py itself closes only idle connections, and only when it connects again).
    Started by :meth:`start` (when the broker is entered, or makes its first blocking
    reader), stopped by :meth:`aclose`."""

    def __init__(self, sentinel: Sentinel, master_name: str) -> None:
        self._sentinel, self._master_name = sentinel, master_name
        self._pools: weakref.WeakSet[SentinelConnectionPool] = weakref.WeakSet()
        self._task: asyncio.Task[None] | None = None
        self.master: tuple[str, int] | None = None
        """The master's address as last seen (None: not asked yet)."""
        self.switches = 0
        """Changes of master seen."""

    def follow(self, client: aioredis.Redis) -> None:
        """Close ``client``'s connections when the master changes."""
        pool = client.connection_pool
        assert isinstance(pool, SentinelConnectionPool)
        self._pools.add(pool)

    def start(self) -> None:
        """Start watching, unless started or no event loop runs yet."""
        if self._task is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._task = loop.create_task(self._watch(), name="toolnexus-sentinel-watch")

    async def _watch(self) -> None:
        while True:
            master = await self.ask()
            if master is not None:
                await self.seen(master)
            await asyncio.sleep(SENTINEL_WATCH_S)

    async def ask(self) -> tuple[str, int] | None:
        """The master's address as the first Sentinel that answers within
        ``2 * SENTINEL_WATCH_S`` names it (None: none did). That Sentinel goes first in the
        list, for redis-py's own look-ups too (it moves one only after it answered, so a
        Sentinel a partition hides would cost every look-up its socket timeout)."""
        sentinels = self._sentinel.sentinels
        for number, client in enumerate(list(sentinels)):
            try:
                async with asyncio.timeout(SENTINEL_WATCH_S * 2):
                    masters = await client.sentinel_masters()
            except (redis.exceptions.RedisError, OSError, TimeoutError) as exc:
                log.debug("asking Sentinel %s for %s: %s", number, self._master_name, exc)
                continue
            state = masters.get(self._master_name) if isinstance(masters, dict) else None
            if state and self._sentinel.check_master_state(state, self._master_name):
                if number:
                    sentinels[0], sentinels[number] = sentinels[number], sentinels[0]
                return str(state["ip"]), int(state["port"])
        return None

    async def seen(self, master: tuple[str, int]) -> None:
        """The Sentinels name ``master``: if it is another than before, close the
        connections to the old one."""
        old, self.master = self.master, master
        if old is None or old == master:
            return
        self.switches += 1
        log.warning(
            "Sentinel master %s moved from %s:%s to %s:%s: reconnecting",
            self._master_name,
            *old,
            *master,
        )
        for pool in list(self._pools):
            pool.master_address = master
            with contextlib.suppress(redis.exceptions.RedisError, OSError):
                await pool.disconnect(inuse_connections=True)

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
