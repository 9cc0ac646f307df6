"""Worker stores on the Redis broker (:meth:`toolnexus.Broker.store`): one hash each, in
the queue's slot, expiring as a whole (Redis 7.0 has no per-field expiry)."""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from .._broker import Store, check_store_entry, check_store_replacement
from .._numeric import check_number
from ._core import Core, boundary
from ._durable import patiently
from ._scripts import REPLACE

log = logging.getLogger("toolnexus.redis")

T = TypeVar("T")


class RedisStore(Store):
    """A :class:`~toolnexus.Store` in the hash :meth:`toolnexus.keys.Keys.store` names (with
    ``agent``, :meth:`~toolnexus.keys.Keys.agent_store`), on the broker's own connections
    (Cluster, Sentinel, TLS, ACL users alike)."""

    def __init__(self, core: Core, name: str, *, agent: bool = False) -> None:
        keys = core.keys
        self.key = keys.agent_store(core.agent, name) if agent else keys.store(name)
        self.name = name
        self._core = core

    async def _call(self, what: str, call: Callable[[], Awaitable[T]]) -> T:
        """``call()`` bounded by ``command_timeout_s``, retried while Redis is away (for up
        to ``answer_patience_s``, as answers are); then ``BrokerUnavailable``."""
        core = self._core
        with boundary(f"store {self.name!r}: {what}"):
            return await patiently(
                core, f"store {self.name!r}: {what}", lambda: core.bounded(call())
            )

    async def get(self, key: str) -> bytes | None:
        check_store_entry(key)
        value: Any = await self._call(
            f"reading {key!r}", lambda: self._core.redis.hget(self.key, key)
        )
        return None if value is None else bytes(value)

    async def set(self, key: str, value: bytes | str, *, ttl_s: float) -> None:
        await self._keep(key, value, ttl_s, replace=True)

    async def claim(self, key: str, value: bytes | str, *, ttl_s: float) -> bool:
        return await self._keep(key, value, ttl_s, replace=False)

    async def replace(self, key: str, old: bytes | str, new: bytes | str, *, ttl_s: float) -> bool:
        expected, data = check_store_replacement(key, old, new)
        ttl = _whole_seconds(ttl_s)
        core = self._core

        async def write() -> bool:
            replaced = core.pipeliner.batch(REPLACE, (self.key,), (ttl,), (), (key, expected, data))
            return bool(await replaced)

        return await self._call(f"replacing {key!r}", write)

    async def _keep(self, key: str, value: bytes | str, ttl_s: float, *, replace: bool) -> bool:
        """``HSET`` (``HSETNX`` unless ``replace``) and the store's TTL, one transaction;
        whether ``key`` holds ``value`` after it (so a retried claim knows it won)."""
        data = check_store_entry(key, value)
        assert data is not None  # a value was given
        ttl = _whole_seconds(ttl_s)

        async def write() -> bool:
            async with self._core.redis.pipeline(transaction=True) as pipe:
                if replace:
                    pipe.hset(self.key, key, data)
                else:
                    pipe.hsetnx(self.key, key, data)
                pipe.hget(self.key, key)
                pipe.expire(self.key, ttl, nx=True)  # a new store gets this TTL
                pipe.expire(self.key, ttl, gt=True)  # an existing one is only ever extended
                replies: list[Any] = await pipe.execute()
            held = replies[1]
            return held is not None and bytes(held) == data

        return await self._call(f"{'keeping' if replace else 'claiming'} {key!r}", write)

    async def delete(self, key: str) -> None:
        check_store_entry(key)
        await self._call(f"forgetting {key!r}", lambda: self._core.redis.hdel(self.key, key))

    async def items(self) -> dict[str, bytes]:
        raw: dict[Any, Any] = await self._call(
            "reading every entry", lambda: self._core.redis.hgetall(self.key)
        )
        entries: dict[str, bytes] = {}
        for field, value in raw.items():
            try:
                entries[field.decode() if isinstance(field, bytes) else field] = bytes(value)
            except UnicodeDecodeError:  # not written by a store: nobody can ask for it
                log.warning("store %r: skipping a key that is not UTF-8: %r", self.name, field)
        return entries


def _whole_seconds(ttl_s: float) -> int:
    """``ttl_s`` as ``EXPIRE`` takes it: whole seconds, at least ``ttl_s``.

    Raises:
        ConfigurationError: ``ttl_s`` is not a positive number of seconds.
    """
    check_number("ttl_s", ttl_s)
    return max(1, math.ceil(ttl_s))
