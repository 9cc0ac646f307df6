"""SPEC §14 quorum: a request that needs ``need`` accepting answers from distinct persons.

Through Redis, the voters are processes of their own: ``tests/servers/voter.py`` (a
responder voting for several persons through one pending, as a web page does for its
users) and ``toolnexus answer``. The semantics also run in-process on both brokers.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

import toolnexus
from conftest import FAST
from helpers import ask, next_event, opened
from toolnexus import (
    AlreadyResolved,
    Answer,
    Broker,
    Event,
    Pending,
    Quorum,
    Request,
    Service,
    Worker,
)
from toolnexus.errors import AlreadyVoted
from toolnexus.models import new_id
from toolnexus.redis_broker import RedisBroker
from toolnexus.responders import approvals_line
from toolnexus.security import Keyring, SigningKey, verify_record

VOTER = str(Path(__file__).resolve().parent / "servers" / "voter.py")
TOOLNEXUS = str(Path(sys.executable).with_name("toolnexus"))


@asynccontextmanager
async def waiting(broker: Broker, request: Request) -> AsyncIterator[asyncio.Task[Answer]]:
    task = asyncio.create_task(broker.wait_for(request, timeout_s=30))
    if isinstance(broker, RedisBroker):
        await opened(broker, request.id)
    else:
        await asyncio.sleep(0)
    try:
        yield task
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def still_waiting(task: asyncio.Task[Answer], for_s: float = 0.5) -> None:
    await asyncio.sleep(for_s)
    assert not task.done(), task.result()


def persons(answer: Answer) -> list[str | None]:
    return [approval.person for approval in answer.approvals or ()]


# -- processes ------------------------------------------------------------------------


class Keys:
    """Key files for an agent and two responders (the voter process, and ``toolnexus
    answer``), and the environment each process reads them from."""

    def __init__(self, directory: Path) -> None:
        self.agent = SigningKey.generate("agent")
        self.web = SigningKey.generate("web")
        self.cli = SigningKey.generate("cli")
        self.directory = directory
        for key in (self.agent, self.web, self.cli):
            key.save(directory / key.name)

    def env(self, name: str) -> dict[str, str]:
        trusted = self.directory / "agent" / "agent.pub"
        return {
            "TOOLNEXUS_SIGNING_KEY": str(self.directory / name / f"{name}.key"),
            "TOOLNEXUS_TRUSTED_KEYS": str(trusted),
            "TOOLNEXUS_REQUIRE_SIGNATURES": "1",
        }

    def agent_broker(self, url: str, namespace: str) -> RedisBroker:
        broker = toolnexus.connect(
            url,
            namespace=namespace,
            signing_key=self.agent,
            trusted_keys=Keyring.of(self.web, self.cli),
            require_signatures=True,
            **FAST,
        )
        assert isinstance(broker, RedisBroker)
        return broker


def _env(extra: dict[str, str] | None) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TOOLNEXUS_")}
    return {**clean, **(extra or {})}


class Voter:
    """``tests/servers/voter.py`` running; :meth:`next` is its next vote's result."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process

    async def next(self, timeout_s: float = 20) -> Any:
        assert self.process.stdout is not None
        async with asyncio.timeout(timeout_s):
            line = await self.process.stdout.readline()
        assert line, "the voter process ended"
        return json.loads(line)


@asynccontextmanager
async def voter(
    url: str, namespace: str, votes: list[tuple[str, str]], env: dict[str, str] | None = None
) -> AsyncIterator[Voter]:
    process = await asyncio.create_subprocess_exec(
        sys.executable, VOTER, url, namespace, json.dumps(votes),
        stdout=asyncio.subprocess.PIPE, env=_env(env),
    )  # fmt: skip
    running = Voter(process)
    try:
        assert await running.next(30) == "ready"
        yield running
    finally:
        process.terminate()
        await process.wait()


async def answer_command(
    url: str, namespace: str, request_id: str, person: str, how: str = "--accept", **env: str
) -> tuple[int, str, str]:
    """``toolnexus answer`` in a process of its own: exit status, stdout, stderr."""
    process = await asyncio.create_subprocess_exec(
        TOOLNEXUS, "answer", request_id, how, "--person", person,
        "--url", url, "--namespace", namespace,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=_env(env),
    )  # fmt: skip
    async with asyncio.timeout(30):
        out, err = await process.communicate()
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


