"""Issue #41, observations 1 and 2: the wait gateway started from its command line
(``toolnexus worker gateway --require-signatures``) on a private redis-server with the ACL
``toolnexus acl`` writes, as the agent user ``agent-a``. An unsigned accepting answer that
the ``responder`` user XADDs into the waiter's reply stream never reaches a gateway agent,
and the genuine signed answer afterwards does (threat-model S4); a trusted responder's
refusal of the request reaches the agent at once, as the documented final answer (S2)."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx2 as httpx
import pytest
from test_agent_acl import QUEUE, fleet_server
from test_agent_acl import url as user_url

import toolnexus
from conformance import TOOLNEXUS, clean_env
from conftest import FAST, RedisServer
from helpers import eventually
from test_forgery import forged, shown
from toolnexus._wire10 import iso_time
from toolnexus.models import new_id
from toolnexus.redis_broker import RedisBroker
from toolnexus.security import Keyring, SigningKey

__all__ = ["fleet_server"]  # the fixture, used here

pytestmark = pytest.mark.redis

TOKEN = "agent-a-gateway-token-0123456789"


@dataclass
class Gateway:
    url: str
    http: httpx.AsyncClient
    lines: list[str]

    async def post(self, body: object, **params: object) -> httpx.Response:
        return await self.http.post(f"{self.url}/v1/requests", json=body, params=params)

    async def get(self, request_id: str, **params: object) -> httpx.Response:
        return await self.http.get(f"{self.url}/v1/requests/{request_id}", params=params)


@dataclass
class Keys:
    agent: SigningKey
    bot: SigningKey


@pytest.fixture
def keys() -> Keys:
    return Keys(SigningKey.generate("agent-a"), SigningKey.generate("ops-bot"))


def responder(server: RedisServer, keys: Keys, trusted: Keyring | None = None) -> RedisBroker:
    """The shipped ``responder`` user, signing with ops-bot's key."""
    made = toolnexus.connect(
        user_url(server, "responder"),
        queue=QUEUE,
        signing_key=keys.bot,
        trusted_keys=trusted or Keyring.of(keys.agent),
        require_signatures=True,
        **FAST,
    )
    assert isinstance(made, RedisBroker)
    return made


@pytest.fixture
async def gateway(fleet_server: RedisServer, keys: Keys, tmp_path: Path) -> AsyncIterator[Gateway]:
    """``toolnexus worker gateway`` as the ``agent-a`` user with signatures required:
    agent-a's key in ``--agent-keys``, ops-bot's public key in ``--trusted-keys``."""
    agents, trusted = tmp_path / "agents", tmp_path / "trusted"
    agents.mkdir()
    trusted.mkdir()
    keys.agent.save(agents)
    keys.bot.save(trusted)
    (trusted / "ops-bot.key").unlink()
    command = [TOOLNEXUS, "worker", "gateway", "--url", user_url(fleet_server, "agent-a")]
    command += ["--queue", QUEUE, "--agent-keys", str(agents), "--trusted-keys", str(trusted)]
    command += ["--require-signatures", "--port", "0", "--keepalive-s", "0.2"]
    env = clean_env(TOOLNEXUS_GATEWAY_TOKENS=f"agent-a={TOKEN}")
    process = await asyncio.create_subprocess_exec(
        *command, stderr=asyncio.subprocess.PIPE, env=env
    )
    lines: list[str] = []

    async def read() -> None:
        assert process.stderr is not None
        async for line in process.stderr:
            lines.append(line.decode())

    reader = asyncio.create_task(read())

    async def serving() -> bool:
        if process.returncode is not None:
            raise AssertionError(f"the gateway exited: {''.join(lines)}")
        return any("wait gateway on" in line for line in lines)

    try:
        await eventually(serving, "the gateway serving", 20)
        url = next(m[1] for line in lines if (m := re.search(r"wait gateway on (\S+)", line)))
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with httpx.AsyncClient(timeout=30, headers=headers) as http:
            yield Gateway(url, http, lines)
    finally:
        if process.returncode is None:
            process.terminate()
            await process.wait()
        await asyncio.gather(reader, return_exceptions=True)


def approval(expires_in_s: float = 60) -> dict[str, object]:
    deadline = iso_time(time.time() + expires_in_s)
    return {"id": new_id("pnd"), "kind": "approval", "prompt": "Deploy?", "expiresAt": deadline}


@pytest.mark.slow
async def test_a_forged_reply_never_reaches_a_gateway_agent_and_the_genuine_one_does(
    fleet_server: RedisServer, keys: Keys, gateway: Gateway
) -> None:
    """S4, observation 1: the gateway starts with signatures required (it exited before),
    and an unsigned ``Answer(ok=True)`` XADDed to its waiter's reply stream is refused."""
    asked = approval()
    created = await gateway.post(asked, wait=0)
    assert created.status_code == 202, created.text
    async with responder(fleet_server, keys) as bot:
        pending = await shown(bot)
        assert pending.request.id == asked["id"]
        assert pending.request.signature is not None
        assert pending.request.signature.key == "agent-a"
        reply_to = pending.request.reply_to
        assert reply_to is not None
        reply_stream = bot.keys.answers(reply_to)
        await bot.redis.xadd(reply_stream, {"id": asked["id"], "a": forged(bot, str(asked["id"]))})
        still = await gateway.get(str(asked["id"]), wait=1)
        assert still.status_code == 202, still.text  # the forgery ended nothing
        await pending.accept({"ticket": "CHG-7"}, person="web:ana")
        answered = await gateway.get(str(asked["id"]), wait=20)
    assert answered.status_code == 200
    assert answered.json() == {
        "id": asked["id"],
        "ok": True,
        "data": {"ticket": "CHG-7"},
        "bridge": {"responder": "ops-bot", "person": "web:ana"},
    }
    assert any("refused an answer to" in line for line in gateway.lines)


@pytest.mark.slow
async def test_a_refusal_reaches_a_gateway_agent_at_once(
    fleet_server: RedisServer, keys: Keys, gateway: Gateway
) -> None:
    """S2, observation 2: a trusted responder that cannot verify the agent's signature
    (it trusts another agent key) refuses the request; the agent's long poll ends with the
    documented answer, long before the request's deadline, and the request is withdrawn."""
    asked = approval(expires_in_s=120)
    started = time.monotonic()
    polling = asyncio.create_task(gateway.post(asked))
    stranger = Keyring.of(SigningKey.generate("agent-a"))  # same name, another key
    bot = responder(fleet_server, keys, trusted=stranger)
    async with bot, bot.responder("ops") as requests:
        reading = asyncio.create_task(anext(requests))
        response = await asyncio.wait_for(polling, 30)
        reading.cancel()
    assert time.monotonic() - started < 30
    assert response.status_code == 200
    answer = response.json()
    assert (answer["id"], answer["ok"], answer["reason"]) == (asked["id"], False, "cancelled")
    assert answer["bridge"]["reason"] == "withdrawn"
    assert answer["bridge"]["responder"] == "ops-bot"
    assert "signature" in answer["bridge"]["refused"]
    again = await gateway.get(str(asked["id"]))
    assert again.json() == answer
