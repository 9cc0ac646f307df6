"""``toolnexus ask``, ``answer``, ``status``, ``check`` and ``audit`` as processes, against
the real Redis, with responders and waiters in this test."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import msgspec
import pytest

import toolnexus
from conftest import Fleet
from toolnexus import Answer, Broker, Request, new_id
from toolnexus.cli._ask import reopened
from toolnexus.cli._main import duration_s
from toolnexus.keys import Keys
from toolnexus.models import Hop, Quorum, Source
from toolnexus.protocol import version
from toolnexus.redis_broker import (
    ConsumerStatus,
    GroupStatus,
    QueueStatus,
    QuorumStatus,
    RedisBroker,
    WaiterVersion,
)
from toolnexus.redis_broker._layout import parse_route

pytestmark = pytest.mark.redis

TOOLNEXUS = str(Path(sys.executable).with_name("toolnexus"))
FAST = {"block_ms": 100, "lease_ms": 600}
FORM = {
    "type": "object",
    "properties": {"seats": {"type": "integer", "minimum": 1}},
    "required": ["seats"],
}


class Done:
    def __init__(self, returncode: int, stdout: str, stderr: str) -> None:
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("TOOLNEXUS_")}


async def run(*args: str, timeout_s: float = 30) -> Done:
    process = await asyncio.create_subprocess_exec(
        TOOLNEXUS,
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=_env(),
    )
    async with asyncio.timeout(timeout_s):
        out, err = await process.communicate()
    assert process.returncode is not None
    return Done(process.returncode, out.decode(), err.decode())


@asynccontextmanager
async def connected(url: str, namespace: str) -> AsyncIterator[RedisBroker]:
    async with toolnexus.connect(url, namespace=namespace, **FAST) as broker:
        assert isinstance(broker, RedisBroker)
        yield broker


async def answer_next(broker: Broker, how: str, data: Any = None) -> Request:
    """Answer the next request of group ``cli`` as ``how`` says; the request answered."""
    async with broker.responder("cli") as requests:
        async with asyncio.timeout(20):
            pending = await anext(requests)
        if how == "accept":
            await pending.accept(data, person="test:alice")
        elif how == "decline":
            await pending.decline(person="test:alice")
        else:
            await pending.dismiss()
        return pending.request


def broker_args(url: str, namespace: str) -> list[str]:
    return ["--url", url, "--namespace", namespace]


# -- ask ------------------------------------------------------------------------------------


@pytest.mark.slow
async def test_ask_accepted_prints_the_data_and_exits_0(
    redis_url: str, namespace: str, tmp_path: Path
) -> None:
    schema = tmp_path / "form.json"
    schema.write_text(json.dumps(FORM))
    async with connected(redis_url, namespace) as broker:
        asking = asyncio.create_task(
            run(
                "ask",
                "How many seats?",
                "--schema",
                str(schema),
                *broker_args(redis_url, namespace),
            )
        )
        request = await answer_next(broker, "accept", {"seats": 2})
        done = await asking
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"seats": 2}
    assert request.kind == "input" and request.schema == FORM
    assert f"waiting for an answer to {request.id}" in done.stderr


@pytest.mark.slow
async def test_ask_with_choices_and_json_prints_the_whole_answer(
    redis_url: str, namespace: str
) -> None:
    async with connected(redis_url, namespace) as broker:
        asking = asyncio.create_task(
            run(
                "ask", "Region?", "--choice", "eu", "--choice", "us", "--json",
                *broker_args(redis_url, namespace),
            )
        )  # fmt: skip
        request = await answer_next(broker, "accept", {"answer": "us"})
        done = await asking
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["id"] == request.id and answer["ok"] is True
    assert answer["data"] == {"answer": "us"} and answer["person"] == "test:alice"
    assert request.schema is not None
    assert request.schema["properties"]["answer"]["enum"] == ["eu", "us"]


@pytest.mark.slow
async def test_ask_declined_exits_1(redis_url: str, namespace: str) -> None:
    async with connected(redis_url, namespace) as broker:
        asking = asyncio.create_task(run("ask", "Deploy?", *broker_args(redis_url, namespace)))
        request = await answer_next(broker, "decline")
        done = await asking
    assert done.returncode == 1, done.stderr
    assert done.stdout == ""
    assert f"toolnexus ask: {request.id} declined by " in done.stderr
    assert request.kind == "approval" and request.prompt == "Deploy?"


@pytest.mark.slow
async def test_ask_dismissed_exits_2(redis_url: str, namespace: str) -> None:
    async with connected(redis_url, namespace) as broker:
        asking = asyncio.create_task(run("ask", "Deploy?", *broker_args(redis_url, namespace)))
        request = await answer_next(broker, "dismiss")
        done = await asking
    assert done.returncode == 2, done.stderr
    assert f"{request.id} dismissed" in done.stderr


@pytest.mark.slow
async def test_ask_expired_exits_2(redis_url: str, namespace: str) -> None:
    done = await run("ask", "Deploy?", "--timeout", "1s", *broker_args(redis_url, namespace))
    assert done.returncode == 2
    assert done.stderr.rstrip().endswith(" expired")


@pytest.mark.slow
async def test_ask_allow_list_reaches_the_request(redis_url: str, namespace: str) -> None:
    async with connected(redis_url, namespace) as broker:
        asking = asyncio.create_task(
            run(
                "ask", "Deploy?", "--allow", "cli-*", "--allow", "test:*",
                *broker_args(redis_url, namespace),
            )
        )  # fmt: skip
        request = await answer_next(broker, "accept")
        done = await asking
    assert done.returncode == 0, done.stderr
    assert request.allow == ["cli-*", "test:*"]
    assert done.stdout == "null\n"


@pytest.mark.slow
async def test_ask_escalates_to_the_queues_given(redis_url: str, namespace: str) -> None:
    oncall = toolnexus.connect(redis_url, namespace=namespace, queue="oncall", **FAST)
    async with oncall, oncall.responder("pager") as pager:
        asking = asyncio.create_task(
            run(
                "ask", "Page someone?", "--escalate", "0.3s=oncall", "--queue", "desk",
                *broker_args(redis_url, namespace),
            )
        )  # fmt: skip
        pending = await anext(pager)
        assert pending.request.escalate == [Hop(0.3, "oncall")]
        await pending.accept(person="pager:ada")
        done = await asking
    assert done.returncode == 0, done.stderr
    assert "(queue desk, then oncall after 0.3 s)" in done.stderr
    bad = await run("ask", "Page?", "--escalate", "5m", *broker_args(redis_url, namespace))
    assert bad.returncode == 2 and "'5m' is not DURATION=QUEUE" in bad.stderr


@pytest.mark.slow
async def test_ask_says_everything_a_request_can(redis_url: str, namespace: str) -> None:
    """Issue 25, observation 8: an authorization with its URL, the source's agent, server
    and tool (responders' rules match them), meta and a quorum, from the command line."""
    async with connected(redis_url, namespace) as broker:
        asking = asyncio.create_task(
            run(
                "ask", "Connect GitHub?", "--link", "https://github.com/login/oauth?x=1",
                "--agent", "ci-7", "--server", "gh", "--tool", "connect",
                "--meta", "ticket=OPS-12", "--meta", "note=a=b", "--quorum", "1",
                *broker_args(redis_url, namespace),
            )
        )  # fmt: skip
        request = await answer_next(broker, "accept")
        done = await asking
        assert done.returncode == 0, done.stderr
        assert request.kind == "authorization"
        assert request.url == "https://github.com/login/oauth?x=1"
        assert request.source == Source(server="gh", tool="connect", agent="ci-7")
        assert request.meta == {"ticket": "OPS-12", "note": "a=b"}
        assert request.quorum == Quorum(need=1, decline="veto")
        asking = asyncio.create_task(
            run(
                "ask", "Roll back?", "--kind", "rollback", "--data", '{"to": "v1.2"}',
                "--quorum", "1", "--quorum-decline", "count", "--timeout", "30s",
                *broker_args(redis_url, namespace),
            )
        )  # fmt: skip
        request = await answer_next(broker, "decline")
        done = await asking
    assert done.returncode == 1, done.stderr
    assert request.kind == "rollback" and request.data == {"to": "v1.2"}
    assert request.source == Source(agent="toolnexus ask") and request.url is None
    assert request.quorum == Quorum(need=1, decline="count")


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--kind", "authorization"], "--kind authorization needs --link URL"),
        (["--kind", "approval", "--choice", "a"], "--kind approval: a form (--schema, --choice)"),
        (["--kind", "input"], "--kind input needs a form"),
        (["--meta", "ticket"], "'ticket' is not KEY=VALUE"),
        (["--quorum", "0"], "'0' is not a whole number of at least 1"),
        (["--data", "{x"], "'{x' is not JSON"),
        (["--data", "1", "--choice", "a"], "not allowed with argument"),
    ],
)
@pytest.mark.slow
async def test_ask_refuses_contradicting_options_in_one_line(flags: list[str], says: str) -> None:
    done = await run("ask", "Deploy?", *flags, "--url", "redis://127.0.0.1:1/0")
    assert done.returncode == 2, done.stderr
    last = done.stderr.strip().splitlines()[-1]  # (argparse prints its usage before it)
    assert last.startswith("toolnexus ask: ") and says in last, done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.slow
