"""load_mcp's defaults against servers nobody here wrote the client side for (issue 15):
fastmcp's ``ctx.elicit``, the SDK's ``MCPServer``, a 2026-07-28-only server, a 2025-06-18
server, a result without ``resultType``, and MCP host configs. Responders answer from
another process through Redis."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import pytest
from mcp.server.mcpserver import Context, MCPServer
from mcp.shared.exceptions import MCPError
from mcp_types import INTERNAL_ERROR, CallToolResult
from pydantic import BaseModel, Field

import toolnexus
from mcp_helpers import FAST, answering, http_server
from mcp_processes import (
    BOOKING,
    COLOUR,
    DELETE,
    FASTMCP,
    SEATS,
    WIRE,
    fastmcp_http,
    responder_process,
)
from toolnexus import Broker, ConfigurationError, Pending, ToolnexusError, load_mcp
from toolnexus.errors import ServerUnavailable
from toolnexus.mcp import McpError
from toolnexus.mcp._config import load_config

pytestmark = pytest.mark.redis


def payload(result: CallToolResult) -> Any:
    assert not result.is_error, result.content
    return json.loads(result.content[0].text)  # type: ignore[union-attr]


def text(result: CallToolResult) -> str:
    return result.content[0].text  # type: ignore[union-attr]


@pytest.fixture
async def rbroker(redis_url: str, namespace: str) -> AsyncIterator[Broker]:
    async with toolnexus.connect(redis_url, namespace=namespace, **FAST) as broker:
        yield broker


# -- fastmcp 4.1.6 with ctx.elicit, load_mcp's defaults ----------------------------------


@pytest.mark.parametrize("transport", ["stdio", "http"])
@pytest.mark.slow
async def test_fastmcp_ctx_elicit_with_the_defaults(
    rbroker: Broker, redis_url: str, namespace: str, transport: str
) -> None:
    with (
        responder_process(redis_url, namespace) as responder,
        fastmcp_http() if transport == "http" else nullcontext() as url,
    ):
        async with load_mcp(url or FASTMCP, wait_for=rbroker.wait_for, agent="a-1") as tools:
            # over HTTP, server/discover first: 2026-07-28, ctx.elicit on a second connection
            assert tools.protocol_version == ("2025-11-25" if url is None else "2026-07-28")
            booked = payload(await tools["book"]())
            seats = payload(await tools["count"]())
            colour = payload(await tools["pick"]())
            deleted = payload(await tools["confirm"](what="delete"))
    # the pydantic model's defaults are filled in before the answer goes back
    assert booked == {"action": "accept", "data": {"name": "Ada", "guests": 2, "vip": False}}
    assert seats == {"action": "accept", "data": 4}
    assert colour == {"action": "accept", "data": "green"}
    assert deleted == {"action": "decline", "data": None}
    for prompt, tool in [
        (BOOKING, "book"),
        (SEATS, "count"),
        (COLOUR, "pick"),
        (DELETE, "confirm"),
    ]:
        seen = responder.by_prompt(prompt)
        assert (seen["server"], seen["tool"], seen["agent"]) == ("fastmcp-elicit", tool, "a-1")


@pytest.mark.slow
async def test_mode_auto_is_2026_where_ctx_elicit_cannot_ask(rbroker: Broker) -> None:
    """What ``mode="auto"`` gives up: fastmcp refuses ``ctx.elicit`` on 2026-07-28."""
    async with load_mcp(FASTMCP, wait_for=rbroker.wait_for, mode="auto") as tools:
        assert tools.protocol_version == "2026-07-28"
        result = await tools["book"]()
    assert result.is_error
    assert "unavailable on 2026-07-28" in text(result)


# -- the SDK's MCPServer with ctx.elicit ------------------------------------------------


class Seat(BaseModel):
    row: int = Field(ge=1, le=30)
    window: bool = True


def sdk_server() -> MCPServer:
    server = MCPServer("sdk-elicit")

    @server.tool()
    async def choose_seat(ctx: Context) -> str:
        result = await ctx.elicit("Which seat?", Seat)
        if result.action == "accept":
            return json.dumps(result.data.model_dump())
        return result.action

    return server


async def test_the_sdks_mcpserver_ctx_elicit_with_the_defaults(rbroker: Broker) -> None:
    async def answer(pending: Pending) -> None:
        with pytest.raises(toolnexus.InvalidAnswer, match="row"):
            await pending.accept({"row": 99})
        await pending.accept({"row": 7})

    server = sdk_server()
    async with answering(rbroker, answer) as seen:
        async with load_mcp(server, wait_for=rbroker.wait_for) as tools:
            assert json.loads(text(await tools["choose_seat"]())) == {"row": 7, "window": True}
        with http_server(server) as url:
            async with load_mcp(url, wait_for=rbroker.wait_for) as tools:
                assert json.loads(text(await tools["choose_seat"]()))["row"] == 7
    assert [(r.source.server, r.source.tool) for r in seen] == [("sdk-elicit", "choose_seat")] * 2


# -- the protocol eras, from a server written against the wire -------------------------


@pytest.mark.slow
async def test_a_2026_only_server_is_connected_at_2026_and_asks_with_input_required(
    rbroker: Broker, redis_url: str, namespace: str
) -> None:
    with responder_process(redis_url, namespace) as responder:
        async with load_mcp([*WIRE, "2026-07-28"], wait_for=rbroker.wait_for, name="wire") as tools:
            assert tools.protocol_version == "2026-07-28"
            result = await tools["book"]()
    assert text(result) == 'booked: {"action": "accept", "content": {"name": "Grace"}}'
    assert (responder.by_prompt("Name?")["server"], responder.by_prompt("Name?")["tool"]) == (
        "wire",
        "book",
    )


async def test_a_2025_06_18_server_asks_with_elicitation_create(rbroker: Broker) -> None:
    async def grace(pending: Pending) -> None:
        await pending.accept({"name": "Grace"})

    async with (
        answering(rbroker, grace),
        load_mcp([*WIRE, "2025-06-18"], wait_for=rbroker.wait_for) as tools,
    ):
        assert (tools.protocol_version, tools.server_name) == ("2025-06-18", "wire-legacy")
        result = await tools["book"]()
    assert text(result) == 'booked: {"action": "accept", "content": {"name": "Grace"}}'


async def test_a_result_without_result_type_is_complete_and_a_malformed_one_an_mcp_error() -> None:
    async with load_mcp([*WIRE, "2026-07-28"], name="wire") as tools:
        assert text(await tools["bare"]()) == "no resultType here"
        with pytest.raises(McpError) as malformed:
            await tools["bad"]()
    error = malformed.value
    assert isinstance(error, ToolnexusError) and isinstance(error, MCPError)
    assert error.code == INTERNAL_ERROR and error.server == "wire"
    assert "does not conform" in error.message and "content" in error.message
    assert str(error).startswith("MCP server 'wire': ")


async def test_a_server_that_cannot_start_or_be_reached_is_server_unavailable() -> None:
    with pytest.raises(ServerUnavailable, match="toolnexus-no-such-server"):
        async with load_mcp("toolnexus-no-such-server --flag"):
            pass
    with pytest.raises(ServerUnavailable, match=r"127\.0\.0\.1"):
        async with load_mcp("http://127.0.0.1:9/mcp"):
            pass


async def test_bad_options_are_refused_by_name() -> None:
    with pytest.raises(ConfigurationError, match="mode must be"):
        load_mcp(FASTMCP, mode="2025-06-18")
    with pytest.raises(ConfigurationError, match=r"pathlib.Path\('servers.json'\)"):
        load_mcp("servers.json")
    with pytest.raises(ConfigurationError, match="config only"):
        load_mcp(FASTMCP, tool_name="{tool}")
    with pytest.raises(ConfigurationError, match="allow must be"):
        load_mcp(FASTMCP, wait_for=lambda r: None, allow="ops")  # type: ignore[arg-type,return-value]


# -- attribution when calls overlap ------------------------------------------------------


@pytest.mark.parametrize("transport", ["http", "stdio"])
@pytest.mark.slow
async def test_overlapping_calls_over_http_name_their_tool_but_not_over_stdio(
    rbroker: Broker, transport: str
) -> None:
    held: list[Pending] = []

    async def both_then_answer(pending: Pending) -> None:
        held.append(pending)
        if len(held) == 2:  # both questions are out: both calls are in flight
            for each in held:
                value = {"value": 4} if each.request.prompt == SEATS else {"name": "Ada"}
                await each.accept(value)

    with fastmcp_http() if transport == "http" else nullcontext() as url:
        async with (
            answering(rbroker, both_then_answer) as seen,
            load_mcp(url or FASTMCP, wait_for=rbroker.wait_for, timeout_s=100) as tools,
        ):
            await asyncio.gather(
                tools["book"].call(timeout_s=70), tools["count"].call(timeout_s=90)
            )
    asked = {r.prompt: (r.source.tool, round((r.expires_at or 0) - r.created_at)) for r in seen}
    if transport == "http":  # each question travels on its call's response stream
        assert asked == {BOOKING: ("book", 70), SEATS: ("count", 90)}
    else:  # nothing on a pipe says which call asked: no tool, the session's deadline
        assert asked == {BOOKING: (None, 100), SEATS: (None, 100)}


# -- MCP host configs ---------------------------------------------------------------------


@pytest.mark.slow
async def test_a_config_with_a_broken_server_loads_the_others(
    rbroker: Broker, redis_url: str, namespace: str, tmp_path: Path
) -> None:
    with responder_process(redis_url, namespace) as responder, fastmcp_http("crm-srv") as url:
        config = {
            "mcpServers": {
                "calendar": {"command": FASTMCP[0], "args": FASTMCP[1:], "env": {"TZ": "UTC"}},
                "crm": {"url": url, "headers": {"X-Test": "1"}},
                "broken": {"command": "toolnexus-no-such-server"},
                "off": {"command": "toolnexus-no-such-server", "disabled": True},
            }
        }
        path = tmp_path / "mcp.json"
        path.write_text(json.dumps(config))
        async with load_mcp(path, wait_for=rbroker.wait_for, agent="a-2") as tools:
            assert set(tools.servers) == {"calendar", "crm"}
            assert set(tools.failures) == {"broken"}
            assert isinstance(tools.failures["broken"], ServerUnavailable)
            assert "calendar.book" in tools and "crm.echo" in tools
            booked = payload(await tools["calendar.book"]())
            assert text(await tools["crm.echo"](text="hi")) == "hi"
            assert payload(await tools["crm.count"]())["data"] == 4
        async with load_mcp(config, tool_name="{server}__{tool}") as renamed:
            assert "crm__echo" in renamed and renamed["crm__echo"].server_name == "crm"
        with pytest.raises(ServerUnavailable, match="'broken'"):
            async with load_mcp(config, require_all=True):
                pass
    assert booked["data"]["name"] == "Ada"
    assert {(s["server"], s["tool"], s["agent"]) for s in responder.seen} == {
        ("calendar", "book", "a-2"),
        ("crm", "count", "a-2"),
    }


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"servers": {}}, '"mcpServers" object'),
        ({"mcpServers": {"a": {"command": "x", "url": "http://h/"}}}, "'a': give either"),
        ({"mcpServers": {"a": {}}}, "'a': give either"),
        ({"mcpServers": {"a": {"url": "ftp://h/"}}}, "'a': url must be http"),
        ({"mcpServers": {"a": {"command": "x", "args": "y"}}}, "'a': args must be a list"),
        ({"mcpServers": {"a": {"command": "x", "env": {"K": 1}}}}, "'a': env must map"),
        ({"mcpServers": {"a": {"type": "sse", "url": "http://h/"}}}, "'sse' is not supported"),
        ({"mcpServers": {"a": "python x.py"}}, "'a': the entry must be an object"),
    ],
)
def test_a_malformed_config_is_refused_naming_the_server(
    config: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigurationError, match=message):
        load_config(config)


def test_a_config_file_that_is_missing_or_not_json_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="cannot read"):
        load_config(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ConfigurationError, match="is not JSON"):
        load_config(tmp_path / "bad.json")
    with pytest.raises(ConfigurationError, match="tool_name must"):
        load_mcp({"mcpServers": {}}, tool_name="{name}")


def test_a_config_entry_maps_to_what_load_mcp_connects_to() -> None:
    entries = load_config(
        {
            "mcpServers": {
                "cal": {"command": sys.executable, "args": ["s.py"], "env": {"A": "1"}},
                "crm": {"type": "http", "url": "https://crm.example.com/mcp"},
            }
        }
    )
    assert list(entries) == ["cal", "crm"]
    stdio = entries["cal"].spec
    assert getattr(stdio, "args", None) == ["s.py"] and getattr(stdio, "env", None) == {"A": "1"}
    assert entries["crm"].spec == "https://crm.example.com/mcp"
