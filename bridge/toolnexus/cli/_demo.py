"""The demo round trip (SPEC §13): an MCP booking server whose tool elicits a form and then
an authorization, an agent calling it through ``load_mcp``, and a responder answering.

:func:`booking_server` works with every protocol version: on 2025-11-25 sessions it
sends ``elicitation/create`` mid-call (and reports the authorization complete with
``notifications/elicitation/complete``); on 2026-07-28 sessions it returns
``InputRequiredResult`` rounds. ``python -m toolnexus.demo`` serves it over stdio.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import uuid
from typing import Any, TextIO

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.session import ServerSession
from mcp_types import (
    CallToolResult,
    ElicitRequest,
    ElicitRequestFormParams,
    ElicitRequestURLParams,
    ElicitResult,
    InputRequiredResult,
    TextContent,
)
from mcp_types.version import is_version_at_least

from .._broker import Broker, Pending, connect, redacted
from .._schema import options
from ..errors import ConfigurationError
from ..mcp._client import load_mcp
from ..models import Answer, Request
from ..responders._terminal import Terminal
from ..settings import EMBEDDED_URL, URL_VARIABLE

BOOKING_FORM: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {
            "type": "string",
            "title": "Name for the booking",
            "minLength": 2,
            "maxLength": 60,
        },
        "email": {"type": "string", "title": "Email", "format": "email"},
        "guests": {"type": "integer", "title": "Guests", "minimum": 1, "maximum": 12, "default": 2},
        "date": {"type": "string", "title": "Date", "format": "date"},
        "seating": {
            "type": "string",
            "title": "Seating",
            "oneOf": [
                {"const": "indoor", "title": "Indoor"},
                {"const": "terrace", "title": "Terrace"},
                {"const": "bar", "title": "At the bar"},
            ],
            "default": "indoor",
        },
        "diet": {
            "type": "array",
            "title": "Dietary needs",
            "items": {
                "type": "string",
                "enum": ["vegetarian", "vegan", "gluten-free", "nut allergy"],
            },
            "default": [],
        },
        "high_chair": {"type": "boolean", "title": "High chair needed", "default": False},
        "budget": {"type": "number", "title": "Budget per person (EUR)", "minimum": 0},
    },
    "required": ["name", "email", "guests", "date"],
}
"""The booking form: every field kind of the MCP schema subset."""

DEPOSIT_URL = "https://pay.example.com/authorize"
"""Where the (fictional) deposit is authorized; nothing is ever fetched from it."""

_INPUT_REQUIRED_VERSION = "2026-07-28"


class _InputRequired(Exception):
    """Raised by :meth:`_Asker.ask` on a 2026-07-28 session: return ``result`` to the client."""

    def __init__(self, result: InputRequiredResult) -> None:
        super().__init__("input required")
        self.result = result


class _Asker:
    """Asks the client within one tool call, whatever the protocol version.

    On 2026-07-28 the answers of earlier rounds travel in ``request_state``: each
    round replays the tool from the start and the first unanswered question ends it.
    ``MCPServer`` seals ``request_state``, so a client cannot forge earlier answers.
    """

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        version = ctx.protocol_version
        self.rounds = version is not None and is_version_at_least(version, _INPUT_REQUIRED_VERSION)
        state = json.loads(ctx.request_state) if self.rounds and ctx.request_state else {}
        self.answers: dict[str, Any] = state.get("answers", {})
        self.ids: dict[str, str] = state.get("ids", {})
        for key, response in (ctx.input_responses or {}).items():
            self.answers[key] = response.model_dump(mode="json", by_alias=True, exclude_none=True)

    def new_id(self, key: str) -> str:
        """An elicitation id that stays the same over the rounds of this call."""
        return self.ids.setdefault(key, uuid.uuid4().hex)

    async def ask(
        self, key: str, params: ElicitRequestFormParams | ElicitRequestURLParams
    ) -> ElicitResult:
        """The client's answer to ``params``.

        Raises:
            _InputRequired: on a 2026-07-28 session, when this question has no answer yet.
        """
        if not self.rounds:
            session: ServerSession = self.ctx.session
            if isinstance(params, ElicitRequestURLParams):
                elicitation_id = params.elicitation_id or self.new_id(key)
                return await session.elicit_url(
                    params.message, params.url, elicitation_id, self.ctx.request_id
                )
            return await session.elicit_form(
                params.message, params.requested_schema, self.ctx.request_id
            )
        if key in self.answers:
            return ElicitResult.model_validate(self.answers[key])
        state = json.dumps({"answers": self.answers, "ids": self.ids})
        raise _InputRequired(
            InputRequiredResult(
                input_requests={key: ElicitRequest(params=params)}, request_state=state
            )
        )

    async def complete(self, elicitation_id: str) -> None:
        """Tell a 2025-11-25 client the out-of-band step is done (2026-07-28 has no such notice)."""
        if not self.rounds:
            await self.ctx.session.send_elicit_complete(elicitation_id, self.ctx.request_id)


def booking_server(name: str = "toolnexus-booking") -> MCPServer:
    """An MCP server whose one tool, ``book_table``, asks for a form, then an authorization."""
    server = MCPServer(name, instructions="Books restaurant tables; asks the guest for details.")

    @server.tool()
    async def book_table(restaurant: str, ctx: Context) -> str | InputRequiredResult:
        """Book a table at `restaurant`: the guest fills in the booking and authorizes a deposit."""
        asker = _Asker(ctx)
        deposit_id = asker.new_id("deposit")
        try:
            details = await asker.ask(
                "details",
                ElicitRequestFormParams(
                    message=f"Booking a table at {restaurant}: who is coming, and when?",
                    requested_schema=BOOKING_FORM,
                ),
            )
            if details.action != "accept" or details.content is None:
                return f"No booking at {restaurant}: the guest chose {details.action!r}."
            deposit = await asker.ask(
                "deposit",
                ElicitRequestURLParams(
                    message=f"Authorize a 20.00 EUR deposit for your table at {restaurant}.",
                    url=f"{DEPOSIT_URL}?booking={deposit_id}&amount=20.00",
                    elicitation_id=deposit_id,
                ),
            )
        except _InputRequired as pending:
            return pending.result
        if deposit.action != "accept":
            return f"No booking at {restaurant}: the deposit was not authorized ({deposit.action})."
        await asker.complete(deposit_id)
        return f"Booked: {_booking(restaurant, details.content)}; deposit authorized."

    return server


def _booking(restaurant: str, form: dict[str, Any]) -> str:
    """Every answer of the booking form, as the tool's result says it back."""
    diet = form.get("diet") or []
    budget = form.get("budget")
    return (
        f"a table for {form['guests']} at {restaurant} on {form['date']}, "
        f"{form.get('seating', 'indoor')}, in the name of {form['name']} ({form['email']}); "
        f"dietary needs: {', '.join(map(str, diet)) if diet else 'none'}; "
        f"high chair: {'yes' if form.get('high_chair') else 'no'}; "
        f"budget per person: {'not given' if budget is None else f'{budget} EUR'}"
    )


