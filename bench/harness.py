"""The steps the floor and toolnexus cases share, so that the two cannot drift apart.

Each case supplies only what differs: how one wait is made (``wait(request)``) and
how a request is built (``make(i)``). Where requests are built, what the harness
holds per wait, and the window that is measured are decided here, once:

- requests are built before any baseline (the caller's request is not the broker's
  cost) and handed to ``wait``; each wait is one task the harness keeps in one list;
- the scale case measures RSS from after the first wait was published to after all
  were, then starts the responder and times until every wait has its answer;
- the wake-up case measures sequential round trips with no other wait pending, then
  the same again with ``pending`` other waits published that no responder answers;
- the event loop is ``asyncio``'s or, where installed and asked for, ``uvloop``'s, in
  the case process and in its responder process alike (:func:`run`).
"""

from __future__ import annotations

import asyncio
import heapq
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from bench.common import (
    Scale,
    Wakeup,
    measure_sequential,
    redis_clients_of_this_process,
    settled_rss,
    stream_entries,
    wait_for_entries,
)

T = TypeVar("T")
R = TypeVar("R")

LOOPS = ("asyncio", "uvloop")


def uvloop_available() -> bool:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return False
    return True


def run(main: Coroutine[Any, Any, T], loop: str = "asyncio") -> T:
    """``asyncio.run(main)``, on uvloop's event loop with ``loop="uvloop"``."""
    if loop == "asyncio":
        return asyncio.run(main)
    if loop != "uvloop":
        raise ValueError(f"unknown event loop {loop!r} (one of {', '.join(LOOPS)})")
    import uvloop

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main)


class Deadlines:
    """The deadline of every wait in one timer, as toolnexus keeps them: a heap and a
    single ``call_at`` for the earliest; a wait past its deadline gets ``TimeoutError``.
    (An ``asyncio.timeout`` per wait would cost the floor a ``Timeout`` and a
    ``TimerHandle`` per wait that toolnexus does not pay.)"""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, asyncio.Future[Any]]] = []
        self._count = 0
        self._timer: asyncio.TimerHandle | None = None

    def add(self, future: asyncio.Future[Any], timeout_s: float, live: int) -> None:
        loop = asyncio.get_running_loop()
        when = loop.time() + timeout_s
        self._count += 1
        if len(self._heap) > 2 * live + 1024:  # drop the entries of waits that ended
            self._heap = [e for e in self._heap if not e[2].done()]
            heapq.heapify(self._heap)
        heapq.heappush(self._heap, (when, self._count, future))
        if self._timer is None or when < self._timer.when():
            self._arm(loop)

    def _arm(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = loop.call_at(self._heap[0][0], self._fire, loop) if self._heap else None

    def _fire(self, loop: asyncio.AbstractEventLoop) -> None:
        now = loop.time()
        while self._heap and self._heap[0][0] <= now:
            future = heapq.heappop(self._heap)[2]
            if not future.done():
                future.set_exception(TimeoutError("no answer before the deadline"))
        self._timer = None
        self._arm(loop)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._heap.clear()


async def measure_scale(
    url: str,
    requests: list[R],
    wait: Callable[[R], Coroutine[Any, Any, Any]],
    start_answering: Callable[[], None],
) -> tuple[Scale, list[Any]]:
    """``len(requests)`` waits pending at once (``requests`` built by the caller before
    this runs); the responder starts answering (``start_answering``) only once every
    one is published. Returns the figures and each wait's result."""
    waits = len(requests)
    before_entries = await stream_entries(url)
    # One wait first: the connections it takes are what any number of waits may take.
    tasks: list[asyncio.Task[Any]] = [asyncio.create_task(wait(requests[0]))]
    await wait_for_entries(url, before_entries + 1)
    connections_at_one = await redis_clients_of_this_process(url)
    rss0 = settled_rss()
    t0 = time.perf_counter()
    tasks += [asyncio.create_task(wait(request)) for request in requests[1:]]
    await wait_for_entries(url, before_entries + waits)
    publish_s = time.perf_counter() - t0
    await asyncio.sleep(0.2)
    rss1 = settled_rss()
    connections = await redis_clients_of_this_process(url)
    t1 = time.perf_counter()
    start_answering()
    results = await asyncio.gather(*tasks)
    resolve_s = time.perf_counter() - t1
    return (
        Scale(
            waits=waits,
            rss_before_bytes=rss0,
            rss_delta_bytes=rss1 - rss0,
            per_wait_bytes=(rss1 - rss0) / (waits - 1),
            connections=connections,
            connections_at_one=connections_at_one,
            publish_s=publish_s,
            resolve_s=resolve_s,
        ),
        results,
    )


async def measure_wakeup(
    url: str,
    round_trip: Callable[[], Awaitable[object]],
    hold: Callable[[], Coroutine[Any, Any, object]],
    pending: int,
    warmup: int,
    n: int,
) -> Wakeup:
    """``n`` round trips alone, then ``n`` with ``pending`` waits made by ``hold`` (waits
    no responder answers: they stay pending until cancelled here)."""
    none, none_samples = await measure_sequential(round_trip, warmup, n)
    await asyncio.sleep(0.1)  # let background writes of the last round trips land
    before = await stream_entries(url)
    held: list[asyncio.Task[object]] = [asyncio.create_task(hold()) for _ in range(pending)]
    await wait_for_entries(url, before + pending)
    await asyncio.sleep(0.2)
    loaded, loaded_samples = await measure_sequential(round_trip, warmup, n)
    for task in held:
        task.cancel()
    await asyncio.gather(*held, return_exceptions=True)
    return Wakeup(
        pending=pending,
        none=none,
        loaded=loaded,
        none_samples_ms=[s / 1e6 for s in none_samples],
        loaded_samples_ms=[s / 1e6 for s in loaded_samples],
    )
