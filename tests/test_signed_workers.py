"""Every worker started signed from its command line (issue #41, deliverable 2): the path an
operator uses. Each ``toolnexus worker NAME`` process gets its signing key, the keys it
trusts and ``TOOLNEXUS_REQUIRE_SIGNATURES=1`` (the gateway: ``--agent-keys``,
``--trusted-keys`` and ``--require-signatures``), then does one signed round trip: an agent
with its own key asks, the worker answers, the agent gets an answer verified as the
worker's key. The responder workers are driven by the conformance suite's adapters
(``tests/conformance.py``), all started at once."""

from __future__ import annotations

import asyncio
import contextlib
import re
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx2 as httpx
import pytest

import toolnexus
from conformance import ADAPTERS, EXPECTED, TOOLNEXUS, clean_env, conformance_request
from conftest import FAST
from helpers import eventually
from toolnexus import Broker
from toolnexus.security import SigningKey

pytestmark = [pytest.mark.redis, pytest.mark.slow, pytest.mark.timeout(240)]

RESPONDERS = ["auto", "terminal", "web", "http", "webhook", "email", "slack", "telegram"]
GATEWAY_TOKEN = "signed-gateway-token-0123456789"


@dataclass
class Keys:
    """An agent's key and a responder's, each side trusting the other's public key."""

    agent: Path
    responder: Path
    agents: Path
    """The agents' public keys (what responders trust)."""
    responders: Path
    """The responders' public keys (what agents trust)."""

    def worker_env(self) -> dict[str, str]:
        return {
            "TOOLNEXUS_SIGNING_KEY": str(self.responder),
            "TOOLNEXUS_TRUSTED_KEYS": str(self.agents),
            "TOOLNEXUS_REQUIRE_SIGNATURES": "1",
        }

    def agent_env(self) -> dict[str, str]:
        return {
            "TOOLNEXUS_SIGNING_KEY": str(self.agent),
            "TOOLNEXUS_TRUSTED_KEYS": str(self.responders),
            "TOOLNEXUS_REQUIRE_SIGNATURES": "1",
        }


@pytest.fixture
def keys(tmp_path: Path) -> Keys:
    found = {}
    for name, side in (("agent-7", "agents"), ("web-1", "responders")):
        directory = tmp_path / side
        directory.mkdir()
        private, public = SigningKey.generate(name).save(tmp_path)
        (directory / public.name).write_text(public.read_text())
        found[name] = private
    return Keys(found["agent-7"], found["web-1"], tmp_path / "agents", tmp_path / "responders")


def agent(url: str, namespace: str, queue: str, keys: Keys) -> Broker:
    """The asking side: its own key, trusting the responder's, requiring signatures."""
    return toolnexus.connect(
        url,
        namespace=namespace,
        queue=queue,
        signing_key=keys.agent,
        trusted_keys=keys.responders,
        require_signatures=True,
        **FAST,
    )


async def test_every_responder_worker_started_signed_answers_a_signed_request(
    redis_url: str, namespace: str, tmp_path: Path, keys: Keys
) -> None:
    adapters = {}
    for name in RESPONDERS:
        directory = tmp_path / name
        directory.mkdir()
        adapters[name] = ADAPTERS[name](directory)
        adapters[name].env = keys.worker_env()
    try:
        await asyncio.gather(
            *(a.start(redis_url, namespace, f"signed-{n}") for n, a in adapters.items())
        )

        async def round_trip(name: str) -> None:
            async with agent(redis_url, namespace, f"signed-{name}", keys) as broker:
                request = conformance_request("answer")
                waiting = asyncio.create_task(broker.wait_for(request, timeout_s=90))
                await adapters[name].answer(request)
                answer = await asyncio.wait_for(waiting, 90)
            assert answer.ok, f"{name}: {answer}"
            assert answer.data == EXPECTED, name
            assert answer.responder == "web-1", f"{name}: not verified as web-1: {answer}"

        await asyncio.gather(*(round_trip(name) for name in adapters))
    finally:
        await asyncio.gather(*(a.close() for a in adapters.values()), return_exceptions=True)


