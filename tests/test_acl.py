"""deploy/redis/users.acl on a private redis-server: the agent and the responder users do
their whole job through toolnexus with no command denied, and nothing beyond it; the file is
what ``toolnexus acl`` writes for the example fleet, and a broker waits as the agent its
Redis user names (tests/adversarial/test_agent_acl.py: two agents, neither reads the other's)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import re
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
import redis.exceptions

import toolnexus
from conftest import FAST, RedisServer
from toolnexus import Answer, Broker, ConfigurationError, Quorum, Request, new_id
from toolnexus.cli import main as toolnexus_main
from toolnexus.cli._acl import users_acl
from toolnexus.cli._ops import dead_letters, purge, read_status, redis_brokers, requeue
from toolnexus.keys import WAITER_ID, Keys
from toolnexus.models import OnExpiry
from toolnexus.redis_broker import RedisBroker

DEPLOY = Path(__file__).parents[1] / "deploy" / "redis"
PASSWORDS = {"agent": "agent-secret", "responder": "responder-secret", "ops": "ops-secret"}
ADMIN = "admin-secret"  # a user of this test alone, to read the ACL log
QUEUE = "acl"
KEYS = Keys("toolnexus", QUEUE)  # the namespace users.acl is written for
FORM = {"type": "object", "properties": {"n": {"type": "integer", "default": 1}}}

pytestmark = pytest.mark.redis


def set_passwords(**env: str) -> subprocess.CompletedProcess[str]:
    script = DEPLOY / "set-passwords.sh"
    return subprocess.run(
        [str(script)], env={"PATH": os.environ["PATH"], **env}, capture_output=True, text=True
    )


def start_server(directory: Path, acl: str) -> RedisServer:
    (directory / "users.acl").write_text(acl + f"user admin on >{ADMIN} +@all ~* &*\n")
    server = RedisServer(
        directory, "--aclfile", str(directory / "users.acl"), username="admin", password=ADMIN
    )
    server.start()
    return server


@pytest.fixture
def acl_server(tmp_path: Path) -> Iterator[RedisServer]:
    env = {f"REDIS_{user.upper()}_PASSWORD": password for user, password in PASSWORDS.items()}
    done = set_passwords(**env)
    assert done.returncode == 0, done.stderr
    server = start_server(tmp_path, done.stdout)
    try:
        yield server
    finally:
        server.kill()


def url(server: RedisServer, user: str) -> str:
    return server.url.replace("redis://", f"redis://{user}:{PASSWORDS[user]}@")


@pytest.fixture
async def admin(acl_server: RedisServer) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(acl_server.url, username="admin", password=ADMIN)
    yield client
    await client.aclose()


@pytest.fixture
async def as_user(acl_server: RedisServer) -> AsyncIterator[Any]:
    clients: list[aioredis.Redis] = []

    def client(user: str) -> aioredis.Redis:
        clients.append(aioredis.Redis.from_url(url(acl_server, user)))
        return clients[-1]

    yield client
    for c in clients:
        await c.aclose()


async def denials(admin: aioredis.Redis) -> list[str]:
    """What the ACL log says was denied, as ``user: reason object`` lines."""
    entries: list[dict[Any, Any]] = await admin.acl_log()
    return [f"{e['username']}: {e['reason']} {e['object']}" for e in entries]


def connect(server: RedisServer, user: str) -> Broker:
    return toolnexus.connect(url(server, user), queue=QUEUE, **FAST)


async def withdraw(waiting: asyncio.Task[Answer]) -> None:
    waiting.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await waiting


# -- the file and its generator -------------------------------------------------------------


def test_the_shipped_file_is_what_toolnexus_acl_writes_for_the_example_fleet(
    capsys: pytest.CaptureFixture[str],
) -> None:
    fleet = ["--agent", "agent", "--responder", "responder", "--ops", "ops"]
    assert toolnexus_main(["acl", *fleet]) == 0
    written = capsys.readouterr().out
    assert (
        written
        == (DEPLOY / "users.acl").read_text()
        == users_acl(["agent"], ["responder"], ["ops"])
    )


def test_each_agent_user_gets_its_own_waiter_keys_and_responders_and_ops_every_one() -> None:
    lines = users_acl(
        ["a1", "agent_2"], ["bot-1", "bot-2"], ["ops"], namespace="my*ns"
    ).splitlines()
    assert lines[0] == "user default off resetchannels -@all"
    assert [line.split()[1] for line in lines] == [
        "default",
        "a1",
        "agent_2",
        "bot-1",
        "bot-2",
        "ops",
    ]
    for line, agent in zip(lines[1:3], ["a1", "agent_2"], strict=True):
        waiter_patterns = {p.split("~", 1)[1].split("}")[0] for p in line.split() if ":w:" in p}
        assert waiter_patterns == {f"{{my\\*ns:w:{agent}.*"}, line  # its own, nothing else
        assert "{my\\*ns:q:*}:requests" in line and "toolnexus" not in line
    for line in lines[3:]:
        assert "{my\\*ns:w:*}" in line and ":w:a1" not in line
    # the rules of a role are the same whatever its name
    assert lines[1].split(" ", 2)[2].replace("a1.", "X.") == lines[2].split(" ", 2)[2].replace(
        "agent_2.", "X."
    )


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["--agent", "a.b"], "agent user 'a.b' must be 1 to 64 letters, digits, '_' or '-'"),
        (["--agent", "a b"], "agent user 'a b' must be"),
        (["--agent", "a*"], "agent user 'a*' must be"),
        (["--agent", "x" * 65], "must be 1 to 64"),
        (["--agent", "default"], "agent user 'default': that user stays off"),
        (["--agent", "bot"], "responder user 'bot': named twice"),
        (["--agent", "a-1", "--ops", "A_1"], "password variable REDIS_A_1_PASSWORD is also"),
        (["--agent", "a", "--namespace", "n:s"], "namespace 'n:s' must be non-empty"),
    ],
)
def test_toolnexus_acl_refuses_a_name_that_cannot_be_a_user_or_an_agent(
    capsys: pytest.CaptureFixture[str], args: list[str], error: str
) -> None:
    assert toolnexus_main(["acl", "--responder", "bot", *args]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("toolnexus acl: ") and error in err
    assert len(err.splitlines()) == 1


def test_toolnexus_acl_needs_an_agent_and_a_responder(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        toolnexus_main(["acl", "--agent", "a"])
    assert exit_.value.code == 2 and "--responder" in capsys.readouterr().err


# -- which agent a broker waits as ------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "options", "variable", "agent"),
    [
        ("redis://127.0.0.1:1/0", {}, None, "anon"),
        ("redis://agent-7:pw@127.0.0.1:1/0", {}, None, "agent-7"),
        ("redis://127.0.0.1:1/0", {"username": "bot_1", "password": "pw"}, None, "bot_1"),
        ("redis://url-user:pw@127.0.0.1:1/0", {"username": "option-user"}, None, "url-user"),
        ("redis://127.0.0.1:1/0?username=q-user&password=pw", {}, None, "q-user"),
        ("redis+cluster://c-user:pw@127.0.0.1:1,127.0.0.1:2", {}, None, "c-user"),
        ("redis+sentinel://s-user:pw@127.0.0.1:1/mymaster", {}, None, "s-user"),
        ("redis://agent-7:pw@127.0.0.1:1/0", {}, "from-env", "from-env"),
        ("redis://agent-7:pw@127.0.0.1:1/0", {"agent": "given"}, "from-env", "given"),
        ("redis://bob%40corp:pw@127.0.0.1:1/0", {"agent": "bob"}, None, "bob"),
    ],
)
def test_a_broker_waits_as_the_agent_its_option_variable_or_redis_user_names(
    monkeypatch: pytest.MonkeyPatch,
    url: str,
    options: dict[str, str],
    variable: str | None,
    agent: str,
) -> None:
    if variable is None:
        monkeypatch.delenv("TOOLNEXUS_AGENT", raising=False)
    else:
        monkeypatch.setenv("TOOLNEXUS_AGENT", variable)
    broker = toolnexus.connect(url, **options)
    assert isinstance(broker, RedisBroker)
    assert broker.settings.agent == agent
    found = WAITER_ID.fullmatch(broker.waiter_id)
    assert found is not None and found["agent"] == agent
    assert broker.keys.durable_waiter(agent).startswith(f"{agent}.")


@pytest.mark.parametrize(
    ("url", "options", "variable", "error"),
    [
        ("redis://127.0.0.1:1/0", {"agent": "a.b"}, None, "option agent='a.b' must be"),
        ("redis://127.0.0.1:1/0", {"agent": 7}, None, "option agent=7 must be text"),
        ("redis://127.0.0.1:1/0", {}, "a b", "TOOLNEXUS_AGENT='a b' must be"),
        (
            "redis://bob%40corp:pw@127.0.0.1:1/0",
            {},
            None,
            "the Redis user 'bob@corp' cannot name the agent (an agent name must be 1 to 64 "
            "letters, digits, '_' or '-'): pass the option agent=NAME or set TOOLNEXUS_AGENT",
        ),
    ],
)
def test_an_agent_name_that_cannot_be_part_of_key_names_is_a_configuration_error(
    monkeypatch: pytest.MonkeyPatch,
    url: str,
    options: dict[str, Any],
    variable: str | None,
    error: str,
) -> None:
    if variable is None:
        monkeypatch.delenv("TOOLNEXUS_AGENT", raising=False)
    else:
        monkeypatch.setenv("TOOLNEXUS_AGENT", variable)
    with pytest.raises(ConfigurationError) as raised:
        toolnexus.connect(url, **options)
    assert error in str(raised.value)


# -- passwords ---------------------------------------------------------------------------


def test_set_passwords_writes_only_hashes(tmp_path: Path) -> None:
    secret_file = tmp_path / "ops.secret"
    secret_file.write_text("ops-from-file\n")
    done = set_passwords(
        REDIS_AGENT_PASSWORD="a-1",
        REDIS_RESPONDER_PASSWORD="r-1",
        REDIS_OPS_PASSWORD_FILE=str(secret_file),
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert [line.split()[1] for line in lines] == ["default", "agent", "responder", "ops"]
    for line, password in zip(lines[1:], ["a-1", "r-1", "ops-from-file"], strict=True):
        assert line.endswith(" #" + hashlib.sha256(password.encode()).hexdigest())
    assert "a-1" not in done.stdout and "ops-from-file" not in done.stdout
    assert lines[0] == (DEPLOY / "users.acl").read_text().splitlines()[0]


def test_set_passwords_reads_a_hyphenated_users_password_with_underscores() -> None:
    acl = users_acl(["agent-7"], ["ops-bot"])
    script = DEPLOY / "set-passwords.sh"
    done = subprocess.run(
        ["bash", "-c", f'"{script}" <(cat)'],
        input=acl,
        env={
            "PATH": os.environ["PATH"],
            "REDIS_AGENT_7_PASSWORD": "a-7",
            "REDIS_OPS_BOT_PASSWORD": "o",
        },
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[1].startswith("user agent-7 on ")
    assert done.stdout.splitlines()[1].endswith(" #" + hashlib.sha256(b"a-7").hexdigest())


def test_set_passwords_refuses_a_user_without_one() -> None:
    done = set_passwords(REDIS_AGENT_PASSWORD="a-1", REDIS_OPS_PASSWORD="o-1")
    assert done.returncode == 1 and done.stdout == ""
    assert "no password for user 'responder': set REDIS_RESPONDER_PASSWORD" in done.stderr


def test_the_shipped_file_loads_and_lets_nobody_in(tmp_path: Path) -> None:
    server = start_server(tmp_path, (DEPLOY / "users.acl").read_text())
    try:
        for user in [*PASSWORDS, "default"]:
            client = redis.Redis.from_url(server.url, username=user, password="anything")
            with pytest.raises(redis.exceptions.AuthenticationError):
                client.ping()
            client.close()
    finally:
        server.kill()


async def test_the_default_user_is_off(acl_server: RedisServer) -> None:
    anonymous = aioredis.Redis.from_url(acl_server.url, protocol=2)
    with pytest.raises(redis.exceptions.AuthenticationError, match="Authentication required"):
        await anonymous.ping()
    await anonymous.aclose()
    default = aioredis.Redis.from_url(acl_server.url, username="default", password="")
    with pytest.raises(redis.exceptions.AuthenticationError, match="disabled"):
        await default.ping()
    await default.aclose()


# -- each role's whole job ---------------------------------------------------------------


async def test_agent_and_responder_do_their_whole_job_with_nothing_denied(
    acl_server: RedisServer, admin: aioredis.Redis
) -> None:
    async with connect(acl_server, "agent") as agent, connect(acl_server, "responder") as bot:
        events = bot.events()
        seen: list[str] = []

        async def respond() -> None:
            async with bot.responder("ops") as requests:
                async for pending in requests:
                    seen.append(pending.request.prompt)
                    if pending.request.kind == "input":
                        await pending.accept({}, person="slack:U1")  # the default fills n
                    elif pending.request.prompt == "Decline?":
                        await pending.decline()
                    elif pending.request.prompt == "By id?":
                        await bot.answer(Answer(id=pending.request.id, ok=True))
                    # anything else is left to expire or be withdrawn

        responding = asyncio.create_task(respond())
        form = Request(id=new_id(), kind="input", prompt="How many?", data={"schema": FORM})
        answer = await agent.wait_for(form, timeout_s=20)
        assert (answer.ok, answer.data, answer.person) == (True, {"n": 1}, "slack:U1")
        declined = await agent.wait_for(Request(id=new_id(), kind="approval", prompt="Decline?"))
        assert declined.reason == "declined"
        by_id = await agent.wait_for(Request(id=new_id(), kind="approval", prompt="By id?"))
        assert by_id.ok
        late = await agent.wait_for(
            Request(id=new_id(), kind="approval", prompt="Ignored"), timeout_s=0.3
        )
        assert late.reason == "expired"
        durable = Request(id=new_id(), kind="approval", prompt="Decline?", durable=True)
        assert (await agent.wait_for(durable, timeout_s=20)).reason == "declined"
        assert (await agent.wait_for(durable)).reason == "declined"  # attached: stored
        ignored = Request(id=new_id(), kind="approval", prompt="Ignored", on_expiry=OnExpiry())
        defaulted = await agent.wait_for(ignored, timeout_s=0.3)
        assert (defaulted.reason, defaulted.defaulted) == ("expired", True)
        withdrawn = Request(id=new_id(), kind="approval", prompt="Withdrawn")
        waiting = asyncio.create_task(agent.wait_for(withdrawn, timeout_s=20))
        while "Withdrawn" not in seen:
            await asyncio.sleep(0.02)
        await withdraw(waiting)
        await agent.complete(form.id)
        kinds: set[tuple[str, str]] = set()
        async with asyncio.timeout(20):
            async for event in events:
                kinds.add((event.event, event.id))
                if ("withdrawn", withdrawn.id) in kinds and ("completed", form.id) in kinds:
                    break
        assert ("answered", form.id) in kinds
        await events.aclose()
        responding.cancel()
    assert seen[:4] == ["How many?", "Decline?", "By id?", "Ignored"]
    assert await denials(admin) == []


@pytest.mark.slow
async def test_a_durable_task_backed_mcp_call_works_as_the_agent_user(
    acl_server: RedisServer, admin: aioredis.Redis, as_user: Any
) -> None:
    """The agent keeps, reads and forgets its durable MCP task's record in its own store
    (``{toolnexus:w:agent.*}:store:mcp-tasks``) with nothing denied; the responder user can
    neither read nor write it."""
    from mcp_processes import task_server_http
    from toolnexus import load_mcp
    from toolnexus.keys import MCP_TASKS_STORE

    with task_server_http() as task_url:
        async with (
            connect(acl_server, "agent") as agent,
            connect(acl_server, "responder") as bot,
            bot.responder("person") as questions,
            load_mcp(task_url, wait_for=agent.wait_for, mode="2026-07-28") as tools,
        ):
            call = asyncio.create_task(tools["ask_hold"].call(durable="acl"))
            pending = await asyncio.wait_for(anext(questions), 30)
            call.cancel()  # left for the next call: the record stays in the agent's store
            await asyncio.gather(call, return_exceptions=True)
            record = KEYS.agent_store("agent", MCP_TASKS_STORE)
            assert await admin.hlen(record) == 1
            await noperm(as_user("responder").hgetall(record))
            await noperm(as_user("responder").hset(record, "x", "{}"))
            again = asyncio.create_task(tools["ask_hold"].call(durable="acl"))
            await asyncio.sleep(0.5)
            await pending.accept({"ok": True}, person="web:alice")
            result = await asyncio.wait_for(again, 30)
            assert result.content[0].text == "accept"  # type: ignore[union-attr]
            assert await admin.exists(record) == 0  # forgotten once the task ended
    assert [line for line in await denials(admin) if not line.startswith("responder:")] == []


async def test_a_quorum_is_voted_checked_and_shown_to_ops_with_nothing_denied(
    acl_server: RedisServer, admin: aioredis.Redis
) -> None:
    async with connect(acl_server, "agent") as agent, connect(acl_server, "responder") as bot:
        request = Request(id=new_id(), kind="approval", prompt="Two of us?", quorum=Quorum(2))
        waiting = asyncio.create_task(agent.wait_for(request, timeout_s=20))
        async with bot.responder("ops") as requests:
            pending = await anext(requests)
            assert await pending.accept(person="web:alice") is not None
            status = await read_status(url(acl_server, "ops"), "toolnexus", [QUEUE])
            [quorum] = status.queues[0].quorums
            assert quorum.accepts == 1 and quorum.approvers == ["web:alice"]
            assert await pending.accept(person="web:bob") is None
        answer = await asyncio.wait_for(waiting, 20)
    assert [a.person for a in answer.approvals or ()] == ["web:alice", "web:bob"]
    assert await denials(admin) == []


async def test_responders_reclaim_and_dead_letter_with_their_own_rights(
    acl_server: RedisServer, admin: aioredis.Redis, as_user: Any
) -> None:
    async with connect(acl_server, "agent") as agent, connect(acl_server, "responder") as bot:
        request = Request(id=new_id(), kind="approval", prompt="Reclaimed?")
        waiting = asyncio.create_task(agent.wait_for(request, timeout_s=20))
        async with bot.responder("ops", "first") as first:
            held = await anext(first)  # taken, never answered: its lease lapses
            assert held.request.id == request.id
        await as_user("agent").xadd(KEYS.requests, {"r": b"not a request"})
        async with bot.responder("ops", "second") as second:
            reclaimed = await anext(second)
            assert reclaimed.request.id == request.id
            await reclaimed.accept()
        assert (await waiting).ok
        dead = await as_user("ops").xrange(KEYS.dead)
        assert [fields[b"raw"] for _, fields in dead] == [b"r=not a request"]
    assert await denials(admin) == []


async def test_ops_requeues_and_purges_dead_letters_with_its_own_rights(
    acl_server: RedisServer, admin: aioredis.Redis, as_user: Any
) -> None:
    await as_user("agent").xadd(KEYS.requests, {"r": b"not a request"})
    bot = connect(acl_server, "responder")
    async with bot, bot.responder("ops", until_idle=True) as requests:
        async for _ in requests:
            raise AssertionError("garbage was taken")
    async with redis_brokers(url(acl_server, "ops"), "toolnexus", [QUEUE]) as (ops,):
        (letter,) = await dead_letters(ops)
        assert letter.requeue_problem is None
        assert await requeue(ops, letter) is not None
        assert await requeue(ops, letter) is None  # once
        assert await dead_letters(ops) == []
        assert [f for _, f in await as_user("ops").xrange(KEYS.requests)] == [
            {b"r": b"not a request"}
        ]
        assert await purge(ops, None) == 0
        assert await denials(admin) == []
        await noperm(ops.redis.xadd(KEYS.dead, {"error": "x"}))  # requeue only, not forge


async def test_ops_requeue_points_the_route_at_the_new_entry_with_its_own_rights(
    acl_server: RedisServer, admin: aioredis.Redis, as_user: Any
) -> None:
    """A requeued request's route names its new entry (answering by id reads it there)."""
    waiter = "agent.0123456789abcdef"
    request = Request(id=new_id(), kind="approval", prompt="Requeue me?", reply_to=waiter)
    encoded = toolnexus.codec.MSGPACK.encode(request)
    fields = {"error": "x", "stream": KEYS.requests, "entry": "1-1", "raw": b"r=" + encoded}
    await admin.xadd(KEYS.dead, fields)  # type: ignore[arg-type]
    await admin.set(KEYS.route(request.id), f"{waiter} 1-1", px=60_000)
    async with redis_brokers(url(acl_server, "ops"), "toolnexus", [QUEUE]) as (ops,):
        (letter,) = await dead_letters(ops)
        added = await requeue(ops, letter)
    assert added is not None
    assert await admin.get(KEYS.route(request.id)) == f"{waiter} {added}".encode()
    assert await denials(admin) == []


