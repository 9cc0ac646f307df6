"""``load_mcp``'s default mode against 2026-07-28-only servers over streamable HTTP: every way
such a server refuses the handshake ends in a working 2026-07-28 connection."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from mcp_processes import FASTMCP, WIRE, free_port
from toolnexus import Answer, Request, load_mcp
from toolnexus.mcp._client import MAX_URL_CONSENTS, NOT_COMPLETED
from toolnexus_workers.chat import view_of

sys.path.insert(0, str(Path(__file__).resolve().parent / "servers"))
from wire_server import MODERN, modern

REFUSALS = {
    # name: (HTTP status, JSON-RPC error or None, or a result for initialize)
    "400 with an error": (400, {"code": -32020, "message": "Missing MCP-Protocol-Version header"}),
    "400 bare": (400, None),
    "404 with an error": (404, {"code": -32601, "message": "no initialize"}),
    "404 bare": (404, None),
    "405 with an error": (405, {"code": -32600, "message": "use 2026-07-28"}),
    "405 bare": (405, None),
    "-32022": (200, {"code": -32022, "message": "no", "data": {"supported": [MODERN]}}),
    "no initialize method": (200, {"code": -32601, "message": "Method not found"}),
    "a 2026-07-28 protocolVersion": (200, "result"),
}


def app(refusal: str, discover: bool, seen: list[tuple[str, str | None]]) -> Starlette:
    """A 2026-07-28-only server refusing ``initialize`` (and, unless ``discover``,
    ``server/discover``) as ``refusal`` says; it serves requests with the version header."""
    status, error = REFUSALS[refusal]

    async def mcp(http: HttpRequest) -> Response:
        message: dict[str, Any] = json.loads(await http.body())
        version = http.headers.get("mcp-protocol-version")
        method, params = message.get("method"), message.get("params") or {}
        seen.append((str(method), version))
        if "id" not in message:
            return Response(status_code=202)
        reply: dict[str, Any] = {"jsonrpc": "2.0", "id": message["id"]}
        if method == "initialize" or (method == "server/discover" and not discover):
            if error == "result":
                info = {"name": "w", "version": "1"}
                reply["result"] = {
                    "protocolVersion": MODERN,
                    "capabilities": {},
                    "serverInfo": info,
                }
                return JSONResponse(reply)
            if error is None:
                return Response("refused", status_code=status)
            reply["error"] = error
            return JSONResponse(reply, status_code=status)
        meta = params.get("_meta") or {}
        if version != MODERN or meta.get("io.modelcontextprotocol/protocolVersion") != MODERN:
            reply["error"] = {"code": -32020, "message": "Missing MCP-Protocol-Version header"}
            return JSONResponse(reply, status_code=400)
        result = modern(str(method), params)
        result.setdefault("resultType", "complete")
        reply["result"] = result
        return JSONResponse(reply)

    return Starlette(routes=[Route("/mcp", mcp, methods=["POST", "GET", "DELETE"])])


@contextmanager
def serving(application: Starlette) -> Iterator[str]:
    """``application`` on a free loopback port in a thread; yields its URL."""
    port = free_port()
    web = uvicorn.Server(uvicorn.Config(application, port=port, log_level="warning"))
    thread = threading.Thread(target=web.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not web.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the server did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        web.should_exit = True
        thread.join(10)


async def grace(request: Request) -> Answer:
    return Answer(id=request.id, ok=True, data={"name": "Grace"})


@pytest.mark.parametrize("discover", [False, True], ids=["discover refused", "discover"])
@pytest.mark.parametrize("refusal", list(REFUSALS))
async def test_a_2026_only_server_is_connected_at_2026_however_it_refuses(
    refusal: str, discover: bool
) -> None:
    seen: list[tuple[str, str | None]] = []
    with serving(app(refusal, discover, seen)) as url:
        async with load_mcp(url, wait_for=grace) as tools:
            assert tools.protocol_version == MODERN
            result = await tools["book"]()
    booked = 'booked: {"action": "accept", "content": {"name": "Grace"}}'
    assert result.content[0].text == booked  # type: ignore[union-attr]
    assert seen[0] == ("server/discover", MODERN)
    calls = [version for method, version in seen if method == "tools/call"]
    assert calls == [MODERN, MODERN]  # the question, then the retry with the answer
    assert ("initialize" in dict(seen)) is not discover


# -- URL consent on 2026-07-28 ----------------------------------------------------------

LINK = "https://example.com/connect"


def url_app(needed: int, seen: list[dict[str, Any]]) -> Starlette:
    """A 2026-07-28 server whose ``connect`` tool asks for :data:`LINK` (no ``elicitationId``)
    until it has been accepted ``needed`` times: the interaction completes out of band."""

    async def mcp(http: HttpRequest) -> Response:
        message: dict[str, Any] = json.loads(await http.body())
        if "id" not in message:
            return Response(status_code=202)
        method, params = message.get("method"), message.get("params") or {}
        cache = {"ttlMs": 0, "cacheScope": "private", "resultType": "complete"}
        if method == "server/discover":
            result = {"supportedVersions": [MODERN], "capabilities": {"tools": {}}, **cache}
        elif method == "tools/list":
            schema = {"type": "object", "properties": {}}
            result = {"tools": [{"name": "connect", "inputSchema": schema}], **cache}
        else:
            seen.append(params)
            accepted = int(params.get("requestState") or 0)
            response = (params.get("inputResponses") or {}).get("link")
            if response is not None and response.get("action") != "accept":
                result = {"content": [{"type": "text", "text": f"ended: {response['action']}"}]}
            elif response is not None and accepted + 1 >= needed:
                result = {"content": [{"type": "text", "text": "connected"}]}
            else:
                if response is not None:
                    accepted += 1
                ask = {"mode": "url", "message": "Connect your account.", "url": LINK}
                result = {
                    "resultType": "input_required",
                    "inputRequests": {"link": {"method": "elicitation/create", "params": ask}},
                    "requestState": str(accepted),
                }
        return JSONResponse({"jsonrpc": "2.0", "id": message["id"], "result": result})

    return Starlette(routes=[Route("/mcp", mcp, methods=["POST", "GET", "DELETE"])])


def responder(*answers: bool) -> tuple[list[Request], Any]:
    """A ``wait_for`` that answers in turn with ``answers`` (then accepts); and what it saw."""
    asked: list[Request] = []

    async def wait_for(request: Request) -> Answer:
        asked.append(request)
        ok = answers[len(asked) - 1] if len(asked) <= len(answers) else True
        return Answer(id=request.id, ok=ok, reason=None if ok else "declined")

    return asked, wait_for


async def test_url_accept_is_consent_and_not_completed_goes_back_with_retry_and_cancel() -> None:
    seen: list[dict[str, Any]] = []
    asked, wait_for = responder(True, True)
    with serving(url_app(2, seen)) as url:
        async with load_mcp(url, wait_for=wait_for) as tools:
            result = await tools["connect"]()
    assert result.content[0].text == "connected"  # type: ignore[union-attr]
    first, again = asked
    assert (first.kind, first.url, first.prompt) == ("authorization", LINK, "Connect your account.")
    assert "elicitation_id" not in first.meta and "not_completed" not in first.meta
    assert again.meta["not_completed"] == 1
    assert again.prompt.startswith(f"{NOT_COMPLETED} (1 of {MAX_URL_CONSENTS - 1}): Connect")
    assert "retry" in again.prompt and "cancel" in again.prompt
    assert again.prompt in view_of(again).text  # the chat workers show it as any prompt
    assert len(seen) == 3  # the call, the retry after consent, the retry a responder asked for

    # cancel ends it: the server hears the decline on the retry
    seen.clear()
    asked, wait_for = responder(True, False)
    with serving(url_app(5, seen)) as url:
        async with load_mcp(url, wait_for=wait_for) as tools:
            result = await tools["connect"]()
    assert result.content[0].text == "ended: decline"  # type: ignore[union-attr]
    assert len(asked) == 2


async def test_url_consents_are_bounded_then_the_server_gets_cancel() -> None:
    seen: list[dict[str, Any]] = []
    asked, wait_for = responder()
    with serving(url_app(100, seen)) as url:
        async with load_mcp(url, wait_for=wait_for) as tools:
            result = await tools["connect"]()
    assert len(asked) == MAX_URL_CONSENTS
    assert result.content[0].text == "ended: cancel"  # type: ignore[union-attr]


# -- a fastmcp server whose tools ask both ways -----------------------------------------

BOTH = [*FASTMCP, "--both-ways"]


async def colours(request: Request) -> Answer:
    data = {"value": "green"} if request.prompt == "Which colour?" else {"name": "Ada"}
    return Answer(id=request.id, ok=True, data=data)


def listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_a_server_whose_tools_ask_both_ways_is_answered_with_the_defaults(
    transport: str,
) -> None:
    with contextlib.ExitStack() as stack:
        server: Any = BOTH
        if transport == "http":
            port = free_port()
            process = subprocess.Popen([*BOTH, "--http", str(port)])
            stack.callback(process.wait, 10)
            stack.callback(process.terminate)
            deadline = time.monotonic() + 30
            while not listening(port):
                assert time.monotonic() < deadline and process.poll() is None
                await asyncio.sleep(0.1)
            server = f"http://127.0.0.1:{port}/mcp"
        async with load_mcp(server, wait_for=colours) as tools:
            # stdio: the handshake first; HTTP: server/discover offers 2026-07-28
            assert tools.protocol_version == ("2025-11-25" if transport == "stdio" else MODERN)
            voted = await tools["vote"]()  # InputRequiredResult: 2026-07-28 only
            booked = await tools["book"]()  # ctx.elicit: the handshake only
    assert json.loads(voted.content[0].text)["content"] == {"value": "green"}  # type: ignore[union-attr]
    assert json.loads(booked.content[0].text)["data"]["name"] == "Ada"  # type: ignore[union-attr]


@pytest.mark.parametrize("refusal", ["-32022", "no-initialize", "modern-result"])
async def test_a_2026_only_stdio_server_is_connected_at_2026_however_it_refuses(
    refusal: str,
) -> None:
    async with load_mcp([*WIRE, MODERN, refusal], wait_for=grace) as tools:
        assert tools.protocol_version == MODERN
        result = await tools["book"]()
    booked = 'booked: {"action": "accept", "content": {"name": "Grace"}}'
    assert result.content[0].text == booked  # type: ignore[union-attr]