async def test_ask_with_no_broker_exits_3() -> None:
    done = await run("ask", "Deploy?", "--url", "redis://127.0.0.1:1/0")
    assert done.returncode == 3
    assert done.stderr.startswith("toolnexus ask: cannot reach Redis at redis://127.0.0.1:1/0")
    assert len(done.stderr.splitlines()) == 1


@pytest.mark.slow
async def test_ask_refuses_a_bad_schema_file(tmp_path: Path) -> None:
    schema = tmp_path / "form.json"
    schema.write_text("[1, 2]")
    done = await run("ask", "Deploy?", "--schema", str(schema))
    assert done.returncode == 2
    assert done.stderr == f"toolnexus ask: --schema {schema}: a form schema is a JSON object\n"


async def test_a_bad_timeout_is_refused_by_the_parser() -> None:
    done = await run("ask", "Deploy?", "--timeout", "soon")
    assert done.returncode == 2
    assert "'soon' is not a positive duration" in done.stderr


# -- answer ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--accept", '{"seats": 3}', "--person", "ops:bob"], Answer("x", True, {"seats": 3})),
        (["--decline", "--person", "ops:bob"], Answer("x", False, reason="declined")),
        (["--dismiss"], Answer("x", False, reason="dismissed")),
    ],
    ids=["accept", "decline", "dismiss"],
)
@pytest.mark.slow
async def test_answer_resolves_a_waiting_request(
    redis_url: str, namespace: str, flags: list[str], expected: Answer
) -> None:
    request = Request(id=new_id(), kind="input", prompt="Seats?", data={"schema": FORM})
    async with connected(redis_url, namespace) as broker:
        waiting = asyncio.create_task(broker.wait_for(request, timeout_s=30))
        done = await run("answer", request.id, *flags, *broker_args(redis_url, namespace))
        got = await asyncio.wait_for(waiting, 20)
    assert done.returncode == 0, done.stderr
    outcome = "accepted" if expected.ok else expected.reason
    by = " by ops:bob" if "--person" in flags else ""
    assert done.stdout == f"{request.id}: {outcome}{by}, taken by the waiter\n"
    assert (got.ok, got.data, got.reason) == (expected.ok, expected.data, expected.reason)
    assert got.person == ("ops:bob" if "--person" in flags else None)


