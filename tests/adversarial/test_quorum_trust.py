"""Quorum by person (threat model S7, and S3 for the votes read back): issue #24,
observation 7, on a private redis-server.

An attacker who can write a request's state (any responder or agent Redis user) fills a
real person's voter slot with a forged decline: one ``HSET``. Before, that person's
genuine vote was refused as ``AlreadyVoted`` until the deadline, the forgery never read,
removed or audited. Now the genuine vote, sent once, wakes the waiter, which refuses the
forgery, removes it, audits it and casts the genuine vote in its place. And one person
voting through two workers' keys counts once.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis.asyncio as aioredis

import toolnexus
from conftest import FAST, RedisServer
from helpers import published_request
from toolnexus import Answer, Event, Pending, Quorum, Request
from toolnexus.errors import AlreadyVoted
from toolnexus.models import new_id
from toolnexus.redis_broker import RedisBroker
from toolnexus.security import Keyring, SigningKey
from toolnexus.security._signing import sign_answer

pytestmark = pytest.mark.redis


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    """A private redis-server (no persistence: nothing here restarts it)."""
    private = RedisServer(tmp_path)
    private.start()
    try:
        yield private
    finally:
        private.kill()


@pytest.fixture
async def attacker(server: RedisServer) -> AsyncIterator[aioredis.Redis]:
    """A plain Redis client on the server: all it takes is write access to a state."""
    client = aioredis.Redis.from_url(server.url)
    try:
        yield client
    finally:
        await client.aclose()


@dataclass
class Fleet:
    """An agent and two responder workers (``web``, ``cli``), each with its own key; with
    ``signed``, every process requires signatures."""

    url: str
    signed: bool = True

    def __post_init__(self) -> None:
        self.agent_key = SigningKey.generate("agent")
        self.keys = {name: SigningKey.generate(name) for name in ("web", "cli")}

    def agent(self) -> RedisBroker:
        if not self.signed:
            return self._connect()
        trusted = Keyring.of(*self.keys.values())
        return self._connect(self.agent_key, trusted)

    def worker(self, name: str) -> RedisBroker:
        if not self.signed:
            return self._connect()
        return self._connect(self.keys[name], Keyring.of(self.agent_key))

    def _connect(
        self, key: SigningKey | None = None, trusted: Keyring | None = None
    ) -> RedisBroker:
        options = {"signing_key": key, "trusted_keys": trusted} if key is not None else {}
        broker = toolnexus.connect(
            self.url, namespace="q", require_signatures=self.signed, **options, **FAST
        )
        assert isinstance(broker, RedisBroker)
        return broker


@asynccontextmanager
async def asking(
    agent: RedisBroker, need: int, durable: bool = False
) -> AsyncIterator[tuple[Request, asyncio.Task[Answer], str]]:
    """A quorum request asked by ``agent``: the request, its wait and its state's key."""
    request = Request(
        id=new_id(), kind="approval", prompt="Wire 40k EUR?", quorum=Quorum(need), durable=durable
    )
    waiter = agent.keys.durable_waiter(agent.settings.agent) if durable else agent.waiter_id
    state = agent.keys.state(waiter, request.id)
    task = asyncio.create_task(agent.wait_for(request, timeout_s=30))
    try:
        async with asyncio.timeout(10):
            while not await agent.redis.exists(state):
                await asyncio.sleep(0.01)
        yield request, task, state
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def shown(worker: RedisBroker, group: str = "web") -> Pending:
    async with asyncio.timeout(10):
        return await anext(worker.responder(group))


async def slot(attacker: aioredis.Redis, state: str, voted: str, person: str) -> str:
    """The field the broker keeps ``person``'s decline in, as an attacker learns it: from
    the field a vote of ``voted`` was stored under (whatever the broker's format)."""
    [field] = [f.decode() for f in await attacker.hkeys(state) if voted in f.decode()]
    return "n:" + field[2:].replace(voted, person)


async def vote(pending: Pending, person: str) -> Event | AlreadyVoted | None:
    """``person``'s accept: what the responder is told (the error, if refused)."""
    try:
        return await pending.accept(person=person)
    except AlreadyVoted as exc:
        return exc