# -- and nothing beyond it ---------------------------------------------------------------


async def noperm(command: Any) -> None:
    with pytest.raises(redis.exceptions.NoPermissionError):
        await command


async def test_a_responder_cannot_add_requests_or_read_beyond_its_keys(
    acl_server: RedisServer, admin: aioredis.Redis, as_user: Any
) -> None:
    async with connect(acl_server, "agent") as agent:
        waiting = asyncio.create_task(agent.wait_for(Request(id=new_id(), kind="approval")))
        responder = as_user("responder")
        await noperm(responder.xadd(KEYS.requests, {"r": b"forged request"}))
        await noperm(responder.xrange(KEYS.dead))  # (XRANGE of requests: answering by id's)
        await noperm(responder.xread({KEYS.answers(agent.waiter_id): "0"}))
        await noperm(responder.xrange(f"{{toolnexus:q:{QUEUE}}}:audit"))
        await noperm(responder.get("some-other-app:secret"))
        await noperm(responder.keys("*"))
        await noperm(responder.flushall())
        # a script it loads itself runs with its own rights, command by command
        forge = "return redis.call('XADD', KEYS[1], '*', 'r', ARGV[1])"
        sha = await responder.script_load(forge)
        with pytest.raises(redis.exceptions.ResponseError, match="script can't access"):
            await responder.evalsha(sha, 1, KEYS.requests, b"forged request")
        assert await as_user("ops").xlen(KEYS.requests) == 1
        await withdraw(waiting)
    assert f"responder: key {KEYS.requests}" in await denials(admin)


