"""The responder SDK (``toolnexus.serve``) on both brokers: concurrency, resolution
events, counters, heartbeats, draining and until-idle runs."""

from __future__ import annotations

import asyncio
import os
import re
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

import toolnexus
from helpers import ask, eventually, page_block, run_fragment
from toolnexus import (
    AlreadyResolved,
    Answer,
    Broker,
    ConfigurationError,
    Event,
    InvalidAnswer,
    NotResolved,
    Pending,
    Request,
    Service,
    Worker,
    new_id,
    serve,
)
from toolnexus.errors import Contested, NotAllowed, UnknownRequest
from toolnexus.lifecycle import LOST, RESOLUTIONS, Status
from toolnexus.models import AnsweredEvent, ExpiredEvent, WithdrawnEvent
from toolnexus.responders._serve import ending_of

FORM = {
    "type": "object",
    "properties": {"name": {"type": "string", "minLength": 2}},
    "required": ["name"],
}


def form(prompt: str = "Your name?") -> Request:
    return Request(id=new_id(), kind="input", prompt=prompt, data={"schema": FORM})


@asynccontextmanager
async def running(service: Service, **options: bool) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(service.run(**options))
    try:
        yield task
    finally:
        service.stop()
        async with asyncio.timeout(20):
            await task


class Shelf(Worker):
    """A UI-like worker: shows requests and keeps them; records what went."""

    group = "shelf"

    def __init__(self) -> None:
        self.shown: dict[str, Pending] = {}
        self.gone_events: dict[str, Event] = {}

    async def show(self, pending: Pending) -> None:
        self.shown[pending.request.id] = pending

    async def gone(self, pending: Pending, event: Event) -> None:
        assert pending is self.shown[pending.request.id]
        assert pending.request.id not in self.gone_events, "gone() called twice"
        self.gone_events[pending.request.id] = event


async def test_a_handler_answers_many_requests_concurrently(broker: Broker) -> None:
    active = peak = 0

    async def approve(pending: Pending) -> None:
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        await asyncio.sleep(0.05)  # a slow bot: answers overlap only if shown concurrently
        active -= 1
        await pending.accept(person="bot:approver")

    service = Service(broker, approve, group="bots", concurrency=8)
    async with running(service):
        answers = await asyncio.gather(*(broker.wait_for(ask(), timeout_s=20) for _ in range(40)))
    assert all(a.ok and a.person == "bot:approver" for a in answers)
    assert 1 < peak <= 8
    stats = service.statistics()
    assert stats == {
        "shown": 40,
        "answered": 40,
        "refused": 0,
        "skipped": 0,
        "errors": 0,
        "holding": 0,
    }
    assert "answered=40" in repr(service) and "bots/" in repr(service)


async def test_a_shown_request_answered_elsewhere_is_gone(broker: Broker) -> None:
    shelf = Shelf()
    service = Service(broker, shelf)
    async with running(service):
        request = ask()
        wait = asyncio.create_task(broker.wait_for(request, timeout_s=20))
        await eventually(lambda: request.id in shelf.shown)
        assert service.statistics()["holding"] == 1
        await broker.answer(Answer(id=request.id, ok=False, reason="declined"))
        await eventually(lambda: request.id in shelf.gone_events)
        assert (await wait).reason == "declined"
    event = shelf.gone_events[request.id]
    assert (event.event, event.id) == ("answered", request.id)
    assert service.statistics()["holding"] == 0
    with pytest.raises(AlreadyResolved, match="already answered"):
        await shelf.shown[request.id].accept()
    assert service.statistics()["refused"] == 1


async def test_a_running_show_is_cancelled_when_its_request_is_withdrawn(broker: Broker) -> None:
    cancelled: list[str] = []

    class Slow(Shelf):
        async def show(self, pending: Pending) -> None:
            await super().show(pending)
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                cancelled.append(pending.request.id)
                raise

    shelf = Slow()
    async with running(Service(broker, shelf)):
        request = ask()
        wait = asyncio.create_task(broker.wait_for(request, timeout_s=20))
        await eventually(lambda: request.id in shelf.shown)
        wait.cancel()  # the asker stops waiting: the request is withdrawn
        await eventually(lambda: request.id in shelf.gone_events)
    assert cancelled == [request.id]
    assert shelf.gone_events[request.id].event == "withdrawn"


