"""Worker heartbeats on the Redis broker: one hash per queue, a field per worker."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping

from ..errors import DecodeError
from ..models import Heartbeat
from ..numeric import check_number
from ._core import Core, boundary

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
    ``group/consumer``, value an encoded :class:`Heartbeat`. The key's TTL is kept at the
    longest heartbeat's, so a fleet that died leaves nothing behind."""
    check_number("ttl_s", ttl_s, minimum=None)
    key, field = core.keys.heartbeats(), f"{group}/{consumer}"
    with boundary(f"recording the heartbeat of {field}"):
        if ttl_s <= 0:
            await core.bounded(core.redis.hdel(key, field))
            return
        now = time.time()
        beat = Heartbeat(group, consumer, now, now + ttl_s, dict(info or {}))
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
    now = time.time()
    live: list[Heartbeat] = []
    stale: list[bytes | str] = []
    for field, raw in fields.items():
        try:
            beat = core.codec.decode_as(raw, Heartbeat)
        except DecodeError:
            stale.append(field)  # not a heartbeat: nobody can read it either
            continue
        if beat.expires_at > now:
            live.append(beat)
        else:
            stale.append(field)
    if stale:
        with contextlib.suppress(Exception):
            await core.bounded(core.redis.hdel(key, *stale))
    return live
