"""Workers show a tool approval for what it is: the terminal prints the tool and its
arguments (answering with the defaults approves them as proposed); the web page shows them
as a pre-filled form; the auto worker's rules match the tool's name."""

from __future__ import annotations

import asyncio
import io
import re

import httpx2 as httpx
import pytest

import toolnexus
from toolnexus.frameworks import decide, tool_call_request
from toolnexus.responders import Terminal
from toolnexus_workers.auto import Rules
from toolnexus_workers.web.server import WebServer

SCHEMA = {
    "type": "object",
    "properties": {"to": {"type": "string"}, "amount": {"type": "integer"}},
    "required": ["to", "amount"],
}
ARGS = {"to": "ACME", "amount": 10}


async def test_the_terminal_prints_the_tool_and_its_arguments_and_can_edit_them() -> None:
    request = tool_call_request("transfer", ARGS, framework="test", schema=SCHEMA)
    output = io.StringIO()
    terminal = Terminal(stdin=io.StringIO("\n7\ny\n"), output=output, color=False)
    answer = await terminal.ask(request)
    shown = output.getvalue()
    assert "Tool:   transfer" in shown
    assert "to = 'ACME'" in shown and "amount = 10" in shown
    decision = decide(request, answer)
    assert decision.approved and decision.edited
    assert decision.arguments == {"to": "ACME", "amount": 7}


RULES = """
[[rule]]
name = "small transfers"
kind = "tool_call"
tool = "transfer*"
action = "accept"

[[rule]]
kind = "tool_call"
action = "decline"
"""


async def test_auto_rules_match_tool_names_and_accept_approves_as_proposed() -> None:
    rules = Rules.parse(RULES)
    transfer = tool_call_request("transfer_funds", ARGS, framework="test", schema=SCHEMA)
    delete = tool_call_request("delete_account", {"id": 1}, framework="test")
    matched = rules.match(transfer)
    assert matched is not None and matched.label == "small transfers"
    other = rules.match(delete)
    assert other is not None and other.action == "decline"
    async with toolnexus.connect("memory://") as broker:
        waiting = asyncio.create_task(broker.wait_for(transfer, timeout_s=10))
        async with broker.responder("ops") as responder, asyncio.timeout(10):
            pending = await anext(responder)
        await pending.accept(matched.data)
        decision = decide(transfer, await waiting)
    assert decision.approved and not decision.edited and decision.arguments == ARGS


@pytest.mark.redis
async def test_the_web_page_shows_the_tool_and_its_arguments_as_an_editable_form(
    redis_url: str, namespace: str
) -> None:
    request = tool_call_request(
        "transfer", ARGS, framework="test", schema=SCHEMA, prompt="Pay ACME?"
    )
    async with (
        toolnexus.connect(redis_url, namespace=namespace, block_ms=100) as broker,
        WebServer(broker, port=0) as web,
        httpx.AsyncClient(base_url=web.url) as client,
    ):
        waiting = asyncio.create_task(broker.wait_for(request, timeout_s=30))
        async with asyncio.timeout(20):
            while "Pay ACME?" not in (page := (await client.get("/")).text):
                await asyncio.sleep(0.05)
        assert "Tool call" in page and "transfer" in page
        assert 'value="ACME"' in page and 'value="10"' in page  # the arguments, pre-filled
        csrf = re.search(r'name="csrf" value="([^"]+)"', page)
        assert csrf is not None
        form = {"request": request.id, "csrf": csrf[1], "action": "accept"}
        sent = await client.post("/answer", data={**form, "field.to": "ACME", "field.amount": "3"})
        assert sent.status_code == 303
        decision = decide(request, await asyncio.wait_for(waiting, 10))
    assert decision.edited and decision.arguments == {"to": "ACME", "amount": 3}