async def test_an_expired_request_is_gone(broker: Broker) -> None:
    shelf = Shelf()
    async with running(Service(broker, shelf)):
        request = ask()
        answer = await broker.wait_for(request, timeout_s=0.5)
        await eventually(lambda: request.id in shelf.gone_events)
    assert answer.reason == "expired"
    assert shelf.gone_events[request.id].event == "expired"


async def test_own_answers_do_not_call_gone_and_refusals_reach_the_worker(broker: Broker) -> None:
    seen: list[str] = []

    class Picky(Shelf):
        async def show(self, pending: Pending) -> None:
            await super().show(pending)
            try:
                await pending.accept({"name": "A"})  # too short
            except InvalidAnswer as exc:
                seen.append(str(exc))
            await pending.accept({"name": "Ada"})

    shelf = Picky()
    service = Service(broker, shelf)
    async with running(service):
        answer = await broker.wait_for(form(), timeout_s=20)
        await eventually(lambda: service.statistics()["answered"] == 1)
    assert answer.data == {"name": "Ada"}
    assert seen == ["field 'name': 'A' is shorter than the minimum length of 2"]
    assert shelf.gone_events == {}
    assert service.statistics() | {"holding": 0} == {
        "shown": 1,
        "answered": 1,
        "refused": 1,
        "skipped": 0,
        "errors": 0,
        "holding": 0,
    }


async def test_two_groups_race_and_what_a_group_lost_is_gone_once(broker: Broker) -> None:
    class Racer(Shelf):
        async def show(self, pending: Pending) -> None:
            await super().show(pending)
            await pending.accept()

    first, second = Racer(), Racer()
    one = Service(broker, first, group="one")
    two = Service(broker, second, group="two")
    async with running(one), running(two):
        answers = await asyncio.gather(*(broker.wait_for(ask(), timeout_s=20) for _ in range(20)))
        await eventually(lambda: one.statistics()["answered"] + two.statistics()["answered"] == 20)
        await asyncio.sleep(0.3)  # late deliveries to the losing group, if any
    assert all(a.ok for a in answers)
    for service, worker in ((one, first), (two, second)):
        # What a group showed and did not win is gone, once each (its show() was cancelled
        # by the event, or its answer was refused).
        lost = service.statistics()["shown"] - service.statistics()["answered"]
        assert len(worker.gone_events) == lost
        assert service.statistics()["refused"] <= lost
        assert {e.event for e in worker.gone_events.values()} <= {"answered"}
    assert one.statistics()["answered"] + two.statistics()["answered"] == 20


async def test_a_failing_show_is_counted_skipped_for_its_group_and_serving_goes_on(
    broker: Broker,
) -> None:
    async def fragile(pending: Pending) -> None:
        if pending.request.prompt == "boom":
            raise RuntimeError("a bug in the worker")
        await pending.accept()

    service = Service(broker, fragile, group="fragile")
    async with running(service), broker.responder("other") as other:
        bad = ask("boom")
        bad_wait = asyncio.create_task(broker.wait_for(bad, timeout_s=20))
        await eventually(lambda: service.statistics()["errors"] == 1)
        assert (await broker.wait_for(ask("fine"), timeout_s=20)).ok
        # Another group still sees the request the failing worker skipped.
        async with asyncio.timeout(10):
            pending = await anext(other)
        assert pending.request.id == bad.id
        await pending.decline()
        assert (await bad_wait).reason == "declined"
    assert service.statistics()["errors"] == 1
    assert service.statistics()["answered"] == 1


async def test_skips_are_counted(broker: Broker) -> None:
    async def passer(pending: Pending) -> None:
        await pending.skip()

    service = Service(broker, passer)
    async with running(service):
        request = ask()
        wait = asyncio.create_task(broker.wait_for(request, timeout_s=20))
        await eventually(lambda: service.statistics()["skipped"] == 1)
        wait.cancel()
    assert service.statistics()["holding"] == 0


