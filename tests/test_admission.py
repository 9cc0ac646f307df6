"""One admission rule: what an incoming item does to a request, by the request's state.

Two tables, each run on both brokers:

- the rule itself: every (state x item x before/after the deadline) case through the Lua
  snippet the ``RESOLVE`` and ``VOTE`` scripts compose (``ADMIT``, on a real Redis) and
  through :func:`toolnexus.lifecycle.admit` (which the embedded broker calls): the same
  outcome, the same stored answer shown again, the same answer contested;
- the brokers: every (state x item) case a program can reach through the public API, on
  ``memory://`` and on Redis, with the outcome a responder is told asserted identical.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass

import pytest
import redis.asyncio as aioredis

import toolnexus
from toolnexus import AlreadyResolved, Answer, Broker, Pending, Quorum, Request, new_id
from toolnexus.errors import AlreadyVoted, Contested, UnknownRequest
from toolnexus.keys import Keys
from toolnexus.lifecycle import Admission, Item, Outcome, Status, admit
from toolnexus.models import WithdrawnEvent
from toolnexus.redis_broker import RedisBroker
from toolnexus.redis_broker._answering import finish
from toolnexus.redis_broker._layout import LUA_FIELDS
from toolnexus.redis_broker._scripts import ADMIT

pytestmark = pytest.mark.redis

WAITER = "0123456789abcdef"

# -- the rule: the Lua snippet and the Python function ----------------------------------

HARNESS = (
    LUA_FIELDS
    + ADMIT
    + """
-- KEYS reply stream, liveness mark, state; ARGV item, id, answer, deadline_ms
local reply = admit(KEYS[3], ARGV[1], ARGV[2], ARGV[3], ARGV[4], KEYS)
if not reply then
  return {'admitted'}
