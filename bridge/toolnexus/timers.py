"""One timer for many: the deadlines of every wait of a process, the hops of every
escalation (SPEC §14), the deadlines of the requests a responder shows
(:mod:`toolnexus.serve`). A heap of times and a single ``call_at`` for the earliest, so
a thousand waits cost one timer handle, not a thousand."""

from __future__ import annotations

import asyncio
import heapq
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Timers(Generic[T]):
    """Calls ``fire(item)`` once each item's time (on the loop's clock) has come.

    Items that ``ended(item)`` are not fired; they stay in the heap until it is rebuilt,
    which happens when it has grown to twice its size after the last rebuild (plus 1,024).
    """

    def __init__(self, fire: Callable[[T], None], ended: Callable[[T], bool]) -> None:
        self._fire_item, self._ended = fire, ended
        self._heap: list[tuple[float, int, T]] = []
        self._count = 0
        self._kept = 0  # the heap's size after its last rebuild
        self._timer: asyncio.TimerHandle | None = None

    def add(self, when: float, item: T) -> None:
        """Fire ``item`` at ``when`` (``loop.time()`` clock)."""
        self._count += 1
        if len(self._heap) > 2 * self._kept + 1024:  # drop the items that ended
            self._heap = [e for e in self._heap if not self._ended(e[2])]
            heapq.heapify(self._heap)
            self._kept = len(self._heap)
        heapq.heappush(self._heap, (when, self._count, item))
        if self._timer is None or when < self._timer.when():
            self._arm(asyncio.get_running_loop())

    def _arm(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = loop.call_at(self._heap[0][0], self._due, loop) if self._heap else None

    def _due(self, loop: asyncio.AbstractEventLoop) -> None:
        now = loop.time()
        while self._heap and self._heap[0][0] <= now:
            item = heapq.heappop(self._heap)[2]
            if not self._ended(item):
                self._fire_item(item)
        self._timer = None
        self._arm(loop)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._heap.clear()
