"""The web page (starlette): open requests, live over server-sent events, answered by form.

Routes: ``GET /`` the page; ``GET /events`` its live changes (SSE: ``reset`` with
every card, then ``shown`` and ``gone``); ``POST /answer`` one answer (``request``,
``action`` accept/decline/dismiss, ``csrf``, and ``field.<name>`` inputs); ``GET|POST
/login`` and ``POST /logout``; ``/static/`` the page's own script and style sheet.

Security: every answer needs a session's CSRF token (or a bearer token header, which
a browser never sends by itself); a cross-site ``Origin`` or ``Sec-Fetch-Site`` is
refused; an open page (no token, no users) answers only to loopback host names, so
a rebound DNS name cannot reach it; a strict Content-Security-Policy allows only the
page's own files, and the page never loads an authorization URL. Sign-ins back off
after repeated failures (429 with ``Retry-After``, see :mod:`.access`).
"""

from __future__ import annotations

import json
import re
import secrets
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.applications import Starlette
from starlette.requests import Request as HttpRequest
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from toolnexus import Request
from toolnexus.errors import (
    AlreadyVoted,
    BrokerUnavailable,
    InvalidAnswer,
    InvalidRequest,
    NotResolved,
)
from toolnexus.rendering import (
    KNOWN_DOMAINS,
    SHORT_CHARS,
    Field,
    Link,
    Submitted,
    ToolCallView,
    argument_changes,
    check_link,
    escalated_note,
    field_errors,
    form_data,
    form_fields,
    kind_label,
    message_for_field,
    request_anchor,
    shorten,
    standing_notes,
    tool_call_fields,
    tool_call_view,
)
from toolnexus.responders import is_loopback, validate_form

from .. import bodies
from .access import TOKEN_PERSON, Access, SignIn
from .board import Board, Change

HERE = Path(__file__).parent
SESSION_COOKIE = "toolnexus_session"
MAX_FORM_BYTES = 256 * 1024
FETCH_HEADER = "x-toolnexus-fetch"
"""Sent by the page's script with each answer: the reply is JSON, not a whole page."""

CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
SECURITY_HEADERS = [
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"referrer-policy", b"no-referrer"),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"x-dns-prefetch-control", b"off"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cross-origin-resource-policy", b"same-origin"),
]
MESSAGE_INPUT = "message"
"""A tool approval's form input for the message a denial gives the agent."""
_ACTIONS = ("accept", "decline", "dismiss")
FAVICON = (HERE / "static" / "favicon.svg").read_bytes()
"""The page's icon (also at ``/static/favicon.svg``), served at ``/favicon.ico``."""


@dataclass(frozen=True)
class Identity:
    """Who is asking the page: ``person`` for answers (``None`` on an open page) and the
    CSRF token their forms carry (``None`` for a bearer-token header: nothing to forge)."""

    person: str | None
    csrf: str | None
    session: str | None = None


@dataclass(frozen=True)
class FieldView:
    """One field as the page shows it: its DOM id, value, choices and message."""

    field: Field
    id: str
    text: str
    chosen: frozenset[int]
    error: str | None
    proposed: str | None = None  # a tool approval's proposed value, as the input holds it

    @property
    def long(self) -> bool:
        """Whether a tool approval's argument is too long for a line: folded
        (``<details>``) on the page, open once it is not the proposed value."""
        return self.proposed is not None and (len(self.text) > SHORT_CHARS or "\n" in self.text)


@dataclass(frozen=True)
class Card:
    """One request as the page shows it."""

    request: Request
    key: str
    kind: str
    who: list[tuple[str, str]]
    asked: str
    left: str
    fields: list[FieldView]
    problem: str | None
    link: Link | None
    error: str | None
    notes: list[str] = field(default_factory=list)  # default on expiry, durable (SPEC §14)
    approvals: str | None = None  # a quorum's progress (SPEC §14): "1 of 2 approvals: ..."
    escalated: str = ""  # where it escalated to while shown here (SPEC §14), as a note
    signer: str | None = None  # the trusted key whose signature on the request verified
    name: str = ""  # what notes call it: kind, source and prompt
    tool: ToolCallView | None = None  # a tool approval's call: its tool and arguments


