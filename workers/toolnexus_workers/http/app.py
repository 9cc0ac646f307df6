"""The HTTP answering API: open requests as JSON, answered by any HTTP client (issue #29).
Described in ``openapi.json`` beside this file, served at ``GET /openapi.json``.

- ``GET /v1/requests`` (``?queue=``, ``?kind=``, ``?source=``): the open requests of the
  queues the bearer token may use, newest first, and the ``cursor`` to follow events from.
- ``GET /v1/requests/{id}``: one of them (``?queue=`` picks among queues sharing an id;
  an id is percent-encoded, ``/`` as ``%2F``).
- ``POST /v1/requests/{id}/answer``: ``{"action": "accept", "data": {...}}``, ``decline``
  (with an optional ``"message"``: why not, which a tool approval's denial tells the
  model) or ``dismiss``, sent as the token's name (``person``), signed with the worker's key. A
  form's data is checked against the request's schema as every responder checks it (422
  ``{"error", "field", "rule"}``).
- ``GET /v1/events?after=CURSOR&wait=S``: long polling: the changes after ``CURSOR``
  (``shown``, ``gone``, ``progress``, ``escalated``), waiting up to ``S`` seconds for one.

Errors are ``{"error": "..."}``: 400 (a bad body or parameter, named), 401 (no, an unknown
or a revoked token), 403 (a queue the token may not use, or a request whose allow-list does
not name the token's person), 404 (no such open request visible to the token: a request of
another queue is 404 too), 409 (already answered, expired or withdrawn; a second vote), 413,
422, 503 (Redis unreachable, or the tokens file unreadable).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from toolnexus import (
    BrokerUnavailable,
    ConfigurationError,
    InvalidAnswer,
    NotResolved,
    Pending,
    Worker,
)
from toolnexus.errors import AlreadyVoted, NotAllowed
from toolnexus.models import ApprovedEvent, EndedEvent, EscalatedEvent
from toolnexus.rendering import escalated_note, gone_note
from toolnexus.responders import approvals_line

from .. import bodies
from ..views import request_view
from .tokens import Grant, Tokens

log = logging.getLogger("toolnexus.http")

OPENAPI = Path(__file__).with_name("openapi.json")
"""The API's OpenAPI 3.1 document."""


JOURNAL_SIZE = 10_000
"""Events kept for followers; one further behind is told to list again (``reset``); as
many ended requests are remembered, with how they ended, for the links followed late."""

MAX_WAIT_S = 60.0
"""The longest ``?wait=`` of ``GET /v1/events`` by default (``--max-wait-s``)."""

DEFAULT_WAIT_S = 25.0
"""How long ``GET /v1/events`` waits without ``?wait=``."""

ACTIONS = ("accept", "decline", "dismiss")
MAX_MESSAGE_CHARS = 2000
"""The longest message a decline may carry (the OpenAPI document says the same)."""


@dataclass
class Open:
    """A request held open by this worker, on queue ``queue``."""

    queue: str
    pending: Pending
    approvals: str | None = None
    escalated: list[str] = field(default_factory=list)

    def view(self) -> dict[str, Any]:
        """The request as the API shows it."""
        return {
            **request_view(self.queue, self.pending),
            "approvals": self.approvals,
            "escalated_to": list(self.escalated),
        }

    def matches(self, source: str | None, kind: str | None) -> bool:
        request = self.pending.request
        if kind is not None and request.kind != kind:
            return False
        if source is None:
            return True
        where = request.source
        return source in (where.agent, where.server, where.tool)


class Desk:
    """The open requests of every served queue and the journal of their changes."""

    def __init__(self) -> None:
        self.open: dict[tuple[str, str], Open] = {}
        self.journal: deque[dict[str, Any]] = deque(maxlen=JOURNAL_SIZE)
        self.ended: dict[tuple[str, str], str] = {}  # (queue, id) -> how it ended
        self.cursor = 0
        self.closed = False
        self._changed = asyncio.Event()

    def record(self, kind: str, held: Open, note: str = "") -> None:
        self.cursor += 1
        entry: dict[str, Any] = {
            "seq": self.cursor,
            "event": kind,
            "queue": held.queue,
            "id": held.pending.request.id,
            "note": note,
        }
        if kind != "gone":
            entry["request"] = held.view()
        self.journal.append(entry)
        self._changed.set()
        self._changed = asyncio.Event()

    def show(self, queue: str, pending: Pending) -> None:
        held = Open(queue, pending)
        self.open[(queue, pending.request.id)] = held
        self.record("shown", held)

    def remove(self, queue: str, request_id: str, note: str) -> None:
        held = self.open.pop((queue, request_id), None)
        if held is not None:
            self.ended[(queue, request_id)] = note
            if len(self.ended) > JOURNAL_SIZE:
                del self.ended[next(iter(self.ended))]
            self.record("gone", held, note)

    def progress(self, queue: str, event: ApprovedEvent) -> None:
        held = self.open.get((queue, event.id))
        if held is not None:
            held.approvals = approvals_line(event)
            self.record("progress", held, held.approvals)

    def escalate(self, queue: str, request_id: str, to: str) -> None:
        held = self.open.get((queue, request_id))
        if held is not None:
            if to not in held.escalated:
                held.escalated.append(to)
            self.record("escalated", held, escalated_note(held.escalated))

    async def changed(self) -> None:
        """Wait until the next change (or :meth:`close`)."""
        if not self.closed:
            await self._changed.wait()

    def close(self) -> None:
        """Wake every follower: the worker is stopping."""
        self.closed = True
        self._changed.set()


