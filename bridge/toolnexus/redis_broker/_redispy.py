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
- Two fixes that are not optimizations and stay in both modes: :class:`ClosingCluster`
  (closes every node's connections, which redis-py's ``aclose`` skips after a failed
  command) and :class:`BlockingSentinelPool` (a Sentinel pool that waits for a free
  connection instead of refusing, as the one-server pool does).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, TypeVar

import redis.asyncio as aioredis
import redis.exceptions
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.sentinel import SentinelConnectionPool

C = TypeVar("C")

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
