"""The wait gateway (``toolnexus worker gateway``, issue #31): §10 waits over real HTTP
(uvicorn), published on a real Redis as the agent a bearer token names, signed with its key,
answered by a real responder that requires signatures."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import shutil
import subprocess
import time
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2 as httpx
import jsonschema
import pytest

import toolnexus
from conftest import FAST
from helpers import page_block
from toolnexus import Broker, ConfigurationError, NotResolved, Pending
from toolnexus._wire10 import iso_time
from toolnexus.models import new_id
from toolnexus.security import SigningKey
from toolnexus_workers.gateway import main as gateway_main
from toolnexus_workers.gateway.app import OPENAPI, Agents, Gateway
from toolnexus_workers.gateway.server import GatewayServer
from toolnexus_workers.gateway.tokens import Tokens

TOKEN = "agent-7-token-0123456789"
OTHER_TOKEN = "agent-8-token-0123456789"
DOCUMENT = json.loads(OPENAPI.read_text())
ROOT = Path(__file__).resolve().parents[1]


def schema(name: str) -> dict[str, Any]:
    found: dict[str, Any] = DOCUMENT["components"]["schemas"][name]
    return found


@dataclass
class Setup:
    url: str
    http: httpx.AsyncClient
    responder: Broker
    gateway: Gateway
    redis_url: str = ""
    namespace: str = ""

    async def post(self, body: Any, token: str = TOKEN, **params: Any) -> httpx.Response:
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        return await self.http.post(
            f"{self.url}/v1/requests",
            content=content,
            params=params,
            headers={"Authorization": f"Bearer {token}"},
        )

    async def get(self, path: str, token: str = TOKEN, **params: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}"}
        return await self.http.get(f"{self.url}{path}", params=params, headers=headers)


@pytest.fixture
async def setup(redis_url: str, namespace: str, tmp_path: Path) -> AsyncIterator[Setup]:
    agents, responders = tmp_path / "agents", tmp_path / "responders"
    for name, directory in (("agent-7", agents), ("agent-8", agents), ("ops-bot", responders)):
        directory.mkdir(exist_ok=True)
        SigningKey.generate(name).save(directory)
    trusted_by_agents, trusted_by_responders = tmp_path / "t-agents", tmp_path / "t-responders"
    trusted_by_agents.mkdir()
    trusted_by_responders.mkdir()
    for pub in responders.glob("*.pub"):
        (trusted_by_agents / pub.name).write_text(pub.read_text())
    for pub in agents.glob("*.pub"):
        (trusted_by_responders / pub.name).write_text(pub.read_text())

    def make(agent: str) -> Broker:
        return toolnexus.connect(
            redis_url,
            namespace=namespace,
            agent=agent,
            signing_key=agents / f"{agent}.key",
            trusted_keys=trusted_by_agents,
            require_signatures=True,
            **FAST,
        )

    tokens = Tokens([("agent-7", TOKEN), ("agent-8", OTHER_TOKEN)])
    gateway = Gateway(Agents(make), tokens, keepalive_s=0.2)
    responder = toolnexus.connect(
        redis_url,
        namespace=namespace,
        signing_key=responders / "ops-bot.key",
        trusted_keys=trusted_by_responders,
        require_signatures=True,
        **FAST,
    )
    async with (
        responder,
        GatewayServer(gateway, port=0) as server,
        httpx.AsyncClient(timeout=20) as http,
    ):
        yield Setup(server.url, http, responder, gateway, redis_url, namespace)


async def next_pending(broker: Broker) -> Pending:
    async with broker.responder("web") as requests, asyncio.timeout(10):
        return await anext(requests)


def approval(**extra: Any) -> dict[str, Any]:
    return {"id": new_id("pnd"), "kind": "approval", "prompt": "Deploy?", **extra}


async def test_a_long_poll_gets_the_signed_answer_of_a_real_responder(setup: Setup) -> None:
    form = {"type": "object", "properties": {"code": {"type": "string"}}}
    asked = {"id": new_id("pnd"), "kind": "input", "prompt": "Code?", "data": {"schema": form}}
    posting = asyncio.create_task(setup.post(asked))
    pending = await next_pending(setup.responder)
    # published as the agent the token names, signed with that agent's key
    assert pending.request.id == asked["id"] and pending.request.source.agent == "agent-7"
    assert pending.request.signature is not None and pending.request.signature.key == "agent-7"
    await pending.accept({"code": "12345"}, person="web:ana")
    response = await posting
    assert response.status_code == 200
    assert (
        response.content.strip()
        == (
            f'{{"id":"{asked["id"]}","ok":true,"data":{{"code":"12345"}},'
            '"bridge":{"responder":"ops-bot","person":"web:ana"}}'
        ).encode()
    )
    jsonschema.validate(response.json(), schema("Answer"))


@pytest.mark.slow
async def test_the_javascript_wait_for_with_nodes_fetch(setup: Setup) -> None:
    """examples/gateway/wait_for.mjs, the toolkit JavaScript port's waitFor, run by Node."""
    node = shutil.which("node")
    if node is None:
        pytest.fail("this test needs Node 18+ (./run test installs Debian's nodejs)")
    asked = approval(expiresAt=iso_time(time.time() + 30))
    process = await asyncio.create_subprocess_exec(
        node,
        str(ROOT / "examples" / "gateway" / "wait_for.mjs"),
        setup.url,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "TOOLNEXUS_GATEWAY_TOKEN": TOKEN},
    )
    talking = asyncio.create_task(process.communicate(json.dumps(asked).encode()))
    pending = await next_pending(setup.responder)
    assert pending.request.prompt == "Deploy?"
    await pending.accept({"ticket": "CHG-1"})
    out, err = await asyncio.wait_for(talking, 20)
    assert process.returncode == 0, err.decode()
    # the §10 Answer, byte for byte as the JavaScript port writes it ("bridge" left out)
    assert out == f'{{"id":"{asked["id"]}","ok":true,"data":{{"ticket":"CHG-1"}}}}'.encode()