class HttpWorker(Worker):
    """Holds every delivered request of ``queue`` on ``desk`` until an API call answers it
    or it ends elsewhere."""

    group = "http"

    def __init__(self, desk: Desk, queue: str) -> None:
        self.desk, self.queue = desk, queue

    async def show(self, pending: Pending) -> None:
        self.desk.show(self.queue, pending)

    async def gone(self, pending: Pending, event: EndedEvent) -> None:
        self.desk.remove(self.queue, pending.request.id, gone_note(event))

    async def progress(self, pending: Pending, event: ApprovedEvent) -> None:
        self.desk.progress(self.queue, event)

    async def escalated(self, pending: Pending, event: EscalatedEvent) -> None:
        self.desk.escalate(self.queue, pending.request.id, event.queue or "another queue")

    def __repr__(self) -> str:
        return f"<HttpWorker {self.queue!r}>"


def error(status: int, message: str, **extra: Any) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse({"error": message, **extra}, status_code=status, headers=headers)


class HttpApi:
    """The API's routes over ``desk``, for the bearer tokens of ``tokens``; ``queues`` are
    the queues the worker serves. A long poll waits at most ``max_wait_s`` seconds."""

    def __init__(
        self, desk: Desk, tokens: Tokens, queues: list[str], *, max_wait_s: float = MAX_WAIT_S
    ) -> None:
        self.desk, self.tokens, self.queues = desk, tokens, queues
        self.max_wait_s = max_wait_s
        self._openapi = OPENAPI.read_bytes()

    def app(self, more: Sequence[Route] = ()) -> Starlette:
        """The API's application, with ``more`` routes (the answer links')."""
        return Starlette(
            routes=[
                *more,
                Route("/openapi.json", self.openapi, methods=["GET"]),
                Route("/v1/requests", self.listing, methods=["GET"]),
                Route("/v1/requests/{id:path}/answer", self.answer, methods=["POST"]),
                Route("/v1/requests/{id:path}", self.read, methods=["GET"]),
                Route("/v1/events", self.events, methods=["GET"]),
            ]
        )

    async def openapi(self, request: HttpRequest) -> Response:
        return Response(self._openapi, media_type="application/json")

    def grant(self, request: HttpRequest) -> Grant | Response:
        """The token's entry, or the 401 (503: the tokens file is unreadable) to send."""
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return error(401, "a bearer token is required (Authorization: Bearer TOKEN)")
        try:
            grant = self.tokens.grant(token.strip())
        except ConfigurationError as exc:
            log.error("refusing every token: %s", exc)
            return error(503, "the tokens file cannot be read: ask the operator")
        if grant is None:
            return error(401, "unknown or revoked token")
        return grant

    def visible(self, grant: Grant, request: HttpRequest) -> list[str] | Response:
        """The queues this call may see (``?queue=`` narrows them), or a 403."""
        queue = request.query_params.get("queue")
        if queue is None:
            return [q for q in self.queues if grant.may(q)]
        if queue not in self.queues or not grant.may(queue):
            return error(403, f"this token may not use queue {queue[:100]!r}")
        return [queue]

    async def listing(self, request: HttpRequest) -> Response:
        grant = self.grant(request)
        if isinstance(grant, Response):
            return grant
        queues = self.visible(grant, request)
        if isinstance(queues, Response):
            return queues
        kind = request.query_params.get("kind")
        source = request.query_params.get("source")
        held = [h for h in self.desk.open.values() if h.queue in queues and h.matches(source, kind)]
        held.sort(key=lambda h: h.pending.request.created_at, reverse=True)
        return JSONResponse({"requests": [h.view() for h in held], "cursor": self.desk.cursor})

    def find(self, request: HttpRequest) -> tuple[Grant, Open] | Response:
        grant = self.grant(request)
        if isinstance(grant, Response):
            return grant
        queues = self.visible(grant, request)
        if isinstance(queues, Response):
            return queues
        request_id = request.path_params["id"]
        for queue in queues:
            held = self.desk.open.get((queue, request_id))
            if held is not None:
                return grant, held
        return error(404, f"no open request {request_id[:100]!r} in this token's queues")

    async def read(self, request: HttpRequest) -> Response:
        found = self.find(request)
        if isinstance(found, Response):
            return found
        return JSONResponse(found[1].view())

    async def answer(self, request: HttpRequest) -> Response:
        found = self.find(request)
        if isinstance(found, Response):
            return found
        grant, held = found
        body = await read_json(request)
        if isinstance(body, Response):
            return body
        action = body.get("action")
        if action not in ACTIONS:
            return error(400, f"action must be one of {', '.join(ACTIONS)}", field="action")
        if action != "accept" and body.get("data") is not None:
            return error(400, f"{action} takes no data", field="data")
        message = body.get("message")
        if message is not None and (action != "decline" or not isinstance(message, str)):
            return error(400, "message is a decline's text, why not", field="message")
        if message is not None and len(message) > MAX_MESSAGE_CHARS:
            return error(
                400, f"message is longer than {MAX_MESSAGE_CHARS} characters", field="message"
            )
        return await settle(
            self.desk, held, action, body.get("data"), grant.person, "over HTTP", message
        )

    async def events(self, request: HttpRequest) -> Response:
        grant = self.grant(request)
        if isinstance(grant, Response):
            return grant
        queues = self.visible(grant, request)
        if isinstance(queues, Response):
            return queues
        after = number(request, "after", self.desk.cursor, integer=True)
        wait_s = number(request, "wait", DEFAULT_WAIT_S)
        if isinstance(after, Response):
            return after
        if isinstance(wait_s, Response):
            return wait_s
        wait_s = min(wait_s, self.max_wait_s)
        deadline = asyncio.get_running_loop().time() + wait_s
        while True:
            journal = self.desk.journal
            reset = after > self.desk.cursor or (bool(journal) and journal[0]["seq"] > after + 1)
            found = [e for e in journal if e["seq"] > after and e["queue"] in queues]
            left = deadline - asyncio.get_running_loop().time()
            if found or reset or left <= 0 or self.desk.closed:
                cursor = self.desk.cursor
                return JSONResponse({"events": found, "cursor": cursor, "reset": reset})
            after = self.desk.cursor  # nothing visible up to here
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(left):
                    await self.desk.changed()