async def test_an_agent_cannot_read_the_requests_of_others(
    acl_server: RedisServer, as_user: Any
) -> None:
    agent = as_user("agent")
    await noperm(agent.xreadgroup("ops", "me", {KEYS.requests: ">"}))
    await noperm(agent.xrange(KEYS.requests))
    await noperm(agent.xgroup_create(KEYS.requests, "mine", mkstream=True))
    await noperm(agent.hset(f"{{toolnexus:q:{QUEUE}}}:workers", "me", "1"))
    await noperm(agent.get("some-other-app:secret"))


async def test_ops_reads_everything_and_writes_nothing(
    acl_server: RedisServer, as_user: Any
) -> None:
    async with connect(acl_server, "agent") as agent, connect(acl_server, "responder") as bot:
        request = Request(id=new_id(), kind="approval", prompt="Seen by ops?")
        waiting = asyncio.create_task(agent.wait_for(request, timeout_s=20))
        async with bot.responder("ops-group") as requests:
            await anext(requests)
            ops = as_user("ops")
            groups = await ops.xinfo_groups(KEYS.requests)
            assert [g["name"] for g in groups] == [b"ops-group"]
            assert (await ops.xpending(KEYS.requests, "ops-group"))["pending"] == 1
            assert await ops.hget(KEYS.state(agent.waiter_id, request.id), "s") == b"open"
            await noperm(ops.hset(KEYS.state(agent.waiter_id, request.id), "s", "answered"))
            await noperm(ops.xadd(KEYS.answers(agent.waiter_id), {"id": request.id}))
        await withdraw(waiting)


