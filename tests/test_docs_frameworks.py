"""The framework examples of the manual (docs/how-to/frameworks.md), run as written against a
real MCP server over streamable HTTP: each block is read from the page, the example's server
address (``https://crm.example.com/mcp``, or ``url``) becomes the local server's, and a
responder beside the test answers the form the server asks for."""

from __future__ import annotations

import json
import re
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp.server.mcpserver import Context, MCPServer
from mcp_types import ElicitRequestFormParams

import toolnexus
from conftest import FAST
from helpers import scripted
from mcp_helpers import answering, elicit, http_server
from toolnexus import Broker, Pending

PAGE = Path(__file__).parents[1] / "docs" / "how-to" / "frameworks.md"
EXAMPLE_URL = "https://crm.example.com/mcp"
BOOKING = {
    "type": "object",
    "properties": {"guests": {"type": "integer", "title": "Guests", "minimum": 1}},
    "required": ["guests"],
}

pytestmark = [pytest.mark.redis, pytest.mark.timeout(120)]


def block(first_line: str) -> str:
    """The Python block of the page whose first line is ``first_line``."""
    for match in re.finditer(r"^```python\n(.*?)^```", PAGE.read_text(), re.S | re.M):
        if match.group(1).startswith(first_line + "\n"):
            return match.group(1)
    raise AssertionError(f"{PAGE.name} has no block starting {first_line!r}")


async def run(code: str, **names: Any) -> dict[str, Any]:
    """Run ``code`` (a fragment with top-level ``await``) with ``names`` bound; its locals."""
    source = "async def example():\n" + textwrap.indent(code + "\nreturn locals()", "    ")
    scope: dict[str, Any] = {"toolnexus": toolnexus, **names}
    exec(compile(source, str(PAGE), "exec"), scope)
    result: dict[str, Any] = await scope["example"]()
    return result


@pytest.fixture(scope="module")
def crm() -> Iterator[str]:
    """An MCP server named crm whose book_table asks how many guests."""
    server = MCPServer("crm")

    @server.tool()
    async def book_table(restaurant: str, ctx: Context) -> str:
        params = ElicitRequestFormParams(message=f"Book {restaurant}?", requested_schema=BOOKING)
        result = await elicit(ctx, params)
        return json.dumps({"action": result.action, "content": result.content})  # type: ignore[union-attr]

    with http_server(server) as url:
        yield url


@pytest.fixture
async def broker(redis_url: str, namespace: str) -> Any:
    async with toolnexus.connect(redis_url, namespace=namespace, **FAST) as b:
        yield b


async def four_guests(pending: Pending) -> None:
    await pending.accept({"guests": 4})


def booked(result: Any) -> dict[str, Any]:
    text = result.data if isinstance(getattr(result, "data", None), str) else result.content[0].text
    return json.loads(text)  # type: ignore[no-any-return]


async def test_the_mcp_sdk_client_example_books_through_a_person(broker: Broker, crm: str) -> None:
    code = block("# MCP SDK (mcp 2.x): Client or ClientSession").replace(EXAMPLE_URL, crm)
    async with answering(broker, four_guests) as seen:
        names = await run(code, broker=broker)
    assert booked(names["result"]) == {"action": "accept", "content": {"guests": 4}}
    (request,) = seen
    assert (request.prompt, request.source.agent, request.source.server) == (
        "Book Noma?",
        "agent-7",
        "crm",
    )


@pytest.mark.slow
async def test_the_fastmcp_example_books_through_a_person(broker: Broker, crm: str) -> None:
    code = block("# fastmcp").replace(EXAMPLE_URL, crm)
    async with answering(broker, four_guests) as seen:
        names = await run(code, broker=broker)
    assert booked(names["result"]) == {"action": "accept", "content": {"guests": 4}}
    assert [r.source.agent for r in seen] == ["agent-7"]


async def test_the_pydantic_ai_example_books_through_a_person(broker: Broker, crm: str) -> None:
    # the example's model is OpenAI's; here a scripted one calls the tool
    code = block("# pydantic-ai (2.x), through fastmcp's client")
    assert '"openai:gpt-5"' in code
    code = code.replace('"openai:gpt-5"', "scripted") + "\nrun = await agent.run('Book Noma')"
    import fastmcp

    async with answering(broker, four_guests) as seen:
        names = await run(
            code,
            broker=broker,
            url=crm,
            fastmcp=fastmcp,
            scripted=scripted(("book_table", {"restaurant": "Noma"})),
        )
    [returned] = json.loads(names["run"].output)
    assert json.loads(returned) == {"action": "accept", "content": {"guests": 4}}
    assert [r.prompt for r in seen] == ["Book Noma?"]