async def settle(
    desk: Desk,
    held: Open,
    action: str,
    data: Any,
    person: str,
    how: str,
    message: str | None = None,
) -> JSONResponse:
    """Answer ``held`` by ``action`` (with ``data`` to accept; a decline with ``message``,
    which a tool approval's denial hands to the model) as ``person``: 200 with
    ``{"outcome": "answered"}`` (or ``"voted"`` for a quorum's vote that did not decide),
    or the error saying why not."""
    pending = held.pending
    try:
        if action == "accept":
            progress = await pending.accept(data, person=person)
        elif action == "decline":
            progress = await pending.decline(message or None, person=person)
        else:
            progress = await pending.dismiss(person=person)
    except InvalidAnswer as exc:
        return error(422, str(exc), field=exc.field, rule=exc.rule)
    except NotAllowed as exc:
        return error(403, f"{person!r} may not answer this request: {exc.reason}")
    except AlreadyVoted as exc:
        return error(409, f"not counted: {exc.reason}")
    except NotResolved as exc:
        desk.remove(held.queue, pending.request.id, f"Not answered: {exc.reason}.")
        return error(409, f"not answered: this request was {exc.reason}")
    except BrokerUnavailable as exc:
        return error(503, f"the broker cannot be reached: {exc}")
    if progress is not None:  # a quorum's vote, counted: it stays open for others
        desk.progress(held.queue, progress)
        return JSONResponse({"outcome": "voted", "approvals": held.approvals})
    done = {"accept": "Accepted", "decline": "Declined", "dismiss": "Dismissed"}[action]
    desk.remove(held.queue, pending.request.id, f"{done} by {person} {how}.")
    log.info("request %s %s by %s %s", pending.request.id, action, person, how)
    return JSONResponse({"outcome": "answered"})


def number(
    request: HttpRequest, name: str, default: float, *, integer: bool = False
) -> float | Response:
    """The query parameter ``name`` (0 or more), or a 400 naming it."""
    text = request.query_params.get(name)
    if text is None:
        return default
    try:
        value = float(int(text)) if integer else float(text)
    except (ValueError, OverflowError):
        value = -1.0
    if not 0 <= value < float("inf"):
        kind = "a whole number" if integer else "a number"
        return error(400, f"{name} must be {kind}, 0 or more, not {text[:20]!r}", field=name)
    return value


async def read_body(request: HttpRequest) -> bytes | Response:
    """The body, or the 413 response when it is over
    :data:`~toolnexus_workers.bodies.MAX_BODY_BYTES`."""
    try:
        return await bodies.read_body(request.stream())
    except bodies.BadBody as bad:
        return error(bad.status, bad.reason)


async def read_json(request: HttpRequest) -> dict[str, Any] | Response:
    """The body as a JSON object, or the 400/413 response naming what is wrong
    (:mod:`toolnexus_workers.bodies`)."""
    try:
        raw = await bodies.read_body(request.stream())
        return bodies.json_object(raw, '{"action": "accept", "data": ...}')
    except bodies.BadBody as bad:
        return error(bad.status, bad.reason)


async def read_form(request: HttpRequest) -> bodies.Form | Response:
    """The body as a URL-encoded form, or the 400/413 response naming what is wrong."""
    try:
        return bodies.form(await bodies.read_body(request.stream()))
    except bodies.BadBody as bad:
        return error(bad.status, bad.reason)


def openapi_document() -> dict[str, Any]:
    """The API's OpenAPI document, parsed."""
    document: dict[str, Any] = json.loads(OPENAPI.read_bytes())
    return document