async def test_liveness_heartbeats_and_audit_have_their_writers_and_readers(
    as_user: Any,
) -> None:
    alive, workers, audit = (
        KEYS.alive("agent.0123456789abcdef"),
        f"{{toolnexus:q:{QUEUE}}}:workers",
        f"{{toolnexus:q:{QUEUE}}}:audit",
    )
    agent, responder, ops = as_user("agent"), as_user("responder"), as_user("ops")
    assert await agent.set(alive, "1", px=30_000)
    assert await responder.get(alive) == b"1" and await responder.pttl(alive) > 0
    await noperm(responder.set(alive, "0"))
    assert await responder.hset(workers, "ops/bot-1", "heartbeat") == 1
    await responder.pexpire(workers, 30_000)
    assert await ops.hgetall(workers) == {b"ops/bot-1": b"heartbeat"}
    # a worker's health probe (toolnexus check) reads heartbeats with the worker's own user
    assert await responder.hgetall(workers) == {b"ops/bot-1": b"heartbeat"}
    # and its metrics count the request and dead-letter streams, without reading them
    assert await responder.xlen(KEYS.requests) >= 0 and await responder.xlen(KEYS.dead) == 0
    await noperm(responder.xrange(KEYS.dead))
    await noperm(agent.hset(workers, "ops/bot-2", "x"))
    await agent.xadd(audit, {"r": b"record"})
    assert [fields for _, fields in await ops.xrange(audit)] == [{b"r": b"record"}]
    # A responder records the withdrawal of a dead waiter's requests: it may add records
    # (each holds a signed answer that verify_record checks), never read them.
    await responder.xadd(audit, {"r": b"record of a withdrawal"})
    assert len(await ops.xrange(audit)) == 2
    await noperm(responder.xrange(audit))
    await noperm(agent.xrange(audit))
    await noperm(ops.xadd(audit, {"r": b"x"}))