async def test_a_decline_is_an_answer(setup: Setup) -> None:
    asked = approval()
    posting = asyncio.create_task(setup.post(asked))
    await (await next_pending(setup.responder)).decline()
    response = await posting
    assert response.status_code == 200
    assert response.json() == {
        "id": asked["id"],
        "ok": False,
        "reason": "declined",
        "bridge": {"responder": "ops-bot"},
    }


@pytest.mark.slow
async def test_nobody_answering_expires_with_keepalives_meanwhile(setup: Setup) -> None:
    asked = approval(expiresAt=iso_time(time.time() + 1.0))
    headers = {"Authorization": f"Bearer {TOKEN}"}
    chunks = []
    async with setup.http.stream(
        "POST", f"{setup.url}/v1/requests", content=json.dumps(asked), headers=headers
    ) as response:
        assert response.status_code == 200
        async for chunk in response.aiter_bytes():
            chunks.append(chunk)
    body = b"".join(chunks)
    assert body.startswith(b" ") and len(chunks) >= 2  # keep-alives came first, apart
    assert json.loads(body) == {"id": asked["id"], "ok": False, "reason": "expired"}


async def test_create_then_poll(setup: Setup) -> None:
    asked = approval()
    created = await setup.post(asked, wait=0)
    assert created.status_code == 202
    assert created.json() == {"id": asked["id"], "status": "open"}
    location = created.headers["location"]
    assert location == f"/v1/requests/{asked['id']}"
    jsonschema.validate(created.json(), schema("Open"))
    still = await setup.get(location, wait=0.2)
    assert still.status_code == 202
    pending = await next_pending(setup.responder)
    await pending.accept()
    polled = await setup.get(location, wait=5)
    assert (polled.status_code, polled.json()["ok"]) == (200, True)
    again = await setup.post(asked, wait=0)  # the same request again: its answer
    assert (again.status_code, again.json()["ok"]) == (200, True)