@pytest.mark.slow
async def test_answer_accept_without_data_on_an_approval(redis_url: str, namespace: str) -> None:
    request = Request(id=new_id(), kind="approval", prompt="Deploy?")
    async with connected(redis_url, namespace) as broker:
        waiting = asyncio.create_task(broker.wait_for(request, timeout_s=30))
        done = await run("answer", request.id, "--accept", *broker_args(redis_url, namespace))
        got = await asyncio.wait_for(waiting, 20)
    assert done.returncode == 0, done.stderr
    assert got.ok and got.data is None


@pytest.mark.slow
async def test_answer_refusals_exit_1_with_the_reason(redis_url: str, namespace: str) -> None:
    request = Request(id=new_id(), kind="input", prompt="Seats?", data={"schema": FORM})
    args = broker_args(redis_url, namespace)
    async with connected(redis_url, namespace) as broker:
        waiting = asyncio.create_task(broker.wait_for(request, timeout_s=30))
        invalid = await run("answer", request.id, "--accept", '{"seats": 0}', *args)
        assert invalid.returncode == 1
        assert invalid.stderr.startswith(f"toolnexus answer: {request.id}: refused: ")
        assert "seats" in invalid.stderr
        first = await run("answer", request.id, "--decline", *args)
        assert first.returncode == 0, first.stderr
        late = await run("answer", request.id, "--accept", '{"seats": 1}', *args)
        got = await asyncio.wait_for(waiting, 20)
    assert late.returncode == 1
    assert late.stderr == f"toolnexus answer: {request.id}: refused: already answered\n"
    assert got.reason == "declined"
    unknown = await run("answer", "req-nobody", "--dismiss", *args)
    assert unknown.returncode == 1
    assert unknown.stderr == "toolnexus answer: req-nobody: refused: unknown request\n"