@contextlib.asynccontextmanager
async def process(command: list[str], env: dict[str, str], ready: str) -> AsyncIterator[list[str]]:
    """``command`` running, its stderr lines so far (once one says ``ready``)."""
    started = await asyncio.create_subprocess_exec(
        *command, stderr=asyncio.subprocess.PIPE, env=env
    )
    lines: list[str] = []

    async def read() -> None:
        assert started.stderr is not None
        async for line in started.stderr:
            lines.append(line.decode())

    reader = asyncio.create_task(read())

    async def serving() -> bool:
        if started.returncode is not None:
            raise AssertionError(f"{command[2]} exited: {''.join(lines)}")
        return any(ready in line for line in lines)

    try:
        await eventually(serving, f"{command[2]} ready", 60)
        yield lines
    finally:
        if started.returncode is None:
            started.terminate()
            await started.wait()
        await asyncio.gather(reader, return_exceptions=True)


async def test_the_gateway_started_signed_gets_its_agent_a_verified_answer(
    redis_url: str, namespace: str, tmp_path: Path, keys: Keys
) -> None:
    agent_keys = tmp_path / "agent-keys"
    agent_keys.mkdir()
    (agent_keys / "agent-7.key").write_bytes(keys.agent.read_bytes())
    command = [TOOLNEXUS, "worker", "gateway", "--url", redis_url, "--namespace", namespace]
    command += ["--queue", "signed-gateway", "--port", "0", "--require-signatures"]
    command += ["--agent-keys", str(agent_keys), "--trusted-keys", str(keys.responders)]
    env = clean_env(TOOLNEXUS_GATEWAY_TOKENS=f"agent-7={GATEWAY_TOKEN}")
    responder = toolnexus.connect(
        redis_url,
        namespace=namespace,
        queue="signed-gateway",
        signing_key=keys.responder,
        trusted_keys=keys.agents,
        require_signatures=True,
        **FAST,
    )
    async with (
        process(command, env, "wait gateway on") as lines,
        responder,
        httpx.AsyncClient(timeout=60) as http,
    ):
        url = next(m[1] for line in lines if (m := re.search(r"wait gateway on (\S+)", line)))
        asked = {"id": f"pnd-{uuid.uuid4().hex[:12]}", "kind": "approval", "prompt": "Deploy?"}
        posting = asyncio.create_task(
            http.post(
                f"{url}/v1/requests",
                json=asked,
                headers={"Authorization": f"Bearer {GATEWAY_TOKEN}"},
            )
        )
        async with responder.responder("ops") as requests, asyncio.timeout(30):
            pending = await anext(requests)
        assert pending.request.signature is not None
        assert pending.request.signature.key == "agent-7"
        await pending.accept({"ticket": "CHG-1"})
        response = await asyncio.wait_for(posting, 30)
    assert response.json() == {
        "id": asked["id"],
        "ok": True,
        "data": {"ticket": "CHG-1"},
        "bridge": {"responder": "web-1"},
    }


async def test_the_a2a_worker_started_signed_continues_a_task_with_a_verified_answer(
    redis_url: str, namespace: str, keys: Keys
) -> None:
    from a2a.client import create_client
    from a2a.helpers import get_message_text

    from mcp_processes import a2a_agent_http
    from test_frameworks_a2a import ended_task, paused_elsewhere

    context_id = f"ctx-{uuid.uuid4()}"
    responder = toolnexus.connect(
        redis_url,
        namespace=namespace,
        signing_key=keys.responder,
        trusted_keys=keys.agents,
        require_signatures=True,
        **FAST,
    )
    with a2a_agent_http() as agent_url:
        async with await create_client(agent_url) as client, responder:
            paused = await paused_elsewhere(client, context_id)
            command = [TOOLNEXUS, "worker", "a2a", "--url", redis_url, "--namespace", namespace]
            command += ["--agent", agent_url, "--context", context_id, "--poll-s", "0.2"]
            command += ["--name", "agent-7"]
            async with process(command, clean_env(**keys.agent_env()), "watching the paused"):
                async with responder.responder("ops") as requests, asyncio.timeout(60):
                    pending = await anext(requests)
                assert pending.request.signature is not None
                assert pending.request.signature.key == "agent-7"
                await pending.accept({"answer": "Grace"}, person="tester")
                ended = await ended_task(client, paused.id)
    assert get_message_text(ended.status.message) == "told: Grace"