async def test_delete_withdraws_and_the_responder_is_told(setup: Setup) -> None:
    asked = approval()
    assert (await setup.post(asked, wait=0)).status_code == 202
    pending = await next_pending(setup.responder)
    async with setup.responder.events() as events:
        deleted = await setup.http.delete(
            f"{setup.url}/v1/requests/{asked['id']}",
            headers={"Authorization": f"Bearer {TOKEN}"},
        )
        assert deleted.status_code == 200
        assert deleted.json() == {
            "id": asked["id"],
            "ok": False,
            "reason": "cancelled",
            "bridge": {"reason": "withdrawn"},
        }
        async with asyncio.timeout(10):
            event = await anext(events)
        assert (event.event, event.id) == ("withdrawn", asked["id"])
    # too late: refused (with signatures required, a withdrawal is no signed outcome, so a
    # responder may be told Contested rather than "withdrawn"; either way nothing resolves)
    with pytest.raises(NotResolved):
        await pending.accept()
    after = await setup.get(f"/v1/requests/{asked['id']}", wait=0)
    assert after.json()["bridge"] == {"reason": "withdrawn"}


async def test_a_request_belongs_to_the_agent_that_posted_it(setup: Setup) -> None:
    asked = approval()
    assert (await setup.post(asked, wait=0)).status_code == 202
    other = await setup.get(f"/v1/requests/{asked['id']}", token=OTHER_TOKEN, wait=0)
    assert other.status_code == 404
    assert other.json() == {"error": f"no request {asked['id']!r} of agent 'agent-8' here"}


async def test_another_question_with_the_same_id_is_a_conflict(setup: Setup) -> None:
    asked = approval()
    assert (await setup.post(asked, wait=0)).status_code == 202
    changed = await setup.post({**asked, "prompt": "Delete production?"}, wait=0)
    assert changed.status_code == 409
    assert "asks something else" in changed.json()["error"]


@pytest.mark.parametrize(
    "authorization", [None, "Bearer wrong-token-0123456789", f"Basic {TOKEN}", TOKEN]
)
async def test_a_missing_or_unknown_token_is_401(setup: Setup, authorization: str | None) -> None:
    headers = {} if authorization is None else {"Authorization": authorization}
    for response in (
        await setup.http.post(f"{setup.url}/v1/requests", json=approval(), headers=headers),
        await setup.http.get(f"{setup.url}/v1/requests/x", headers=headers),
        await setup.http.delete(f"{setup.url}/v1/requests/x", headers=headers),
    ):
        assert response.status_code == 401
        assert response.headers["www-authenticate"] == "Bearer"
        assert response.json() == {"error": "a bearer token that names an agent is required"}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"not json", "§10 request: the body is not JSON"),
        (b'{"id":"a","kind":"input"}', "§10 request: prompt is missing; it must be a string"),
        (b'{"id":"a","kind":"input","prompt":"p","data":"x"}', "data must be an object"),
        (
            b'{"id":"a","kind":"input","prompt":"p","expiresAt":"2026-12-01T10:00:00"}',
            "expiresAt '2026-12-01T10:00:00' has no time zone",
        ),
        (b'{"id":"a b","kind":"input","prompt":"p"}', "without spaces"),
    ],
)
async def test_a_bad_body_is_400_naming_the_key(setup: Setup, body: bytes, message: str) -> None:
    response = await setup.post(body)
    assert response.status_code == 400
    assert message in response.json()["error"]
    jsonschema.validate(response.json(), schema("Error"))


async def test_a_bad_wait_is_400(setup: Setup) -> None:
    response = await setup.post(approval(), wait="soon")
    assert response.status_code == 400
    assert response.json() == {"error": "wait must be a number of seconds, 0 or more, not 'soon'"}


async def test_the_openapi_document_is_served_and_describes_every_route(setup: Setup) -> None:
    response = await setup.http.get(f"{setup.url}/openapi.json")
    assert response.status_code == 200 and response.json() == DOCUMENT
    assert set(DOCUMENT["paths"]) == {"/v1/requests", "/v1/requests/{id}", "/openapi.json"}
    assert set(DOCUMENT["paths"]["/v1/requests/{id}"]) == {"parameters", "get", "delete"}
    routes = {(r.path, m) for r in setup.gateway.app().routes for m in getattr(r, "methods", ())}
    assert {("/v1/requests", "POST"), ("/openapi.json", "GET")} <= routes
    jsonschema.Draft202012Validator.check_schema(schema("Request"))