async def test_an_agent_reads_heartbeats_to_warn_that_nobody_reads_with_nothing_denied(
    acl_server: RedisServer, admin: aioredis.Redis, as_user: Any, caplog: pytest.LogCaptureFixture
) -> None:
    workers = f"{{toolnexus:q:{QUEUE}}}:workers"
    caplog.set_level(logging.WARNING, logger="toolnexus")
    async with connect(acl_server, "agent") as agent:
        answer = await agent.wait_for(Request(id=new_id(), kind="approval"), timeout_s=0.5)
    assert answer.reason == "expired"
    [warned] = [r.getMessage() for r in caplog.records if "nobody reads" in r.getMessage()]
    assert warned.startswith(f"nobody reads queue {QUEUE!r} of namespace 'toolnexus'"), warned
    assert await denials(admin) == []
    await noperm(as_user("agent").hset(workers, "ops/bot-2", "x"))  # it reads them only


async def test_what_acls_cannot_prevent(acl_server: RedisServer, as_user: Any) -> None:
    """A responder must write waiters' state and reply streams to answer, so it can write
    an answer nobody gave: only signatures tell the two apart (README, Signatures)."""
    async with connect(acl_server, "agent") as agent:
        request = Request(id=new_id(), kind="approval", prompt="Drop table users?")
        waiting = asyncio.create_task(agent.wait_for(request, timeout_s=20))
        await asyncio.sleep(0.2)
        forged = toolnexus.codec.MSGPACK.encode(
            Answer(id=request.id, ok=True, responder="alice@ops")
        )
        await as_user("responder").xadd(
            KEYS.answers(agent.waiter_id), {"id": request.id, "a": forged}
        )
        answer = await waiting
        assert (answer.ok, answer.responder) == (True, "alice@ops")