end
return reply
"""
)

STATES: dict[str, tuple[Status | None, bytes | None]] = {
    # name: (status stored, answer stored); "same" below stores the incoming answer
    "unknown": (None, None),
    "open": (Status.OPEN, None),
    "open-gone": (Status.OPEN, None),  # its waiter is not alive
    "open-durable-gone": (Status.OPEN, None),  # durable: its waiter counts as alive
    "answered": (Status.ANSWERED, b"the stored answer"),
    "answered-same": (Status.ANSWERED, b"incoming"),  # the same answer, sent again
    "answered-empty": (Status.ANSWERED, None),  # an edited state: no answer stored
    "expired": (Status.EXPIRED, b"the expiry"),
    "withdrawn": (Status.WITHDRAWN, b"the withdrawal"),
}


@dataclass(frozen=True)
class RuleCase:
    state: str
    item: Item
    before: bool  # before the signed deadline, by Redis time

    @property
    def id(self) -> str:
        return f"{self.state}-{self.item}-{'before' if self.before else 'after'}"


RULE_CASES = [
    RuleCase(state, item, before) for state in STATES for item in Item for before in (True, False)
]


@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    redis_ = aioredis.Redis.from_url(redis_url)
    yield redis_
    await redis_.aclose()


async def _in_lua(
    client: aioredis.Redis, keys: Keys, case: RuleCase, deadline_ms: int
) -> Admission:
    status, stored = STATES[case.state]
    state, answers, alive = keys.state(WAITER, "r"), keys.answers(WAITER), keys.alive(WAITER)
    await client.delete(state, answers, alive)
    if not case.state.endswith("gone"):
        await client.set(alive, "1")
    if status is not None:
        fields: dict[str, str | bytes | int] = {"s": status.value, "x": deadline_ms}
        if stored is not None:
            fields["a"] = stored
        if case.state == "open-durable-gone":
            fields["d"] = "1"
        await client.hset(state, mapping=fields)
    reply = await client.eval(
        HARNESS, 3, answers, alive, state, case.item.value, "r", "incoming", deadline_ms
    )
    sent = [fields for _, fields in await client.xrange(answers)]
    said = reply[0].decode()
    return Admission(
        None if said == "admitted" else Outcome(said),
        resend=any(b"c" not in entry for entry in sent),
        contest=any(b"c" in entry for entry in sent),
    )


def _in_python(case: RuleCase, now_ms: int, deadline_ms: int) -> Admission:
    status, stored = STATES[case.state]
    return admit(
        case.item,
        status,
        stored_same=None if stored is None else stored == b"incoming",
        now_ms=now_ms,
        deadline_ms=deadline_ms,
        alive=not case.state.endswith("gone"),
        durable=case.state == "open-durable-gone",
    )


async def test_the_lua_snippet_and_the_python_rule_agree_on_every_case(
    client: aioredis.Redis, namespace: str
) -> None:
    keys = Keys(namespace, "default")
    seen: dict[Outcome | None, int] = {}
    for case in RULE_CASES:
        seconds, micros = await client.time()
        now_ms = seconds * 1000 + micros // 1000
        deadline_ms = now_ms + 60_000 if case.before else now_ms - 1_000
        lua = await _in_lua(client, keys, case, deadline_ms)
        python = _in_python(case, now_ms, deadline_ms)
        assert lua == python, case.id
        seen[lua.outcome] = seen.get(lua.outcome, 0) + 1
    # every verdict the rule has was reached (the table is not vacuous)
    assert set(seen) == {None, *Outcome} - {Outcome.OK, Outcome.COUNTED}


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        (RuleCase("unknown", Item.ANSWER, True), Admission(Outcome.CONTESTED, contest=True)),
        (RuleCase("unknown", Item.VOTE, True), Admission(Outcome.UNKNOWN)),
        (RuleCase("open", Item.ANSWER, True), Admission(None)),
        (RuleCase("open", Item.VOTE, False), Admission(Outcome.LATE)),
        (RuleCase("open", Item.EXPIRY, True), Admission(Outcome.EARLY)),
        (RuleCase("open", Item.EXPIRY, False), Admission(None)),
        (RuleCase("open", Item.END, True), Admission(None)),
        (RuleCase("open-gone", Item.ANSWER, True), Admission(Outcome.GONE)),
        (RuleCase("open-durable-gone", Item.VOTE, True), Admission(None)),
        (
            RuleCase("answered", Item.ANSWER, True),
            Admission(Outcome.CONTESTED, resend=True, contest=True),
        ),
        (RuleCase("answered", Item.ANSWER, False), Admission(Outcome.ANSWERED, resend=True)),
        (RuleCase("answered", Item.VOTE, True), Admission(Outcome.ANSWERED, resend=True)),
        (RuleCase("answered-same", Item.ANSWER, True), Admission(Outcome.ANSWERED, resend=True)),
        (RuleCase("expired", Item.VOTE, True), Admission(Outcome.EXPIRED, resend=True)),
        (RuleCase("withdrawn", Item.END, True), Admission(Outcome.WITHDRAWN)),
    ],
    ids=lambda value: value.id if isinstance(value, RuleCase) else "",
)
def test_the_rule_decides_as_the_trust_model_says(case: RuleCase, expected: Admission) -> None:
    """The cases docs/security.md names: an answer before the deadline to a state that holds
    another answer or none is contested (S4), a vote is not (the waiter checks every vote,
    S7); a stored answer is shown to the waiter again whenever an answer or a vote finds the
    request resolved; a responder's expiry waits for the deadline by Redis time."""
    now_ms = 1_000_000
    deadline_ms = now_ms + 60_000 if case.before else now_ms - 1_000
    assert _in_python(case, now_ms, deadline_ms) == expected


# -- the brokers: the outcome a responder is told ---------------------------------------


@dataclass(frozen=True)
class Case:
    state: str  # how the request stands when the item comes
    item: str  # answer (a vote, on a quorum) | resent | different | late
    told: str  # what the responder sending the item is told

    @property
    def id(self) -> str:
        return f"{self.state}-{self.item}"


CASES = [
    Case("unknown", "answer", "unknown"),
    Case("unknown", "different", "unknown"),
    Case("unknown", "late", "unknown"),
    Case("open", "answer", "ok"),
    Case("open", "resent", "ok"),
    Case("open", "different", "ok"),
    Case("open", "late", "lost: expired"),
    Case("accepted", "answer", "lost: answered"),
    Case("accepted", "resent", "ok"),
    Case("accepted", "different", "lost: answered"),
    Case("accepted", "late", "lost: answered"),
    Case("declined", "answer", "lost: answered"),
    Case("declined", "resent", "ok"),
    Case("declined", "different", "lost: answered"),
    Case("declined", "late", "lost: answered"),
    Case("expired", "answer", "lost: expired"),
    Case("expired", "different", "lost: expired"),
    Case("expired", "late", "lost: expired"),
    Case("withdrawn", "answer", "lost: withdrawn"),
    Case("withdrawn", "different", "lost: withdrawn"),
    Case("withdrawn", "late", "lost: withdrawn"),
    Case("quorum-open", "answer", "counted"),
    Case("quorum-open", "resent", "counted"),
    Case("quorum-open", "different", "counted"),
    Case("quorum-open", "late", "lost: expired"),
    Case("quorum-partial", "answer", "counted"),
    Case("quorum-partial", "resent", "counted"),
    Case("quorum-partial", "different", "already voted"),
    Case("quorum-partial", "late", "lost: expired"),
]