def introduction(responder: str, queue: str) -> str:
    """What the demo's three parts are, said before it starts."""
    you = {
        "terminal": "you, at this terminal: the responder, a person answering each question",
        "auto": "the auto responder: answers each question for you, with plausible values",
        "none": "a responder worker elsewhere, reading that queue: the person who answers",
    }[responder]
    return "\n".join(
        [
            "demo: three parts talk through a toolnexus broker:",
            "  - an MCP server (an example restaurant's, in this process): its tool",
            "    book_table asks its caller for the booking's details, then for a deposit;",
            "  - an agent (in this process): calls book_table through toolnexus's load_mcp,",
            f"    which turns each question the tool asks into a request on queue {queue!r};",
            f"  - {you}.",
            "",
        ]
    )


RECAP = """
What happened: the agent called the MCP tool book_table; the tool asked two questions (a
form, then a deposit authorization); toolnexus carried each from the agent to the responder
and each answer back, and the result above is what the agent received.
Next: the agent and the person in two processes, on Redis:
  toolnexus worker terminal --queue demo --url redis://127.0.0.1:6379/0   # one terminal
  toolnexus demo --responder none --url redis://127.0.0.1:6379/0          # another
(the demo asks on queue 'demo': a worker started without --queue reads queue 'default'
and never sees it). The tutorial "A small fleet on Redis" (docs/tutorials/fleet.md)
adds the web page."""
"""Said after the demo's tool result: what happened, and what to try next."""


def auto_answer(request: Request) -> Answer:
    """An unattended answer: URLs accepted, forms filled with defaults and plausible values."""
    schema = request.schema
    if request.kind == "authorization" or schema is None:
        return Answer(id=request.id, ok=True)
    required = set(schema.get("required", []))
    data = {
        name: field["default"] if "default" in field else _plausible(name, field)
        for name, field in schema.get("properties", {}).items()
        if "default" in field or name in required
    }
    return Answer(id=request.id, ok=True, data=data)