# -- through Redis, with responder processes ------------------------------------------


@pytest.mark.redis
@pytest.mark.slow
async def test_two_of_three_where_one_person_answers_twice(
    redis_url: str, namespace: str, tmp_path: Path
) -> None:
    keys = Keys(tmp_path)
    async with keys.agent_broker(redis_url, namespace) as agent:
        events = agent.events()
        request = ask(quorum=Quorum(2))
        async with waiting(agent, request) as wait:
            votes = [("web:alice", "accept"), ("web:alice", "accept")]
            async with voter(redis_url, namespace, votes, keys.env("web")) as web:
                first = await web.next()
                assert first["result"] == "counted"
                assert (first["count"], first["need"]) == (1, 2)
                assert first["approvers"] == ["web:alice"]  # the voter is the person
                second = await web.next()
                assert second["result"] == "already voted by web:alice"
                await still_waiting(wait)  # one person twice is one vote
                code, out, err = await answer_command(
                    redis_url, namespace, request.id, "ops:bob", **keys.env("cli")
                )
                assert (code, err) == (0, ""), err
                assert (
                    out.strip() == f"{request.id}: accepted by cli / ops:bob, taken by the waiter"
                )
                answer = await asyncio.wait_for(wait, 20)
        approved = await next_event(events, "approved", request.id)
        await events.aclose()
        assert approvals_line(approved) == "1 of 2 approvals: web:alice"
        assert (answer.ok, answer.responder, answer.person) == (True, "cli", "ops:bob")
        assert persons(answer) == ["web:alice", "ops:bob"]
        assert [a.responder for a in answer.approvals or ()] == ["web", "cli"]
        records = await agent.audit(request_id=request.id)
    [record] = records
    assert record.status == "answered" and record.ok is True and record.verified is True
    assert len(record.votes) == 2  # each signed vote, as it was stored
    voted = sorted(agent.codec.decode_as(vote, Answer).person or "" for vote in record.votes)
    assert voted == ["ops:bob", "web:alice"]
    assert verify_record(record, Keyring.of(keys.agent, keys.web, keys.cli))
    assert not verify_record(record, Keyring.of(keys.agent, keys.cli))  # alice's vote: web's key


@pytest.mark.redis
@pytest.mark.slow
async def test_a_decline_vetoes(redis_url: str, namespace: str) -> None:
    async with toolnexus.connect(redis_url, namespace=namespace, **FAST) as agent:
        request = ask(quorum=Quorum(2))
        async with waiting(agent, request) as wait:
            async with voter(redis_url, namespace, [("web:alice", "accept")]) as web:
                assert (await web.next())["result"] == "counted"
                code, out, err = await answer_command(
                    redis_url, namespace, request.id, "ops:carol", "--decline"
                )
                taken = f"{request.id}: declined by ops:carol, taken by the waiter"
                assert (code, out.strip(), err) == (0, taken, "")
                answer = await asyncio.wait_for(wait, 20)
            code, _, err = await answer_command(redis_url, namespace, request.id, "ops:dave")
            assert (code, err.strip()) == (
                1,
                f"toolnexus answer: {request.id}: refused: already answered",
            )
        assert (answer.ok, answer.reason, answer.person) == (False, "declined", "ops:carol")
        assert persons(answer) == ["web:alice"]  # who had approved before the veto
        [record] = await agent.audit(request_id=request.id)
        assert (record.ok, record.person, len(record.votes)) == (False, "ops:carol", 2)


