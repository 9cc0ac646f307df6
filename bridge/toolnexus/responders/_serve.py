"""The responder SDK (SPEC §12): a worker implements "show this request" and "it is gone".

**Delivery is at least once.** A request can reach a worker again (after a crash,
a reconnect, a lapsed lease), so ``show()`` must be idempotent, and an answer
refused with :class:`~toolnexus.AlreadyResolved` means "someone else was first".

    class Approver(Worker):
        group = "ops-bot"

        async def show(self, pending: Pending) -> None:
            await pending.accept()

    statistics = await serve(broker, Approver())      # until SIGTERM; or until_idle=True

Each delivered request's ``show()`` runs in a task of its own, at most
``concurrency`` at once. A bot answers before returning; a UI returns at once and
answers later through the same ``pending`` (when the person clicks). The service
follows :meth:`Broker.events`: when a shown request is answered by someone else,
expires or is withdrawn, its still-running ``show()`` is cancelled and ``gone()`` is
called, once per shown request. When a shown request escalates to another queue (SPEC
§14), ``escalated()`` is called and the request stays shown.
"""

from __future__ import annotations

import abc
import asyncio
import collections
import contextlib
import logging
import os
import signal
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from .._broker import Broker, EventStream, Pending, Responder
from .._numeric import MAX_COUNT, check_number
from .._outcomes import expired_answer
from .._timers import Timers
from ..errors import (
    AlreadyVoted,
    BrokerUnavailable,
    ConfigurationError,
    InvalidAnswer,
    NotAllowed,
    NotResolved,
)
from ..lifecycle import RESOLUTIONS, Status
from ..models import (
    Answer,
    AnsweredEvent,
    ApprovedEvent,
    EndedEvent,
    EscalatedEvent,
    Event,
    ExpiredEvent,
    Request,
    WithdrawnEvent,
    ended_event,
)
from ..observability._tracing import responder_span, wants_span

log = logging.getLogger("toolnexus.serve")

Handler = Callable[[Pending], Awaitable[None]]
"""A worker as a plain function: ``async (pending) -> None``, i.e. its ``show()``."""

_RECENT = 10_000  # how many resolved ids are remembered, for deliveries that lag their event
_PROVIDER_CHECK_S = 0.01  # "is a tracer provider set?" is asked this often, not per request


def approvals_line(event: ApprovedEvent) -> str:
    """A quorum's progress (an ``approved`` event) as people read it: ``1 of 2 approvals:
    ops / web:alice`` (SPEC §14)."""
    approvers = ", ".join(event.approvers)
    return f"{event.count} of {event.need} approvals" + (f": {approvers}" if approvers else "")


def ending_of(lost: NotResolved, request_id: str) -> EndedEvent:
    """The event that ends the show of ``request_id``, whose answer ``lost``: by the
    request's typed status (never by the words of the message). A resolution is told as
    itself; a request unknown (its state has expired), contested (the waiter decides) or
    not allowed here ends here as expired."""
    status = lost.status if lost.status in RESOLUTIONS else Status.EXPIRED
    return ended_event(status, request_id)


class Worker(abc.ABC):
    """Base class of responder programs: one consumer group (``group``) of a queue.

    Delivery is at least once, so :meth:`show` must be idempotent.
    """

    group: str = "worker"
    """The consumer group: one per channel (``"web"``, ``"auto"``, ...); every group sees
    every request, and within a group each request goes to one consumer."""

    @abc.abstractmethod
    async def show(self, pending: Pending) -> None:
        """Show ``pending`` (a bot answers it now; a UI keeps it and answers it later).

        Answering (``pending.accept()``, ...) raises what :meth:`Pending.answer` raises;
        an exception escaping ``show()`` is logged, counted in ``errors`` and the request
        is skipped by this group (other groups still see it). Returning without answering
        leaves the request shown until it is answered through ``pending`` or gone.
        """

    async def gone(self, pending: Pending, event: EndedEvent) -> None:  # noqa: B027 (optional)
        """``pending`` was resolved by someone else: answered elsewhere, expired or withdrawn.

        Called once per shown request that ends so (never for requests this worker
        answered or skipped itself), after its ``show()``, if still running, was cancelled.
        ``event`` (an answered, expired or withdrawn event) says how. The default does
        nothing.
        """

    async def progress(self, pending: Pending, event: ApprovedEvent) -> None:  # noqa: B027
        """A vote on ``pending``, which needs a quorum (SPEC §14), was counted here or
        elsewhere without deciding it: ``event`` (``approved``) has ``count`` of ``need``
        and the ``approvers`` so far. The request stays shown for other persons to vote
        on. The default does nothing.
        """

    async def escalated(self, pending: Pending, event: EscalatedEvent) -> None:  # noqa: B027
        """``pending``, still shown here and still open, escalated to queue ``event.queue``
        (SPEC §14): a UI marks it so. Called once per hop; the default does nothing."""

    def counters(self) -> dict[str, int]:
        """The worker's own counters, told in its heartbeat beside the service's
        :meth:`Service.statistics` (which win a clash of names). The default has none."""
        return {}


