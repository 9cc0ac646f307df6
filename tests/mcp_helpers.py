"""MCP test servers, a responder that runs beside a test, and a streamable-HTTP server thread."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.shared.exceptions import UrlElicitationRequiredError
from mcp_types import (
    ElicitRequest,
    ElicitRequestFormParams,
    ElicitRequestURLParams,
    ElicitResult,
    InputRequiredResult,
)
from mcp_types.version import is_version_at_least

from mcp_processes import free_port
from toolnexus import Broker, Pending, Request

FAST = {"block_ms": 100, "lease_ms": 600}
"""Redis broker options that keep tests quick."""

FORM: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "title": "Name", "minLength": 2, "maxLength": 40},
        "email": {"type": "string", "format": "email"},
        "website": {"type": "string", "format": "uri"},
        "birthday": {"type": "string", "format": "date"},
        "meeting": {"type": "string", "format": "date-time"},
        "guests": {"type": "integer", "minimum": 1, "maximum": 10, "default": 2},
        "budget": {"type": "number", "minimum": 0, "maximum": 1000.5},
        "vip": {"type": "boolean", "default": False},
        "color": {"type": "string", "enum": ["red", "green"]},
        "size": {
            "type": "string",
            "oneOf": [{"const": "s", "title": "Small"}, {"const": "l", "title": "Large"}],
        },
        "legacy": {"type": "string", "enum": ["a", "b"], "enumNames": ["Option A", "Option B"]},
        "toppings": {
            "type": "array",
            "items": {"type": "string", "enum": ["cheese", "ham", "olives"]},
            "minItems": 1,
        },
        "extras": {
            "type": "array",
            "items": {"anyOf": [{"const": "bag", "title": "A bag"}, {"const": "fork"}]},
            "default": ["fork"],
        },
    },
    "required": ["name", "email", "birthday", "color", "size", "toppings"],
}
"""A form with every field kind of the MCP schema subset."""

FILLED = {
    "name": "Ada",
    "email": "ada@example.com",
    "website": "https://ada.example.com/",
    "birthday": "1815-12-10",
    "meeting": "2026-08-01T10:30:00Z",
    "budget": 99.5,
    "color": "green",
    "size": "l",
    "legacy": "b",
    "toppings": ["cheese", "olives"],
}
"""A valid answer to FORM that leaves the defaulted fields out."""

WITH_DEFAULTS = {**FILLED, "guests": 2, "vip": False, "extras": ["fork"]}

AUTH_URL = "https://auth.example.com/authorize?state=xyz"

MODERN = "2026-07-28"


def _modern(ctx: Context) -> bool:
    version = ctx.protocol_version
    return version is not None and is_version_at_least(version, MODERN)


async def elicit(
    ctx: Context, params: ElicitRequestFormParams | ElicitRequestURLParams
) -> ElicitResult | InputRequiredResult:
    """Ask one question in either protocol: the answer, or the round to return (2026-07-28)."""
    if _modern(ctx):
        responses = ctx.input_responses or {}
        if "q" in responses:
            response = responses["q"]
            assert isinstance(response, ElicitResult)
            return response
        return InputRequiredResult(input_requests={"q": ElicitRequest(params=params)})
    if isinstance(params, ElicitRequestURLParams):
        assert params.elicitation_id is not None
        return await ctx.session.elicit_url(
            params.message, params.url, params.elicitation_id, ctx.request_id
        )
    return await ctx.session.elicit_form(params.message, params.requested_schema, ctx.request_id)


def outcome(result: ElicitResult) -> str:
    return json.dumps({"action": result.action, "content": result.content})


@dataclass
class ElicitServer:
    """An MCPServer with tools that ask in every way, and what they saw."""

    server: MCPServer
    authorized: set[str] = field(default_factory=set)
    completions: list[str] = field(default_factory=list)


def make_server(name: str = "test-elicit") -> ElicitServer:
    """Tools: ask_form, ask_url (then notifies completion), needs_auth (-32042), echo,
    fail, slow, capabilities, ask_twice (two forms at once on 2026-07-28), ask_three (three
    forms and a request state)."""
    server = MCPServer(name)
    state = ElicitServer(server)

    @server.tool()
    async def echo(text: str) -> str:
        return text

    @server.tool()
    async def fail() -> str:
        raise ToolError("this tool always fails")

    @server.tool()
    async def slow(seconds: float) -> str:
        await anyio.sleep(seconds)
        return "done"

    @server.tool()
    async def capabilities(ctx: Context) -> str:
        caps = ctx.client_capabilities
        elicitation = caps.elicitation if caps is not None else None
        return json.dumps(None if elicitation is None else elicitation.model_dump(mode="json"))

    @server.tool()
    async def ask_form(ctx: Context) -> str | InputRequiredResult:
        result = await elicit(
            ctx, ElicitRequestFormParams(message="Who are you?", requested_schema=FORM)
        )
        return result if isinstance(result, InputRequiredResult) else outcome(result)

    @server.tool()
    async def ask_url(ctx: Context, complete: list[str] | None = None) -> str | InputRequiredResult:
        params = ElicitRequestURLParams(
            message="Authorize us", url=AUTH_URL, elicitation_id="eid-1"
        )
        result = await elicit(ctx, params)
        if isinstance(result, InputRequiredResult):
            return result
        if result.action == "accept" and not _modern(ctx):
            for elicitation_id in complete if complete is not None else ["eid-1"]:
                await ctx.session.send_elicit_complete(elicitation_id, ctx.request_id)
        return outcome(result)

    @server.tool()
    async def needs_auth(services: list[str]) -> str:
        missing = [s for s in services if s not in state.authorized]
        if missing:
            raise UrlElicitationRequiredError(
                [
                    ElicitRequestURLParams(
                        message=f"Connect your {s} account",
                        url=f"https://auth.example.com/{s}",
                        elicitation_id=f"auth-{s}",
                    )
                    for s in missing
                ]
            )
        return "authorized: " + ", ".join(services)

    @server.tool()
    async def ask_twice(ctx: Context) -> str | InputRequiredResult:
        if not _modern(ctx):
            return "legacy"
        responses = ctx.input_responses or {}
        if {"a", "b"} <= set(responses):
            return json.dumps(
                {key: responses[key].model_dump(mode="json")["action"] for key in "ab"}
            )
        schema = {"type": "object", "properties": {"x": {"type": "string"}}}
        return InputRequiredResult(
            input_requests={
                key: ElicitRequest(
                    params=ElicitRequestFormParams(message=key, requested_schema=schema)
                )
                for key in "ab"
            }
        )

    @server.tool()
    async def ask_three(ctx: Context, label: str) -> str | InputRequiredResult:
        """Three forms in one result (2026-07-28), with a request state to echo exactly."""
        responses = ctx.input_responses or {}
        expected = f"state/{label}/\u00fc \u00e9+=/"
        if set(responses) >= {"a", "b", "c"}:
            return json.dumps(
                {
                    "state_echoed": ctx.request_state == expected,
                    **{k: responses[k].model_dump(mode="json", exclude_none=True) for k in "abc"},
                }
            )
        schema = {"type": "object", "properties": {"x": {"type": "string"}}}
        return InputRequiredResult(
            input_requests={
                key: ElicitRequest(
                    params=ElicitRequestFormParams(
                        message=f"{label}:{key}", requested_schema=schema
                    )
                )
                for key in "abc"
            },
            request_state=expected,
        )

    return state


Handler = Callable[[Pending], Awaitable[None]]


@asynccontextmanager
async def answering(
    broker: Broker, handle: Handler, group: str = "test"
) -> AsyncIterator[list[Request]]:
    """Run a responder beside the test: ``handle`` each pending request; yields those seen."""
    seen: list[Request] = []

    async def respond() -> None:
        async with broker.responder(group) as responder:
            async for pending in responder:
                seen.append(pending.request)
                await handle(pending)

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(respond)
        yield seen
        tasks.cancel_scope.cancel()


async def accept_all(pending: Pending) -> None:
    """Accept: URLs as they are, forms with FILLED."""
    await pending.accept(None if pending.request.kind == "authorization" else FILLED)


@contextmanager
def http_server(server: MCPServer) -> Iterator[str]:
    """Serve ``server`` over streamable HTTP on a free loopback port in a thread; yield its URL."""
    port = free_port()
    config = uvicorn.Config(
        server.streamable_http_app(), host="127.0.0.1", port=port, log_level="warning"
    )
    web = uvicorn.Server(config)
    thread = threading.Thread(target=web.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not web.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the streamable-HTTP test server did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        web.should_exit = True
        thread.join(10)