@pytest.mark.redis
@pytest.mark.slow
async def test_a_forged_vote_never_counts_and_the_genuine_votes_resolve_it(
    redis_url: str, namespace: str, tmp_path: Path
) -> None:
    keys = Keys(tmp_path)
    async with keys.agent_broker(redis_url, namespace) as agent:
        request = ask(quorum=Quorum(2))
        async with waiting(agent, request) as wait:
            state = await opened(agent, request.id)
            forged = Answer(id=request.id, ok=True, responder="web", person="web:mallory")
            await agent.redis.hset(state, "y:web:mallory", agent.codec.encode(forged))
            votes = [("web:alice", "accept")]
            async with voter(redis_url, namespace, votes, keys.env("web")) as web:
                # Redis counts mallory's and alice's: 2 of 2; the waiter refuses mallory's
                assert (await web.next())["result"] == "resolved"
                await still_waiting(wait)
                # ... and opens the request again: shown again, alice cannot vote twice
                again = await web.next()
                assert again["result"] == "already voted by web:alice", again
                assert not await agent.redis.hexists(state, "y:web:mallory")
                code, _, err = await answer_command(
                    redis_url, namespace, request.id, "ops:bob", **keys.env("cli")
                )
                assert (code, err) == (0, ""), err
                answer = await asyncio.wait_for(wait, 20)
        assert answer.ok and persons(answer) == ["web:alice", "ops:bob"]
        [record] = await agent.audit(request_id=request.id)
        assert [(r.person, r.reason) for r in record.refused] == [
            ("web:mallory", "missing signature")
        ]
        assert len(record.votes) == 2 and record.verified is True


# -- the semantics, on both brokers ----------------------------------------------------


async def shown(broker: Broker, group: str = "web") -> Pending:
    async with asyncio.timeout(10):
        return await anext(broker.responder(group))


@pytest.mark.parametrize("broker", ["memory", "redis"], indirect=True)
async def test_a_second_vote_by_the_same_person_is_refused_and_the_pending_stays(
    broker: Broker,
) -> None:
    request = ask(quorum=Quorum(2))
    async with waiting(broker, request) as wait:
        pending = await shown(broker)
        progress = await pending.accept(person="web:alice")
        assert progress is not None and (progress.event, progress.count) == ("approved", 1)
        with pytest.raises(AlreadyVoted, match=r"already voted by web:alice$") as caught:
            await pending.accept(person="web:alice")
        assert caught.value.voter == "web:alice" and not caught.value.contested
        await still_waiting(wait, 0.2)
        assert await pending.accept(person="web:bob") is None  # the same pending: decides
        answer = await asyncio.wait_for(wait, 10)
        assert persons(answer) == ["web:alice", "web:bob"]
        with pytest.raises(AlreadyResolved):
            await pending.accept(person="web:carol")


@pytest.mark.parametrize("broker", ["memory", "redis"], indirect=True)
async def test_one_person_through_two_responders_is_one_voter(broker: Broker) -> None:
    """The voter is the person (toolnexus.voting): alice on the web page and alice in
    Slack are one approver; a bot that names no person is a voter by its own name."""
    request = ask(quorum=Quorum(2))
    async with waiting(broker, request) as wait:
        on_web, on_slack = await shown(broker, "web"), await shown(broker, "slack")
        assert await on_web.accept(person="alice") is not None
        with pytest.raises(AlreadyVoted) as caught:
            await on_slack.accept(person="alice")
        assert caught.value.voter == "alice"
        await still_waiting(wait, 0.3)
        assert await on_slack.accept() is None  # the slack worker itself, no person
        answer = await asyncio.wait_for(wait, 10)
    assert [(a.responder, a.person) for a in answer.approvals or ()] == [
        (on_web.responder_name, "alice"),
        (on_slack.responder_name, None),
    ]


@pytest.mark.parametrize("broker", ["memory", "redis"], indirect=True)
async def test_declines_counted_decide_when_they_reach_need(broker: Broker) -> None:
    request = ask(quorum=Quorum(2, "count"))
    async with waiting(broker, request) as wait:
        pending = await shown(broker)
        declined = await pending.decline(person="web:carol")
        assert declined is not None and (declined.count, declined.approvers) == (0, [])
        approved = await pending.accept(person="web:alice")
        assert approved is not None and approved.count == 1
        await still_waiting(wait, 0.2)
        assert await pending.decline(person="web:dave") is None
        answer = await asyncio.wait_for(wait, 10)
    assert (answer.ok, answer.reason, answer.person) == (False, "declined", "web:dave")
    assert persons(answer) == ["web:alice"]
    [record] = await broker.audit(request_id=request.id)
    assert len(record.votes) == 3