class _FunctionWorker(Worker):
    def __init__(self, handler: Handler) -> None:
        self.handler = handler

    async def show(self, pending: Pending) -> None:
        await self.handler(pending)

    def __repr__(self) -> str:
        return f"<worker {getattr(self.handler, '__qualname__', self.handler)!r}>"


@dataclass(eq=False)
class _Counters:
    shown: int = 0
    answered: int = 0
    refused: int = 0
    skipped: int = 0
    errors: int = 0


class _Shown(Pending):
    """The pending a worker sees: the broker's, counted, and tracked until it ends."""

    def __init__(self, service: Service, inner: Pending) -> None:
        self.request = inner.request
        self.responder_name = inner.responder_name
        self.signer = inner.signer
        self.inner = inner
        self.service = service
        self.task: asyncio.Task[None] | None = None

    async def answer(self, answer: Answer) -> ApprovedEvent | None:
        counters = self.service._counters
        try:
            progress = await self.inner.answer(answer)
        except (InvalidAnswer, AlreadyVoted, NotAllowed):  # the request stays open
            counters.refused += 1
            raise
        except NotResolved as exc:
            counters.refused += 1
            ended = ending_of(exc, self.request.id)
            self.service._resolved(self.request.id, ended, by=asyncio.current_task())
            raise
        counters.answered += 1
        if progress is None:  # else a quorum's vote: shown until the quorum decides
            self.service._release(self)
        return progress

    async def skip(self) -> None:
        await self.inner.skip()
        if self.service._release(self):
            self.service._counters.skipped += 1


