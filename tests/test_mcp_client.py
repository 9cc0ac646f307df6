"""load_mcp (SPEC §2): every way an MCP server asks, answered through wait_for and the broker."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp.client.stdio import StdioServerParameters
from mcp.shared.exceptions import MCPError, UrlElicitationRequiredError
from mcp_types import REQUEST_TIMEOUT, URL_ELICITATION_REQUIRED, CallToolResult

import toolnexus
from conftest import RedisServer
from helpers import next_event, page_block, run_fragment
from mcp_helpers import (
    AUTH_URL,
    FAST,
    FILLED,
    FORM,
    WITH_DEFAULTS,
    accept_all,
    answering,
    http_server,
    make_server,
)
from toolnexus import (
    Answer,
    Broker,
    ConfigurationError,
    InvalidAnswer,
    Pending,
    Request,
    Source,
    load_mcp,
)
from toolnexus.cli import booking_server
from toolnexus.errors import ServerUnavailable
from toolnexus.mcp._transport import target

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def outcome(result: CallToolResult) -> Any:
    assert not result.is_error, result.content
    text = result.content[0].text  # type: ignore[union-attr]
    return json.loads(text)


class Recorder:
    """A local wait_for: answers with ``reply(request)`` and records what it was asked."""

    def __init__(self, reply: Any = None, delay: float = 0.0) -> None:
        self.requests: list[Request] = []
        self.cancelled: list[str] = []
        self.reply = reply or (lambda request: Answer(id=request.id, ok=True, data=FILLED))
        self.delay = delay
        self.asked = asyncio.Event()

    async def __call__(self, request: Request) -> Answer:
        self.requests.append(request)
        self.asked.set()
        try:
            await asyncio.sleep(self.delay)
        except asyncio.CancelledError:
            self.cancelled.append(request.id)
            raise
        answer: Answer = self.reply(request)
        return answer


@pytest.fixture
async def rbroker(redis_url: str, namespace: str) -> AsyncIterator[Broker]:
    async with toolnexus.connect(redis_url, namespace=namespace, **FAST) as broker:
        yield broker


# -- the tools mapping -----------------------------------------------------------------


async def test_tools_are_a_read_only_mapping_of_callables() -> None:
    async with load_mcp(make_server().server, mode="legacy") as tools:
        assert tools.server_name == "test-elicit"
        assert tools.protocol_version == "2025-11-25"
        assert {"echo", "ask_form", "needs_auth"} <= set(tools)
        echo = tools["echo"]
        assert echo.name == "echo"
        assert echo.input_schema["properties"]["text"]["type"] == "string"
        assert (await echo(text="hi")).content[0].text == "hi"  # type: ignore[union-attr]
        assert not hasattr(tools, "__setitem__")
        failed = await tools["fail"]()
        assert failed.is_error
        assert "always fails" in failed.content[0].text  # type: ignore[union-attr]


def test_server_specs_are_recognised() -> None:
    how = target("python -m 'my server' --flag")
    assert how.stdio is not None
    assert (how.stdio.command, how.stdio.args, how.label) == (
        "python",
        ["-m", "my server", "--flag"],
        "python",
    )
    how = target(["/usr/bin/node", "server.js"])
    assert how.stdio is not None and how.label == "node"
    params = StdioServerParameters(command="/bin/srv")
    assert target(params).stdio is params
    how = target("https://mcp.example.com/mcp")
    assert how.stdio is None and how.label == "mcp.example.com" and how.reusable
    assert hasattr(how.connect(), "__aenter__")
    with pytest.raises(ConfigurationError, match="must not be empty"):
        target([])


class CountingAuth(httpx2.Auth):
    """An ``httpx2.Auth`` that stamps and counts the requests it authenticates."""

    def __init__(self) -> None:
        self.requests = 0

    def auth_flow(self, request: httpx2.Request) -> Any:
        self.requests += 1
        request.headers["Authorization"] = "Bearer test"
        yield request


@pytest.mark.slow
async def test_auth_authenticates_an_http_servers_requests_and_nothing_else() -> None:
    auth = CountingAuth()
    with http_server(make_server().server) as url:
        async with load_mcp(url, auth=auth) as tools:
            await tools["capabilities"]()
    assert auth.requests >= 3  # discovery or handshake, the listing, the call
    with pytest.raises(ConfigurationError, match="auth= authenticates an http"):
        target("python server.py", auth=auth)
    with pytest.raises(ConfigurationError, match="name= and auth= are one server's"):
        load_mcp({"mcpServers": {}}, auth=auth)


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_elicitation_is_advertised_only_with_wait_for(mode: str) -> None:
    server = make_server().server
    async with load_mcp(server, mode=mode) as tools:
        assert outcome(await tools["capabilities"]()) is None
    async with load_mcp(server, mode=mode, wait_for=Recorder()) as tools:
        assert outcome(await tools["capabilities"]()) == {"form": {}, "url": {}}


# -- mapping answers, with a local wait_for ----------------------------------------------


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_a_form_answer_gets_its_defaults_and_names_who_asks(mode: str) -> None:
    wait_for = Recorder()
    async with load_mcp(make_server().server, wait_for=wait_for, mode=mode, agent="a-7") as tools:
        assert outcome(await tools["ask_form"]()) == {"action": "accept", "content": WITH_DEFAULTS}
    [request] = wait_for.requests
    assert request.kind == "input" and request.prompt == "Who are you?"
    assert request.schema == FORM
    assert request.source == Source(server="test-elicit", tool="ask_form", agent="a-7")


async def test_an_answer_that_breaks_the_form_is_a_cancel() -> None:
    wait_for = Recorder(lambda r: Answer(id=r.id, ok=True, data={"name": "A"}))
    async with load_mcp(make_server().server, wait_for=wait_for, mode="legacy") as tools:
        assert outcome(await tools["ask_form"]()) == {"action": "cancel", "content": None}


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_a_url_accept_carries_no_content(mode: str) -> None:
    wait_for = Recorder(lambda r: Answer(id=r.id, ok=True, data={"stray": "data"}))
    async with load_mcp(make_server().server, wait_for=wait_for, mode=mode) as tools:
        assert outcome(await tools["ask_url"]()) == {"action": "accept", "content": None}
    [request] = wait_for.requests
    assert (request.kind, request.url, request.data) == ("authorization", AUTH_URL, None)
    # 2026-07-28 dropped elicitation ids along with the completion notification
    assert request.meta.get("elicitation_id") == ("eid-1" if mode == "legacy" else None)


async def test_several_input_requests_of_one_round_are_asked_at_once() -> None:
    wait_for = Recorder(lambda r: Answer(id=r.id, ok=True, data={}), delay=0.3)
    async with load_mcp(make_server().server, wait_for=wait_for, mode="2026-07-28") as tools:
        started = time.monotonic()
        assert outcome(await tools["ask_twice"]()) == {"a": "accept", "b": "accept"}
        assert time.monotonic() - started < 0.55
    assert sorted(r.prompt for r in wait_for.requests) == ["a", "b"]
    assert {r.source.tool for r in wait_for.requests} == {"ask_twice"}


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_cancelling_the_tool_call_cancels_the_wait(mode: str) -> None:
    wait_for = Recorder(delay=30)
    async with load_mcp(make_server().server, wait_for=wait_for, mode=mode) as tools:
        call = asyncio.create_task(tools["ask_form"]())
        await asyncio.wait_for(wait_for.asked.wait(), 5)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        assert wait_for.cancelled == [wait_for.requests[0].id]


@pytest.mark.slow
async def test_a_slow_person_is_not_cut_by_the_read_timeout_but_a_slow_server_is() -> None:
    wait_for = Recorder(delay=0.8)
    server = make_server().server
    async with load_mcp(server, wait_for=wait_for, mode="legacy", read_timeout_s=0.3) as tools:
        assert outcome(await tools["ask_form"]())["action"] == "accept"
        with pytest.raises(MCPError) as timed_out:
            await tools["slow"](seconds=2)
        assert timed_out.value.code == REQUEST_TIMEOUT
        assert (await tools["slow"].call({"seconds": 0.5}, read_timeout_s=2)).content


async def test_the_deadline_per_call_overrides_the_sessions() -> None:
    wait_for = Recorder()
    async with load_mcp(make_server().server, wait_for=wait_for, timeout_s=100) as tools:
        await tools["ask_form"]()
        await tools["ask_form"].call(timeout_s=5)
    first, second = wait_for.requests
    assert first.expires_at == pytest.approx(first.created_at + 100)
    assert second.expires_at == pytest.approx(second.created_at + 5)


async def test_without_wait_for_a_url_elicitation_required_error_is_raised_as_is() -> None:
    async with load_mcp(make_server().server, mode="legacy") as tools:
        with pytest.raises(MCPError) as error:
            await tools["needs_auth"](services=["mail"])
    assert error.value.code == URL_ELICITATION_REQUIRED


async def test_a_completion_notification_calls_on_complete_once_for_known_ids() -> None:
    completed: list[str] = []

    async def on_complete(request_id: str) -> None:
        completed.append(request_id)

    wait_for = Recorder()
    async with load_mcp(
        make_server().server, wait_for=wait_for, on_complete=on_complete, mode="legacy"
    ) as tools:
        await tools["ask_url"](complete=["unknown", "eid-1", "eid-1"])
        await asyncio.sleep(0.1)
    assert completed == [wait_for.requests[0].id]


# -- end to end through Redis -------------------------------------------------------------


@pytest.mark.redis
@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_form_every_field_kind_through_redis(rbroker: Broker, mode: str) -> None:
    refused: list[str] = []

    async def answer(pending: Pending) -> None:
        with pytest.raises(InvalidAnswer) as invalid:
            await pending.accept({**FILLED, "toppings": []})
        refused.append(str(invalid.value))
        await pending.accept(FILLED)  # the request stayed open

    server = make_server().server
    async with (
        answering(rbroker, answer) as seen,
        load_mcp(server, wait_for=rbroker.wait_for, mode=mode, agent="agent-1") as tools,
    ):
        assert tools.protocol_version == ("2025-11-25" if mode == "legacy" else mode)
        assert outcome(await tools["ask_form"]()) == {"action": "accept", "content": WITH_DEFAULTS}
    assert "toppings" in refused[0]
    assert seen[0].source == Source(server="test-elicit", tool="ask_form", agent="agent-1")


@pytest.mark.redis
@pytest.mark.parametrize(
    ("respond", "action"),
    [(Pending.decline, "decline"), (Pending.dismiss, "cancel")],
)
async def test_decline_and_dismiss_through_redis(
    rbroker: Broker, respond: Any, action: str
) -> None:
    async with (
        answering(rbroker, respond),
        load_mcp(make_server().server, wait_for=rbroker.wait_for, mode="legacy") as tools,
    ):
        assert outcome(await tools["ask_form"]()) == {"action": action, "content": None}
        assert outcome(await tools["ask_url"]()) == {"action": action, "content": None}


@pytest.mark.redis
async def test_no_answer_before_the_deadline_is_a_cancel(rbroker: Broker) -> None:
    async with (
        rbroker.events() as events,
        load_mcp(make_server().server, wait_for=rbroker.wait_for, timeout_s=0.3) as tools,
    ):
        assert outcome(await tools["ask_form"]()) == {"action": "cancel", "content": None}
        assert (await next_event(events, "expired")).answer.reason == "expired"  # type: ignore[union-attr]


@pytest.mark.redis
async def test_url_accept_and_the_completion_notification_through_redis(rbroker: Broker) -> None:
    async with (
        rbroker.events() as events,
        answering(rbroker, accept_all) as seen,
        load_mcp(make_server().server, wait_for=rbroker.wait_for, mode="legacy") as tools,
    ):
        assert outcome(await tools["ask_url"]()) == {"action": "accept", "content": None}
        [request] = seen
        assert (request.kind, request.url, request.data) == ("authorization", AUTH_URL, None)
        assert (await next_event(events, "completed")).id == request.id


@pytest.mark.redis
@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_url_elicitation_required_is_authorized_then_retried(
    rbroker: Broker, mode: str
) -> None:
    state = make_server()

    async def authorize(pending: Pending) -> None:
        state.authorized.add(pending.request.meta["elicitation_id"].removeprefix("auth-"))
        await pending.accept()

    async with (
        answering(rbroker, authorize) as seen,
        load_mcp(state.server, wait_for=rbroker.wait_for, mode=mode, agent="a") as tools,
    ):
        result = await tools["needs_auth"](services=["mail", "calendar"])
    assert result.content[0].text == "authorized: mail, calendar"  # type: ignore[union-attr]
    assert sorted(r.url or "" for r in seen) == [
        "https://auth.example.com/calendar",
        "https://auth.example.com/mail",
    ]
    assert {(r.kind, r.source.tool) for r in seen} == {("authorization", "needs_auth")}


@pytest.mark.redis
async def test_a_declined_url_elicitation_raises_the_sdks_error_and_withdraws_the_rest(
    rbroker: Broker,
) -> None:
    held: list[Pending] = []

    async def decline_mail(pending: Pending) -> None:
        held.append(pending)
        if len(held) == 2:  # both are shown: refuse the mail one
            await next(p for p in held if (p.request.url or "").endswith("mail")).decline()

    async with (
        rbroker.events() as events,
        answering(rbroker, decline_mail) as seen,
        load_mcp(make_server().server, wait_for=rbroker.wait_for) as tools,
    ):
        with pytest.raises(UrlElicitationRequiredError) as error:
            await tools["needs_auth"](services=["mail", "calendar"])
        assert error.value.code == URL_ELICITATION_REQUIRED
        assert len(error.value.elicitations) == 2
        [calendar] = [r for r in seen if r.url and r.url.endswith("calendar")]
        await next_event(events, "withdrawn", calendar.id)


@pytest.mark.redis
async def test_cancelling_the_tool_call_withdraws_the_request(rbroker: Broker) -> None:
    shown: asyncio.Queue[Pending] = asyncio.Queue()
    async with (
        rbroker.events() as events,
        answering(rbroker, shown.put) as _,
        load_mcp(make_server().server, wait_for=rbroker.wait_for, mode="legacy") as tools,
    ):
        call = asyncio.create_task(tools["ask_form"]())
        pending = await asyncio.wait_for(shown.get(), 5)
        call.cancel()
        await next_event(events, "withdrawn", pending.request.id)
        with pytest.raises(toolnexus.AlreadyResolved):
            await pending.accept(FILLED)


@pytest.mark.redis
@pytest.mark.slow
async def test_a_responder_slower_than_the_read_timeout_over_http(rbroker: Broker) -> None:
    async def slowly(pending: Pending) -> None:
        await asyncio.sleep(1.0)
        await accept_all(pending)

    state = make_server()
    with http_server(state.server) as url:
        async with (
            rbroker.events() as events,
            answering(rbroker, slowly) as seen,
            load_mcp(url, wait_for=rbroker.wait_for, mode="legacy", read_timeout_s=0.4) as tools,
        ):
            assert tools.server_name == "test-elicit"
            assert outcome(await tools["ask_form"]()) == {
                "action": "accept",
                "content": WITH_DEFAULTS,
            }
            assert outcome(await tools["ask_url"]())["action"] == "accept"
            assert (await next_event(events, "completed")).id == seen[1].id
    assert seen[0].source.tool == "ask_form"


@pytest.mark.redis
async def test_the_booking_server_over_http_in_2026_mode(rbroker: Broker) -> None:
    with http_server(booking_server()) as url:
        async with (
            answering(rbroker, accept_booking) as seen,
            load_mcp(url, wait_for=rbroker.wait_for, agent="http-agent", mode="auto") as tools,
        ):
            assert tools.protocol_version == "2026-07-28"
            result = await tools["book_table"](restaurant="Noma")
    assert "Booked: a table for 3 at Noma on 2026-09-01" in result.content[0].text  # type: ignore[union-attr]
    assert [r.kind for r in seen] == ["input", "authorization"]
    assert {r.source for r in seen} == {
        Source(server="toolnexus-booking", tool="book_table", agent="http-agent")
    }


@pytest.mark.redis
@pytest.mark.slow
async def test_the_booking_server_over_stdio_in_legacy_mode(rbroker: Broker) -> None:
    command = [sys.executable, str(EXAMPLES / "booking_server.py")]
    async with (
        rbroker.events() as events,
        answering(rbroker, accept_booking) as seen,
        load_mcp(command, wait_for=rbroker.wait_for, mode="legacy", agent="stdio-agent") as tools,
    ):
        result = await tools["book_table"](restaurant="Noma")
        assert (await next_event(events, "completed")).id == seen[1].id
    assert "deposit authorized" in result.content[0].text  # type: ignore[union-attr]
    # no contextvar crosses a pipe: the one call in flight names the tool
    assert {r.source.tool for r in seen} == {"book_table"}


async def accept_booking(pending: Pending) -> None:
    if pending.request.kind == "authorization":
        await pending.accept()
    else:
        await pending.accept(
            {"name": "Ada", "email": "ada@example.com", "guests": 3, "date": "2026-09-01"}
        )


PAGE = "docs/how-to/mcp-servers.md"


@pytest.mark.redis
@pytest.mark.slow
async def test_the_mcp_servers_page_first_example_books_through_a_person(
    redis_server: RedisServer,
) -> None:
    """The first block of docs/how-to/mcp-servers.md as written, its server the booking
    example's over stdio and ``url`` a private redis-server's; a responder beside it
    answers the form and the deposit link."""
    code = page_block(PAGE, "async with (\n    toolnexus.connect(url) as broker,")
    command = f"{sys.executable} {EXAMPLES / 'booking_server.py'}"
    assert '"python my_server.py"' in code
    code = code.replace('"python my_server.py"', repr(command))
    async with (
        toolnexus.connect(redis_server.url, **FAST) as responder,
        answering(responder, accept_booking) as seen,
    ):
        names = await asyncio.wait_for(run_fragment(code, PAGE, url=redis_server.url), 60)
    assert "deposit authorized" in names["result"].content[0].text
    assert [r.source.agent for r in seen] == ["agent-7", "agent-7"]


CALENDAR = """
import os
from mcp.server.mcpserver import MCPServer

calendar = MCPServer("calendar")


@calendar.tool()
def book(day: str) -> str:
    return f"booked {day} ({os.environ['TZ']})"


calendar.run("stdio")
"""


@pytest.mark.slow
async def test_the_mcp_servers_page_host_config_example_loads_what_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The host-config block of docs/how-to/mcp-servers.md as written, run where its
    ``calendar_server.py`` is a real stdio server and its crm address has nobody: the
    calendar's tool runs, the crm is a failure."""
    code = page_block(PAGE, "config = {")
    assert '"command": "python"' in code and "https://crm.example.com/mcp" in code
    code = code.replace('"command": "python"', f'"command": {sys.executable!r}')
    code = code.replace("https://crm.example.com/mcp", "http://127.0.0.1:9/mcp")  # discard
    (tmp_path / "calendar_server.py").write_text(CALENDAR)
    monkeypatch.chdir(tmp_path)
    async with toolnexus.connect("memory://") as broker:
        names = await asyncio.wait_for(run_fragment(code, PAGE, broker=broker), 60)
    tools = names["tools"]
    assert set(tools.failures) == {"crm"}
    assert isinstance(tools.failures["crm"], ServerUnavailable)
    assert "calendar.book" in tools