@pytest.mark.slow
async def test_answer_says_when_the_waiter_refuses_it(fleet: Fleet) -> None:
    """Observation 4 of issue 25: an unsigned answer to an agent requiring signatures is
    stored by Redis, then refused by the waiter, which opens the request again: exit 1,
    saying so (it used to print "accepted" and exit 0). The signed answer after it is
    taken."""
    request = Request(id=new_id(), kind="approval", prompt="Deploy?")
    async with fleet.agent() as agent:
        waiting = asyncio.create_task(agent.wait_for(request, timeout_s=60))
        while await agent.redis.xlen(agent.keys.requests) < 1:
            await asyncio.sleep(0.02)
        args = ["--url", fleet.url, "--namespace", "sec"]
        unsigned = await run("answer", request.id, "--accept", *args)
        assert unsigned.returncode == 1, unsigned
        assert unsigned.stdout == ""
        refused = reopened("missing signature")
        assert unsigned.stderr == f"toolnexus answer: {request.id}: refused: {refused}\n"
        assert not waiting.done()
        async with fleet.responder() as bot:
            signed = await bot.answer(Answer(id=request.id, ok=True))
        assert signed is None and (await asyncio.wait_for(waiting, 20)).ok


@pytest.mark.slow
async def test_answer_sent_but_not_confirmed_exits_4(redis_url: str, namespace: str) -> None:
    """A durable request nobody waits for now: the answer is stored, no waiter takes it."""
    request = Request(id=new_id(), kind="approval", prompt="Later?", durable=True)
    async with connected(redis_url, namespace) as broker:
        waiting = asyncio.create_task(broker.wait_for(request, timeout_s=60))
        while await broker.redis.xlen(broker.keys.requests) < 1:
            await asyncio.sleep(0.02)
        waiting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await waiting
    args = broker_args(redis_url, namespace)
    done = await run("answer", request.id, "--decline", "--confirm", "1s", *args)
    assert done.returncode == 4, done
    assert done.stderr.startswith(
        f"toolnexus answer: {request.id}: sent, not confirmed: no waiter took it within 1 s"
    )
    async with connected(redis_url, namespace) as broker:  # attaching, it takes it
        got = await asyncio.wait_for(broker.wait_for(request, timeout_s=60), 20)
    assert got.reason == "declined"


@pytest.mark.slow
async def test_answer_usage_errors() -> None:
    bad_json = await run("answer", "req-1", "--accept", "{seats")
    assert bad_json.returncode == 2 and "'{seats' is not JSON" in bad_json.stderr
    neither = await run("answer", "req-1")
    assert neither.returncode == 2 and "one of the arguments" in neither.stderr
    unreachable = await run("answer", "req-1", "--decline", "--url", "redis://127.0.0.1:1/0")
    assert unreachable.returncode == 3


# -- status ---------------------------------------------------------------------------------