class Service:
    """One running worker: reads ``group``'s requests and shows each to ``worker``.

    ``worker`` is a :class:`Worker` or a plain ``async (pending) -> None`` (its show).
    ``group`` defaults to ``worker.group`` (``"worker"`` for a function); ``consumer``
    to a name unique to this process. At most ``concurrency`` ``show()`` calls run at
    once. A heartbeat good for ``heartbeat_ttl_s`` is renewed every third of it.
    :meth:`stop` lets running ``show()`` calls finish for up to ``drain_s``.
    """

    def __init__(
        self,
        broker: Broker,
        worker: Worker | Handler,
        *,
        group: str | None = None,
        consumer: str | None = None,
        concurrency: int = 100,
        heartbeat_ttl_s: float = 30.0,
        drain_s: float = 10.0,
    ) -> None:
        check_number(
            "concurrency", concurrency, integer=True, minimum=1, inclusive=True, maximum=MAX_COUNT
        )
        check_number("heartbeat_ttl_s", heartbeat_ttl_s)
        check_number("drain_s", drain_s, inclusive=True)
        self.broker = broker
        self.worker: Worker = worker if isinstance(worker, Worker) else _FunctionWorker(worker)
        self.group = group or self.worker.group
        self.consumer = consumer
        self.concurrency = concurrency
        self.heartbeat_ttl_s = heartbeat_ttl_s
        self.drain_s = drain_s
        self._counters = _Counters()
        self._shown: dict[str, _Shown] = {}
        self._deadlines: Timers[_Shown] = Timers(self._expired, self._ended)
        self._recent: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._tasks: set[asyncio.Task[None]] = set()  # show() calls running
        self._endings: set[asyncio.Task[None]] = set()  # gone() calls running
        self._free = concurrency  # how many more show() calls may start now
        self._freed: asyncio.Future[None] | None = None  # the reader waits for a free one
        self._provider_set = False  # a tracer provider is set: see _traced
        self._provider_checked = -_PROVIDER_CHECK_S  # when, on the loop's clock
        self._stopping = asyncio.Event()
        self._stops = 0
        self._running = False

    # -- public ---------------------------------------------------------------------

    async def run(self, *, until_idle: bool = False, handle_signals: bool = False) -> None:
        """Show requests until :meth:`stop` (or SIGTERM/SIGINT with ``handle_signals``).

        With ``until_idle``, reading ends once nothing is left to deliver, and ``run``
        returns when the running ``show()`` calls have finished. On the way out,
        requests shown but not answered go back to the group.

        Raises:
            ConfigurationError: this service is already running.
        """
        if self._running:
            raise ConfigurationError(f"{self!r} is already running")
        self._running = True
        loop = asyncio.get_running_loop()
        handled = self._install_signals(loop) if handle_signals else []
        events = self.broker.events()  # before reading, so no resolution is missed
        responder = self.broker.responder(self.group, self.consumer, until_idle=until_idle)
        self.consumer = responder.consumer
        # the responder keeps the heartbeat, with this service's counters
        responder.heartbeat_ttl_s, responder.heartbeat_info = self.heartbeat_ttl_s, self._info
        helpers = [
            loop.create_task(self._follow(events), name=f"toolnexus-events-{self.group}"),
        ]
        log.info("%s/%s serving %r", self.group, self.consumer, self.worker)
        try:
            await self._read_until_stopped(responder)
            if until_idle:
                await self._finish_tasks(until_stopped=True)
            await self._finish_tasks(until_stopped=False)
        finally:
            for helper in helpers:
                helper.cancel()
            await asyncio.gather(*helpers, return_exceptions=True)
            await self._close(responder)
            for signum in handled:
                loop.remove_signal_handler(signum)
            self._running, self._stops = False, 0
            self._stopping.clear()
            log.info("%r stopped", self)

    def stop(self) -> None:
        """Stop reading; let running ``show()`` calls finish within ``drain_s``.

        A second call cancels them at once. Safe to call from a signal handler.
        """
        self._stops += 1
        self._stopping.set()
        if self._stops > 1:
            for task in list(self._tasks):
                task.cancel()

    def statistics(self) -> dict[str, int]:
        """Counters: shown, answered, refused, skipped, errors; ``holding`` is shown now."""
        c = self._counters
        return {
            "shown": c.shown,
            "answered": c.answered,
            "refused": c.refused,
            "skipped": c.skipped,
            "errors": c.errors,
            "holding": len(self._shown),
        }

    def __repr__(self) -> str:
        counters = " ".join(f"{k}={v}" for k, v in self.statistics().items())
        return f"<Service {self.group}/{self.consumer or '?'} {counters}>"

    # -- reading --------------------------------------------------------------------

    async def _read_until_stopped(self, responder: Responder) -> None:
        reading = asyncio.ensure_future(self._read(responder))
        stopping = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait({reading, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
            if not reading.done():
                reading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reading

    async def _read(self, responder: Responder) -> None:
        """Admit each delivery once fewer than ``concurrency`` show() calls run; taken
        before a slot is free, so that reading the next batch overlaps these answers."""
        loop = asyncio.get_running_loop()
        while True:
            try:
                pending = await anext(responder)
            except StopAsyncIteration:
                return
            while not self._free:  # ``concurrency`` show() calls run: wait for one to end
                self._freed = loop.create_future()
                await self._freed
            self._admit(pending)

    def _admit(self, inner: Pending) -> None:
        request = inner.request
        if request.id in self._recent or request.id in self._shown:
            # resolved before it reached us, or delivered again while shown
            if request.id in self._recent:
                self._release_quietly(inner)
            return
        shown = _Shown(self, inner)
        self._shown[request.id] = shown
        self._counters.shown += 1
        loop = asyncio.get_running_loop()
        if request.expires_at is not None:
            self._deadlines.add(loop.time() + max(0.0, request.expires_at - time.time()), shown)
        shown.task = task = loop.create_task(self._show(shown), name=f"show-{request.id}")
        self._free -= 1
        self._tasks.add(task)
        task.add_done_callback(self._shown_done)

    def _shown_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._free += 1
        freed, self._freed = self._freed, None
        if freed is not None and not freed.done():
            freed.set_result(None)

    def _traced(self, request: Request) -> bool:
        """Whether ``request``'s show() runs in a span
        (:func:`~toolnexus.observability._tracing.wants_span`).
        OpenTelemetry's "is a provider set?" reads ``os.environ`` (~1 µs), so it is asked at
        most every ``_PROVIDER_CHECK_S``: a provider set while serving applies to the show()
        calls started from 10 ms later. Once set it stays set (OpenTelemetry sets it once)."""
        if request.trace is not None or self._provider_set:
            return wants_span(request)
        now = asyncio.get_running_loop().time()
        if now - self._provider_checked >= _PROVIDER_CHECK_S:
            self._provider_checked = now
            self._provider_set = wants_span(request)
        return self._provider_set

    async def _show(self, shown: _Shown) -> None:
        try:
            showing = self.worker.show(shown)
            if self._traced(shown.request):
                with responder_span(shown.request):
                    await showing
            else:
                await showing
        except asyncio.CancelledError:
            raise
        except (InvalidAnswer, NotResolved) as exc:  # counted as refused when it was raised
            log.warning("%s: show() let a refusal escape: %s", shown.request.id, exc)
            await self._skip_after_failure(shown)
        except BrokerUnavailable as exc:  # not acknowledged: the broker shows it again
            self._counters.errors += 1
            log.warning("%s: the answer did not get through: %s", shown.request.id, exc)
            self._release(shown, remember=False)
        except Exception:
            self._counters.errors += 1
            log.exception("%s: show() failed; the request is skipped", shown.request.id)
            await self._skip_after_failure(shown)

    async def _skip_after_failure(self, shown: _Shown) -> None:
        if self._release(shown):
            await _quietly(shown.inner.skip(), f"skipping {shown.request.id}")

    # -- ending ---------------------------------------------------------------------

    def _release(self, shown: _Shown, *, remember: bool = True) -> bool:
        """Stop tracking ``shown`` (answered or skipped here); False if it already ended.
        Without ``remember``, a delivery of it again is shown again."""
        if self._shown.get(shown.request.id) is not shown:
            return False
        del self._shown[shown.request.id]
        if remember:
            self._remember(shown.request.id)
        return True

    def _ended(self, shown: _Shown) -> bool:
        """Whether ``shown`` is no longer shown (its deadline no longer matters)."""
        return self._shown.get(shown.request.id) is not shown

    def _expired(self, shown: _Shown) -> None:
        """``shown`` reached its deadline while shown: gone with the outcome its waiter
        gets (a default on expiry told as such, SPEC §14)."""
        request = shown.request
        answer = expired_answer(request)
        self._resolved(request.id, ExpiredEvent(id=request.id, answer=answer))

    def _resolved(
        self, request_id: str, event: EndedEvent, *, by: asyncio.Task[object] | None = None
    ) -> None:
        """``request_id`` was resolved by someone else: end its show(), then call gone().

        ``by`` is the task that found out (its show() is waited for, not cancelled).
        """
        self._remember(request_id)
        shown = self._shown.pop(request_id, None)
        if shown is None:
            return
        task = asyncio.get_running_loop().create_task(self._end(shown, event, by))
        self._endings.add(task)
        task.add_done_callback(self._endings.discard)

    async def _end(self, shown: _Shown, event: EndedEvent, by: asyncio.Task[object] | None) -> None:
        running = shown.task
        if running is not None and not running.done():
            if running is not by:
                running.cancel()
            await asyncio.gather(running, return_exceptions=True)
        self._release_quietly(shown.inner)
        try:
            await self.worker.gone(shown, event)
        except Exception:
            self._counters.errors += 1
            log.exception("%s: gone() failed", shown.request.id)

    def _escalated(self, shown: _Shown, event: EscalatedEvent) -> None:
        """Tell the worker that ``shown`` escalated, in a task of its own."""

        async def tell() -> None:
            try:
                await self.worker.escalated(shown, event)
            except Exception:
                self._counters.errors += 1
                log.exception("%s: escalated() failed", shown.request.id)

        task = asyncio.get_running_loop().create_task(tell())
        self._endings.add(task)
        task.add_done_callback(self._endings.discard)

    def _release_quietly(self, inner: Pending) -> None:
        """Let the broker forget a request resolved elsewhere (acknowledge it) in the background."""

        task = asyncio.get_running_loop().create_task(_quietly(inner.skip(), "acknowledging"))
        self._endings.add(task)
        task.add_done_callback(self._endings.discard)

    def _remember(self, request_id: str) -> None:
        self._recent[request_id] = None
        self._recent.move_to_end(request_id)
        while len(self._recent) > _RECENT:
            self._recent.popitem(last=False)

    async def _follow(self, events: EventStream) -> None:
        """End the shown requests that events say were resolved elsewhere, until the
        broker closes; a stream that fails is logged and followed again."""
        while True:
            try:
                async for event in events:
                    self._dispatch(event)
                return
            except Exception:
                log.exception("%s/%s: following events failed", self.group, self.consumer)
            finally:
                await _quietly(events.aclose(), "closing the event stream")
            await asyncio.sleep(1.0)
            events = self.broker.events()

    def _dispatch(self, event: Event) -> None:
        """Act on one event of the queue."""
        match event:
            case AnsweredEvent() | ExpiredEvent() | WithdrawnEvent() if not self._own(event):
                self._resolved(event.id, event)
            case ApprovedEvent():
                self._progress(event)
            case EscalatedEvent() if event.id in self._shown:
                self._escalated(self._shown[event.id], event)

    def _progress(self, event: ApprovedEvent) -> None:
        """Tell the worker of a quorum's progress on a request it shows."""
        shown = self._shown.get(event.id)
        if shown is None:
            return
        task = asyncio.get_running_loop().create_task(self._tell(shown, event))
        self._endings.add(task)
        task.add_done_callback(self._endings.discard)

    async def _tell(self, shown: _Shown, event: ApprovedEvent) -> None:
        try:
            await self.worker.progress(shown, event)
        except Exception:
            self._counters.errors += 1
            log.exception("%s: progress() failed", shown.request.id)

    def _own(self, event: EndedEvent) -> bool:
        """Whether ``event`` is the answer this worker gave (its answer() call releases it)."""
        shown = self._shown.get(event.id)
        answer = event.answer
        return shown is not None and answer is not None and answer.responder == shown.responder_name

    # -- heartbeat and shutdown -----------------------------------------------------

    def _info(self) -> dict[str, str | int | float]:
        return {
            **self.worker.counters(),
            **self.statistics(),
            "concurrency": self.concurrency,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "worker": type(self.worker).__name__,
        }

    async def _finish_tasks(self, *, until_stopped: bool) -> None:
        """Wait for running show() calls: with ``until_stopped``, until stop() is called;
        else for at most ``drain_s``, then cancel what is left."""
        if until_stopped:
            while self._tasks and not self._stopping.is_set():
                stopping = asyncio.ensure_future(self._stopping.wait())
                await asyncio.wait({*self._tasks, stopping}, return_when=asyncio.FIRST_COMPLETED)
                stopping.cancel()
            return
        if self._tasks:
            log.info("%s/%s: draining %d show() calls", self.group, self.consumer, len(self._tasks))
            await asyncio.wait(set(self._tasks), timeout=self.drain_s)
        left = list(self._tasks)
        for task in left:
            task.cancel()
        await asyncio.gather(*left, return_exceptions=True)

    async def _close(self, responder: Responder) -> None:
        if self._endings:
            await asyncio.wait(set(self._endings), timeout=self.drain_s + 1)
            for task in list(self._endings):
                task.cancel()
        self._deadlines.close()
        self._shown.clear()  # unanswered: closing the responder hands them back to the group
        await _quietly(responder.aclose(), "closing the responder")  # its heartbeat too

    def _install_signals(self, loop: asyncio.AbstractEventLoop) -> list[int]:
        handled: list[int] = []
        for signum in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(signum, self._on_signal, signum)
                handled.append(signum)
        return handled

    def _on_signal(self, signum: int) -> None:
        log.info("%s/%s: %s, stopping", self.group, self.consumer, signal.Signals(signum).name)
        self.stop()


async def _quietly(step: Awaitable[None], what: str) -> None:
    """Await a best-effort step (acknowledging, closing): a failure is logged, not raised."""
    try:
        await step
    except Exception as exc:
        log.warning("%s failed: %s", what, exc)


async def serve(
    broker: Broker,
    worker: Worker | Handler,
    *,
    group: str | None = None,
    consumer: str | None = None,
    concurrency: int = 100,
    until_idle: bool = False,
    handle_signals: bool = True,
    drain_s: float = 10.0,
    heartbeat_ttl_s: float = 30.0,
) -> dict[str, int]:
    """Run ``worker`` on ``broker`` (see :class:`Service`) until SIGTERM or SIGINT, or with
    ``until_idle`` until nothing is left; return its :meth:`Service.statistics`.

    Raises:
        ConfigurationError: a bad option (``concurrency < 1``, ...).
    """
    service = Service(
        broker,
        worker,
        group=group,
        consumer=consumer,
        concurrency=concurrency,
        heartbeat_ttl_s=heartbeat_ttl_s,
        drain_s=drain_s,
    )
    await service.run(until_idle=until_idle, handle_signals=handle_signals)
    return service.statistics()


__all__ = ["Handler", "Service", "Worker", "serve"]