async def test_the_same_request_posted_twice_at_once_is_one_wait(setup: Setup) -> None:
    asked = approval()
    first, second = await asyncio.gather(setup.post(asked, wait=0), setup.post(asked, wait=0))
    assert (first.status_code, second.status_code) == (202, 202)
    pending = await next_pending(setup.responder)
    await pending.accept()
    polled = await setup.get(f"/v1/requests/{asked['id']}", wait=5)
    assert polled.json() == {"id": asked["id"], "ok": True, "bridge": {"responder": "ops-bot"}}


async def test_over_max_waits_and_without_redis_the_gateway_says_503(
    redis_url: str, namespace: str
) -> None:
    def make(agent: str) -> Broker:
        return toolnexus.connect(redis_url, namespace=namespace, agent=agent, **FAST)

    def unreachable(agent: str) -> Broker:
        return toolnexus.connect("redis://127.0.0.1:1/0", connect_timeout_s=0.5)

    tokens = Tokens([("agent-7", TOKEN)])
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with (
        GatewayServer(Gateway(Agents(make), tokens, max_waits=1), port=0) as full,
        GatewayServer(Gateway(Agents(unreachable), tokens), port=0) as away,
        httpx.AsyncClient(timeout=20) as http,
    ):
        url = f"{full.url}/v1/requests"
        assert (
            await http.post(url, json=approval(), headers=headers, params={"wait": 0})
        ).status_code == 202
        refused = await http.post(url, json=approval(), headers=headers, params={"wait": 0})
        assert refused.status_code == 503
        assert refused.json() == {"error": "1 requests are open here: try again later"}
        down = await http.post(f"{away.url}/v1/requests", json=approval(), headers=headers)
        assert down.status_code == 503
        assert "cannot reach Redis at redis://127.0.0.1:1/0" in down.json()["error"]


def test_without_tokens_the_gateway_serves_loopback_only() -> None:
    def make(agent: str) -> Broker:
        return toolnexus.connect("memory://")

    with pytest.raises(ConfigurationError, match=r"refusing to serve the gateway on '0\.0\.0\.0'"):
        GatewayServer(Gateway(Agents(make), Tokens()), host="0.0.0.0")
    GatewayServer(Gateway(Agents(make), Tokens([("a", TOKEN)])), host="0.0.0.0")  # guarded
    GatewayServer(Gateway(Agents(make), Tokens()), host="127.0.0.1")