@pytest.mark.slow
async def test_status_json_counts_pending_a_dead_consumer_and_dead_letters(
    redis_url: str, namespace: str
) -> None:
    async with connected(redis_url, namespace) as broker:
        requests = [Request(id=new_id(), kind="approval", prompt=f"#{i}") for i in range(3)]
        waits = [asyncio.create_task(broker.wait_for(r, timeout_s=60)) for r in requests]
        redis_, stream = broker.redis, broker.keys.requests
        while await redis_.xlen(stream) < 3:
            await asyncio.sleep(0.02)
        await redis_.xadd(stream, {"m": b"\xff garbage"})
        await redis_.xgroup_create(stream, "web", id="0")
        await redis_.xreadgroup("web", "dead-1", {stream: ">"}, count=1)  # holds, never beats
        await redis_.xreadgroup("web", "live-1", {stream: ">"}, count=1)
        await broker.heartbeat("web", "live-1", ttl_s=60, info={"host": "h"})
        await broker.heartbeat("auto", "idle-1", ttl_s=60)
        async with broker.responder("bot", until_idle=True) as bot:  # dead-letters the garbage
            async for pending in bot:
                await pending.skip()
        done = await run("status", "--json", *broker_args(redis_url, namespace))
        for wait in waits:
            wait.cancel()
        await asyncio.gather(*waits, return_exceptions=True)
    assert done.returncode == 0, done.stderr
    status = json.loads(done.stdout)
    assert status["namespace"] == namespace and status["waiters_alive"] == 1
    (queue,) = status["queues"]
    assert queue["queue"] == "default"
    # the garbage is bot's dead letter, and stays in the stream for the other groups
    assert queue["open_requests"] == 4 and queue["dead_letters"] == 1
    assert 0 <= queue["oldest_waiting_s"] < 30
    groups = {g["group"]: g for g in queue["groups"]}
    assert sorted(groups) == ["auto", "bot", "web"]
    web = groups["web"]
    assert web["unacknowledged"] == 2 and web["undelivered"] == 2  # a request, the garbage
    assert 0 <= web["oldest_unacknowledged_s"] < 30
    dead, live = web["consumers"]
    assert dead["consumer"] == "dead-1" and dead["unacknowledged"] == 1
    assert dead["alive"] is False and dead["heartbeat_age_s"] is None
    assert dead["idle_s"] >= 0
    assert live["consumer"] == "live-1" and live["alive"] is True
    assert 0 <= live["heartbeat_age_s"] < 30
    assert groups["bot"]["unacknowledged"] == 0 and groups["bot"]["undelivered"] == 0
    assert groups["auto"] == {
        "group": "auto",
        "unacknowledged": 0,
        "undelivered": None,
        "oldest_unacknowledged_s": None,
        "consumers": [
            {
                "consumer": "idle-1",
                "unacknowledged": 0,
                "idle_s": None,
                "heartbeat_age_s": groups["auto"]["consumers"][0]["heartbeat_age_s"],
                "alive": True,
                "version": version(),
                "reads": [1, 2],
                "writes": 2,
            }
        ],
    }


@pytest.mark.slow
async def test_status_text_and_every_queue(redis_url: str, namespace: str) -> None:
    async with toolnexus.connect(redis_url, namespace=namespace, queue="deploys") as broker:
        wait = asyncio.create_task(broker.wait_for(Request(id=new_id(), kind="approval")))
        await asyncio.sleep(0.5)
        done = await run("status", *broker_args(redis_url, namespace))
        wait.cancel()
        await asyncio.gather(wait, return_exceptions=True)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith(f"namespace {namespace} · 1 waiters alive · ")
    assert lines[1].startswith("queue deploys: 1 open (oldest ")
    assert lines[2] == "  no consumer groups: no responder has read this queue"


@pytest.mark.slow
async def test_status_watch_refreshes_until_interrupted(redis_url: str, namespace: str) -> None:
    process = await asyncio.create_subprocess_exec(
        TOOLNEXUS, "status", "--watch", "--json", "--interval", "100ms", "--queue", "default",
        *broker_args(redis_url, namespace),
        stdout=asyncio.subprocess.PIPE, env=_env(),
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # even if ignored here
    )  # fmt: skip
    assert process.stdout is not None
    async with asyncio.timeout(20):
        frames = [json.loads(await process.stdout.readline()) for _ in range(2)]
    process.send_signal(signal.SIGINT)
    assert await asyncio.wait_for(process.wait(), 20) == 0
    assert frames[0]["namespace"] == namespace and frames[1]["at"] > frames[0]["at"]


