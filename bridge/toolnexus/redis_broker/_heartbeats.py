"""Worker heartbeats on the Redis broker: one hash per queue, a field per worker."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping
from typing import Any

import redis.exceptions

from .._numeric import check_number
from ..errors import DecodeError
from ..keys import WORKERS_PATTERN, queue_of_workers
from ..models import Heartbeat
from ._connections import username_of
from ._core import Core, boundary, text

ELSEWHERE_SCANS = 20
"""``SCAN`` calls (of 1,000 keys each) at most, looking for workers on other queues."""

ELSEWHERE_QUEUES = 20
"""Other queues' heartbeats read at most."""

DROP_OUT_S = 300.0
"""A consumer of a group that has no live heartbeat, holds no request and has not read for
this long (5 minutes) is a stopped worker: ``toolnexus status`` and
:meth:`RedisBroker.inspect <toolnexus.redis_broker.RedisBroker.inspect>` leave it out.
One that holds requests stays listed, as "no heartbeat (gone?)", until they are claimed."""


async def heartbeat(
    core: Core,
    group: str,
    consumer: str,
    ttl_s: float,
    info: Mapping[str, str | int | float] | None,
) -> None:
    """:meth:`RedisBroker.heartbeat`: one hash per queue (:meth:`Keys.heartbeats`), field
    ``group/consumer``, value an encoded :class:`Heartbeat` (with this toolnexus's version,
    the protocols it reads and the one it writes, in that one). The key's TTL is kept at
    the longest heartbeat's, so a fleet that died leaves nothing behind."""
    check_number("ttl_s", ttl_s, minimum=None)
    key, field = core.keys.heartbeats(), f"{group}/{consumer}"
    with boundary(f"recording the heartbeat of {field}"):
        if ttl_s <= 0:
            await core.bounded(core.redis.hdel(key, field))
            return
        beat = Heartbeat.fresh(group, consumer, ttl_s, info, writes=core.protocol)
        ttl_ms = max(1, int(ttl_s * 1000))
        async with core.redis.pipeline(transaction=True) as pipe:
            pipe.hset(key, field, core.codec.encode(beat))
            pipe.pexpire(key, ttl_ms, nx=True)  # a new key gets this heartbeat's TTL
            pipe.pexpire(key, ttl_ms, gt=True)  # an existing one is only ever extended
            await core.bounded(pipe.execute())


async def heartbeats(core: Core) -> list[Heartbeat]:
    """:meth:`RedisBroker.heartbeats`: the live ones; stale or unreadable fields are
    deleted on the way."""
    key = core.keys.heartbeats()
    with boundary("reading heartbeats"):
        fields: dict[bytes | str, bytes | str] = await core.bounded(core.redis.hgetall(key))
    live, stale = _sorted_out(core, fields)
    if stale:
        with contextlib.suppress(Exception):
            await core.bounded(core.redis.hdel(key, *stale))
    return live


def _sorted_out(
    core: Core, fields: dict[bytes | str, bytes | str]
) -> tuple[list[Heartbeat], list[bytes | str]]:
    """The live heartbeats of a heartbeats hash's ``fields``, and the fields stale or
    unreadable (nobody can read those either; a heartbeat of a newer protocol is neither:
    newer processes read it, so it is left be)."""
    now = time.time()
    live: list[Heartbeat] = []
    stale: list[bytes | str] = []
    for field, raw in fields.items():
        try:
            beat = core.codec.decode_as(raw, Heartbeat)
        except DecodeError:
            if not core.codec.newer(raw):
                stale.append(field)
            continue
        if beat.expires_at > now:
            live.append(beat)
        else:
            stale.append(field)
    return live, stale


async def live_heartbeats(core: Core, key: str | None = None) -> list[Heartbeat]:
    """The live heartbeats in ``key`` (this queue's by default), read only (an agent's ACL
    lets it read heartbeats, not delete them), with this turn's other commands.

    Raises:
        redis-py errors (NOPERM among them), BrokerClosed.
    """
    fields = await core.command("HGETALL", key or core.keys.heartbeats())
    return _sorted_out(core, fields or {})[0]


async def workers_elsewhere(core: Core) -> dict[tuple[str, str], list[Heartbeat]]:
    """The live workers of other queues and namespaces on this Redis, by (namespace, queue):
    bounded work (:data:`ELSEWHERE_SCANS`, :data:`ELSEWHERE_QUEUES`), for a warning. On a
    Cluster, or logged in as a named Redis user (an ACL, whose agents may not ``SCAN``:
    a refused command would fill the ACL log), none are found.

    Raises:
        redis-py errors other than a refused command, BrokerClosed.
    """
    if not core.one_server or username_of(core.url, core.redis_options) not in (None, "default"):
        return {}
    own = core.keys.heartbeats()
    found: list[str] = []
    cursor: Any = 0
    try:
        for _ in range(ELSEWHERE_SCANS):
            cursor, keys = await core.bounded(
                core.redis.scan(cursor, match=WORKERS_PATTERN, count=1000)
            )
            found += [k for k in map(text, keys) if k != own and k not in found]
            if not int(cursor) or len(found) >= ELSEWHERE_QUEUES:
                break
    except redis.exceptions.NoPermissionError:
        return {}
    where: dict[tuple[str, str], list[Heartbeat]] = {}
    for key in found[:ELSEWHERE_QUEUES]:
        queue = queue_of_workers(key)
        if queue is None:
            continue
        try:
            live = await live_heartbeats(core, key)
        except redis.exceptions.ResponseError:  # NOPERM (another namespace), WRONGTYPE
            continue
        if live:
            where[queue] = live
    return where
