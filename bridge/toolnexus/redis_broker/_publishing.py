"""Publishing a wait's request on the Redis broker: its state opened and its entry added
to the queue's request stream (one script on one server, one per slot on a Cluster), and
published again, with backoff, while Redis is away.

A publish also looks, now and then and in the background, whether anybody reads the
queue: with no worker's heartbeat fresh on it, a warning names the namespace, the queue
and the workers alive elsewhere (:meth:`Publisher.look_for_readers`).

A plain wait does not hold its encoded request once it is published: it is encoded again
from the caller's request in the rare case it must be published again (Redis lost it, or
it was reopened), which gives the same bytes. A wait that signs, checks its answers or is
durable keeps the encoding (see :class:`~toolnexus.redis_broker._wait.Wait`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Sequence
from typing import Any

import msgspec
import redis.exceptions

from ..errors import BrokerClosed, InvalidRequest
from ..models import UNAVAILABLE, Answer, Heartbeat, Request
from ._core import CONNECTION_ERRORS, Backoff, Core, ms
from ._escalation import record_reached
from ._heartbeats import live_heartbeats, workers_elsewhere
from ._scripts import OPEN, OPEN_PUBLISH, PUBLISH
from ._wait import Wait

log = logging.getLogger("toolnexus.redis")

LOOK_EVERY_S = 10.0
"""How often at most a waiter looks whether anybody reads its queue (on a publish, in the
background: a publish never waits for it)."""

NAMED_WORKERS = 5
"""Workers named at most per queue in the warning that nobody reads a queue."""


def unread_warning(
    namespace: str, queue: str, request_id: str, elsewhere: dict[tuple[str, str], list[Heartbeat]]
) -> str:
    """The warning that nobody reads ``queue``: where the workers alive are instead (this
    namespace's queues first)."""
    places = []
    own_first = sorted(elsewhere.items(), key=lambda item: (item[0][0] != namespace, item[0]))
    for (ns, q), beats in own_first:
        names = sorted(f"{b.group}/{b.consumer}" for b in beats)
        more = f" and {len(names) - NAMED_WORKERS} more" if len(names) > NAMED_WORKERS else ""
        where = f"queue {q!r}" if ns == namespace else f"namespace {ns!r} queue {q!r}"
        places.append(f"{where}: {', '.join(names[:NAMED_WORKERS])}{more}")
    alive = (
        "workers alive elsewhere: " + "; ".join(places)
        if places
        else "no worker is alive on any other queue this process can see either"
    )
    return (
        f"nobody reads queue {queue!r} of namespace {namespace!r}: no worker has a fresh "
        f"heartbeat there, so request {request_id} waits for one until its deadline ({alive})"
    )


class Publisher:
    """Publishes the requests of one waiter's waits."""

    def __init__(self, core: Core) -> None:
        self.core = core
        self._unpublished: set[Wait] = set()
        self._republisher: asyncio.Task[None] | None = None
        self._looked_at = -LOOK_EVERY_S
        self._looking: asyncio.Task[None] | None = None
        self._may_look = True  # False once Redis refused (an ACL without the heartbeats)

    def as_published(
        self, request: Request, deadline: float, allow: Sequence[str] | None, reply_to: str
    ) -> Request:
        """``request`` as published: with its deadline, reply stream and allow-list."""
        changes: dict[str, Any] = {"expires_at": deadline, "reply_to": reply_to}
        if allow is not None:
            changes["allow"] = list(allow)
        return msgspec.structs.replace(request, **changes)

    def published(self, wait: Wait) -> Request:
        """The request of ``wait`` as published (signed if this process signs)."""
        if wait.payload is not None:
            return self.core.codec.decode_as(wait.payload, Request)
        # not kept: this process does not sign, so the request as published is this
        return self.as_published(wait.asked, wait.expires_at, wait.allow, wait.replies.waiter)

    def payload(self, wait: Wait) -> bytes:
        """The request of ``wait`` as published, encoded: as kept, or encoded again."""
        if wait.payload is not None:
            return wait.payload
        return self.core.codec.encode(self.published(wait))

    def publish(self, wait: Wait, again: bool = False) -> None:
        """Open the request's state and add it to the request stream, with everything else
        sent this turn: in one script on one server, else one per slot. If Redis is away,
        :meth:`_republish` tries again. A durable request is added only if its route does
        not exist yet (processes attaching at once publish it once between them), unless
        published ``again`` (reopened). A request whose id another waiter owns is refused
        (see :meth:`_took`)."""
        core = self.core
        payload = self.payload(wait)
        settings, keys, call = core.settings, core.keys, core.pipeliner
        replies = wait.replies
        now_ms = ms(time.time())
        ttl_ms = max(1, wait.deadline_ms - now_ms) + settings.retention_ms
        liveness_ms = 0 if replies.durable else settings.liveness_ms
        # trimmed by age, to the second so that one turn's publishes share a batch
        min_id = max(0, now_ms - settings.stream_retention_ms) // 1000 * 1000
        once = int(replies.durable and not again)
        state = keys.state(replies.waiter, wait.request_id)
        if not again:
            self.look_for_readers(wait.request_id)
        if core.one_server:
            call.post_batch(
                OPEN_PUBLISH,
                (replies.key, replies.alive_key, keys.requests),
                (liveness_ms, min_id, replies.waiter),
                (state, keys.route(wait.request_id)),
                (wait.deadline_ms, payload, ttl_ms, int(replies.durable), once),
                lazy=False,
                on_reply=functools.partial(self._on_reply, wait),
            )
            return
        opened = call.batch(
            OPEN,
            (replies.key, replies.alive_key),
            (liveness_ms,),
            (state,),
            (wait.deadline_ms, payload, ttl_ms, int(replies.durable)),
        )
        added = call.batch(
            PUBLISH,
            (keys.requests,),
            (min_id, replies.waiter),
            (keys.route(wait.request_id),),
            (payload, ttl_ms, once),
        )
        added.add_done_callback(functools.partial(self._on_published, wait, opened))

    def look_for_readers(self, request_id: str) -> None:
        """Unless looked at less than :data:`LOOK_EVERY_S` ago, look in the background
        whether any worker reads this queue (a fresh heartbeat), and warn if none does."""
        now = time.monotonic()
        if not self._may_look or self._looking is not None or now - self._looked_at < LOOK_EVERY_S:
            return
        self._looked_at = now
        self._looking = asyncio.get_running_loop().create_task(self._look(request_id))

    async def _look(self, request_id: str) -> None:
        core = self.core
        try:
            if await live_heartbeats(core):
                return
            elsewhere = await workers_elsewhere(core)
        except redis.exceptions.NoPermissionError as exc:
            self._may_look = False
            log.debug("cannot look whether anybody reads the queue: %s", exc)
            return
        except (*CONNECTION_ERRORS, BrokerClosed, redis.exceptions.RedisError) as exc:
            log.debug("looking whether anybody reads the queue: %s", exc)
            return
        finally:
            self._looking = None
        keys = core.keys
        log.warning(unread_warning(keys.namespace, keys.queue, request_id, elsewhere))

    def _on_published(
        self, wait: Wait, opened: asyncio.Future[Any], added: asyncio.Future[Any]
    ) -> None:
        """On a Cluster: the replies of the request's ``OPEN`` and ``PUBLISH``."""
        done = [f.exception() for f in (opened, added) if f.done() and not f.cancelled()]
        errors = [e for e in done if e is not None]
        self._took(wait, errors, None if errors else added.result())

    def _on_reply(self, wait: Wait, reply: Any) -> None:
        """On one server: the reply of the request's ``OPEN_PUBLISH`` (or its failure)."""
        if isinstance(reply, BaseException):
            self._took(wait, [reply], None)
        else:
            self._took(wait, [], reply)

    def _took(self, wait: Wait, errors: list[BaseException], entry: Any) -> None:
        """What became of publishing ``wait``: published (``entry`` its stream entry, or
        none for a durable request published by an earlier wait), refused (``entry`` 0:
        another waiter owns its id, SPEC §11: the wait ends with :class:`InvalidRequest`),
        or ``errors``."""
        if not errors and entry == 0:
            if not wait.answer.done():
                wait.answer.set_exception(
                    InvalidRequest(f"request id {wait.request_id!r} is owned by another waiter")
                )
        elif not errors:
            wait.published = True
            if not wait.keeps:
                wait.payload = None  # encoded again if it must be published again
            if entry:  # (a durable request published by an earlier wait gives none)
                if wait.entry_id is not None and wait.entry_id != entry:
                    # published again (reopened): its old entry would stay open for good
                    self.core.settle(delete=wait.entry_id)
                wait.entry_id = entry
                if wait.replies.durable:  # where it is, for the next wait that attaches
                    reached = wait.escalation.reached if wait.escalation is not None else ()
                    record_reached(self.core, wait.replies.waiter, wait, reached)
        elif any(isinstance(e, BrokerClosed) for e in errors):
            return
        elif all(isinstance(e, CONNECTION_ERRORS) for e in errors):
            if not wait.answer.done() and not self.core.closed:
                self._unpublished.add(wait)
                if self._republisher is None:
                    self._republisher = asyncio.get_running_loop().create_task(self._republish())
        elif not wait.answer.done():  # Redis refuses: this wait cannot be served
            log.error("publishing %s failed: %s", wait.request_id, errors[0])
            wait.answer.set_result(Answer(id=wait.request_id, ok=False, reason=UNAVAILABLE))

    async def _republish(self) -> None:
        """The one task that publishes again what Redis could not take, with backoff."""
        backoff = Backoff()
        try:
            while self._unpublished and not self.core.closed:
                await backoff.wait("publishing requests", ConnectionError("Redis is away"))
                waits, self._unpublished = self._unpublished, set()
                for wait in waits:
                    if not wait.answer.done():
                        self.publish(wait)
                with contextlib.suppress(*CONNECTION_ERRORS, BrokerClosed):
                    await self.core.pipeliner.drain()
        finally:
            self._republisher = None

    def close(self) -> None:
        for task in (self._republisher, self._looking):
            if task is not None:
                task.cancel()