def _plausible(name: str, field: dict[str, Any]) -> Any:
    """A value that satisfies ``field`` (one property of an MCP form schema)."""
    choices = [value for value, _ in options(field)]
    kind = field.get("type")
    if kind == "array":
        return choices[: field.get("minItems", 0)]
    if choices:
        return choices[0]
    if kind == "boolean":
        return False
    if kind in ("integer", "number"):
        value = 0
        if "minimum" in field:
            value = max(value, field["minimum"])
        if "exclusiveMinimum" in field:
            value = max(value, field["exclusiveMinimum"] + 1)
        if "maximum" in field:
            value = min(value, field["maximum"])
        return value
    formats = {
        "email": "guest@example.com",
        "uri": "https://example.com/",
        "date": datetime.date.today().isoformat(),
        "date-time": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }
    text = formats.get(field.get("format", ""), f"demo {name}").ljust(
        field.get("minLength", 0), "x"
    )
    return text[: field["maxLength"]] if "maxLength" in field else text


async def _respond(
    broker: Broker, how: str, agent: str, terminal: Terminal, output: TextIO
) -> None:
    """Answer this demo's requests (others are left to their own responders)."""
    async with broker.responder(f"demo-{how}") as responder:
        async for pending in responder:
            if pending.request.source.agent != agent:
                await pending.skip()
            elif how == "auto":
                await _answer_automatically(pending, output)
            else:
                await terminal.handle(pending)


async def _answer_automatically(pending: Pending, output: TextIO) -> None:
    answer = auto_answer(pending.request)
    what = pending.request.url if pending.request.kind == "authorization" else answer.data
    print(f"[auto responder] {pending.request.prompt} -> accept {what}", file=output, flush=True)
    await pending.answer(answer)


async def run_demo(
    url: str | None = None,
    *,
    responder: str = "terminal",
    restaurant: str = "Chez Toolnexus",
    timeout_s: float = 300.0,
    stdin: TextIO | None = None,
    output: TextIO | None = None,
    **broker_options: Any,
) -> CallToolResult:
    """The whole round trip on ``url`` (else ``TOOLNEXUS_URL``, else the embedded
    ``memory://``: :data:`~toolnexus.settings.EMBEDDED_URL`): returns the tool's result.

    ``responder`` is ``"terminal"`` (a person at ``stdin``/``output``), ``"auto"``, or
    ``"none"``: responder workers elsewhere answer (a Redis URL, then).

    Raises:
        ConfigurationError: a bad broker URL or responder kind.
        BrokerUnavailable: the broker cannot be reached.
    """
    if responder not in ("terminal", "auto", "none"):
        raise ConfigurationError(
            f"unknown responder {responder!r}: use 'terminal', 'auto' or 'none'"
        )
    output = output or sys.stdout
    terminal = Terminal(stdin=stdin or sys.stdin, output=output)
    agent = f"demo-{uuid.uuid4().hex[:8]}"
    broker_options.setdefault("queue", "demo")
    url = url or os.environ.get(URL_VARIABLE) or EMBEDDED_URL
    print(introduction(responder, broker_options["queue"]), file=output, flush=True)
    async with connect(url, **broker_options) as broker, anyio.create_task_group() as tasks:
        if responder != "none":
            tasks.start_soon(_respond, broker, responder, agent, terminal, output)
        else:
            queue = broker_options["queue"]
            namespace = broker_options.get("namespace") or "toolnexus"
            print(
                f"demo: asking on queue {queue!r} of namespace {namespace!r} at "
                f"{redacted(broker.url)}; nothing in this process answers: a responder "
                f"worker must read that queue (toolnexus worker NAME --queue {queue})",
                file=output,
                flush=True,
            )
        async with load_mcp(
            booking_server(), wait_for=broker.wait_for, agent=agent, timeout_s=timeout_s
        ) as tools:
            result = await tools["book_table"](restaurant=restaurant)
        tasks.cancel_scope.cancel()
    return result


def result_text(result: CallToolResult) -> str:
    """The text of a tool result, as a person reads it."""
    texts = [block.text for block in result.content if isinstance(block, TextContent)]
    return "\n".join(texts) or json.dumps(result.structured_content)


if __name__ == "__main__":
    booking_server().run()