@pytest.mark.slow
async def test_status_needs_redis() -> None:
    done = await run("status", "--url", "memory://")
    assert done.returncode == 2
    assert "this command looks inside Redis" in done.stderr
    unreachable = await run("status", "--url", "redis://127.0.0.1:1/0")
    assert unreachable.returncode == 3 and len(unreachable.stderr.splitlines()) == 1


# -- check and audit -------------------------------------------------------------------------


@pytest.mark.slow
async def test_check_exits_0_for_fresh_heartbeats_and_1_otherwise(
    redis_url: str, namespace: str
) -> None:
    args = broker_args(redis_url, namespace)
    none = await run("check", *args)
    assert none.returncode == 1
    assert none.stderr == "toolnexus check: no worker has a fresh heartbeat on queue 'default'\n"
    async with connected(redis_url, namespace) as broker:
        await broker.heartbeat("auto", "c1", ttl_s=60, info={"host": socket.gethostname()})
        await broker.heartbeat("web", "elsewhere", ttl_s=60, info={"host": "other-host"})
        await broker.heartbeat("gone", "c9", ttl_s=0.05)
        await asyncio.sleep(0.2)
        any_worker = await run("check", *args)
        named = await run("check", "--worker", "auto/c1", "--worker", "web", *args)
        missing = await run("check", "--worker", "gone", "--worker", "auto", *args)
        here = await run("check", "--here", "--worker", "auto", *args)
        not_here = await run("check", "--here", "--worker", "web", *args)
    assert any_worker.returncode == 0 and "auto/c1, web/elsewhere" in any_worker.stdout
    assert named.returncode == 0, named.stderr
    assert missing.returncode == 1
    assert missing.stderr == (
        "toolnexus check: no fresh heartbeat from gone on queue 'default' "
        "(fresh: auto/c1, web/elsewhere)\n"
    )
    assert here.returncode == 0, here.stderr
    assert not_here.returncode == 1 and f"on host {socket.gethostname()}" in not_here.stderr
    unreachable = await run("check", "--url", "redis://ops:sekret@127.0.0.1:1/0")
    assert unreachable.returncode == 1
    assert unreachable.stderr.startswith("toolnexus check: Redis is not reachable: ")
    assert len(unreachable.stderr.splitlines()) == 1
    assert "redis://ops:***@127.0.0.1:1/0" in unreachable.stderr  # a probe's output is kept
    assert "sekret" not in unreachable.stderr


@pytest.mark.slow
async def test_audit_shows_who_answered(redis_url: str, namespace: str) -> None:
    args = broker_args(redis_url, namespace)
    async with connected(redis_url, namespace) as broker:
        asking = asyncio.create_task(run("ask", "Deploy?", *args))
        request = await answer_next(broker, "accept")
        assert (await asking).returncode == 0
    done = await run("audit", "--json", "--id", request.id, "--since", "1h", *args)
    assert done.returncode == 0, done.stderr
    (record,) = json.loads(done.stdout)
    assert record["id"] == request.id and record["status"] == "answered"
    assert record["ok"] is True and record["person"] == "test:alice"
    assert record["source"] == {"agent": "toolnexus ask"}
    text = await run("audit", *args)
    assert text.returncode == 0
    (line,) = text.stdout.splitlines()
    assert f" {request.id} approval accepted by " in line
    assert "test:alice asked by toolnexus ask (unsigned after " in line


def test_scan_patterns_match_only_their_namespace() -> None:
    keys = Keys("a*b", "q")
    assert keys.alive_pattern() == "{a\\*b:w:*}:alive"
    assert keys.requests_pattern() == "{a\\*b:q:*}:requests"
    assert keys.queue_of(Keys("a*b", "deploys").requests) == "deploys"
    assert keys.queue_of(Keys("other", "deploys").requests) is None
    assert keys.queue_of("{a*b:q:x:y}:requests") is None


@pytest.mark.parametrize(
    ("text", "seconds"), [("90", 90), ("30s", 30), ("10m", 600), ("1.5h", 5400), ("500ms", 0.5)]
)
def test_durations(text: str, seconds: float) -> None:
    assert duration_s(text) == seconds


