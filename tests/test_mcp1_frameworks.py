"""mcp 1.x (issue 17): toolnexus's callback as the elicitation backend of the 1.x SDK's own
``ClientSession``, of langchain-mcp-adapters 0.3's ``MultiServerMCPClient`` (which pins
mcp<2) and of strands-agents' ``MCPClient`` (mcp<2.2), against a real server on 1.x's
FastMCP asking with ``ctx.elicit``/``ctx.elicit_url``, answered by a responder in another
process through Redis. No model: strands' tools are called the way its agent calls them.

Runs in .venv-mcp1 only (``./run test`` makes it; conftest leaves this file out on mcp 2.x).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import mcp.types
import pytest
from langchain_mcp_adapters.callbacks import CallbackContext, Callbacks
from langchain_mcp_adapters.client import MultiServerMCPClient
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from strands.tools.mcp import MCPClient

import toolnexus
from helpers import asked, next_event, page_block, run_fragment, wait_until
from mcp_processes import BOOKING, DELETE, MCP1, SEATS, free_port, responder_process
from toolnexus import Broker

SIGN_IN = "Sign in to the calendar"
NOMA = "Book Noma?"
RULES = {
    NOMA: {"accept": {"guests": 4}},
    BOOKING: {"accept": {"name": "Ada"}},
    DELETE: "decline",
    SEATS: "hold",
    SIGN_IN: {"accept": None},
}
"""The responder accepts the booking form and the sign-in, declines the deletion, holds the
seat count (so that the call can be cancelled while its question is open)."""
SERVER = StdioServerParameters(command=MCP1[0], args=MCP1[1:])
FAST = {"block_ms": 100, "lease_ms": 600}


@pytest.fixture
async def rbroker(redis_url: str, namespace: str) -> AsyncIterator[Broker]:
    async with toolnexus.connect(redis_url, namespace=namespace, **FAST) as broker:
        yield broker


def payload(result: Any) -> dict[str, Any]:
    """The JSON a tool of mcp1_server.py returned: from the SDK's ``CallToolResult``, from
    langchain's list of content blocks, or from strands' ``MCPToolResult`` (a dict)."""
    if isinstance(result, dict):
        result = result["content"]
    text = result[0]["text"] if isinstance(result, list) else result.content[0].text
    return json.loads(text)  # type: ignore[no-any-return]


def test_the_mapping_uses_mcp_types_on_1x() -> None:
    result = toolnexus.mcp.answer_to_elicit_result(toolnexus.Answer(id="elc-1", ok=True, data={}))
    assert type(result) is mcp.types.ElicitResult


def test_load_mcp_says_it_needs_2x() -> None:
    with pytest.raises(toolnexus.ConfigurationError, match=r"mcp 1\.\d+\.\d+ is installed") as info:
        toolnexus.load_mcp  # noqa: B018
    assert "toolnexus-bridge[mcp2]" in str(info.value)


@pytest.mark.redis
async def test_the_1x_sdks_client_session(rbroker: Broker, redis_url: str, namespace: str) -> None:
    callback = toolnexus.elicitation_callback(
        rbroker.wait_for, agent="sdk1-agent", server="bookings", timeout_s=120
    )

    async def agent(*calls: tuple[str, dict[str, Any]]) -> list[Any]:
        async with (
            stdio_client(SERVER) as (read, write),
            ClientSession(read, write, elicitation_callback=callback) as session,
        ):
            await session.initialize()
            return [await session.call_tool(name, arguments) for name, arguments in calls]

    with responder_process(redis_url, namespace, RULES) as responder:
        booked, declined, signed_in = await agent(
            ("book", {}), ("confirm", {"what": "delete"}), ("sign_in", {})
        )
        async with rbroker.events() as events:
            # mcp 1.x sends the server no cancellation for a cancelled call_tool, so the
            # question stays open until the session closes: the agent gives up on both.
            call = asyncio.create_task(agent(("count", {})))
            held = await asked(responder, SEATS, 30)
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
            await next_event(events, "withdrawn", held["id"], 20)
    assert payload(booked) == {
        "action": "accept",
        "data": {"name": "Ada", "guests": 2, "vip": False},
    }
    assert payload(declined) == {"action": "decline"}
    assert payload(signed_in) == {"action": "accept"}
    form, url = responder.by_prompt(BOOKING), responder.by_prompt(SIGN_IN)
    assert (form["kind"], form["server"], form["agent"], form["timeout_s"]) == (
        "input",
        "bookings",
        "sdk1-agent",
        120,
    )
    assert url["kind"] == "authorization" and url["meta"] == {"elicitation_id": "el-cal-1"}


@pytest.mark.redis
async def test_langchain_mcp_adapters_multi_server_client(
    rbroker: Broker, redis_url: str, namespace: str
) -> None:
    ask = toolnexus.elicitation_callback(rbroker.wait_for, agent="lc-agent")

    async def on_elicitation(
        _mcp_context: Any, params: Any, context: CallbackContext
    ) -> mcp.types.ElicitResult | mcp.types.ErrorData:
        return await ask.ask(params, server=context.server_name, tool=context.tool_name)

    client = MultiServerMCPClient(
        {"bookings": {"transport": "stdio", "command": MCP1[0], "args": MCP1[1:]}},
        callbacks=Callbacks(on_elicitation=on_elicitation),
    )
    with responder_process(redis_url, namespace, RULES) as responder:
        tools = {tool.name: tool for tool in await client.get_tools()}
        async with rbroker.events() as events:
            booked = await tools["book"].ainvoke({})
            declined = await tools["confirm"].ainvoke({"what": "delete"})
            call = asyncio.create_task(tools["count"].ainvoke({}))
            held = await asked(responder, SEATS, 30)
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
            await next_event(events, "withdrawn", held["id"], 20)
    assert payload(booked)["data"] == {"name": "Ada", "guests": 2, "vip": False}
    assert payload(declined) == {"action": "decline"}
    form = responder.by_prompt(BOOKING)
    assert (form["server"], form["tool"], form["agent"]) == ("bookings", "book", "lc-agent")


@pytest.mark.redis
async def test_strands_agents_mcp_client(rbroker: Broker, redis_url: str, namespace: str) -> None:
    # strands runs the MCP session on a thread and event loop of its own; loop= runs each
    # wait on the loop that owns the broker.
    ask = toolnexus.elicitation_callback(
        rbroker.wait_for, agent="strands-agent", server="bookings", loop=asyncio.get_running_loop()
    )
    client = MCPClient(lambda: stdio_client(SERVER), elicitation_callback=ask)
    cancel = threading.Event()  # what a strands Agent sets when its invocation is cancelled
    with responder_process(redis_url, namespace, RULES) as responder:
        async with rbroker.events() as events:
            await asyncio.to_thread(client.start)
            try:
                booked = await client.call_tool_async("use-1", "book")
                declined = await client.call_tool_async("use-2", "confirm", {"what": "delete"})
                signed_in = await client.call_tool_async("use-3", "sign_in")
                call = asyncio.create_task(
                    client.call_tool_async("use-4", "count", cancel_signal=cancel)
                )
                held = await asked(responder, SEATS, 30)
                cancel.set()
                cancelled = await call
            finally:
                # strands tells the 1.x server, which cancels nothing on the client: the
                # question stays open (and the session's reader waits on it) until the client
                # stops. Stopping withdraws it; mcp 1.x's stdio reader, holding the server's
                # reply to the cancelled call, then fails and strands' stop() re-raises that.
                with contextlib.suppress(RuntimeError):
                    await asyncio.to_thread(client.stop, None, None, None)
            await next_event(events, "withdrawn", held["id"], 20)
    assert payload(booked) == {
        "action": "accept",
        "data": {"name": "Ada", "guests": 2, "vip": False},
    }
    assert payload(declined) == {"action": "decline"}
    assert payload(signed_in) == {"action": "accept"}
    assert (booked["status"], booked["toolUseId"]) == ("success", "use-1")
    assert cancelled["status"] == "error" and cancelled.get("cancelled") is True
    form, url = responder.by_prompt(BOOKING), responder.by_prompt(SIGN_IN)
    assert (form["kind"], form["server"], form["agent"]) == ("input", "bookings", "strands-agent")
    assert url["kind"] == "authorization" and url["meta"] == {"elicitation_id": "el-cal-1"}


def test_importing_toolnexus_loads_no_mcp_sdk_on_1x() -> None:
    code = "import sys, toolnexus; print('mcp' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# The examples of docs/how-to/frameworks.md that run on mcp 1.x, as written: ``params`` is
# the stdio server above, ``url`` the same server over streamable HTTP.
PAGE = "docs/how-to/frameworks.md"


@contextlib.contextmanager
def http_server() -> Iterator[str]:
    """mcp1_server.py over streamable HTTP on a free port; its URL once it listens."""
    port = free_port()
    process = subprocess.Popen([*MCP1, "--http", str(port)], stderr=subprocess.DEVNULL)
    try:
        wait_until("the mcp1 server listening", lambda: _listening(port))
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.terminate()
        process.wait(10)


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.redis
async def test_the_frameworks_page_client_session_example(
    rbroker: Broker, redis_url: str, namespace: str
) -> None:
    code = page_block(PAGE, "# MCP SDK 1.x: ClientSession")
    with responder_process(redis_url, namespace, RULES) as responder:
        names = await run_fragment(code, PAGE, broker=rbroker, params=SERVER)
    assert payload(names["result"]) == {"action": "accept", "data": {"guests": 4}}
    asked_for = responder.by_prompt(NOMA)
    assert (asked_for["server"], asked_for["agent"]) == ("crm", "agent-7")


@pytest.mark.redis
async def test_the_frameworks_page_langchain_example(
    rbroker: Broker, redis_url: str, namespace: str
) -> None:
    code = page_block(PAGE, "# langchain-mcp-adapters")
    with http_server() as url, responder_process(redis_url, namespace, RULES) as responder:
        names = await run_fragment(code, PAGE, broker=rbroker, url=url)
        tools = {tool.name: tool for tool in await names["client"].get_tools()}
        booked = await tools["book_table"].ainvoke({"restaurant": "Noma"})
    assert payload(booked) == {"action": "accept", "data": {"guests": 4}}
    asked_for = responder.by_prompt(NOMA)
    assert (asked_for["server"], asked_for["tool"]) == ("crm", "book_table")


@pytest.mark.redis
async def test_the_frameworks_page_strands_example(
    rbroker: Broker, redis_url: str, namespace: str
) -> None:
    code = page_block(PAGE, "# strands-agents")
    with http_server() as url, responder_process(redis_url, namespace, RULES) as responder:
        names = await run_fragment(code, PAGE, broker=rbroker, url=url, asyncio=asyncio)
        crm = names["crm"]
        await asyncio.to_thread(crm.start)
        try:
            booked = await crm.call_tool_async("use-1", "book_table", {"restaurant": "Noma"})
        finally:
            await asyncio.to_thread(crm.stop, None, None, None)
    assert payload(booked) == {"action": "accept", "data": {"guests": 4}}
    assert responder.by_prompt(NOMA)["server"] == "crm"
