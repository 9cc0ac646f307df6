"""The public adapters (issue 17): toolnexus as the elicitation backend of the MCP SDK's own
client, of fastmcp's ``Client`` and of a pydantic-ai agent through it (a scripted model, no
LLM), against a real eliciting server, answered by a responder in another process through
Redis."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import fastmcp
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.server.mcpserver import Context, MCPServer
from mcp.types import ElicitRequestFormParams, ElicitResult, ErrorData
from pydantic_ai import Agent
from pydantic_ai.mcp import MCPToolset

import toolnexus
from helpers import asked, next_event, scripted
from mcp_helpers import FAST
from mcp_processes import BOOKING, DELETE, FASTMCP, SEATS, fastmcp_http, responder_process
from toolnexus import Answer, Broker, ConfigurationError, Request

HOLD_SEATS = {BOOKING: {"accept": {"name": "Ada"}}, DELETE: "decline", SEATS: "hold"}
"""The responder accepts the booking form, declines the deletion, holds the seat count."""


@pytest.fixture
async def rbroker(redis_url: str, namespace: str) -> AsyncIterator[Broker]:
    async with toolnexus.connect(redis_url, namespace=namespace, **FAST) as broker:
        yield broker


@pytest.mark.redis
@pytest.mark.slow
async def test_the_sdks_client_with_elicitation_callback(
    rbroker: Broker, redis_url: str, namespace: str
) -> None:
    callback = toolnexus.elicitation_callback(
        rbroker.wait_for, agent="sdk-agent", timeout_s=120, allow=["process-responder/*"]
    )
    server = StdioServerParameters(command=FASTMCP[0], args=FASTMCP[1:])
    with responder_process(redis_url, namespace, HOLD_SEATS) as responder:
        async with (
            rbroker.events() as events,
            Client(server, mode="legacy", elicitation_callback=callback) as client,
        ):
            booked = await client.call_tool("book", {})
            declined = await client.call_tool("confirm", {"what": "delete"})
            call = asyncio.create_task(client.call_tool("count", {}))
            held = await asked(responder, SEATS)
            call.cancel()  # the framework gives up on the call: its question is withdrawn
            with pytest.raises(asyncio.CancelledError):
                await call
            await next_event(events, "withdrawn", held["id"], 10)
    assert json.loads(booked.content[0].text) == {  # type: ignore[union-attr]
        "action": "accept",
        "data": {"name": "Ada", "guests": 2, "vip": False},
    }
    assert json.loads(declined.content[0].text)["action"] == "decline"  # type: ignore[union-attr]
    form = responder.by_prompt(BOOKING)
    assert (form["server"], form["tool"], form["agent"]) == ("fastmcp-elicit", None, "sdk-agent")
    # Without a key, a responder is named group/consumer; the allow-list admits it.
    assert form["timeout_s"] == 120 and form["allow"] == ["process-responder/*"]


@pytest.mark.redis
@pytest.mark.slow
async def test_fastmcps_client_with_the_elicitation_handler(
    rbroker: Broker, redis_url: str, namespace: str
) -> None:
    handler = toolnexus.mcp.fastmcp_elicitation_handler(
        rbroker.wait_for, agent="fm-agent", server="bookings"
    )
    with responder_process(redis_url, namespace, HOLD_SEATS) as responder, fastmcp_http() as url:
        async with (
            rbroker.events() as events,
            fastmcp.Client(url, elicitation_handler=handler, mode="legacy") as client,
        ):
            booked = await client.call_tool("book", {})
            declined = await client.call_tool("confirm", {"what": "delete"})
            call = asyncio.create_task(client.call_tool("count", {}))
            held = await asked(responder, SEATS)
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
            await next_event(events, "withdrawn", held["id"], 10)
    assert json.loads(booked.data)["data"] == {"name": "Ada", "guests": 2, "vip": False}
    assert json.loads(declined.data)["action"] == "decline"
    assert {(s["server"], s["agent"]) for s in responder.seen} == {("bookings", "fm-agent")}


@pytest.mark.redis
@pytest.mark.slow
async def test_pydantic_ai_agent_through_fastmcps_client(
    rbroker: Broker, redis_url: str, namespace: str
) -> None:
    handler = toolnexus.mcp.fastmcp_elicitation_handler(rbroker.wait_for, agent="pai-agent")
    with responder_process(redis_url, namespace, HOLD_SEATS) as responder, fastmcp_http() as url:
        client = fastmcp.Client(url, elicitation_handler=handler, mode="legacy")
        toolset = MCPToolset(client)
        booking = Agent(scripted(("book", {}), ("confirm", {"what": "delete"})), toolsets=[toolset])
        counting = Agent(scripted(("count", {})), toolsets=[toolset])
        async with rbroker.events() as events:
            booked, declined = json.loads((await booking.run("Book a table")).output)
            call = asyncio.create_task(counting.run("Count the seats"))
            held = await asked(responder, SEATS)
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
            await next_event(events, "withdrawn", held["id"], 10)
    assert json.loads(booked)["data"] == {"name": "Ada", "guests": 2, "vip": False}
    assert json.loads(declined)["action"] == "decline"
    form = responder.by_prompt(BOOKING)
    assert (form["server"], form["agent"]) == ("fastmcp-elicit", "pai-agent")


# -- local: the callback's own rules ---------------------------------------------------


class Script:
    """A local wait_for that answers from a list, recording each request."""

    def __init__(self, *answers: Any) -> None:
        self.answers = list(answers)
        self.requests: list[Request] = []

    async def __call__(self, request: Request) -> Answer:
        self.requests.append(request)
        return Answer(id=request.id, ok=True, data=self.answers.pop(0))


SCHEMA = {
    "type": "object",
    "properties": {
        "n": {"type": "integer", "minimum": 1},
        "note": {"type": "string", "default": "-"},
    },
    "required": ["n"],
}
PARAMS = ElicitRequestFormParams(message="How many?", requested_schema=SCHEMA)


async def test_an_answer_that_breaks_the_form_is_asked_again_as_a_fresh_request() -> None:
    wait_for = Script({"n": 0}, {"n": 2})
    result = await toolnexus.elicitation_callback(wait_for, server="s")(None, PARAMS)
    assert result == ElicitResult(action="accept", content={"n": 2, "note": "-"})
    first, second = wait_for.requests
    assert second.id != first.id and second.meta["asked_before"] == first.id
    assert "minimum" in second.meta["invalid_answer"]
    assert second.expires_at == first.expires_at and second.source.server == "s"


async def test_answers_that_never_fit_end_in_cancel() -> None:
    wait_for = Script({"n": 0}, {"n": "x"}, {})
    result = await toolnexus.elicitation_callback(wait_for)(None, PARAMS)
    assert result == ElicitResult(action="cancel")
    assert len(wait_for.requests) == 3


async def test_params_that_cannot_be_asked_are_an_error_reply() -> None:
    result = await toolnexus.elicitation_callback(Script())(None, {"message": "no schema"})
    assert isinstance(result, ErrorData) and "requestedSchema" in result.message
    handler = toolnexus.mcp.fastmcp_elicitation_handler(Script())
    with pytest.raises(toolnexus.InvalidRequest, match="requestedSchema"):
        await handler("no schema", None, {"message": "no schema"}, None)


class Recorded:
    """``broker.wait_for``, recording each request and the loop it ran on."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.requests: list[Request] = []
        self.loops: list[asyncio.AbstractEventLoop] = []

    async def __call__(self, request: Request) -> Answer:
        self.requests.append(request)
        self.loops.append(asyncio.get_running_loop())
        return await self.broker.wait_for(request)