def test_the_reference_documents_every_status_field() -> None:
    page = Path(__file__).parents[1] / "docs" / "reference" / "status-json.md"
    table = page.read_text().split("`status --json` prints these fields", 1)[1].split("\n\n", 2)[1]
    documented = {
        name.strip("`")
        for row in table.splitlines()[2:]
        for name in row.split("|")[1].strip().split(", ")
    }
    expected = {f"{name}" for name in ("namespace", "at", "waiters_alive")}
    expected |= {f"waiters[].{f.name}" for f in msgspec.structs.fields(WaiterVersion)}
    for prefix, kind in [
        ("queues[].", QueueStatus),
        ("queues[].groups[].", GroupStatus),
        ("queues[].groups[].consumers[].", ConsumerStatus),
        ("queues[].quorums[].", QuorumStatus),
    ]:
        nested = ("groups", "consumers", "quorums")
        expected |= {prefix + f.name for f in msgspec.structs.fields(kind) if f.name not in nested}
    assert documented == expected


@pytest.mark.slow
async def test_answer_is_signed_with_the_configured_key(
    redis_url: str, namespace: str, tmp_path: Path
) -> None:
    for name in ("agent-7", "ops-cli"):
        (tmp_path / name).mkdir()
        done = await run("keygen", name, "--dir", str(tmp_path / name))
        assert done.returncode == 0, done.stderr
    request = Request(id=new_id(), kind="approval", prompt="Deploy?")
    async with toolnexus.connect(
        redis_url,
        namespace=namespace,
        signing_key=tmp_path / "agent-7" / "agent-7.key",
        trusted_keys=tmp_path / "ops-cli" / "ops-cli.pub",
        require_signatures=True,
        **FAST,
    ) as broker:
        waiting = asyncio.create_task(broker.wait_for(request, timeout_s=30))
        process = await asyncio.create_subprocess_exec(
            TOOLNEXUS, "answer", request.id, "--accept", *broker_args(redis_url, namespace),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            env={
                **_env(),
                "TOOLNEXUS_SIGNING_KEY": str(tmp_path / "ops-cli" / "ops-cli.key"),
                "TOOLNEXUS_TRUSTED_KEYS": str(tmp_path / "agent-7" / "agent-7.pub"),
                "TOOLNEXUS_REQUIRE_SIGNATURES": "1",
            },
        )  # fmt: skip
        _, err = await asyncio.wait_for(process.communicate(), 30)
        got = await asyncio.wait_for(waiting, 20)
    assert process.returncode == 0, err.decode()
    assert got.ok and got.responder == "ops-cli"
    assert got.signature is not None and got.signature.key == "ops-cli"


# -- dead-letters ---------------------------------------------------------------------------


@pytest.mark.slow
async def test_dead_letters_lists_shows_requeues_and_purges(redis_url: str, namespace: str) -> None:
    """An unsigned request that a responder requiring signatures dead-letters: listed and
    shown with its request and error; requeued, it reaches a responder that takes it and
    its waiter gets the answer; then the dead letters are empty."""
    args = broker_args(redis_url, namespace)
    strict = toolnexus.connect(
        redis_url,
        namespace=namespace,
        signing_key=toolnexus.security.SigningKey.generate("strict-bot"),
        trusted_keys=toolnexus.security.Keyring.of(
            toolnexus.security.SigningKey.generate("someone")
        ),
        require_signatures=True,
        **FAST,
    )
    request = Request(id=new_id(), kind="approval", prompt="Requeue me?")
    async with connected(redis_url, namespace) as broker, strict:
        waiting = asyncio.create_task(broker.wait_for(request, timeout_s=60))
        while await broker.redis.xlen(broker.keys.requests) < 1:
            await asyncio.sleep(0.02)
        async with strict.responder("strict", until_idle=True) as requests:
            async for _ in requests:
                raise AssertionError("an unsigned request reached a responder requiring them")
        listed = await run("dead-letters", "list", *args)
        assert listed.returncode == 0, listed.stderr
        (line,) = listed.stdout.splitlines()
        dead_id = line.split()[0]
        assert f" group strict {request.id} approval 'Requeue me?': " in line
        shown = await run("dead-letters", "show", dead_id, "--json", *args)
        assert shown.returncode == 0, shown.stderr
        letter = json.loads(shown.stdout)
        assert letter["id"] == dead_id and letter["request_id"] == request.id
        assert letter["stream"] == broker.keys.requests and letter["requeue_problem"] is None
        assert letter["truncated"] is False and letter["raw"].startswith("r=")
        assert letter["group"] == "strict"  # the group that could not take it
        text = await run("dead-letters", "show", dead_id, *args)
        assert f"request:  {request.id} (approval) 'Requeue me?'" in text.stdout
        assert "requeue:  yes" in text.stdout
        assert "group:    strict (could not take it; other groups still may)" in text.stdout

        requeued = await run("dead-letters", "requeue", dead_id, *args)
        assert requeued.returncode == 0, requeued.stderr
        assert requeued.stdout.startswith(f"{dead_id}: requeued as ")
        # its route names the new entry: answering by id reads the request there
        route = parse_route(await broker.redis.get(broker.keys.route(request.id)))
        assert route == (broker.waiter_id, requeued.stdout.split()[3])
        taken = await answer_next(broker, "accept")
        assert taken.id == request.id
        assert (await asyncio.wait_for(waiting, 20)).ok
        again = await run("dead-letters", "requeue", dead_id, *args)
        assert again.returncode == 1
        assert again.stderr == (
            f"toolnexus dead-letters: no dead letter {dead_id} on queue 'default'\n"
        )
        empty = await run("dead-letters", "list", *args)
    assert empty.returncode == 0 and empty.stdout == "no dead letters on queue 'default'\n"


