"""Escalation on the Redis broker (SPEC §14): a request still unanswered ``after_s`` seconds
after it was created is published to the hop's queue as well.

A hop queue is served like any other: its consumer groups read its request stream, so the
group a request escalates to is the one whose workers read that queue. The hop publishes
the same encoded request, with a route to the same waiter, so an answer from the hop
queue resolves the request's one state like any other answer. One timer serves every hop
of every wait of a process (as one serves every deadline). Each hop is recorded: in the
wait (for the audit record), in the request's state (field ``q``: every queue reached and
its stream entry, which ``toolnexus status`` and responders read), and as an ``escalated``
event (``Event.queue``: the hop's queue) on the events streams of the queues reached
before, whose workers keep showing the request, marked as escalated. Whoever resolves the
request settles it on every queue it reached: the outcome's event, and its entry deleted.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import redis.exceptions

from .._timers import Timers
from ..errors import BrokerClosed
from ..keys import Keys, name_problem
from ..models import EscalatedEvent, Event, Hop, Request
from ._core import CONNECTION_ERRORS, Core, ms, text
from ._layout import QUEUES
from ._scripts import PUBLISH, REACHED

log = logging.getLogger("toolnexus.redis")

RETRY_S = 1.0
"""How soon a hop that Redis could not take is tried again (while the wait lasts)."""

NO_ENTRY = "-"
"""The entry id recorded for a queue whose stream entry is not known."""


class Replies(Protocol):
    """What escalation reads of the reply stream a wait is on."""

    waiter: str
    durable: bool


class Waiting(Protocol):
    """What escalation reads of a wait (the waiter's own record of it)."""

    request_id: str
    deadline_ms: int
    answer: asyncio.Future[Any]
    entry_id: bytes | None
    protocol: int  # its request's: the events about it are written in it


@dataclass(eq=False, slots=True)
class Escalation:
    """The hops of one wait: those planned, and those reached (``taken`` with the seconds
    after ``created_at`` at which each was published, ``reached`` with its queue's keys
    and stream entry). ``final`` is the wait's outcome event once it ended."""

    wait: Waiting
    hops: list[Hop]
    created_at: float
    waiter: str  # the waiter id its state and route are under
    once: bool  # attached to: a hop whose route is this waiter's was published before
    hinted: dict[str, str | None]  # entries the state's hop record names (hints)
    payload: bytes  # the request as published, as each hop publishes it
    taken: list[Hop] = field(default_factory=list)
    reached: list[tuple[Keys, bytes | str]] = field(default_factory=list)
    final: Event | None = None


def queues_field(origin: str, origin_entry: bytes | str | None, reached: Sequence[Any]) -> str:
    """The state's field ``q``: ``queue entry`` pairs, the origin queue first."""
    pairs = [(origin, origin_entry), *((keys.queue, entry) for keys, entry in reached)]
    return " ".join(f"{queue} {text(entry) if entry else NO_ENTRY}" for queue, entry in pairs)


def parse_queues_field(value: bytes | str | None) -> list[tuple[str, str | None]]:
    """The ``(queue, entry id or None)`` pairs of a state's field ``q`` (none if unreadable)."""
    try:
        words = text(value).split() if value else []
    except UnicodeDecodeError:
        return []
    pairs = list(zip(words[::2], words[1::2], strict=False))
    return [(queue, None if entry == NO_ENTRY else entry) for queue, entry in pairs]


def record_reached(
    core: Core, waiter: str, wait: Waiting, reached: Sequence[tuple[Keys, bytes | str]]
) -> None:
    """Record in the state of ``wait`` (of waiter ``waiter``) every queue it was published
    to: this broker's queue (its entry ``wait.entry_id``) and those ``reached``."""
    core.pipeliner.post_batch(
        REACHED,
        (core.keys.answers(waiter), core.keys.alive(waiter)),
        (),
        (core.keys.state(waiter, wait.request_id),),
        (queues_field(core.keys.queue, wait.entry_id, reached),),
        lazy=False,
    )


class Escalator:
    """The hops of every wait of one waiter, on one timer. A hop whose wait has ended is
    dropped when its time comes."""

    def __init__(self, core: Core) -> None:
        self.core = core
        self.published = 0  # hops published
        self._hops: Timers[tuple[Escalation, int]] = Timers(self._due, self._ended)
        self._keys: dict[str, Keys] = {}

    def plan(
        self,
        request: Request,
        wait: Waiting,
        replies: Replies,
        payload: bytes,
        reached: Sequence[tuple[str, str | None]] | None = None,
    ) -> Escalation | None:
        """Schedule the hops of ``request`` (checked already; as published, encoded as
        ``payload``; signed, with its ``created_at``, if this process signs), waited for as
        ``wait`` on ``replies`` (its waiter id). Every hop is published when due by the
        signed plan and this process's clock. A wait attached to a durable request
        (``reached``: the queues its state's hop record names, a hint, SPEC §11) skips a
        hop only where the hop queue's route is this waiter's already, which the publish
        script checks: a forged hop record suppresses nothing."""
        if not request.escalate:
            return None
        escalation = Escalation(
            wait,
            list(request.escalate),
            request.created_at,
            replies.waiter,
            replies.durable and reached is not None,
            dict(reached or ()),
            payload,
        )
        loop = asyncio.get_running_loop()
        offset = loop.time() - time.time()
        for index, hop in enumerate(escalation.hops):
            self._hops.add(request.created_at + hop.after_s + offset, (escalation, index))
        return escalation

    def _ended(self, hop: tuple[Escalation, int]) -> bool:
        return hop[0].wait.answer.done() or self.core.closed

    def _due(self, hop: tuple[Escalation, int]) -> None:
        self._publish(*hop)

    def _keys_of(self, queue: str) -> Keys:
        keys = self._keys.get(queue)
        if keys is None:
            keys = self._keys[queue] = Keys(self.core.settings.namespace, queue)
        return keys

    def _publish(self, escalation: Escalation, index: int) -> None:
        """Add the request to the hop's request stream, with a route to this waiter."""
        core, wait = self.core, escalation.wait
        settings = core.settings
        keys = self._keys_of(escalation.hops[index].queue)
        now_ms = ms(time.time())
        added = core.pipeliner.batch(
            PUBLISH,
            (keys.requests,),
            (
                max(0, now_ms - settings.stream_retention_ms) // 1000 * 1000,
                escalation.waiter,
                core.protocol,
            ),
            (keys.route(wait.request_id),),
            (
                escalation.payload,
                max(1, wait.deadline_ms - now_ms) + settings.retention_ms,
                int(escalation.once),
            ),
        )
        added.add_done_callback(functools.partial(self._on_published, escalation, index, keys))

    def _on_published(
        self, escalation: Escalation, index: int, keys: Keys, added: asyncio.Future[Any]
    ) -> None:
        core, wait = self.core, escalation.wait
        hop = escalation.hops[index]
        error = None if added.cancelled() else added.exception()
        if added.cancelled() or isinstance(error, BrokerClosed):
            return
        if error is not None:
            if isinstance(error, CONNECTION_ERRORS) and not wait.answer.done():
                log.warning("escalating %s to %s: %s; retrying", wait.request_id, hop.queue, error)
                loop = asyncio.get_running_loop()
                self._hops.add(loop.time() + RETRY_S, (escalation, index))
            else:
                log.error("escalating %s to %s failed: %s", wait.request_id, hop.queue, error)
            return
        # published there by an earlier wait (None): its entry as the hop record says
        entry: Any = added.result()
        if entry is None:
            entry = escalation.hinted.get(hop.queue) or ""
        if entry == 0:  # refused: another waiter owns this id on that queue
            log.error(
                "escalating %s to %s: the id is owned by another waiter there",
                wait.request_id,
                hop.queue,
            )
            return
        earlier = [core.keys, *(k for k, _ in escalation.reached)]
        escalation.reached.append((keys, entry))
        escalation.taken.append(Hop(round(time.time() - escalation.created_at, 3), hop.queue))
        self.published += 1
        log.info("request %s escalated to queue %s", wait.request_id, hop.queue)
        record_reached(core, escalation.waiter, wait, escalation.reached)
        if escalation.final is not None:  # the wait ended while this hop was on its way
            core.settle(escalation.final, delete=entry, keys=keys, protocol=wait.protocol)
            return
        event = EscalatedEvent(id=wait.request_id, queue=hop.queue)
        for earlier_keys in earlier:
            core.settle(event, keys=earlier_keys, protocol=wait.protocol)

    def settle(self, escalation: Escalation, event: Event) -> None:
        """Settle the outcome ``event`` of an ended wait on every hop queue it reached
        (its own queue is the waiter's to settle), and on those still being reached."""
        escalation.final = event
        for keys, entry in escalation.reached:
            self.core.settle(event, delete=entry, keys=keys, protocol=escalation.wait.protocol)

    def close(self) -> None:
        self._hops.close()


async def settle_reached(
    core: Core, request: Request, event: Event, entry: str | None, protocol: int
) -> None:
    """Settle ``event`` (an expiry or withdrawal a responder recorded) on this queue,
    deleting ``entry``, and on every other queue the request's state says it reached; in
    ``protocol``, the request's."""
    core.settle(event, delete=entry, protocol=protocol)
    if not request.escalate or request.reply_to is None:
        return
    state = core.keys.state(request.reply_to, request.id)
    try:
        reached = parse_queues_field(await core.command("HGET", state, QUEUES))
    except (redis.exceptions.RedisError, OSError, BrokerClosed) as exc:
        log.warning("settling %s on the queues it escalated to: %s", request.id, exc)
        return
    for queue, queue_entry in reached:
        if queue != core.keys.queue and name_problem(queue) is None:
            keys = Keys(core.settings.namespace, queue)
            core.settle(event, delete=queue_entry, keys=keys, protocol=protocol)