async def test_a_heartbeat_is_kept_while_serving_and_removed_after(broker: Broker) -> None:
    shelf = Shelf()
    service = Service(broker, shelf, consumer="c-1", heartbeat_ttl_s=3)
    async with running(service):

        async def beating() -> bool:
            return any(b.consumer == "c-1" for b in await broker.heartbeats())

        await eventually(beating)
        (beat,) = [b for b in await broker.heartbeats() if b.consumer == "c-1"]
        assert (beat.group, beat.info["worker"], beat.info["pid"]) == (
            "shelf",
            "Shelf",
            os.getpid(),
        )
        assert 0 < beat.expires_at - beat.at <= 3
    assert [b for b in await broker.heartbeats() if b.consumer == "c-1"] == []


async def test_expired_heartbeats_are_not_listed(broker: Broker) -> None:
    await broker.heartbeat("g", "short", ttl_s=0.05, info={"n": 1})
    await broker.heartbeat("g", "long", ttl_s=30, info={"n": 2})
    await asyncio.sleep(0.2)
    beats = await broker.heartbeats()
    assert [(b.group, b.consumer, b.info) for b in beats] == [("g", "long", {"n": 2})]
    await broker.heartbeat("g", "long", ttl_s=0)
    assert await broker.heartbeats() == []


async def test_stop_lets_running_shows_finish_within_the_grace_period(broker: Broker) -> None:
    started = asyncio.Event()

    async def careful(pending: Pending) -> None:
        started.set()
        await asyncio.sleep(0.3)
        await pending.accept()

    service = Service(broker, careful, drain_s=10)
    run = asyncio.create_task(service.run())
    wait = asyncio.create_task(broker.wait_for(ask(), timeout_s=20))
    await asyncio.wait_for(started.wait(), 10)
    service.stop()
    await asyncio.wait_for(run, 10)
    assert (await wait).ok
    assert service.statistics()["answered"] == 1


async def test_past_the_grace_period_held_requests_go_back_to_the_group(broker: Broker) -> None:
    started = asyncio.Event()

    async def stuck(pending: Pending) -> None:
        started.set()
        await asyncio.sleep(60)

    service = Service(broker, stuck, group="g", drain_s=0.1)
    run = asyncio.create_task(service.run())
    request = ask()
    wait = asyncio.create_task(broker.wait_for(request, timeout_s=30))
    await asyncio.wait_for(started.wait(), 10)
    service.stop()
    await asyncio.wait_for(run, 10)
    # Another consumer of the same group gets it (at once, or once the lease lapses).
    async with broker.responder("g") as again:
        async with asyncio.timeout(15):
            pending = await anext(again)
        assert pending.request.id == request.id
        await pending.accept()
    assert (await wait).ok


async def test_until_idle_answers_what_is_there_and_returns(broker: Broker) -> None:
    requests = [ask(f"batch {n}") for n in range(20)]
    waits = [asyncio.create_task(broker.wait_for(r, timeout_s=20)) for r in requests]
    async with broker.responder("probe") as probe:  # proves all 20 are published
        for _ in requests:
            async with asyncio.timeout(10):
                await anext(probe)

    async def approve(pending: Pending) -> None:
        await asyncio.sleep(0.01)
        await pending.accept()

    stats = await asyncio.wait_for(
        serve(broker, approve, group="batch", until_idle=True, handle_signals=False), 20
    )
    assert (stats["shown"], stats["answered"], stats["holding"]) == (20, 20, 0)
    assert all(a.ok for a in await asyncio.gather(*waits))


async def test_sigterm_drains_when_signals_are_handled(broker: Broker) -> None:
    started = asyncio.Event()

    async def careful(pending: Pending) -> None:
        started.set()
        await asyncio.sleep(0.2)
        await pending.accept()

    service = Service(broker, careful)
    run = asyncio.create_task(service.run(handle_signals=True))
    wait = asyncio.create_task(broker.wait_for(ask(), timeout_s=20))
    await asyncio.wait_for(started.wait(), 10)
    os.kill(os.getpid(), signal.SIGTERM)
    await asyncio.wait_for(run, 10)
    assert (await wait).ok