class SecurityHeaders:
    """ASGI middleware adding the Content-Security-Policy and friends to every response."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        static = scope["path"].startswith("/static/")

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers += SECURITY_HEADERS
                if not static:
                    headers.append((b"cache-control", b"no-store"))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_headers)


class WebPage:
    """The page's routes over ``board``, for the people ``access`` lets in."""

    def __init__(
        self,
        board: Board,
        access: Access,
        *,
        known_domains: tuple[str, ...] = KNOWN_DOMAINS,
        ping_s: float = 15.0,
    ) -> None:
        self.board = board
        self.access = access
        self.known_domains = known_domains
        self.ping_s = ping_s
        self.open_csrf = secrets.token_urlsafe(32)  # an open page's forms carry it too
        self.templates = Environment(
            loader=FileSystemLoader(HERE / "templates"),
            autoescape=select_autoescape(default=True),
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self.templates.filters["breakable"] = breakable
        self.templates.filters["shorten"] = shorten

    def app(self) -> ASGIApp:
        """The ASGI application."""
        routes = [
            Route("/", self.page, methods=["GET"]),
            Route("/events", self.events, methods=["GET"]),
            Route("/answer", self.answer, methods=["POST"]),
            Route("/login", self.login, methods=["GET", "POST"]),
            Route("/logout", self.logout, methods=["POST"]),
            Route("/favicon.ico", self.favicon, methods=["GET"]),
            Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
        ]
        return SecurityHeaders(Starlette(routes=routes))

    # -- who ------------------------------------------------------------------------

    def identity(self, request: HttpRequest) -> Identity | None:
        """Who sent ``request``, or ``None`` if they must sign in first."""
        if self.access.open:
            host = request.url.hostname or ""
            return Identity(None, self.open_csrf) if is_loopback(host) else None
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and token:
            person = self.access.person_for_token(token.strip())
            return Identity(person, None) if person else None
        sid = request.cookies.get(SESSION_COOKIE)
        session = self.access.session(sid)
        return Identity(session.person, session.csrf, sid) if session else None

    @staticmethod
    def cross_site(request: HttpRequest) -> bool:
        """Whether the browser says ``request`` comes from another site.

        ``Sec-Fetch-Site`` decides where a browser sends it (a form posted under
        ``Referrer-Policy: no-referrer`` has ``Origin: null``); else ``Origin``.
        """
        site = request.headers.get("sec-fetch-site")
        if site is not None:
            return site not in ("same-origin", "none")
        origin = request.headers.get("origin")
        return origin is not None and origin != f"{request.url.scheme}://{request.url.netloc}"

    # -- pages ----------------------------------------------------------------------

    async def favicon(self, request: HttpRequest) -> Response:
        """The page's icon, where browsers look for it first (it names nobody: no sign-in)."""
        return Response(
            FAVICON,
            media_type="image/svg+xml",
            headers={"cache-control": "public, max-age=86400"},
        )

    async def page(self, request: HttpRequest) -> Response:
        token = request.query_params.get("token")
        if token is not None and not self.access.open:
            attempt = self.access.sign_in_with_token(client_address(request), token)
            if attempt.person is None:
                return self.refused(attempt, "That token is not valid.")
            return self.signed_in(request, attempt.person)
        who = self.identity(request)
        if who is None:
            loopback_only = "Without sign-in, this page answers at 127.0.0.1 or localhost only."
            return self.login_page(loopback_only if self.access.open else None, status_code=401)
        return HTMLResponse(self.render_page(who))

    def render_page(self, who: Identity, replaced: Card | None = None) -> str:
        cards = [self.card(p.request) for p in self.board.newest_first()]
        if replaced is not None:
            cards = [replaced if c.key == replaced.key else c for c in cards]
        return self.templates.get_template("page.html").render(
            cards=cards,
            who=who,
            now=time.time(),
            open=self.access.open,
            by_token=who.person == TOKEN_PERSON,
        )

    def render_cards(self, cards: list[Card], who: Identity) -> str:
        template = self.templates.get_template("cards.html")
        return template.render(cards=cards, who=who, now=time.time())

    def login_page(self, error: str | None, *, status_code: int, name: str = "") -> Response:
        html = self.templates.get_template("login.html").render(
            error=error,
            token=self.access.token is not None,
            users=bool(self.access.users),
            name=name,
        )
        return HTMLResponse(html, status_code=status_code)

    def signed_in(self, request: HttpRequest, person: str) -> Response:
        """Open a session for ``person`` and send the browser to the page (the token, if it
        came in the address, leaves the address bar)."""
        response = RedirectResponse("/", status_code=303)
        response.set_cookie(
            SESSION_COOKIE,
            self.access.sign_in(person),
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )
        return response

    async def login(self, request: HttpRequest) -> Response:
        if request.method == "GET" or self.access.open:
            if self.access.open:
                return RedirectResponse("/", status_code=303)
            return self.login_page(None, status_code=200)
        if self.cross_site(request):
            return Response("cross-site sign-in refused", status_code=403)
        form = await read_form(request)
        if form is None:
            return Response("a sign-in must be a form of at most 256 KiB", status_code=400)
        token, name = _last(form, "token"), _last(form, "name")
        client = client_address(request)
        if token:
            attempt = self.access.sign_in_with_token(client, token)
        else:
            password = _last(form, "password")
            attempt = await self.access.sign_in_with_password(client, name, password)
        if attempt.person is None:
            return self.refused(attempt, "Wrong token, name or password.", name=name)
        return self.signed_in(request, attempt.person)

    def refused(self, attempt: SignIn, error: str, *, name: str = "") -> Response:
        """The sign-in page after a failed ``attempt``: 401 with ``error``, or 429 with
        ``Retry-After`` when it was refused unchecked after too many failures."""
        if not attempt.retry_after_s:
            return self.login_page(error, status_code=401, name=name)
        wait = attempt.retry_after_s
        response = self.login_page(
            f"Too many failed sign-ins: try again in {wait} s.", status_code=429, name=name
        )
        response.headers["retry-after"] = str(wait)
        return response

    async def logout(self, request: HttpRequest) -> Response:
        who = self.identity(request)
        form = await read_form(request)
        if who is None or form is None or not self.csrf_ok(who, form):
            return Response("sign-out refused", status_code=403)
        self.access.sign_out(who.session)
        response = RedirectResponse("/login", status_code=303)
        response.delete_cookie(SESSION_COOKIE)
        return response

    # -- live -----------------------------------------------------------------------

    async def events(self, request: HttpRequest) -> Response:
        who = self.identity(request)
        if who is None:
            return Response("sign in first", status_code=401)
        return EventSourceResponse(
            self.stream(who), ping=self.ping_s, headers={"cache-control": "no-store"}
        )

    async def stream(self, who: Identity) -> AsyncIterator[ServerSentEvent]:
        with self.board.follow() as follower:
            cards = [self.card(p.request) for p in self.board.newest_first()]
            yield ServerSentEvent(self.render_cards(cards, who), event="reset")
            async for change in follower:
                yield self.change_event(change, who)

    def change_event(self, change: Change, who: Identity) -> ServerSentEvent:
        request = change.pending.request
        key = request_anchor(request.id)
        if change.kind == "shown":
            html = self.render_cards([self.card(request)], who)
            payload = {"key": key, "created": request.created_at, "html": html}
        elif change.kind == "progress":
            payload = {"key": key, "approvals": change.note}
        elif change.kind == "escalated":
            payload = {"key": key, "note": change.note}
        else:
            payload = {"key": key, "note": note_text(request, change.note)}
        return ServerSentEvent(json.dumps(payload), event=change.kind)

    # -- answers --------------------------------------------------------------------

    def csrf_ok(self, who: Identity, form: Submitted) -> bool:
        if who.csrf is None:
            return True
        return secrets.compare_digest(_last(form, "csrf").encode(), who.csrf.encode())

    async def answer(self, request: HttpRequest) -> Response:
        who = self.identity(request)
        if who is None:
            return Response("sign in first", status_code=401)
        if self.cross_site(request):
            return Response("cross-site answer refused", status_code=403)
        form = await read_form(request)
        if form is None:
            return Response("an answer must be a form of at most 256 KiB", status_code=400)
        if not self.csrf_ok(who, form):
            return Response("this form is stale or forged: reload the page", status_code=403)
        action = _last(form, "action")
        if action not in _ACTIONS:
            return Response(f"action must be one of {', '.join(_ACTIONS)}", status_code=400)
        request_id = _last(form, "request")
        pending = self.board.get(request_id)
        fetch = FETCH_HEADER in request.headers
        if pending is None:
            return self.outcome(fetch, who, "gone", "This request is no longer open.")
        req = pending.request
        tool = self.tool_view(req)
        data: Any = None
        if action == "accept" and req.schema is not None:
            try:
                fields = self.fields(req, tool)
            except InvalidRequest as exc:
                card = self.card(req, error=f"This form cannot be answered here: {exc}")
                return self.outcome(fetch, who, "invalid", "", card)
            data = form_data(fields, form) if fields else None
            errors = field_errors(req.schema, fields, data) if fields else {}
            if errors:
                return self.outcome(fetch, who, "invalid", "", self.card(req, form, errors))
        message = _last(form, MESSAGE_INPUT).strip() if tool is not None else ""
        try:
            if action == "accept":
                progress = await pending.accept(data, person=who.person)
            elif action == "decline":  # a tool approval's message is for the model
                progress = await pending.decline(message or None, person=who.person)
            else:
                progress = await pending.dismiss(person=who.person)
        except AlreadyVoted as exc:  # the card stays, for others to vote on
            card = self.card(req, error=f"Not counted: {exc.reason}.")
            return self.outcome(fetch, who, "invalid", "", card, status_code=409)
        except InvalidAnswer as exc:
            errors = {exc.field: message_for_field(exc, exc.field)} if exc.field else {}
            card = self.card(req, form, errors, error=None if exc.field else str(exc))
            return self.outcome(fetch, who, "invalid", "", card)
        except NotResolved as exc:
            note = f"Not sent: this request was {exc.reason} before your answer."
            self.board.remove(request_id, note)
            return self.outcome(fetch, who, "gone", note_text(req, note))
        except BrokerUnavailable:
            card = self.card(req, form, error="The broker cannot be reached: try again.")
            return self.outcome(fetch, who, "invalid", "", card, status_code=503)
        done = {"accept": "Accepted", "decline": "Declined", "dismiss": "Dismissed"}[action]
        if tool is not None:
            done = self.tool_outcome(req, action, data, message)
        if progress is not None:  # a quorum's vote, counted: the card stays for others
            self.board.progress(progress)
            note = f"{done}: your vote is counted ({self.board.approvals(request_id)})."
            return self.outcome(fetch, who, "voted", note, self.card(req))
        by = f" by {who.person}" if who.person else ""
        self.board.remove(request_id, f"{done} on this page{by}, in another tab or browser.")
        return self.outcome(fetch, who, "sent", note_text(req, f"{done}: the agent is told."))

    def outcome(
        self,
        fetch: bool,
        who: Identity,
        outcome: str,
        note: str,
        card: Card | None = None,
        *,
        status_code: int | None = None,
    ) -> Response:
        status = status_code or (422 if outcome == "invalid" else 200)
        if fetch:
            html = self.render_cards([card], who) if card is not None else None
            return JSONResponse(
                {"outcome": outcome, "note": note, "card": html}, status_code=status
            )
        if card is None:
            return RedirectResponse("/", status_code=303)
        return HTMLResponse(self.render_page(who, replaced=card), status_code=status)

    @staticmethod
    def fields(request: Request, tool: ToolCallView | None) -> list[Field]:
        """The fields of ``request``'s form; a tool approval's that edit its arguments
        (none: its arguments are shown as they are, approved as proposed or denied).

        Raises:
            InvalidRequest: the schema is not a form (:func:`toolnexus.rendering.form_fields`).
        """
        if tool is not None:
            return tool_call_fields(request) or []
        return form_fields(request.schema or {})

    @staticmethod
    def tool_view(request: Request) -> ToolCallView | None:
        """The call a tool approval proposes (None: not a tool approval, or a malformed one,
        which shows as a plain request)."""
        if request.kind != "tool_call":
            return None
        try:
            return tool_call_view(request)
        except InvalidRequest:
            return None

    @staticmethod
    def tool_outcome(request: Request, action: str, data: Any, message: str) -> str:
        """What a tool approval's answer did, in words: approved as proposed, or with each
        change from the proposal (``Approved with changes (Amount: 10 → 3)``); denied, with
        its message."""
        if action == "dismiss":
            return "Dismissed"
        if action == "decline":
            return f"Denied (“{shorten(message, 120)}”)" if message else "Denied"
        if data is None or request.schema is None:
            return "Approved as proposed"
        changes = argument_changes(request, validate_form(request.schema, data))
        if not changes:
            return "Approved as proposed"
        return f"Approved with changes ({'; '.join(str(c) for c in changes)})"

    # -- cards ----------------------------------------------------------------------

    def card(
        self,
        request: Request,
        submitted: Submitted | None = None,
        errors: Mapping[str, str] | None = None,
        *,
        error: str | None = None,
    ) -> Card:
        """The view of ``request``: with ``submitted`` values and ``errors`` after a refusal."""
        key = request_anchor(request.id)
        tool = self.tool_view(request)
        errors = errors or {}
        views: list[FieldView] = []
        problem = None
        schema = request.schema
        if schema is not None:
            try:
                fields = self.fields(request, tool)
            except InvalidRequest as exc:
                problem = f"This form cannot be shown here: {exc}"
            else:
                for index, f in enumerate(fields):
                    text, chosen = f.state(submitted)
                    message = errors.get(f.name)
                    if message is not None:
                        message = labelled(message, fields)
                    proposed = proposed_key(f) if tool is not None else None
                    views.append(FieldView(f, f"{key}-f{index}", text, chosen, message, proposed))
                if error is not None:
                    error = labelled(error, fields)
        source = request.source
        who = [
            (label, value)
            for label, value in (
                ("server", source.server),
                ("tool", source.tool),
                ("agent", source.agent),
            )
            if value
        ]
        link = None
        if request.kind == "authorization" and request.url:
            link = check_link(request.url, self.known_domains)
        asked = datetime.fromtimestamp(request.created_at, UTC)
        escalated = self.board.escalations(request.id)
        shown = self.board.get(request.id)
        return Card(
            request=request,
            key=key,
            kind=kind_label(request.kind),
            who=who,
            asked=asked.isoformat(timespec="seconds"),
            left=time_left(request.expires_at),
            fields=views,
            problem=problem,
            link=link,
            error=error,
            approvals=self.board.approvals(request.id)
            or (f"0 of {request.quorum.need} approvals" if request.quorum else None),
            notes=standing_notes(request),
            escalated=escalated_note(escalated) if escalated else "",
            signer=shown.signer if shown is not None else None,
            name=request_name(request),
            tool=tool,
        )


def proposed_key(f: Field) -> str:
    """A field's proposed value as its input holds it, for the page's script to tell an
    edit: the text; ``true``/``false`` for a checkbox; the chosen positions, comma-separated,
    for a choice."""
    text, chosen = f.state(None)
    if f.widget == "checkbox":
        return "true" if chosen else "false"
    if f.widget in ("select", "checks"):
        return ",".join(str(i) for i in sorted(chosen))
    return text


def time_left(expires_at: float | None) -> str:
    """How long until ``expires_at`` (a Unix time), in words; ``""`` for no deadline."""
    if expires_at is None:
        return ""
    left_s = int(expires_at - time.time())
    if left_s <= 0:
        return "expired"
    if left_s < 60:
        return f"{left_s} s left"
    if left_s < 3600:
        return f"{left_s // 60} min {left_s % 60} s left"
    return f"{left_s // 3600} h {left_s % 3600 // 60} min left"


def request_name(request: Request) -> str:
    """What a note calls ``request``: its kind, where it comes from and its prompt, e.g.
    ``Question from agent ci-bot (tool deploy): “Ship it?”``."""
    kind = kind_label(request.kind)
    source = request.source
    origin = source.agent or source.server
    name = f"{kind} from {'agent' if source.agent else 'server'} {origin}" if origin else kind
    if source.tool:
        name += f" (tool {source.tool})"
    prompt = " ".join(request.prompt.split())
    if prompt:
        name += f": “{prompt if len(prompt) <= 60 else prompt[:59] + '…'}”"
    return name


def note_text(request: Request, note: str) -> str:
    """``note`` about ``request``, naming it (see :func:`request_name`)."""
    return f"{request_name(request)} — {note}"


def labelled(message: str, fields: Sequence[Field]) -> str:
    """``message`` with each field named by its label rather than its key (``field
    'max_cost' is required`` → ``“Maximum cost” is required``)."""
    for f in fields:
        message = message.replace(f"field {f.name!r}", f"“{f.title}”")
    return message


_BREAKS = re.compile(r"(?<=[/?&=#.\-_~:@])")


def breakable(text: str) -> Markup:
    """``text`` (a piece of a URL), escaped, with a line break allowed after each ``/``,
    ``.``, ``?``, ``&``, ... (``<wbr>``), so a narrow screen breaks it where a reader
    expects rather than in the middle of a name."""
    return Markup("<wbr>").join(_BREAKS.split(text))


async def read_form(request: HttpRequest) -> Submitted | None:
    """The URL-encoded form in ``request``'s body (the shared rule,
    :mod:`toolnexus_workers.bodies`, at most :data:`MAX_FORM_BYTES`); ``None`` if it is not
    one, too big or not UTF-8."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip()
    if content_type != "application/x-www-form-urlencoded":
        return None
    try:
        return bodies.form(await bodies.read_body(request.stream(), MAX_FORM_BYTES))
    except bodies.BadBody:
        return None


def client_address(request: HttpRequest) -> str:
    """The address ``request`` came from (uvicorn takes it from ``X-Forwarded-For`` only
    when a proxy it trusts sends it: loopback, by default)."""
    return request.client.host if request.client is not None else ""


def _last(form: Submitted, name: str) -> str:
    values = form.get(name)
    return values[-1] if values else ""