DEADLINE_S = 0.8
"""The deadline of a request that is to expire, or to be answered late."""


async def _told(call: Awaitable[object]) -> str:
    try:
        progress = await call
    except AlreadyVoted:
        return "already voted"
    except AlreadyResolved as exc:
        return f"lost: {exc.status}"
    except UnknownRequest:
        return "unknown"
    except Contested:
        return "contested"
    return "ok" if progress is None else "counted"


async def _next(responder: toolnexus.Responder) -> Pending:
    async with asyncio.timeout(10):
        return await anext(responder)


async def _withdrawn(events: toolnexus.EventStream, request_id: str) -> None:
    async with asyncio.timeout(10):
        async for event in events:
            if isinstance(event, WithdrawnEvent) and event.id == request_id:
                return


async def _case(broker: Broker, case: Case) -> str:
    quorum = Quorum(need=3, decline="count") if case.state.startswith("quorum") else None
    request = Request(id=new_id("adm"), kind="approval", prompt="Deploy?", quorum=quorum)
    if case.state == "unknown":  # (no deadline is known of a request nobody knows)
        return await _told(broker.answer(Answer(id=request.id, ok=True, person="b")))
    expiring = case.state == "expired" or case.item == "late"
    deadline = time.time() + (DEADLINE_S if expiring else 30)
    first = Answer(
        id=request.id,
        ok=case.state != "declined",
        reason="declined" if case.state == "declined" else None,
        person="a",
    )
    async with (
        broker.events() as events,
        broker.responder("web") as web,
        broker.responder("chat") as chat,
    ):
        wait = asyncio.create_task(broker.wait_for(request, timeout_s=deadline - time.time()))
        try:
            mine, other = await _next(web), await _next(chat)
            if case.state in ("accepted", "declined", "quorum-partial"):
                assert await _told(mine.answer(first)) in ("ok", "counted")
            elif case.state == "expired":
                assert (await wait).reason == "expired"
            elif case.state == "withdrawn":
                wait.cancel()
                await asyncio.gather(wait, return_exceptions=True)
                await _withdrawn(events, request.id)
            if case.item == "late":
                await asyncio.sleep(max(0.0, deadline - time.time()) + 0.3)
            if case.item == "resent":
                if case.state in ("open", "quorum-open"):
                    await _told(mine.answer(first))
                return await _told(mine.answer(first))
            if case.item == "different":  # the same person, the other way
                return await _told(other.answer(Answer(id=request.id, ok=not first.ok, person="a")))
            return await _told(other.answer(Answer(id=request.id, ok=True, person="b")))
        finally:
            wait.cancel()
            await asyncio.gather(wait, return_exceptions=True)


@pytest.fixture(params=["memory", "redis"])
async def each_broker(
    request: pytest.FixtureRequest, namespace: str, redis_url: str
) -> AsyncIterator[Broker]:
    url = "memory://" if request.param == "memory" else redis_url
    options = {} if request.param == "memory" else {"block_ms": 100, "lease_ms": 600}
    async with toolnexus.connect(url, namespace=namespace, **options) as broker:
        yield broker


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=lambda case: case.id)
async def test_both_brokers_tell_a_responder_the_same(each_broker: Broker, case: Case) -> None:
    assert await _case(each_broker, case) == case.told


async def test_a_responder_cannot_expire_a_request_before_its_deadline_by_redis_time(
    redis_url: str, namespace: str
) -> None:
    """What a responder whose clock runs ahead would do, ending a request it takes for late:
    Redis time judges, and the request stays open for its answer."""
    async with toolnexus.connect(redis_url, namespace=namespace, block_ms=100) as broker:
        assert isinstance(broker, RedisBroker)
        async with broker.responder("web") as web:
            request = Request(id=new_id("adm"), kind="approval", prompt="Deploy?")
            wait = asyncio.create_task(broker.wait_for(request, timeout_s=30))
            pending = await _next(web)
            expiry = finish(broker.core, pending.request, Status.EXPIRED, None, pending.protocol)
            assert not await expiry
            state = broker.keys.state(pending.request.reply_to or "", request.id)
            assert await broker.redis.hget(state, "s") == b"open"
            await pending.accept(person="a")
            assert (await wait).ok