async def answered(wait: asyncio.Task[Answer], otherwise: str) -> Answer:
    """The answer ``wait`` gets within 10 s; else the test fails saying ``otherwise``."""
    done, _ = await asyncio.wait({wait}, timeout=10)
    assert done, otherwise
    return wait.result()


def persons(answer: Answer) -> list[str | None]:
    return [approval.person for approval in answer.approvals or ()]


@pytest.mark.parametrize("durable", [False, True], ids=["own", "durable"])
async def test_a_forged_decline_in_a_persons_slot_is_refused_removed_audited_and_the_person_counts(
    server: RedisServer, attacker: aioredis.Redis, durable: bool
) -> None:
    """S7/S3, observation 7: a forged decline stored in alice's voter slot. Her genuine
    accept, sent once, counts: the waiter refuses the forgery (audited), removes it and
    casts her vote, which decides; her worker is told so. The outcome is carol's and
    alice's quorum. The same for a durable request (state and replies under the queue's
    durable waiter)."""
    fleet = Fleet(server.url)
    rogue = SigningKey.generate("web")  # named as the web worker, not its key
    async with fleet.agent() as agent, fleet.worker("web") as web:
        async with asking(agent, need=2, durable=durable) as (request, wait, state):
            pending = await shown(web)
            counted = await pending.accept(person="web:carol")
            assert counted is not None and counted.count == 1
            field = await slot(attacker, state, "web:carol", "web:alice")
            published = await published_request(agent, request.id)
            forged = Answer(id=request.id, ok=False, reason="declined", person="web:alice")
            forged = sign_answer(forged, published, rogue)
            await attacker.hset(state, field, agent.codec.encode(forged))

            told = await vote(pending, "web:alice")  # alice votes once, no more
            answer = await answered(wait, "the forged decline blocks alice's genuine vote")
            assert not await attacker.hexists(state, field)  # the forgery is gone
        [record] = await agent.audit(request_id=request.id)
    assert told is None, told  # told what happened: cast by the waiter, her vote decided
    assert (answer.ok, answer.person, answer.responder) == (True, "web:alice", "web")
    assert persons(answer) == ["web:carol", "web:alice"]
    assert (record.status, record.ok, record.verified) == ("answered", True, True)
    assert [(r.person, r.key, r.reason) for r in record.refused] == [
        ("web:alice", "web", "bad signature")
    ]
    voted = sorted(agent.codec.decode_as(v, Answer).person or "" for v in record.votes)
    assert voted == ["web:alice", "web:carol"]


async def test_a_person_whose_slot_held_a_forgery_is_told_the_count(
    server: RedisServer, attacker: aioredis.Redis
) -> None:
    """S7/S4, observation 7: a forged accept (unsigned) in alice's slot of a quorum that
    needs three. Her genuine accept, sent once, counts, and her worker is told the count
    (2 of 3: carol and her), not "already voted"."""
    fleet = Fleet(server.url)
    async with fleet.agent() as agent, fleet.worker("web") as web:
        async with asking(agent, need=3) as (request, wait, state):
            pending = await shown(web)
            assert await pending.accept(person="web:carol") is not None
            field = await slot(attacker, state, "web:carol", "web:alice")
            forged = Answer(id=request.id, ok=True, responder="web", person="web:alice")
            await attacker.hset(state, "y:" + field[2:], agent.codec.encode(forged))
            told = await vote(pending, "web:alice")
            assert isinstance(told, Event), f"alice's genuine vote was refused: {told}"
            assert (told.count, sorted(told.approvers or ())) == (2, ["web:alice", "web:carol"])
            assert await pending.accept(person="web:bob") is None
            answer = await answered(wait, "the quorum of three did not decide")
        [record] = await agent.audit(request_id=request.id)
    assert answer.ok and persons(answer) == ["web:carol", "web:alice", "web:bob"]
    assert [(r.person, r.reason) for r in record.refused] == [("web:alice", "missing signature")]


