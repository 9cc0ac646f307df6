"""Issue #41, observation 3: bodies that cannot crash a server. Every HTTP server of the
workers (the web page, the HTTP answering API, an answer link, the wait gateway, the Slack
receiver), served for real (uvicorn, aiohttp) on a real Redis, is sent bodies nested
100,000 deep, over the size limit, of the wrong JSON type or not UTF-8, as JSON and as
forms where it takes forms; each answers 400 or 413 with a one-line reason, never a 5xx
(threat-model S10: the gateway and the HTTP API answered 500 to deep JSON, with an uncaught
``RecursionError``)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import httpx2 as httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import toolnexus
from chat_fakes import BOT_TOKEN, SIGNING_SECRET, FakeSlack, slack_signature
from conftest import FAST, REDIS_URL
from helpers import eventually
from toolnexus import Broker
from toolnexus.models import Request, new_id
from toolnexus_workers.bodies import MAX_BODY_BYTES
from toolnexus_workers.gateway.app import Agents, Gateway
from toolnexus_workers.gateway.server import GatewayServer
from toolnexus_workers.gateway.tokens import Tokens as GatewayTokens
from toolnexus_workers.http.server import HttpServer
from toolnexus_workers.http.tokens import Tokens
from toolnexus_workers.links import LinkKey, link_url
from toolnexus_workers.slack.server import SlackServer
from toolnexus_workers.web.access import Access
from toolnexus_workers.web.server import WebServer

pytestmark = [pytest.mark.redis, pytest.mark.timeout(300)]

TOKEN = "bodies-http-token-0123456789"
GATEWAY_TOKEN = "bodies-gateway-token-0123456789"
WEB_TOKEN = "bodies-web-token-0123456789"
SECRET = "a link secret for the bodies test, long enough"
JSON = "application/json"
FORM = "application/x-www-form-urlencoded"


@dataclass(frozen=True)
class Target:
    """One route that takes a body: where, what it takes (JSON, forms), its headers."""

    name: str
    url: str
    kinds: tuple[str, ...]
    headers: Callable[[bytes], dict[str, str]]


def signed_by_slack(body: bytes) -> dict[str, str]:
    timestamp = str(int(time.time()))
    return {
        "x-slack-request-timestamp": timestamp,
        "x-slack-signature": slack_signature(SIGNING_SECRET, timestamp, body),
    }


async def serve(directory: Path, ready: queue.Queue[list[Target]], stop: threading.Event) -> None:
    """Every server, until ``stop``: an HTTP API on Redis with a request open (and a link
    to it), a gateway, a web page that needs a sign-in and a Slack receiver."""
    tokens = directory / "tokens.toml"
    digest = hashlib.sha256(TOKEN.encode()).hexdigest()
    tokens.write_text(f'[[token]]\nname = "ops"\nsha256 = "{digest}"\nqueues = ["*"]\n')
    links = LinkKey(secret=SECRET)
    namespace = f"bodies-{new_id('t')}"

    def memory(agent: str) -> Broker:
        return toolnexus.connect("memory://")

    async with contextlib.AsyncExitStack() as stack:
        enter = stack.enter_async_context
        api_broker = await enter(toolnexus.connect(REDIS_URL, namespace=namespace, **FAST))
        agent = await enter(toolnexus.connect(REDIS_URL, namespace=namespace, **FAST))
        api = await enter(HttpServer({"default": api_broker}, Tokens(tokens), port=0, links=links))
        gateway = Gateway(Agents(memory), GatewayTokens([("agent-7", GATEWAY_TOKEN)]))
        gateway_server = await enter(GatewayServer(gateway, port=0))
        web_broker = await enter(toolnexus.connect("memory://"))
        web = await enter(WebServer(web_broker, port=0, access=Access(token=WEB_TOKEN)))
        slack_api = await enter(FakeSlack())
        slack_broker = await enter(toolnexus.connect("memory://"))
        slack = SlackServer(
            slack_broker,
            bot_token=BOT_TOKEN,
            signing_secret=SIGNING_SECRET,
            channel="C1",
            allowed=["U1"],
            port=0,
            api_url=slack_api.url,
        )
        await enter(slack)
        request = Request(
            id=new_id("pnd"), kind="approval", prompt="Deploy?", expires_at=time.time() + 600
        )
        waiting = asyncio.create_task(agent.wait_for(request))
        http = await enter(httpx.AsyncClient(timeout=30))
        bearer = {"Authorization": f"Bearer {TOKEN}"}
        read_url = f"{api.url}/v1/requests/{quote(request.id)}"

        async def shown() -> bool:
            return (await http.get(read_url, headers=bearer)).status_code == 200

        await eventually(shown, "the request shown by the HTTP API")
        published = api.desk.open[("default", request.id)].pending.request
        token = links.mint("default", published, "mail:ops@example.com")
        ready.put(
            [
                Target("http api", f"{read_url}/answer", (JSON,), lambda body: bearer),
                Target("answer link", link_url(api.url, token), (JSON, FORM), lambda body: {}),
                Target(
                    "gateway",
                    f"{gateway_server.url}/v1/requests",
                    (JSON,),
                    lambda body: {"Authorization": f"Bearer {GATEWAY_TOKEN}"},
                ),
                Target("web sign-in", f"{web.url.rstrip('/')}/login", (FORM,), lambda body: {}),
                Target("slack receiver", slack.url, (JSON, FORM), signed_by_slack),
            ]
        )
        while not stop.is_set():
            await asyncio.sleep(0.1)
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)


@pytest.fixture(scope="module")
def targets(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Target]]:
    """The servers, run in a thread of their own (hypothesis drives plain functions)."""
    ready: queue.Queue[list[Target]] = queue.Queue()
    stop = threading.Event()
    failed: list[BaseException] = []

    def run() -> None:
        try:
            asyncio.run(serve(tmp_path_factory.mktemp("bodies"), ready, stop))
        except BaseException as exc:  # told to the test below
            failed.append(exc)
            ready.put([])

    thread = threading.Thread(target=run, name="bodies servers")
    thread.start()
    try:
        found = ready.get(timeout=60)
        assert not failed, failed
        yield found
    finally:
        stop.set()
        thread.join(30)


def deep(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


BAD = st.one_of(
    st.integers(2_000, 100_000).map(lambda n: ("deep", deep(n))),
    st.integers(2_000, 100_000).map(lambda n: ("deep", b'{"a":' * n + b"1" + b"}" * n)),
    st.integers(1, 1000).map(lambda n: ("long", b" " * (MAX_BODY_BYTES + n))),
    st.sampled_from([b"[]", b"1", b'"x"', b"null", b"true", b"[1,2]"]).map(lambda b: ("typed", b)),
    st.binary(min_size=1, max_size=50).map(lambda b: ("utf8", b'{"a":"\xff' + b + b'"}')),
)


def bad_for(target: Target, kind: str, what: str) -> bool:
    """Whether ``target`` must refuse a ``what`` body sent as ``kind``: every long or
    non-UTF-8 body, JSON that is deep or not an object, a form whose field must be JSON (a
    Slack interaction's ``payload``); a form's other fields are text, which a deep array is
    (the web page then refuses the sign-in itself: 401)."""
    return what in ("long", "utf8") or kind == JSON or target.name == "slack receiver"


def send(http: httpx.Client, target: Target, kind: str, body: bytes) -> httpx.Response:
    if kind == FORM:
        body = (b"payload=" if target.name == "slack receiver" else b"action=") + body
    headers = {"Content-Type": kind, **target.headers(body)}
    return http.post(target.url, content=body, headers=headers)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bad=BAD)
@pytest.mark.slow
def test_no_bad_body_gets_a_server_error(targets: list[Target], bad: tuple[str, bytes]) -> None:
    """S10, observation 3: deep, long, wrongly typed or non-UTF-8 bodies, as JSON and as
    forms: 400 or 413 with a one-line reason, from every server."""
    what, body = bad
    with httpx.Client(timeout=30) as http:
        for target in targets:
            for kind in target.kinds:
                response = send(http, target, kind, body)
                where = f"{target.name} ({kind}, {what} body)"
                assert response.status_code < 500, f"{where}: {response.status_code}"
                if bad_for(target, kind, what):
                    assert response.status_code in (400, 413), f"{where}: {response.text}"
                    reason = response.text.strip()
                    assert reason and "\n" not in reason, f"{where}: {response.text}"


def test_deep_json_is_400_from_the_gateway_and_the_http_api(targets: list[Target]) -> None:
    """S10, observation 3, as it was seen: a body nested 100,000 deep (a 500 before)."""
    with httpx.Client(timeout=30) as http:
        for target in targets[:3]:
            response = send(http, target, JSON, deep(100_000))
            assert response.status_code == 400, target.name
            assert "nested too deep" in response.json()["error"], target.name