@pytest.mark.parametrize("broker", ["memory", "redis"], indirect=True)
async def test_accepts_reaching_need_win_in_count_mode_and_data_is_the_deciding_vote(
    broker: Broker,
) -> None:
    request = ask(quorum=Quorum(2, "count"))
    async with waiting(broker, request) as wait:
        pending = await shown(broker)
        await pending.decline(person="web:carol")
        await pending.accept({"note": "first"}, person="web:alice")
        assert await pending.accept({"note": "second"}, person="web:bob") is None
        answer = await asyncio.wait_for(wait, 10)
    assert answer.ok and answer.data == {"note": "second"}
    assert persons(answer) == ["web:alice", "web:bob"]


@pytest.mark.parametrize("broker", ["memory", "redis"], indirect=True)
async def test_the_veto_on_both_brokers(broker: Broker) -> None:
    request = ask(quorum=Quorum(3))
    async with waiting(broker, request) as wait:
        pending = await shown(broker)
        await pending.accept(person="web:alice")
        assert await pending.decline(person="web:carol") is None
        answer = await asyncio.wait_for(wait, 10)
    assert (answer.ok, answer.reason, persons(answer)) == (False, "declined", ["web:alice"])


class Approvers(Worker):
    """Votes for alice when shown; records what serve() tells it."""

    group = "approvers"

    def __init__(self) -> None:
        self.progress_seen: list[Event] = []
        self.gone_seen: list[str] = []
        self.shows = 0

    async def show(self, pending: Pending) -> None:
        self.shows += 1
        await pending.accept(person="bot:alice")

    async def progress(self, pending: Pending, event: Event) -> None:
        self.progress_seen.append(event)

    async def gone(self, pending: Pending, event: Event) -> None:
        self.gone_seen.append(event.event)


@pytest.mark.parametrize("broker", ["memory", "redis"], indirect=True)
async def test_serve_counts_a_vote_as_done_and_keeps_the_request_shown(broker: Broker) -> None:
    worker = Approvers()
    service = Service(broker, worker)
    running = asyncio.create_task(service.run())
    try:
        request = ask(quorum=Quorum(2))
        async with waiting(broker, request) as wait:
            async with asyncio.timeout(10):
                while not worker.progress_seen:
                    await asyncio.sleep(0.02)
            assert approvals_line(worker.progress_seen[0]).startswith("1 of 2 approvals: ")
            assert service.statistics()["holding"] == 1  # still shown, for other voters
            await asyncio.sleep(0.3)
            assert worker.shows == 1  # show() ran once: the vote was its answer
            await broker.answer(Answer(id=request.id, ok=True, person="ops:bob"))
            answer = await asyncio.wait_for(wait, 10)
            async with asyncio.timeout(10):
                while not worker.gone_seen:
                    await asyncio.sleep(0.02)
        assert worker.gone_seen == ["answered"] and persons(answer) == ["bot:alice", "ops:bob"]
        assert service.statistics()["holding"] == 0
    finally:
        service.stop()
        await asyncio.wait_for(running, 20)


@pytest.mark.redis
@pytest.mark.slow
async def test_status_shows_a_quorums_progress_and_audit_its_votes(
    redis_url: str, namespace: str
) -> None:
    async with toolnexus.connect(redis_url, namespace=namespace, **FAST) as agent:
        request = ask("Deploy to prod?", quorum=Quorum(2))
        async with waiting(agent, request) as wait:
            code, out, _ = await answer_command(redis_url, namespace, request.id, "ops:alice")
            assert code == 0
            assert out.strip() == f"{request.id}: accepted, counted: 1 of 2 approvals: ops:alice"
            status = await run_command("status", "--url", redis_url, "--namespace", namespace)
            assert f"quorum {request.id} 'Deploy to prod?': 1 of 2 approvals: ops:alice" in status
            await answer_command(redis_url, namespace, request.id, "ops:bob")
            await asyncio.wait_for(wait, 20)
        audit = await run_command("audit", "--url", redis_url, "--namespace", namespace)
        assert f"{request.id} approval accepted by ops:bob" in audit
        assert "votes +ops:alice, +ops:bob" in audit or "votes +ops:bob, +ops:alice" in audit