async def test_one_person_through_two_workers_keys_counts_once(server: RedisServer) -> None:
    """S7, observation 7: alice approves through the web worker and again through the
    cli worker (each its own trusted key). Need 2 is not met by one person: her second
    vote is not counted, the request stays open until bob approves."""
    fleet = Fleet(server.url)
    async with fleet.agent() as agent, fleet.worker("web") as web, fleet.worker("cli") as cli:
        async with asking(agent, need=2) as (request, wait, _):
            on_web, on_cli = await shown(web), await shown(cli, "cli")
            counted = await on_web.accept(person="web:alice")
            assert counted is not None and counted.count == 1
            told = await vote(on_cli, "web:alice")
            await asyncio.sleep(0.5)  # the waiter, woken to check, keeps her first vote
            assert not wait.done(), f"alice counted twice: {wait.result().approvals}"
            assert isinstance(told, AlreadyVoted) and told.voter == "web:alice", told
            assert not told.contested  # signed for this request: her first vote stands
            assert await on_cli.accept(person="ops:bob") is None
            answer = await asyncio.wait_for(wait, 10)
        [record] = await agent.audit(request_id=request.id)
    assert answer.ok and persons(answer) == ["web:alice", "ops:bob"]
    assert [a.responder for a in answer.approvals or ()] == ["web", "cli"]
    assert len(record.votes) == 2 and record.refused == []


async def test_a_persons_genuine_vote_copied_into_another_slot_counts_once_and_is_removed(
    server: RedisServer, attacker: aioredis.Redis
) -> None:
    """S3/S7, observation 7: alice's genuine signed vote copied into another voter's slot
    (Redis then counts her twice). The waiter counts her once, refuses the copy (audited:
    stored under another voter) and removes it, so Redis's count is honest again; the
    outcome is the genuine quorum's."""
    fleet = Fleet(server.url)
    async with fleet.agent() as agent, fleet.worker("web") as web:
        async with asking(agent, need=3) as (request, wait, state):
            pending = await shown(web)
            assert await pending.accept(person="web:alice") is not None
            [alices] = [f for f in await attacker.hkeys(state) if b"web:alice" in f]
            copy = alices.replace(b"web:alice", b"web:mallory")  # mallory's slot
            mine = await attacker.hget(state, alices)
            await attacker.hset(state, copy, mine)
            assert await pending.accept(person="web:bob") is None  # 3 in Redis: resolved
            await asyncio.sleep(0.5)  # the waiter counts 2 of 3: opened again
            assert not wait.done(), f"alice counted twice: {wait.result().approvals}"
            assert not await attacker.hexists(state, copy), "the copy still counts in Redis"
            assert await web.answer(Answer(id=request.id, ok=True, person="web:carol")) is None
            answer = await answered(wait, "the genuine quorum of three did not decide")
        [record] = await agent.audit(request_id=request.id)
    assert answer.ok and persons(answer) == ["web:alice", "web:bob", "web:carol"]
    assert [(r.person, r.reason) for r in record.refused] == [
        ("web:alice", "stored under another voter")
    ]


async def test_garbage_in_a_persons_slot_without_signatures_does_not_block_them(
    server: RedisServer, attacker: aioredis.Redis
) -> None:
    """S7, observation 7, without signatures: unreadable bytes in alice's voter slot
    neither crash the waiter nor block her: her vote counts and the garbage is removed
    and audited."""
    fleet = Fleet(server.url, signed=False)
    async with fleet.agent() as agent, fleet.worker("web") as web:
        async with asking(agent, need=2) as (request, wait, state):
            pending = await shown(web)
            assert await pending.accept(person="web:carol") is not None
            field = await slot(attacker, state, "web:carol", "web:alice")
            await attacker.hset(state, field, b"\xc1 not a vote")
            told = await vote(pending, "web:alice")
            answer = await answered(wait, "the garbage in alice's slot blocks her vote")
            assert not await attacker.hexists(state, field)
            assert told is None, told  # her vote decided
        [record] = await agent.audit(request_id=request.id)
    assert answer.ok and persons(answer) == ["web:carol", "web:alice"]
    assert [r.reason for r in record.refused] == ["unreadable vote"]