def test_the_command_refuses_a_bad_configuration(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TOOLNEXUS_GATEWAY_TOKENS", raising=False)
    monkeypatch.delenv("TOOLNEXUS_SIGNING_KEY", raising=False)
    assert gateway_main(["--host", "0.0.0.0"]) == 2
    assert "refusing to serve the gateway on '0.0.0.0' without access control" in (
        capsys.readouterr().err
    )
    monkeypatch.setenv("TOOLNEXUS_GATEWAY_TOKENS", "agent-7=short")
    assert gateway_main([]) == 2
    assert (
        "the gateway token of 'agent-7' must be at least 16 characters" in capsys.readouterr().err
    )
    monkeypatch.setenv("TOOLNEXUS_GATEWAY_TOKENS", f"agent-7={TOKEN}")
    assert gateway_main(["--agent-keys", str(tmp_path)]) == 2
    assert f"no signing key for agent 'agent-7': {tmp_path}/agent-7.key" in capsys.readouterr().err
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(
        f'[agents]\nagent-7 = ["{TOKEN}", "{OTHER_TOKEN}"]\n"bad name" = "{TOKEN}x"\n'
    )
    monkeypatch.delenv("TOOLNEXUS_GATEWAY_TOKENS")
    assert gateway_main(["--tokens", str(tokens)]) == 2
    assert "agent name 'bad name' must be 1 to 64 letters" in capsys.readouterr().err


GATEWAY_PAGE = "docs/how-to/gateway.md"


async def test_the_gateway_page_curl_example_gets_the_answer(setup: Setup) -> None:
    """The curl block of docs/how-to/gateway.md as written, its address this gateway's."""
    block = page_block(GATEWAY_PAGE, "curl ", language="sh")
    assert "http://127.0.0.1:8710" in block
    block = block.replace("http://127.0.0.1:8710", setup.url)
    env = {**os.environ, "TOKEN": TOKEN}
    posting = asyncio.create_task(
        asyncio.to_thread(
            subprocess.run, ["bash", "-euc", block], env=env, capture_output=True, timeout=30
        )
    )
    pending = await next_pending(setup.responder)
    assert (pending.request.id, pending.request.prompt) == ("pnd-1", "Deploy?")
    await pending.accept()
    done = await posting
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert (got["id"], got["ok"]) == ("pnd-1", True)


@dataclasses.dataclass
class ToolkitRequest:
    """The toolkit's ``Request``, as its agents hold it."""

    id: str
    kind: str
    prompt: str
    url: str | None = None
    data: Any = None
    expiresAt: str | None = None


@dataclasses.dataclass
class ToolkitAnswer:
    id: str
    ok: bool
    data: Any = None
    reason: str | None = None


async def test_the_gateway_page_python_wait_for_gets_the_answer(setup: Setup) -> None:
    """The Python waitFor of docs/how-to/gateway.md as written, with toolkit-shaped
    ``Request`` and ``Answer`` classes, against this gateway."""
    code = page_block(GATEWAY_PAGE, "def wait_for_blocking(request: Request) -> Answer:")
    scope: dict[str, Any] = {
        "json": json,
        "urllib": urllib,
        "Request": ToolkitRequest,
        "Answer": ToolkitAnswer,
        "GATEWAY": setup.url,
        "TOKEN": TOKEN,
    }
    exec(compile(code, GATEWAY_PAGE, "exec"), scope)
    asked = ToolkitRequest(id=new_id("pnd"), kind="approval", prompt="Deploy?")
    waiting = asyncio.create_task(asyncio.to_thread(scope["wait_for_blocking"], asked))
    await (await next_pending(setup.responder)).decline()
    answer = await asyncio.wait_for(waiting, 20)
    assert answer == ToolkitAnswer(id=asked.id, ok=False, reason="declined")


async def test_a_refusal_ends_the_python_wait_for_at_once_as_documented(
    setup: Setup, tmp_path: Path
) -> None:
    """A responder that cannot verify the agent's signature refuses the request: the
    gateway withdraws it and the page's Python waitFor returns ``cancelled`` at once; the
    JSON has the keys docs/how-to/gateway.md shows."""
    code = page_block(GATEWAY_PAGE, "def wait_for_blocking(request: Request) -> Answer:")
    scope: dict[str, Any] = {
        "json": json,
        "urllib": urllib,
        "Request": ToolkitRequest,
        "Answer": ToolkitAnswer,
        "GATEWAY": setup.url,
        "TOKEN": TOKEN,
    }
    exec(compile(code, GATEWAY_PAGE, "exec"), scope)
    expires = iso_time(time.time() + 120)
    asked = ToolkitRequest(id=new_id("pnd"), kind="approval", prompt="Deploy?", expiresAt=expires)
    waiting = asyncio.create_task(asyncio.to_thread(scope["wait_for_blocking"], asked))
    stranger = tmp_path / "stranger"
    stranger.mkdir()
    SigningKey.generate("agent-7").save(stranger)  # agent-7's name, another key
    (stranger / "agent-7.key").unlink()
    refuser = toolnexus.connect(
        setup.redis_url,
        namespace=setup.namespace,
        signing_key=tmp_path / "responders" / "ops-bot.key",
        trusted_keys=stranger,
        require_signatures=True,
        **FAST,
    )
    async with refuser, refuser.responder("web") as requests:
        reading = asyncio.create_task(anext(requests))
        answer = await asyncio.wait_for(waiting, 30)
        reading.cancel()
    assert answer == ToolkitAnswer(id=asked.id, ok=False, reason="cancelled")
    got = (await setup.get(f"/v1/requests/{asked.id}")).json()
    documented = json.loads(page_block(GATEWAY_PAGE, '{"id": "pnd-1"', language="json"))
    assert got.keys() == documented.keys() and got["bridge"].keys() == documented["bridge"].keys()
    assert (got["reason"], got["bridge"]["reason"]) == ("cancelled", "withdrawn")
    assert got["bridge"]["responder"] == "ops-bot" and "signature" in got["bridge"]["refused"]
    jsonschema.validate(got, schema("Answer"))
