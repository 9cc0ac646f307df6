"""One timer for many: the deadlines of every wait of a process, the hops of every
escalation (SPEC §14), the deadlines of the requests a responder shows
(:mod:`toolnexus.responders._serve`). A heap of times and a single ``call_at`` for the earliest, so
a thousand waits cost one timer handle, not a thousand. And :class:`Bound`: the
successive awaits of one connection bounded by one timer, not one each.

The heap reads the time from a :class:`Clock`: the running loop's by default, one that a
test moves by hand (``tests/helpers.py``'s ``ManualClock``) to pass a deadline without
sleeping."""

from __future__ import annotations

import asyncio
import heapq
from collections.abc import Callable
from types import TracebackType
from typing import Generic, Protocol, TypeVar

T = TypeVar("T")


class Handle(Protocol):
    """A call planned on a :class:`Clock` (``asyncio.TimerHandle`` is one)."""

    def when(self) -> float: ...

    def cancel(self) -> None: ...


class Clock(Protocol):
    """Where timers read the time (seconds, any origin) and plan their calls."""

    def now(self) -> float: ...

    def call_at(self, when: float, callback: Callable[[], object]) -> Handle: ...

    async def sleep(self, seconds: float) -> None: ...


class LoopClock:
    """The running event loop's clock (``loop.time()``): the default :class:`Clock`."""

    def now(self) -> float:
        return asyncio.get_running_loop().time()

    def call_at(self, when: float, callback: Callable[[], object]) -> Handle:
        return asyncio.get_running_loop().call_at(when, callback)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


LOOP_CLOCK = LoopClock()


class Timers(Generic[T]):
    """Calls ``fire(item)`` once each item's time (on ``clock``, the loop's by default)
    has come.

    Items that ``ended(item)`` are not fired; they stay in the heap until it is rebuilt,
    which happens when it has grown to twice its size after the last rebuild (plus 1,024).
    """

    def __init__(
        self, fire: Callable[[T], None], ended: Callable[[T], bool], clock: Clock = LOOP_CLOCK
    ) -> None:
        self._fire_item, self._ended, self._clock = fire, ended, clock
        self._heap: list[tuple[float, int, T]] = []
        self._count = 0
        self._kept = 0  # the heap's size after its last rebuild
        self._timer: Handle | None = None

    def now(self) -> float:
        """The time on this heap's clock."""
        return self._clock.now()

    def add(self, when: float, item: T) -> None:
        """Fire ``item`` at ``when`` (on this heap's clock: ``loop.time()`` by default)."""
        self._count += 1
        if len(self._heap) > 2 * self._kept + 1024:  # drop the items that ended
            self._heap = [e for e in self._heap if not self._ended(e[2])]
            heapq.heapify(self._heap)
            self._kept = len(self._heap)
        heapq.heappush(self._heap, (when, self._count, item))
        if self._timer is None or when < self._timer.when():
            self._arm()

    def _arm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._clock.call_at(self._heap[0][0], self._due) if self._heap else None

    def _due(self) -> None:
        now = self._clock.now()
        while self._heap and self._heap[0][0] <= now:
            item = heapq.heappop(self._heap)[2]
            if not self._ended(item):
                self._fire_item(item)
        self._timer = None
        self._arm()

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._heap.clear()


class Bound:
    """``with bound(seconds): await ...``: as ``async with asyncio.timeout(seconds)``, for
    one await at a time (the commands of one connection), with one timer for them all.

    An await still going when its time is up is cancelled, and ``TimeoutError`` raised
    from the ``with`` (a cancellation from elsewhere stays a cancellation). The timer is
    set once and moved on only when it fires early, so a round trip costs two attribute
    writes instead of a timer handle of its own (``asyncio.timeout`` costs ~4 µs).
    """

    __slots__ = ("_cancelling", "_expired", "_task", "_timer", "_until")

    def __init__(self) -> None:
        self._until: float | None = None  # the time of the await under way, if any
        self._task: asyncio.Task[object] | None = None
        self._cancelling = 0  # the task's cancellation requests before this await
        self._timer: asyncio.TimerHandle | None = None
        self._expired = False

    def __call__(self, seconds: float) -> Bound:
        loop = asyncio.get_running_loop()
        self._until = until = loop.time() + seconds
        self._task = task = asyncio.current_task()
        self._cancelling = task.cancelling() if task is not None else 0
        timer = self._timer
        if timer is None or until < timer.when():  # (else it fires early and moves on)
            if timer is not None:
                timer.cancel()
            self._timer = loop.call_at(until, self._check)
        return self

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._until = None
        task, self._task = self._task, None
        if self._expired:
            self._expired = False
            # (uncancel first, whatever the exception: the cancellation was ours)
            uncancelled = task is not None and task.uncancel() <= self._cancelling
            if uncancelled and exc_type is asyncio.CancelledError:
                raise TimeoutError("no reply in time") from exc

    def _check(self) -> None:
        self._timer = None
        until, task = self._until, self._task
        if until is None or task is None:
            return  # nothing under way: no timer until the next await
        loop = asyncio.get_running_loop()
        if loop.time() < until:  # a later await than the one the timer was set for
            self._timer = loop.call_at(until, self._check)
            return
        self._expired = True
        task.cancel()

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
