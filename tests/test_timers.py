"""The timer heap on a clock the test moves: deadlines pass without sleeping."""

from __future__ import annotations

import asyncio

from helpers import ManualClock
from toolnexus._timers import LOOP_CLOCK, Timers


def heap(clock: ManualClock, ended: set[str] | None = None) -> tuple[Timers[str], list[str]]:
    fired: list[str] = []
    gone = ended if ended is not None else set()
    return Timers(fired.append, gone.__contains__, clock), fired


def test_items_fire_once_their_time_has_come_in_time_order() -> None:
    clock = ManualClock()
    timers, fired = heap(clock)
    timers.add(clock.now() + 30, "late")
    timers.add(clock.now() + 10, "early")
    timers.add(clock.now() + 20, "middle")
    clock.advance(9.999)
    assert fired == []
    clock.advance(0.001)
    assert fired == ["early"]
    clock.advance(3600)
    assert fired == ["early", "middle", "late"]


def test_an_earlier_item_moves_the_one_timer_forward() -> None:
    clock = ManualClock()
    timers, fired = heap(clock)
    timers.add(clock.now() + 60, "a minute")
    timers.add(clock.now() + 1, "a second")
    clock.advance(1)
    assert fired == ["a second"]
    clock.advance(58)
    assert fired == ["a second"]
    clock.advance(1)
    assert fired == ["a second", "a minute"]


def test_ended_items_are_not_fired_and_close_drops_the_rest() -> None:
    clock = ManualClock()
    ended: set[str] = set()
    timers, fired = heap(clock, ended)
    for name in ("answered", "open", "later"):
        timers.add(clock.now() + 5, name)
    timers.add(clock.now() + 50, "closed before its time")
    ended.add("answered")
    clock.advance(5)
    assert fired == ["open", "later"]
    timers.close()
    clock.advance(100)
    assert fired == ["open", "later"]


def test_ended_items_are_dropped_when_the_heap_has_doubled() -> None:
    clock = ManualClock()
    asked: list[str] = []

    def ended(item: str) -> bool:
        asked.append(item)
        return item != "the open one"

    fired: list[str] = []
    timers: Timers[str] = Timers(fired.append, ended, clock)
    timers.add(clock.now() + 5000, "the open one")
    for n in range(3000):  # answered at once: a heap of the ended
        timers.add(clock.now() + 10 + n, f"wait {n}")
    assert len(asked) >= 1025  # rebuilt along the way: every item was looked at
    clock.advance(10_000)
    assert fired == ["the open one"]


async def test_by_default_the_heap_keeps_the_loops_time() -> None:
    loop = asyncio.get_running_loop()
    fired = asyncio.Event()
    timers: Timers[str] = Timers(lambda _: fired.set(), lambda _: False)
    assert abs(timers.now() - loop.time()) < 0.5 and LOOP_CLOCK.now() <= loop.time()
    timers.add(timers.now() + 0.05, "soon")
    await asyncio.wait_for(fired.wait(), 5)


async def test_a_manual_clock_sleeps_until_it_is_moved() -> None:
    clock = ManualClock()
    nap = asyncio.create_task(clock.sleep(60))
    await asyncio.sleep(0)
    assert not nap.done()
    clock.advance(60)
    await asyncio.wait_for(nap, 1)