async def test_an_expired_question_is_cancel_and_not_asked_again(namespace: str) -> None:
    async with toolnexus.connect("memory://", namespace=namespace) as broker:
        wait_for = Recorded(broker)
        result = await toolnexus.elicitation_callback(wait_for, timeout_s=0.2)(None, PARAMS)
    assert result == ElicitResult(action="cancel")
    assert len(wait_for.requests) == 1


async def test_loop_runs_each_wait_on_the_brokers_loop_from_another_thread(
    namespace: str,
) -> None:
    # strands-agents' MCPClient calls the callback on a thread and event loop of its own.
    async with toolnexus.connect("memory://", namespace=namespace) as broker:
        main_loop = asyncio.get_running_loop()
        wait_for = Recorded(broker)
        ask = toolnexus.elicitation_callback(wait_for, loop=main_loop)

        async def on_another_loop(cancel_after_s: float | None) -> Any:
            call = asyncio.ensure_future(ask(None, PARAMS))
            if cancel_after_s is not None:
                await asyncio.sleep(cancel_after_s)
                call.cancel()
            return (await asyncio.gather(call, return_exceptions=True))[0]

        async with broker.events() as events:
            answered = asyncio.create_task(asyncio.to_thread(asyncio.run, on_another_loop(None)))
            async with asyncio.timeout(5):
                while not wait_for.requests:
                    await asyncio.sleep(0.01)
            await broker.answer(Answer(id=wait_for.requests[0].id, ok=True, data={"n": 3}))
            result = await answered
            cancelled = await asyncio.to_thread(asyncio.run, on_another_loop(0.3))
            async with asyncio.timeout(5):
                seen = [await anext(events) for _ in range(2)]
    assert result == ElicitResult(action="accept", content={"n": 3, "note": "-"})
    assert isinstance(cancelled, asyncio.CancelledError)
    assert [(e.event, e.id) for e in seen] == [
        ("answered", wait_for.requests[0].id),
        ("withdrawn", wait_for.requests[1].id),
    ]
    assert wait_for.loops == [main_loop, main_loop]


def test_bad_options_are_refused() -> None:
    with pytest.raises(ConfigurationError, match="timeout_s"):
        toolnexus.elicitation_callback(Script(), timeout_s=0)
    with pytest.raises(ConfigurationError, match="allow must be"):
        toolnexus.mcp.fastmcp_elicitation_handler(Script(), allow=[""])


async def test_the_server_is_named_by_its_handshake_when_not_given() -> None:
    server = MCPServer("named-by-handshake")

    @server.tool()
    async def ask(ctx: Context) -> str:
        result = await ctx.session.elicit_form("How many?", SCHEMA, ctx.request_id)
        return json.dumps(result.content)

    wait_for = Script({"n": 3})
    callback = toolnexus.elicitation_callback(wait_for)
    async with Client(server, mode="legacy", elicitation_callback=callback) as client:
        result = await client.call_tool("ask", {})
    assert json.loads(result.content[0].text) == {"n": 3, "note": "-"}  # type: ignore[union-attr]
    assert wait_for.requests[0].source.server == "named-by-handshake"
