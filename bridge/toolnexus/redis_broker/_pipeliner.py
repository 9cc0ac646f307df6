"""One shared mechanism for the Redis broker's commands: everything issued during one
event-loop turn goes to Redis as one pipeline, whoever issued it, and the items of
batch scripts (:mod:`toolnexus.redis_broker._scripts`) for the same slot become one ``EVAL``.

A thousand concurrent waits publishing, or a responder answering a batch, cost one
round trip and a few commands instead of thousands, with no task or timer per item.

*Lazy* items (events, acknowledgements, audit records: what nobody waits for) do not start
a pipeline: they travel behind the urgent items of the next one, or go out after
``LAZY_DELAY_S``. Work that only issues lazy items can be put off until the next pipeline
is written (:meth:`Pipeliner.after_send`): off the path of the commands issued meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import redis.exceptions
from redis.asyncio.cluster import RedisCluster

from .._timers import Bound
from ..errors import BrokerClosed
from ._connections import Client
from ._redispy import Direct, direct
from ._scripts import SCRIPTS, BatchScript

log = logging.getLogger("toolnexus.redis")

_Target = asyncio.Future[Any] | Callable[[Any], object] | None
"""Where an item's reply goes: its future, a handler called with it at once (the reply, or
the exception of a failure), or nowhere (a posted item: a failure is logged)."""

_Item = tuple[tuple[Any, ...], _Target]


class Unconfirmed(Exception):
    """What an item issued with ``confirm=True`` gets instead of its reply when the
    pipeline's ``WAIT`` counted fewer replicas than asked (the write is on the master, and
    may be lost in a failover): ``reply`` is the reply, ``replicas`` the count."""

    def __init__(self, reply: Any, replicas: int, required: int) -> None:
        super().__init__(f"WAIT confirmed {replicas} of {required} replicas")
        self.reply, self.replicas, self.required = reply, replicas, required


MAX_BATCH_ITEMS = 128
"""Items in one batch ``EVAL``."""

LAZY_DELAY_S = 0.02
"""How long lazy items (events, acknowledgements, audit records) wait, at most, for urgent
ones to travel with."""

MAX_PIPELINE_ITEMS = 512
"""Items (commands or batch items) in one pipeline; a larger queue goes out in several,
one after another, so a burst of thousands never holds all its bytes in flight at once."""


class _Batch:
    """The items of one batch script for one slot, collected during one turn."""

    __slots__ = ("item_args", "item_keys", "script", "shared_args", "shared_keys", "targets")

    def __init__(
        self, script: BatchScript, shared_keys: tuple[str, ...], shared_args: tuple[Any, ...]
    ) -> None:
        self.script, self.shared_keys, self.shared_args = script, shared_keys, shared_args
        self.item_keys: list[str] = []
        self.item_args: list[Any] = []
        self.targets: list[_Target] = []

    def command(self) -> tuple[Any, ...]:
        keys = [*self.shared_keys, *self.item_keys]
        return ("EVALSHA", self.script.sha, len(keys), *keys, *self.shared_args, *self.item_args)

    def settle(
        self,
        reply: Any,
        check: Callable[[_Target, Any, int | None], Any] | None = None,
        acked: int | None = None,
    ) -> None:
        failed = isinstance(reply, Exception)
        for i, target in enumerate(self.targets):  # one reply per item, or one for all
            one = reply if failed or not isinstance(reply, list) else reply[i]
            _deliver(target, one if check is None else check(target, one, acked))


class Pipeliner:
    """Coalesces commands into pipelines: :meth:`call` and :meth:`batch` return futures;
    :meth:`post` and :meth:`post_batch` send what nobody awaits."""

    def __init__(
        self,
        redis_: Client,
        *,
        timeout_s: float,
        wait: tuple[int, int] | None = None,
        scripts: tuple[BatchScript, ...] = SCRIPTS,
        public_api: bool = False,
        demotable: bool = False,
    ) -> None:
        """``wait=(replicas, timeout_ms)`` ends every pipeline with a ``WAIT`` on each
        node it wrote to (see ``durability`` in :mod:`._core`). ``public_api``: send
        redis-py pipelines even on one server (see :mod:`._redispy`). ``demotable``: the
        server is a master Sentinel may demote, so a ``READONLY`` reply is a fault of the
        connection (the master is now a replica), retried, not a refusal."""
        self._redis = redis_
        # On one server, the connection it sends on (None: on a Cluster, or public_api)
        self._direct = direct(redis_, public_api)
        self._bound = Bound()  # each pipeline's replies within timeout_s, one timer for all
        self._wait = wait
        self._demotable = demotable
        self.timeout_s = timeout_s
        self._scripts = {script.sha: script for script in scripts}
        self._load_scripts = True
        self._queue: list[_Item | _Batch] = []  # urgent
        self._batches: dict[tuple[Any, ...], _Batch] = {}
        self._lazy: list[_Item | _Batch] = []
        self._lazy_batches: dict[tuple[Any, ...], _Batch] = {}
        self._task: asyncio.Task[None] | None = None
        self._lazy_timer: asyncio.TimerHandle | None = None
        self._lazy_due = False  # lazy items go out now, urgent ones or not
        self._later: list[Callable[[], object]] = []  # see after_send
        self._confirming: set[Any] = set()  # targets that get Unconfirmed if WAIT falls short
        self._holding = False  # items issued now are sent by their caller (see sending)
        self._inline: asyncio.Future[None] | None = None  # a caller's pipeline on its way
        self.round_trips = 0

    def _schedule(self) -> None:
        if self._holding:
            return
        if self._lazy_timer is not None:
            self._lazy_timer.cancel()
            self._lazy_timer = None
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name="toolnexus-pipeliner"
            )

    def _schedule_lazy(self) -> None:
        if self._lazy_timer is None and self._task is None:
            loop = asyncio.get_running_loop()
            self._lazy_timer = loop.call_later(LAZY_DELAY_S, self._lazy_delay_over)

    def _lazy_delay_over(self) -> None:
        self._lazy_timer = None
        self._run_later()
        if self._lazy or self._queue:
            self._lazy_due = True
            self._schedule()

    def after_send(self, work: Callable[[], object]) -> None:
        """Run ``work``, which issues only lazy items, once the next pipeline is written
        (or after ``LAZY_DELAY_S``): put off until the commands issued meanwhile are on
        their way. A failure of ``work`` is logged."""
        self._later.append(work)
        self._schedule_lazy()

    def _run_later(self) -> None:
        work, self._later = self._later, []
        for deferred in work:
            try:
                deferred()
            except Exception:
                log.exception("work put off until after a pipeline failed")

    def call(self, *args: Any, lazy: bool = False, confirm: bool = False) -> asyncio.Future[Any]:
        """Send command ``args`` with the others of this turn; its future gets the reply.
        A ``lazy`` one goes with the lazy items (see the module's docstring). With
        ``confirm`` (and a ``wait``), the future gets :class:`Unconfirmed` instead if the
        pipeline's ``WAIT`` counted fewer replicas than asked."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._add((args, future), lazy)
        self._confirm(future, confirm)
        return future

    def _confirm(self, target: _Target, confirm: bool) -> None:
        if confirm and self._wait is not None and target is not None:
            self._confirming.add(target)

    def post(self, *args: Any, lazy: bool = True) -> None:
        """Send command ``args``, lazy unless told otherwise, and let its reply go; a
        failure is logged."""
        self._add((args, None), lazy)

    def _add(self, item: _Item, lazy: bool) -> None:
        if lazy:
            self._lazy.append(item)
            self._schedule_lazy()
        else:
            self._queue.append(item)
            self._schedule()

    def batch(
        self,
        script: BatchScript,
        shared_keys: tuple[str, ...],
        shared_args: tuple[Any, ...],
        item_keys: tuple[str, ...],
        item_args: tuple[Any, ...],
        *,
        lazy: bool = False,
        confirm: bool = False,
    ) -> asyncio.Future[Any]:
        """Add one item to this turn's ``EVALSHA`` of ``script`` for ``shared_keys`` (which
        fix the slot) and ``shared_args``; its future gets the item's reply. A ``lazy``
        item waits up to ``LAZY_DELAY_S`` for other commands to travel with. ``confirm``:
        as for :meth:`call`.

        A script Redis forgot (after a restart) is loaded again and its batch sent again;
        every script is loaded before the first command after a lost connection, so that
        a script failing where the next command depends on it stays a rare event.
        """
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._confirm(future, confirm)
        self._add_to_batch(script, shared_keys, shared_args, item_keys, item_args, future, lazy)
        return future

    def post_batch(
        self,
        script: BatchScript,
        shared_keys: tuple[str, ...],
        shared_args: tuple[Any, ...],
        item_keys: tuple[str, ...],
        item_args: tuple[Any, ...],
        *,
        lazy: bool = True,
        on_reply: Callable[[Any], object] | None = None,
        confirm: bool = False,
    ) -> None:
        """As :meth:`batch`, lazy unless told otherwise, with no future: ``on_reply`` (if
        any) is called with the item's reply, or with the exception if it failed, as soon
        as it is read; without it, a failure is logged. ``confirm``: as for :meth:`call`
        (``on_reply`` gets the :class:`Unconfirmed`)."""
        self._confirm(on_reply, confirm)
        self._add_to_batch(script, shared_keys, shared_args, item_keys, item_args, on_reply, lazy)

    def _add_to_batch(
        self,
        script: BatchScript,
        shared_keys: tuple[str, ...],
        shared_args: tuple[Any, ...],
        item_keys: tuple[str, ...],
        item_args: tuple[Any, ...],
        target: _Target,
        lazy: bool,
    ) -> None:
        assert len(item_keys) == script.keys_per_item and len(item_args) == script.args_per_item
        group = (script.name, shared_keys, shared_args)
        batches = self._lazy_batches if lazy else self._batches
        pending = batches.get(group)
        if pending is not None and len(pending.targets) >= MAX_BATCH_ITEMS:
            batches.clear()  # only batches behind this one may take items now: see _run
            pending = None
        if pending is None:
            pending = batches[group] = _Batch(script, shared_keys, shared_args)
            (self._lazy if lazy else self._queue).append(pending)
        if lazy:
            self._schedule_lazy()
        else:
            self._schedule()
        pending.item_keys.extend(item_keys)
        pending.item_args.extend(item_args)
        pending.targets.append(target)

    def sending(self, now: bool = True) -> _Sending:
        """``async with pipeliner.sending(): <issue commands, without awaiting>``: on leaving,
        the urgent commands issued are sent at once, by this task, if no pipeline is on its
        way or queued (the pipeliner's task would send them a turn later); else as usual.
        For a caller that waits for their replies next and expects no company: they cost
        no turn. (Others issuing in the same turn would wait for them, on the one
        connection, so a busy caller passes ``now=False``: as usual.)"""
        return _Sending(self, now)

    async def _send_held(self) -> None:
        self._holding = False
        if not self._queue:
            return
        if self._task is not None or self._inline is not None:
            self._schedule()
            return
        inline = self._inline = asyncio.get_running_loop().create_future()
        queue = _take(self._queue, MAX_PIPELINE_ITEMS)  # only this caller's: see sending
        self._batches.clear()
        try:
            await self._send(queue)
        finally:
            self._inline = None
            inline.set_result(None)
            if self._queue:
                self._schedule()

    async def _run(self) -> None:
        try:
            while self._inline is not None:  # one pipeline at a time on the connection
                await asyncio.shield(self._inline)
            while self._queue or (self._lazy and self._lazy_due):
                queue = _take(self._queue, MAX_PIPELINE_ITEMS)
                queue += _take(self._lazy, MAX_PIPELINE_ITEMS)
                self._lazy_due = self._lazy_due and bool(self._lazy)
                # Items issued from now on go to new batches at the end of the queue, so that
                # what one caller issues in order runs in that order (a request's state is
                # opened before it is published). Joining a batch still queued could put an
                # item ahead of one its caller issued before. (Lazy items go after the
                # urgent ones they travel with: nothing depends on them.)
                self._batches.clear()
                self._lazy_batches.clear()
                if queue:
                    await self._send(queue)
        finally:
            self._task = None
            if self._lazy or self._later:  # issued while the last pipeline was out
                self._schedule_lazy()

    async def _send(self, queue: list[_Item | _Batch]) -> None:
        commands = _commands(queue)
        try:
            with self._bound(self.timeout_s):  # a peer that never replies is a fault
                replies = await self._execute(commands)
        except Exception as exc:  # every caller gets the failure, e.g. a lost connection
            if isinstance(exc, redis.exceptions.ConnectionError | OSError):
                self._load_scripts = True  # Redis may come back without them
            self._forget_confirming(queue)
            _fail(queue, exc)
            return
        except asyncio.CancelledError:
            self._forget_confirming(queue)
            _fail(queue, BrokerClosed("the broker was closed"))
            raise
        if self._demotable and any(
            isinstance(reply, redis.exceptions.ReadOnlyError) for reply in replies
        ):
            # A master demoted to a replica (a Sentinel failover it was partitioned from):
            # a fault of the connection, as redis-py's Sentinel connections say it, so that
            # callers retry on the new master instead of taking READONLY as a refusal.
            if self._direct is not None:
                await self._direct.abandon()
            self._forget_confirming(queue)
            _fail(queue, redis.exceptions.ConnectionError("the master is now a replica"))
            return
        self._settle(queue, replies)

    def _checked(self, target: _Target, reply: Any, acked: int | None) -> Any:
        """``reply``, or :class:`Unconfirmed` for a ``confirm`` item whose ``WAIT`` counted
        fewer replicas than asked (``acked``)."""
        if target not in self._confirming:
            return reply
        self._confirming.discard(target)
        assert self._wait is not None
        required = self._wait[0]
        if acked is None or acked >= required or isinstance(reply, Exception):
            return reply
        return Unconfirmed(reply, acked, required)

    def _forget_confirming(self, queue: list[_Item | _Batch]) -> None:
        if self._confirming:
            for entry in queue:
                for target in entry.targets if isinstance(entry, _Batch) else (entry[1],):
                    self._confirming.discard(target)

    def _settle(self, queue: list[_Item | _Batch], replies: list[Any]) -> None:
        """Hand out ``replies``: those of the commands of ``queue``, then (with a ``wait``)
        those of the ``WAIT`` commands after them, which items issued with ``confirm``
        check (see :meth:`call`)."""
        acked = _fewest(replies[len(queue) :]) if self._wait is not None else None
        check = self._checked if self._confirming else None
        forgotten = []
        for entry, reply in zip(queue, replies[: len(queue)], strict=True):
            if isinstance(reply, redis.exceptions.NoScriptError):
                forgotten.append(entry)
            elif isinstance(entry, _Batch):
                entry.settle(reply, check, acked)
            else:
                _deliver(entry[1], reply if check is None else check(entry[1], reply, acked))
        if forgotten:  # Redis lost its scripts (restart, SCRIPT FLUSH): load, send again
            log.warning("Redis forgot the toolnexus scripts; loading them again")
            self._load_scripts = True
            self._queue[:0] = forgotten
            self._schedule()

    async def _execute(self, commands: list[tuple[Any, ...]]) -> list[Any]:
        if self._load_scripts:
            for script in self._scripts.values():
                await self._redis.script_load(script.source)
            self._load_scripts = False
        self.round_trips += 1
        if self._direct is not None:
            return await self._execute_directly(self._direct, commands)
        self._run_later()  # (redis-py's pipeline writes and reads in one call)
        if len(commands) == 1 and self._wait is None:  # no pipeline needed for one command
            try:
                return [await self._redis.execute_command(*commands[0])]
            except redis.exceptions.ResponseError as exc:
                return [exc]
        async with self._redis.pipeline(transaction=False) as pipe:
            for command in commands:
                pipe.execute_command(*command)
            if self._wait is not None:
                self._add_waits(pipe, commands)
            replies: list[Any] = await pipe.execute(raise_on_error=False)
            return replies  # those of WAIT last

    async def _execute_directly(
        self, connection: Direct, commands: list[tuple[Any, ...]]
    ) -> list[Any]:
        """The commands written at once, then every reply read: what a redis-py pipeline
        does, without building one, on the one connection this pipeliner keeps (it sends
        one pipeline at a time), without checking a connection out of redis-py's pool
        (which checks it each time) (docs/explanation/performance.md gives the gain).
        Replies are as Redis sent them (no response callbacks); an error reply is the
        exception, in its place. A connection failing or cancelled mid-reply is closed
        (and connected again for the next pipeline), never read again."""
        sent = commands if self._wait is None else [*commands, ("WAIT", *self._wait)]
        try:
            await connection.write(sent)
            self._run_later()
            replies = await connection.replies(len(sent))
        except BaseException:
            await connection.abandon()
            raise
        return replies  # that of WAIT last

    def _add_waits(self, pipe: Any, commands: list[tuple[Any, ...]]) -> None:
        """A ``WAIT`` after the writes, on each Cluster node they went to (WAIT counts
        the replicas that acknowledged everything this connection wrote before it)."""
        assert self._wait is not None
        if not isinstance(self._redis, RedisCluster):  # one server, public_api
            pipe.execute_command("WAIT", *self._wait)
            return
        nodes = {}
        for command in commands:
            if command[0] == "EVALSHA":
                key = command[3] if command[2] else None
            else:
                key = command[1] if len(command) > 1 else None
            node = self._redis.get_node_from_key(key) if key is not None else None
            if node is not None:
                nodes[node.name] = node
        for node in nodes.values():
            pipe.execute_command("WAIT", *self._wait, target_nodes=node)

    async def drain(self) -> None:
        """Wait until everything issued so far has been sent (work put off included)."""
        self._run_later()
        if self._queue or self._lazy:
            self._lazy_due = True
            self._schedule()
        while self._task is not None or self._inline is not None:
            if self._inline is not None:
                await asyncio.shield(self._inline)
            if self._task is not None:
                await asyncio.shield(self._task)

    def close(self) -> None:
        """Stop: commands not yet sent fail with :class:`~toolnexus.BrokerClosed`."""
        self._bound.close()
        if self._lazy_timer is not None:
            self._lazy_timer.cancel()
        if self._task is not None:
            self._task.cancel()
        for queue in (self._queue, self._lazy):
            _fail(queue, BrokerClosed("the broker was closed"))
            queue.clear()
        self._later.clear()
        self._confirming.clear()
        self._batches.clear()
        self._lazy_batches.clear()


class _Sending:
    """The context of :meth:`Pipeliner.sending`."""

    __slots__ = ("_now", "_pipeliner")

    def __init__(self, pipeliner: Pipeliner, now: bool) -> None:
        self._pipeliner, self._now = pipeliner, now

    async def __aenter__(self) -> None:
        self._pipeliner._holding = self._now

    async def __aexit__(self, *exc: object) -> None:
        if self._now:
            await self._pipeliner._send_held()


def _commands(queue: list[_Item | _Batch]) -> list[tuple[Any, ...]]:
    return [entry.command() if isinstance(entry, _Batch) else entry[0] for entry in queue]


def _fewest(waits: list[Any]) -> int:
    """The fewest replicas the replies of ``WAIT`` commands counted (a failed one: 0)."""
    return min((w if isinstance(w, int) else 0 for w in waits), default=0)


def _take(queue: list[_Item | _Batch], most: int) -> list[_Item | _Batch]:
    """The first entries of ``queue``, removed from it, up to ``most`` items in all."""
    size, items = 0, 0
    for entry in queue:
        items += len(entry.targets) if isinstance(entry, _Batch) else 1
        size += 1
        if items >= most:
            break
    taken = queue[:size]
    del queue[:size]
    return taken


def _fail(queue: list[_Item | _Batch], exc: BaseException) -> None:
    for entry in queue:
        for target in entry.targets if isinstance(entry, _Batch) else (entry[1],):
            _deliver(target, exc)


def _deliver(target: _Target, reply: Any) -> None:
    """Hand ``reply`` (an exception: the item failed) to where the item's reply goes."""
    if isinstance(target, asyncio.Future):
        if not target.done():
            if isinstance(reply, BaseException):
                target.set_exception(reply)
            else:
                target.set_result(reply)
    elif target is not None:
        try:
            target(reply)
        except Exception:
            log.exception("handling a Redis reply failed")
    elif isinstance(reply, Exception) and not isinstance(reply, BrokerClosed):
        log.warning("background Redis command failed: %s", reply)