async def test_a_chat_bot_keeps_its_message_map_as_a_responder(as_user: Any) -> None:
    messages = KEYS.store("slack")
    responder, agent = as_user("responder"), as_user("agent")
    assert await responder.hset(messages, "req-1", '{"channel": "C1", "ts": "1.2"}') == 1
    assert await responder.expire(messages, 60)
    assert await responder.hgetall(messages) == {b"req-1": b'{"channel": "C1", "ts": "1.2"}'}
    assert await responder.hdel(messages, "req-1") == 1
    await noperm(agent.hset(messages, "req-2", "{}"))


def run_state_rules() -> str:
    """The rules docs/how-to/tool-approvals.md says an agent's user needs added to keep
    resumable runs' state (in queue stores, the responder role's with the shipped ACL)."""
    page = (Path(__file__).parents[1] / "docs" / "how-to" / "tool-approvals.md").read_text()
    match = re.search(r"`(\(~\{toolnexus:q:\*\}:store:\*[^`]*)`\s+added", page)
    assert match is not None, "the page names no rules for an agent's resumable runs"
    return match.group(1)


async def test_the_ledger_is_the_agents_alone_and_a_tool_runs_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/security.md, S3 (tests/adversarial/test_claim_forgery.py, observation 3): the
    tool-call ledger is the agent's own store, which the shipped ACL lets the agent user do
    all the ledger does in (claim, record, read, replace a forged claim), with nothing
    denied, and the responder user neither read, delete nor write. A responder-role attacker
    who copies a resumable run's kept state (a queue store: the agent user has the rules
    the tool-approvals page says to add) and puts it back after the approved tool ran gets
    the run refused as "ran already": the tool runs once. Before, it deleted the claim
    (``HDEL`` on the queue store ``tool-calls``) and the tool ran twice."""
    pytest.importorskip("pydantic_ai")
    from test_forgery import shown
    from test_frameworks_pydantic_ai import ARGS, resumable_bank
    from toolnexus.frameworks import Ledger, tool_call_digest
    from toolnexus.frameworks.pydantic_ai import STORE, resume, run_resumable
    from toolnexus.keys import TOOL_CALLS_STORE
    from toolnexus.security import Keyring, SigningKey

    monkeypatch.delenv("TOOLNEXUS_AGENT", raising=False)  # the agent is its Redis user
    env = {f"REDIS_{user.upper()}_PASSWORD": password for user, password in PASSWORDS.items()}
    done = set_passwords(**env)
    assert done.returncode == 0, done.stderr
    acl = "".join(
        f"{line} {run_state_rules()}\n" if line.startswith("user agent ") else f"{line}\n"
        for line in done.stdout.splitlines()
    )
    server = start_server(tmp_path, acl)
    admin = aioredis.Redis.from_url(server.url, username="admin", password=ADMIN)
    attacker = aioredis.Redis.from_url(url(server, "responder"))
    own = aioredis.Redis.from_url(url(server, "agent"))  # the agent user, by hand
    agent_key, bot_key = SigningKey.generate("agent"), SigningKey.generate("bot")
    ran: list[dict[str, Any]] = []
    run, digest = "run-acl", tool_call_digest("transfer", ARGS)
    ledger_key, kept_key = KEYS.agent_store("agent", TOOL_CALLS_STORE), KEYS.store(STORE)
    try:
        async with (
            toolnexus.connect(
                url(server, "agent"),
                queue=QUEUE,
                signing_key=agent_key,
                trusted_keys=Keyring.of(bot_key),
                require_signatures=True,
                **FAST,
            ) as agent,
            toolnexus.connect(
                url(server, "responder"),
                queue=QUEUE,
                signing_key=bot_key,
                trusted_keys=Keyring.of(agent_key),
                require_signatures=True,
                **FAST,
            ) as bot,
        ):
            assert isinstance(bot, RedisBroker)
            ledger = Ledger.of(agent)
            assert getattr(ledger.store, "key", None) == ledger_key
            started = asyncio.create_task(
                run_resumable(resumable_bank(ran), "Pay ACME", broker=agent, run=run)
            )
            pending = await shown(bot)
            started.cancel()  # the process is gone; the durable request stays open
            await asyncio.gather(started, return_exceptions=True)
            copied = await attacker.hget(kept_key, run)  # the responder reads queue stores
            assert copied is not None
            await pending.accept(person="web:alice")
            result = await resume(resumable_bank(ran), broker=agent, run=run)
            assert json.loads(str(result.output)) == ["sent 10 to ACME"]
            assert ran == [ARGS]
            request_id = pending.request.id
            claim = f"{request_id}:executed"
            assert (await ledger.get(request_id))["executed"] == digest
            # the responder can neither read, delete nor write the claim (nor any entry)
            await noperm(attacker.hdel(ledger_key, claim))
            await noperm(attacker.hset(ledger_key, claim, "forged"))
            await noperm(attacker.hget(ledger_key, claim))
            await noperm(attacker.delete(ledger_key))
            await noperm(attacker.expire(ledger_key, 1))
            # it puts the run's kept state back, as before the run: refused, nothing runs
            assert await attacker.hset(kept_key, run, copied) == 1
            with pytest.raises(toolnexus.InvalidAnswer, match="ran already"):
                await asyncio.wait_for(resume(resumable_bank(ran), broker=agent, run=run), 30)
            assert ran == [ARGS]
            # the agent user does all the ledger does: a forged claim of its own store's
            # writer is replaced (EVALSHA on the store's key) and the approved call claimed
            await own.hset(ledger_key, "tool-2:executed", "forged")
            assert await ledger.executing("tool-2", "transfer", ARGS, approved=digest)
            assert (await ledger.get("tool-2"))["executed"] == digest
            # what remains: the agent's own rights delete a claim (the ACL is the defence)
            assert await own.hdel(ledger_key, "tool-2:executed") == 1
        # the agent user was denied nothing; the responder only its attempts on the ledger
        # (DEL is no command of its role; the log counts repeats in one entry)
        assert sorted(await denials(admin)) == [
            "responder: command del",
            f"responder: key {ledger_key}",
        ]
    finally:
        for client in (own, attacker, admin):
            await client.aclose()
        server.kill()