async def test_bad_options_are_refused(broker: Broker) -> None:
    with pytest.raises(ConfigurationError, match="concurrency=0 must be at least 1"):
        Service(broker, Shelf(), concurrency=0)
    with pytest.raises(ConfigurationError, match="heartbeat_ttl_s=0 must be positive"):
        Service(broker, Shelf(), heartbeat_ttl_s=0)
    service = Service(broker, Shelf())
    async with running(service):
        await asyncio.sleep(0.05)
        with pytest.raises(ConfigurationError, match="already running"):
            await service.run()


@pytest.mark.slow
async def test_the_write_a_worker_example_approves(broker: Broker) -> None:
    page = Path(__file__).parents[1] / "docs" / "how-to" / "write-a-worker.md"
    blocks = re.findall(r"```python\n(.*?)```", page.read_text(), re.S)
    (example,) = [block for block in blocks if "class Approver" in block]
    namespace: dict[str, object] = {"__name__": "docs_example"}
    exec(compile(example, str(page), "exec"), namespace)
    approver = namespace["Approver"]
    assert isinstance(approver, type) and issubclass(approver, Worker)
    approval = asyncio.create_task(broker.wait_for(ask("Restart?"), timeout_s=20))
    form_wait = asyncio.create_task(broker.wait_for(form(), timeout_s=1))
    async with broker.responder("probe") as probe:  # both published
        for _ in range(2):
            await asyncio.wait_for(anext(probe), 10)
    stats = await serve(broker, approver(), until_idle=True, handle_signals=False)
    assert (await approval).person == "bot:ops"
    assert (await form_wait).reason == "expired"  # skipped by the bot: left for others
    assert (stats["answered"], stats["skipped"]) == (1, 1)


@pytest.mark.parametrize(
    ("lost", "expected"),
    [
        (AlreadyResolved("r-1", Status.ANSWERED), AnsweredEvent),
        (AlreadyResolved("r-1", Status.EXPIRED), ExpiredEvent),
        (AlreadyResolved("r-1", Status.WITHDRAWN), WithdrawnEvent),
        (UnknownRequest("r-1"), ExpiredEvent),  # its state has expired
        (Contested("r-1"), ExpiredEvent),  # the waiter decides; it ends here
        (NotAllowed("r-1"), ExpiredEvent),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, NotResolved) else "",
)
def test_what_a_worker_is_told_follows_the_typed_status_not_the_words(
    lost: NotResolved, expected: type, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Reworded messages change nothing: the event comes from ``status`` (it once came
    # from the text, and anything it did not know became "expired").
    for status in (Status.ANSWERED, Status.EXPIRED, Status.WITHDRAWN):
        monkeypatch.setitem(LOST, status, f"no longer open ({status.upper()})")
    reworded = type(lost).__new__(type(lost))
    NotResolved.__init__(reworded, lost.request_id, "something else entirely", lost.status)
    for refused in (lost, reworded):
        ended = ending_of(refused, "r-1")
        assert type(ended) is expected and ended.id == "r-1"
        assert ended.event == (lost.status if lost.status in RESOLUTIONS else Status.EXPIRED)
    assert AlreadyResolved("r-2", Status.WITHDRAWN).reason == "no longer open (WITHDRAWN)"


async def test_the_workers_page_approver_answers_until_stopped() -> None:
    """The Approver of docs/how-to/workers.md, as written, run to its first answer."""
    page = "docs/how-to/workers.md"
    code = page_block(page, "class Approver(toolnexus.Worker):")
    async with toolnexus.connect("memory://") as broker:
        serving = asyncio.create_task(run_fragment(code, page, broker=broker))
        await eventually(lambda: _serving(broker), "the Approver's heartbeat")
        answer = await asyncio.wait_for(broker.wait_for(ask("Deploy?")), 10)
        assert answer.ok and answer.answered_by is not None and "ops-bot" in answer.answered_by
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)


async def _serving(broker: Broker) -> bool:
    return any(beat.group == "ops-bot" for beat in await broker.heartbeats())
