"""S6 (and S5's "attaching to a durable request needs the identity that made it", from the
ACL side), issue #24 observation 6: on a private redis-server loaded with the ACL that
``toolnexus acl`` writes for two agent users and a responder, one agent cannot read the
other's reply stream, state or durable request, nor attach to it, with or without
signatures; the asking agent still gets its answer."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
import redis.exceptions

import toolnexus
from conftest import FAST, RedisServer
from toolnexus import Request, ToolnexusError
from toolnexus.models import new_id
from toolnexus.redis_broker import RedisBroker
from toolnexus.security import Keyring, SigningKey

pytestmark = pytest.mark.redis

DEPLOY = Path(__file__).parents[2] / "deploy" / "redis"
TOOLNEXUS = str(Path(sys.executable).parent / "toolnexus")
PASSWORDS = {"agent-a": "a-secret", "agent-b": "b-secret", "responder": "r-secret"}
ADMIN = "admin-secret"  # a user of this test alone, to look at what the agents cannot
QUEUE = "acl"
SECRET = {"code": "vault-7f3a"}
FORM = {"type": "object", "properties": {"code": {"type": "string"}}}


@pytest.fixture
def fleet_server(tmp_path: Path) -> Iterator[RedisServer]:
    """redis-server with the ACL ``toolnexus acl`` writes for agents agent-a and agent-b
    and responder responder, passwords added by set-passwords.sh."""
    acl = subprocess.run(
        [TOOLNEXUS, "acl", "--agent", "agent-a", "--agent", "agent-b", "--responder", "responder"],
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


def broker(server: RedisServer, user: str, **options: Any) -> RedisBroker:
    made = toolnexus.connect(url(server, user), queue=QUEUE, **FAST, **options)
    assert isinstance(made, RedisBroker)
    return made


@pytest.fixture
async def agent_b(fleet_server: RedisServer) -> AsyncIterator[aioredis.Redis]:
    """A plain client of agent-b's Redis user: what a rogue agent can type."""
    client = aioredis.Redis.from_url(url(fleet_server, "agent-b"))
    yield client
    await client.aclose()


async def noperm(command: Any) -> None:
    with pytest.raises(redis.exceptions.NoPermissionError):
        await command


async def answer_one(bot: RedisBroker) -> str:
    """Accept the next request with the secret; its id."""
    async with bot.responder("ops") as requests:
        pending = await anext(requests)
        await pending.accept(SECRET, person="web:alice")
        return pending.request.id


def never_the_answer(got: Any) -> None:
    """What agent B got from waiting with agent A's id: an error or an unanswered ending,
    never A's answer."""
    if not isinstance(got, ToolnexusError):
        assert not got.ok and got.data is None, got
    assert "vault" not in repr(got)


async def test_another_agent_user_cannot_read_an_agents_answers_or_states(
    fleet_server: RedisServer, agent_b: aioredis.Redis
) -> None:
    """S6, observation 6 (unsigned): what agent A waits for and gets back stays A's; on
    main agent B read A's answer, form data included, from A's reply stream."""
    async with broker(fleet_server, "agent-a") as a, broker(fleet_server, "responder") as bot:
        assert a.waiter_id.startswith("agent-a.")  # the agent is the Redis user
        request = Request(id=new_id(), kind="input", prompt="Vault code?", data={"schema": FORM})
        waiting = asyncio.create_task(a.wait_for(request, timeout_s=20))
        answered = asyncio.create_task(answer_one(bot))
        answer = await asyncio.wait_for(waiting, 20)
        assert (answer.ok, answer.data) == (True, SECRET)
        assert await answered == request.id
        reply_stream, state = a.keys.answers(a.waiter_id), a.keys.state(a.waiter_id, request.id)
        await noperm(agent_b.xread({reply_stream: "0"}))
        await noperm(agent_b.xrevrange(reply_stream))
        await noperm(agent_b.xrange(reply_stream))
        await noperm(agent_b.hget(state, "a"))
        await noperm(agent_b.hgetall(state))
        await noperm(agent_b.xtrim(reply_stream, maxlen=0))
        await noperm(agent_b.xadd(reply_stream, {"id": request.id, "a": b"forged"}))
        await noperm(agent_b.hset(state, "s", "open"))
        await noperm(agent_b.set(a.keys.alive(a.waiter_id), "1"))
        # an EVALSHA gives it nothing more: Redis checks every command of a script
        sha = await agent_b.script_load("return redis.call('XRANGE', KEYS[1], '-', '+')")
        with pytest.raises(redis.exceptions.NoPermissionError):
            await agent_b.evalsha(sha, 1, reply_stream)


async def test_another_agent_cannot_attach_to_an_agents_durable_request(
    fleet_server: RedisServer, agent_b: aioredis.Redis
) -> None:
    """S6 and S5 (attaching needs the identity that made it), observation 6 (signed, each
    agent with its own key): B waiting with A's durable id, under another allow-list, gets
    an error or its own unanswered ending, never A's answer (on main it got A's answer
    data); B's user cannot read A's durable state; A attaches again and gets its answer."""
    key_a, key_b, bot_key = (SigningKey.generate(n) for n in ("agent-a", "agent-b", "ops-bot"))
    agents = Keyring.of(key_a, key_b)

    def agent(user: str, key: SigningKey, **options: Any) -> RedisBroker:
        return broker(
            fleet_server,
            user,
            signing_key=key,
            trusted_keys=Keyring.of(bot_key),
            require_signatures=True,
            **options,
        )

    responder = broker(
        fleet_server, "responder", signing_key=bot_key, trusted_keys=agents, require_signatures=True
    )
    async with agent("agent-a", key_a) as a, responder as bot:
        request = Request(
            id=new_id(), kind="input", prompt="Vault code?", data={"schema": FORM}, durable=True
        )
        waiting = asyncio.create_task(a.wait_for(request, timeout_s=30, allow=["web:alice"]))
        answered = asyncio.create_task(answer_one(bot))
        answer = await asyncio.wait_for(waiting, 20)
        assert (answer.ok, answer.data, answer.responder) == (True, SECRET, "ops-bot")
        await answered
        durable_state = a.keys.state(a.keys.durable_waiter("agent-a"), request.id)
        await noperm(agent_b.hgetall(durable_state))
        await noperm(agent_b.xread({a.keys.answers(a.keys.durable_waiter("agent-a")): "0"}))

        async with agent("agent-b", key_b) as b:
            try:
                got: Any = await b.wait_for(request, timeout_s=0.5, allow=["web:mallory"])
            except ToolnexusError as exc:
                got = exc
            never_the_answer(got)
        # nor by claiming to be agent-a: its Redis user may not touch agent-a's keys
        async with agent("agent-b", key_b, agent="agent-a") as spoofing:
            try:
                got = await asyncio.wait_for(spoofing.wait_for(request, timeout_s=0.5), 10)
            except ToolnexusError as exc:
                got = exc
            never_the_answer(got)
        again = await a.wait_for(request, timeout_s=5, allow=["web:alice"])
        assert (again.ok, again.data) == (True, SECRET)  # A itself still attaches
