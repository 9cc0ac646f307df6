"""SPEC §11 semantics, run identically against memory:// and a real Redis."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

import helpers
import toolnexus
from toolnexus import (
    AlreadyResolved,
    Answer,
    Broker,
    InvalidAnswer,
    InvalidRequest,
    Pending,
    Quorum,
    Request,
    Responder,
)
from toolnexus.errors import AlreadyVoted
from toolnexus.models import new_id

FORM = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 2},
        "guests": {"type": "integer", "minimum": 1, "maximum": 8, "default": 2},
    },
    "required": ["name"],
}


ask = functools.partial(helpers.ask, kind="input", data={"schema": FORM})
"""A form request (the prompt, unless given: "?")."""


async def next_pending(responder: Responder, timeout_s: float = 5) -> Pending:
    async with asyncio.timeout(timeout_s):
        return await anext(responder)


@asynccontextmanager
async def waiting(
    broker: Broker, request: Request, timeout_s: float = 10
) -> AsyncIterator[asyncio.Task[Answer]]:
    task = asyncio.create_task(broker.wait_for(request, timeout_s=timeout_s))
    try:
        yield task
    finally:
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def test_an_answer_reaches_its_waiter(broker: Broker) -> None:
    async with broker.responder("web") as web, waiting(broker, ask("Your name?")) as wait:
        pending = await next_pending(web)
        assert pending.request.prompt == "Your name?"
        await pending.accept({"name": "Ada"})
        answer = await wait
    assert answer.ok is True
    # The default of the schema is filled in; the responder is named.
    assert answer.data == {"name": "Ada", "guests": 2}
    assert answer.responder == pending.responder_name
    assert answer.responder.startswith("web/")


async def test_a_quorum_counts_distinct_persons_across_groups(broker: Broker) -> None:
    request = Request(id=new_id(), kind="approval", prompt="Two of you?", quorum=Quorum(2))
    async with (
        broker.responder("web") as web,
        broker.responder("slack") as slack,
        waiting(broker, request) as wait,
    ):
        on_web, on_slack = await next_pending(web), await next_pending(slack)
        progress = await on_web.accept(person="alice")
        assert progress is not None and (progress.count, progress.need) == (1, 2)
        with pytest.raises(AlreadyVoted):
            await on_web.accept(person="alice")
        assert not wait.done()
        assert await on_slack.accept(person="bob") is None
        answer = await wait
    assert [(a.responder, a.person) for a in answer.approvals or ()] == [
        (on_web.responder_name, "alice"),
        (on_slack.responder_name, "bob"),
    ]


async def test_every_group_sees_every_request_and_the_first_answer_wins(broker: Broker) -> None:
    async with (
        broker.responder("web") as web,
        broker.responder("slack") as slack,
        waiting(broker, ask()) as wait,
    ):
        on_web = await next_pending(web)
        on_slack = await next_pending(slack)
        assert on_web.request.id == on_slack.request.id
        await on_slack.decline()
        with pytest.raises(AlreadyResolved, match="already answered") as refused:
            await on_web.accept({"name": "Ada"})
        assert refused.value.reason == "already answered"
        answer = await wait
    assert (answer.ok, answer.reason) == (False, "declined")


@pytest.mark.slow
async def test_one_consumer_of_a_group_gets_each_request(broker: Broker) -> None:
    async def drain(responder: Responder) -> list[Pending]:
        got = []
        while True:
            try:
                got.append(await next_pending(responder, timeout_s=1.5))
            except TimeoutError:
                return got

    async with (
        broker.responder("web", "a") as a,
        broker.responder("web", "b") as b,
        waiting(broker, ask("one")) as one,
        waiting(broker, ask("two")) as two,
    ):
        on_a, on_b = await asyncio.gather(drain(a), drain(b))
        prompts = sorted(p.request.prompt for p in on_a + on_b)
        assert prompts == ["one", "two"]  # each shown once in the group, not twice
        for pending in on_a + on_b:
            await pending.accept({"name": pending.request.prompt})
        assert {(await one).data["name"], (await two).data["name"]} == {"one", "two"}


async def test_answer_by_id_from_anywhere(broker: Broker) -> None:
    request = ask()
    async with broker.responder("web") as web, waiting(broker, request) as wait:
        await next_pending(web)  # published and visible
        await broker.answer(Answer(id=request.id, ok=True, data={"name": "Grace"}))
        assert (await wait).data == {"name": "Grace", "guests": 2}
        with pytest.raises(AlreadyResolved, match="already answered"):
            await broker.answer(Answer(id=request.id, ok=False, reason="declined"))


async def test_an_unknown_request_is_refused_by_name(broker: Broker) -> None:
    with pytest.raises(toolnexus.errors.UnknownRequest, match=r"'elc-nope'.*unknown request"):
        await broker.answer(Answer(id="elc-nope", ok=True))


async def test_the_deadline_resolves_as_expired_and_refuses_late_answers(broker: Broker) -> None:
    request = ask()
    async with broker.responder("web") as web, waiting(broker, request, timeout_s=0.5) as wait:
        shown = await next_pending(web)
        answer = await wait
        assert (answer.ok, answer.reason) == (False, "expired")
        with pytest.raises(AlreadyResolved, match="expired"):
            await shown.accept({"name": "Late"})
        with pytest.raises(AlreadyResolved, match="expired"):
            await broker.answer(Answer(id=request.id, ok=True, data={"name": "Late"}))


@pytest.mark.slow
async def test_the_requests_own_expiry_bounds_the_wait(broker: Broker) -> None:
    started = time.monotonic()
    # 1 s: a publish must land first (a just-started Cluster can take a few hundred ms).
    answer = await broker.wait_for(ask(expires_at=time.time() + 1.0), timeout_s=30)
    assert answer.reason == "expired"
    assert time.monotonic() - started < 6  # the request's 1 s, not the call's 30 s


async def test_a_cancelled_wait_withdraws_its_request(broker: Broker) -> None:
    request = ask()
    async with broker.events() as events, broker.responder("web") as web:
        wait = asyncio.create_task(broker.wait_for(request, timeout_s=10))
        pending = await next_pending(web)
        wait.cancel()
        with pytest.raises(asyncio.CancelledError):
            await wait
        async with asyncio.timeout(5):
            event = await anext(events)
        assert (event.event, event.id) == ("withdrawn", request.id)
        with pytest.raises(AlreadyResolved, match="withdrawn"):
            await pending.accept({"name": "Too late"})


async def test_an_invalid_form_answer_is_refused_and_the_request_stays_open(
    broker: Broker,
) -> None:
    async with broker.responder("web") as web, waiting(broker, ask()) as wait:
        pending = await next_pending(web)
        with pytest.raises(InvalidAnswer, match="name"):
            await pending.accept({"name": "A"})  # minLength 2
        with pytest.raises(InvalidAnswer, match="guests"):
            await pending.accept({"name": "Ada", "guests": 99})
        assert not wait.done()
        await pending.accept({"name": "Ada", "guests": 3})
        assert (await wait).data == {"name": "Ada", "guests": 3}


async def test_a_group_that_starts_later_still_sees_open_requests(broker: Broker) -> None:
    async with waiting(broker, ask("early")) as wait:
        await asyncio.sleep(0.05)
        async with broker.responder("late-group") as late:
            pending = await next_pending(late)
            assert pending.request.prompt == "early"
            await pending.accept({"name": "Ada"})
        assert (await wait).ok


async def test_requests_resolved_before_a_group_reads_them_are_skipped(broker: Broker) -> None:
    async with broker.responder("fast") as fast, broker.responder("slow") as slow:
        async with waiting(broker, ask("first")) as first:
            await (await next_pending(fast)).accept({"name": "Ada"})
            await first
        async with waiting(broker, ask("second")) as second:
            shown = await next_pending(slow)
            assert shown.request.prompt == "second"  # "first" was skipped
            await shown.accept({"name": "Bob"})
            await second


async def test_events_tell_responders_what_happened(broker: Broker) -> None:
    answered, expired = ask("answered"), ask("expired")
    async with broker.events() as events, broker.responder("web") as web:
        async with waiting(broker, answered) as wait:
            await (await next_pending(web)).accept({"name": "Ada"})
            await wait
        await broker.wait_for(expired, timeout_s=0.2)
        await broker.complete(answered.id)
        seen = []
        async with asyncio.timeout(5):
            while len(seen) < 3:
                event = await anext(events)
                seen.append((event.event, event.id))
    assert seen == [("answered", answered.id), ("expired", expired.id), ("completed", answered.id)]


async def test_a_request_held_by_a_closed_consumer_goes_to_another(broker: Broker) -> None:
    async with waiting(broker, ask()) as wait:
        first = broker.responder("web", "first")
        await next_pending(first)
        await first.aclose()  # closed without answering
        async with broker.responder("web", "second") as second:
            pending = await next_pending(second, timeout_s=10)
            await pending.accept({"name": "Ada"})
        assert (await wait).ok


async def test_a_skipped_request_is_not_shown_again_to_its_group(broker: Broker) -> None:
    async with broker.responder("bot") as bot, broker.responder("web") as web:
        async with waiting(broker, ask("hard")) as wait:
            await (await next_pending(bot)).skip()
            await (await next_pending(web)).accept({"name": "Ada"})
            assert (await wait).ok
        async with waiting(broker, ask("next")):
            assert (await next_pending(bot)).request.prompt == "next"


async def test_waiting_twice_for_one_id_is_misuse(broker: Broker) -> None:
    request = ask()
    async with waiting(broker, request):
        await asyncio.sleep(0.01)
        with pytest.raises(InvalidRequest, match="already being waited for"):
            await broker.wait_for(request)


async def test_concurrent_waits_each_get_their_own_answer(broker: Broker) -> None:
    async def respond() -> None:
        async with broker.responder("echo") as echo:
            async for pending in echo:
                await pending.accept({"name": pending.request.prompt})

    responder = asyncio.create_task(respond())
    try:
        prompts = [f"p{i}" for i in range(500)]
        answers = await asyncio.gather(*(broker.wait_for(ask(p), timeout_s=8) for p in prompts))
    finally:
        responder.cancel()
        await asyncio.gather(responder, return_exceptions=True)
    assert [a.data["name"] for a in answers] == prompts


@pytest.mark.slow
async def test_wait_for_is_a_wait_for(broker: Broker) -> None:
    wait_for: toolnexus.WaitFor = broker.wait_for
    # 1 s: a publish must land first (a just-started Cluster can take a few hundred ms).
    answer = await wait_for(
        Request(
            id=new_id(), kind="approval", prompt="ok?", expires_at=__import__("time").time() + 1.0
        )
    )
    assert answer.reason == "expired"


async def test_an_until_idle_responder_ends_once_nothing_is_left(broker: Broker) -> None:
    requests = [ask(f"q{i}") for i in range(5)]
    tasks = [asyncio.create_task(broker.wait_for(r, timeout_s=10)) for r in requests]
    for _ in range(200):  # until every request is published
        await asyncio.sleep(0.01)
        async with broker.responder("count", until_idle=True) as counter:
            seen = [p async for p in counter]
        if len(seen) == 5:
            break
    async with asyncio.timeout(5), broker.responder("bot", until_idle=True) as bot:
        async for pending in bot:
            await pending.accept({"name": pending.request.prompt})
    answers = await asyncio.gather(*tasks)
    assert [a.data["name"] for a in answers] == [f"q{i}" for i in range(5)]
    async with asyncio.timeout(5), broker.responder("bot", until_idle=True) as again:
        assert [p async for p in again] == []  # nothing left: ends at once


@pytest.mark.parametrize(
    ("data", "rule"),
    [
        ({"name": "Ada", "admin": True}, "additionalProperties"),
        ({"name": "Ada", "__proto__": {}}, "additionalProperties"),
        ({"name": "Ada", "guests": float("nan")}, "finite"),
        ({"name": "x" * (2 * 1024 * 1024)}, "maxBytes"),
    ],
    ids=["extra-field", "proto", "nan", "2MB"],
)
async def test_answers_that_cannot_be_delivered_are_refused_and_the_request_stays_open(
    broker: Broker, data: dict[str, Any], rule: str
) -> None:
    async with broker.responder("web") as web, waiting(broker, ask()) as wait:
        pending = await next_pending(web)
        with pytest.raises(InvalidAnswer) as info:
            await pending.accept(data)
        assert info.value.rule == rule
        assert len(str(info.value)) < 300
        if rule == "maxBytes":
            assert "over the limit of 1048576 bytes" in str(info.value)
        await pending.accept({"name": "Ada"})
        assert (await wait).data == {"name": "Ada", "guests": 2}


@pytest.mark.parametrize("reason", ["expired", "withdrawn", "unavailable"])
async def test_responders_cannot_give_the_broker_s_own_reasons(broker: Broker, reason: str) -> None:
    async with broker.responder("web") as web, waiting(broker, ask()) as wait:
        pending = await next_pending(web)
        with pytest.raises(InvalidAnswer, match=f"reason '{reason}' is the broker's"):
            await pending.answer(Answer(id=pending.request.id, ok=False, reason=reason))
        await pending.answer(Answer(id=pending.request.id, ok=False, reason="not today"))
        assert (await wait).reason == "not today"


async def test_a_group_that_starts_right_after_an_answer_is_not_shown_it(
    broker: Broker,
) -> None:
    async with broker.responder("first") as first:
        for i in range(10):
            async with waiting(broker, ask(f"r{i}")) as wait:
                await (await next_pending(first)).accept({"name": "Ada"})
                async with broker.responder(f"late{i}", until_idle=True) as late:
                    assert [p.request.prompt async for p in late] == []
                assert (await wait).ok


async def test_a_request_id_that_cannot_name_a_key_is_misuse(broker: Broker) -> None:
    for bad in ("", "has space", "x" * 201, "tab\there"):
        with pytest.raises(InvalidRequest, match="request id"):
            await broker.wait_for(Request(id=bad, kind="approval"))