async def run_command(*args: str) -> str:
    """``toolnexus ARGS`` in a process of its own: its output (it must succeed)."""
    process = await asyncio.create_subprocess_exec(
        TOOLNEXUS, *args, stdout=asyncio.subprocess.PIPE, env=_env(None)
    )
    async with asyncio.timeout(30):
        out, _ = await process.communicate()
    assert process.returncode == 0, out
    return out.decode()


@pytest.mark.parametrize("broker", ["memory", "redis"], indirect=True)
async def test_only_the_allowed_set_may_vote(broker: Broker) -> None:
    request = ask(quorum=Quorum(2))
    task = asyncio.create_task(broker.wait_for(request, timeout_s=30, allow=["web:a*", "ops:*"]))
    try:
        pending = await shown(broker)
        with pytest.raises(toolnexus.errors.NotAllowed):
            await pending.accept(person="web:mallory")
        assert await pending.accept(person="web:alice") is not None
        assert await pending.accept(person="ops:bob") is None
        answer = await asyncio.wait_for(task, 10)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert persons(answer) == ["web:alice", "ops:bob"]


def test_the_quorum_example_runs() -> None:
    page = (Path(__file__).parents[1] / "docs" / "how-to" / "beyond.md").read_text()
    found = re.search(r"## Quorum\n.*?```python\n(.*?)```", page, flags=re.S)
    assert found is not None
    done = subprocess.run(
        [sys.executable, "-c", found.group(1)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["1 of 2 approvals", "True ['web:alice', 'web:bob']"]


@pytest.mark.redis
async def test_a_durable_quorum_counts_votes_while_no_process_waits(
    redis_url: str, namespace: str
) -> None:
    request = Request(
        id=new_id(), kind="approval", prompt="Durable?", quorum=Quorum(2), durable=True
    )
    async with toolnexus.connect(redis_url, namespace=namespace, **FAST) as first:
        task = asyncio.create_task(first.wait_for(request, timeout_s=60))
        async with asyncio.timeout(10):
            while not await first.redis.exists(first.keys.route(request.id)):
                await asyncio.sleep(0.01)
        assert await first.answer(Answer(id=request.id, ok=True, person="ops:alice"))
        task.cancel()  # this process stops waiting; the durable request stays open
        await asyncio.gather(task, return_exceptions=True)
    async with toolnexus.connect(redis_url, namespace=namespace, **FAST) as voter:
        assert await voter.answer(Answer(id=request.id, ok=True, person="ops:bob")) is None
    async with toolnexus.connect(redis_url, namespace=namespace, **FAST) as again:
        answer = await again.wait_for(request, timeout_s=60)  # attaches: the stored outcome
    assert answer.ok and persons(answer) == ["ops:alice", "ops:bob"]


@pytest.mark.redis
@pytest.mark.slow
async def test_a_durable_quorum_short_of_a_forged_vote_is_published_again(
    redis_url: str, namespace: str, tmp_path: Path
) -> None:
    keys = Keys(tmp_path)
    async with keys.agent_broker(redis_url, namespace) as agent:
        request = Request(
            id=new_id(), kind="approval", prompt="Durable?", quorum=Quorum(2), durable=True
        )
        wait = asyncio.create_task(agent.wait_for(request, timeout_s=30))
        try:
            state = agent.keys.state(agent.keys.durable_waiter(agent.settings.agent), request.id)
            async with asyncio.timeout(10):
                while not await agent.redis.exists(state):
                    await asyncio.sleep(0.01)
            forged = Answer(id=request.id, ok=True, responder="web", person="web:mallory")
            await agent.redis.hset(state, "y:web:mallory", agent.codec.encode(forged))
            votes = [("web:alice", "accept")]
            async with voter(redis_url, namespace, votes, keys.env("web")) as web:
                assert (await web.next())["result"] == "resolved"  # with mallory's, in Redis
                again = await web.next()  # refused by the waiter: opened and shown again
                assert again["result"] == "already voted by web:alice", again
                code, _, err = await answer_command(
                    redis_url, namespace, request.id, "ops:bob", **keys.env("cli")
                )
                assert (code, err) == (0, ""), err
                answer = await asyncio.wait_for(wait, 20)
        finally:
            wait.cancel()
            await asyncio.gather(wait, return_exceptions=True)
    assert answer.ok and persons(answer) == ["web:alice", "ops:bob"]