@pytest.mark.slow
async def test_dead_letters_refuses_to_requeue_what_it_cannot_rebuild(
    redis_url: str, namespace: str
) -> None:
    args = broker_args(redis_url, namespace)
    async with connected(redis_url, namespace) as broker:
        dead, keys = broker.redis, broker.keys
        cut = b"r=" + b"x" * 100 + b"... (9000 bytes in all)"
        await dead.xadd(keys.dead, {"error": "bad", "stream": keys.requests, "entry": "1-0",
                                    "raw": cut})  # fmt: skip
        answers = keys.answers("agent.0123456789abcdef")
        await dead.xadd(keys.dead, {"error": "undecodable answer", "stream": answers,
                                    "entry": "2-0", "raw": b"id=x\na=\xff"})  # fmt: skip
        await dead.xadd(keys.dead, {"error": "bad", "stream": keys.requests, "entry": "3-0",
                                    "raw": b"r=\x81\xa2"})  # fmt: skip
        listed = await run("dead-letters", "list", "--json", *args)
        truncated, answer, whole = json.loads(listed.stdout)
        assert (
            truncated["truncated"] is True
            and "first 102 of its 9000 bytes" in (truncated["requeue_problem"])
        )
        assert answer["raw"] == "id=x\na=\\xff" and answer["request_id"] is None
        assert answer["requeue_problem"] == (
            f"it came from {answers!r}, not from the request stream of queue 'default'"
        )
        one = await run("dead-letters", "requeue", truncated["id"], *args)
        assert one.returncode == 1
        assert one.stderr == (
            f"toolnexus dead-letters: {truncated['id']} not requeued: "
            f"{truncated['requeue_problem']}\n"
        )
        every = await run("dead-letters", "requeue", "--all", "--json", *args)
        assert every.returncode == 1 and len(every.stderr.splitlines()) == 2
        (done,) = json.loads(every.stdout)["requeued"]
        assert done["id"] == whole["id"]
        assert [f for _, f in await dead.xrange(keys.requests)] == [{b"r": b"\x81\xa2"}]
        assert await dead.xlen(keys.dead) == 2

        unknown = await run("dead-letters", "show", "not-an-id", *args)
        assert unknown.returncode == 1 and "no dead letter not-an-id" in unknown.stderr
        purged = await run("dead-letters", "purge", answer["id"], *args)
        assert purged.returncode == 0 and "purged 1 dead letter(s)" in purged.stdout
        purged = await run("dead-letters", "purge", "--all", "--json", *args)
        assert json.loads(purged.stdout) == {"purged": 1}
        assert await dead.xlen(keys.dead) == 0
    usage = await run("dead-letters", "purge", *args)
    assert usage.returncode == 2 and "one of the arguments" in usage.stderr
    both = await run("dead-letters", "requeue", "1-0", "--all", *args)
    assert both.returncode == 2 and "Traceback" not in both.stderr
