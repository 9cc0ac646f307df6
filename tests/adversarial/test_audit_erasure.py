"""S8, issue #41 observation 4: no responder can erase the record of an outcome. On a
private redis-server loaded with the ACL that ``toolnexus acl`` writes (an agent, the
responder ``web-1``, an ops user), an agent asks, ``web-1`` approves; then ``web-1``, as a
plain Redis client, tries to trim or delete every audit stream that holds the record
(``XTRIM``, ``XDEL``, ``DEL``, and a script of its own that trims, by ``EVALSHA`` and by
``EVAL``): each is refused, and ``toolnexus audit`` (the ops user) still shows the record.
On 56a6318 the record sat in the queue's audit stream, which ``web-1`` could trim to 0."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
import redis.exceptions

import toolnexus
from conftest import FAST, RedisServer
from toolnexus import Request
from toolnexus.keys import Keys
from toolnexus.models import new_id
from toolnexus.redis_broker import RedisBroker

pytestmark = pytest.mark.redis

DEPLOY = Path(__file__).parents[2] / "deploy" / "redis"
TOOLNEXUS = str(Path(sys.executable).parent / "toolnexus")
PASSWORDS = {"agent-a": "a-secret", "agent-b": "b-secret", "web-1": "w-secret", "ops": "o-secret"}
ADMIN = "admin-secret"  # a user of this test alone, to find where the records are
QUEUE = "audit"
TRIM = "return redis.call('XTRIM', KEYS[1], 'MAXLEN', 0)"


@pytest.fixture
def fleet_server(tmp_path: Path) -> Iterator[RedisServer]:
    """redis-server with the ACL ``toolnexus acl`` writes for agents agent-a and agent-b,
    responder web-1 and ops user ops, passwords added by set-passwords.sh."""
    roles = ["--agent", "agent-a", "--agent", "agent-b", "--responder", "web-1", "--ops", "ops"]
    acl = subprocess.run(
        [TOOLNEXUS, "acl", *roles],
        capture_output=True,
        text=True,
    )
    assert acl.returncode == 0, acl.stderr
    (tmp_path / "fleet.acl").write_text(acl.stdout)
    env = {f"REDIS_{u.upper().replace('-', '_')}_PASSWORD": p for u, p in PASSWORDS.items()}
    hashed = subprocess.run(
        [str(DEPLOY / "set-passwords.sh"), str(tmp_path / "fleet.acl")],
        env={"PATH": os.environ["PATH"], **env},
        capture_output=True,
        text=True,
    )
    assert hashed.returncode == 0, hashed.stderr
    (tmp_path / "users.acl").write_text(hashed.stdout + f"user admin on >{ADMIN} +@all ~* &*\n")
    server = RedisServer(
        tmp_path, "--aclfile", str(tmp_path / "users.acl"), username="admin", password=ADMIN
    )
    server.start()
    try:
        yield server
    finally:
        server.kill()


def url(server: RedisServer, user: str) -> str:
    return server.url.replace("redis://", f"redis://{user}:{PASSWORDS[user]}@")


def broker(server: RedisServer, user: str) -> RedisBroker:
    made = toolnexus.connect(url(server, user), queue=QUEUE, **FAST)
    assert isinstance(made, RedisBroker)
    return made


def audit(server: RedisServer) -> list[dict[str, Any]]:
    """``toolnexus audit --json`` as the ops user."""
    shown = subprocess.run(
        [TOOLNEXUS, "audit", "--json", "--url", url(server, "ops"), "--queue", QUEUE],
        capture_output=True,
        text=True,
    )
    assert shown.returncode == 0, shown.stderr
    records: list[dict[str, Any]] = json.loads(shown.stdout)
    return records


async def holding(admin: aioredis.Redis, request_id: str) -> list[str]:
    """The streams whose entries hold the audit record of ``request_id``."""
    found = []
    async for key in admin.scan_iter(match="*audit*", _type="stream"):
        entries = await admin.xrange(key)
        if any(request_id.encode() in fields.get(b"r", b"") for _, fields in entries):
            found.append(key.decode())
    return found


async def approved(server: RedisServer) -> tuple[str, dict[str, Any]]:
    """agent-a asks, web-1 approves: the request's id and its audit record, as shown."""
    request = Request(id=new_id(), kind="approval", prompt="Deploy v2 to production?")
    async with broker(server, "agent-a") as agent, broker(server, "web-1") as bot:
        waiting = asyncio.create_task(agent.wait_for(request, timeout_s=20))
        async with bot.responder("ops") as shown:
            pending = await anext(shown)
            await pending.accept(person="web:mallory")
        assert (await asyncio.wait_for(waiting, 20)).ok
    [record] = [r for r in audit(server) if r["id"] == request.id]
    assert record["ok"] is True and record["person"] == "web:mallory", record
    return request.id, record


async def test_a_responder_user_can_neither_trim_nor_delete_the_record_of_what_it_answered(
    fleet_server: RedisServer,
) -> None:
    request_id, record = await approved(fleet_server)

    admin = aioredis.Redis.from_url(fleet_server.url.replace("redis://", f"redis://admin:{ADMIN}@"))
    web = aioredis.Redis.from_url(url(fleet_server, "web-1"))
    try:
        streams = await holding(admin, request_id)
        assert streams, "the record is in no stream"
        sha = await web.script_load(TRIM)  # any user may load a script; running it is judged
        for stream in streams:
            entry = (await admin.xrange(stream))[-1][0]
            attacks: dict[str, Callable[[], Awaitable[Any]]] = {
                "XTRIM": lambda s=stream: web.xtrim(s, maxlen=0, approximate=False),
                "XDEL": lambda s=stream, e=entry: web.xdel(s, e),
                "DEL": lambda s=stream: web.delete(s),
                "EVALSHA": lambda s=stream: web.evalsha(sha, 1, s),
                "EVAL": lambda s=stream: web.eval(TRIM, 1, s),
            }
            for name, attack in attacks.items():
                with pytest.raises(redis.exceptions.NoPermissionError):
                    await attack()
                    pytest.fail(f"web-1 ran {name} on {stream}")
            assert await admin.xlen(stream) >= 1
    finally:
        await web.aclose()
        await admin.aclose()
    [kept] = [r for r in audit(fleet_server) if r["id"] == request_id]
    assert kept == record


async def test_no_role_may_trim_another_roles_audit_stream(fleet_server: RedisServer) -> None:
    """Each writer caps its own stream only: another agent cannot trim agent-a's, and an
    agent cannot write or trim the responders' (S8)."""
    request_id, record = await approved(fleet_server)
    keys = Keys("toolnexus", QUEUE)
    own = keys.agent_audit("agent-a")
    b = aioredis.Redis.from_url(url(fleet_server, "agent-b"))
    a = aioredis.Redis.from_url(url(fleet_server, "agent-a"))
    try:
        for attack in (
            lambda: b.xtrim(own, maxlen=0, approximate=False),
            lambda: b.xadd(own, {"r": b"x"}, maxlen=0, approximate=False),
            lambda: b.delete(own),
            lambda: a.xtrim(keys.responder_audit, maxlen=0, approximate=False),
            lambda: a.xadd(keys.responder_audit, {"r": b"x"}, maxlen=0, approximate=False),
        ):
            with pytest.raises(redis.exceptions.NoPermissionError):
                await attack()
    finally:
        await a.aclose()
        await b.aclose()
    assert [r for r in audit(fleet_server) if r["id"] == request_id] == [record]
