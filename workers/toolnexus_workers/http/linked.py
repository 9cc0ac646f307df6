"""The single-use answer links' home: ``GET`` and ``POST /v1/links/TOKEN`` of the HTTP
answering API (:mod:`toolnexus_workers.links` makes and checks the tokens).

``GET`` describes the request (JSON, or a small page for a browser: the question, its
source, the time left, a tool call's arguments, and a form for an input request); it never
answers, so a mail scanner that prefetches a link uses nothing. ``POST`` answers:
``{"action": "accept", "data": {...}}`` (or the page's form), as ``link:RECIPIENT``,
signed with the worker's key. Refusals are ``{"error": ...}`` (or a polite page): 403 a
forged token, a token for another request or another action; 404 a request not open
here; 409 a request answered elsewhere; 410 an expired or used link, or a request closed
before the link was followed.
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import json
import time
from typing import Any

from starlette.requests import Request as HttpRequest
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from toolnexus import InvalidRequest
from toolnexus.rendering import Field, form_data, form_fields

from ..chat import header
from ..links import ACTIONS, BadLink, Claims, LinkKey, request_digest
from .app import Desk, Open, error, read_form, read_json, settle

DELIVERY_GRACE_S = 3.0
"""How long a followed link waits for its request to reach this worker (a webhook can be
faster than the worker's own delivery)."""

_LABELS = {"accept": "Approve", "decline": "Decline", "dismiss": "Dismiss"}


class AnswerLinks:
    """The link routes over ``desk``, for tokens signed with ``key`` (None: every link is
    refused, 404)."""

    def __init__(self, desk: Desk, key: LinkKey | None) -> None:
        self.desk, self.key = desk, key
        self.used: dict[str, float] = {}  # nonce -> its link's expiry

    def routes(self) -> list[Route]:
        return [Route("/v1/links/{token}", self.follow, methods=["GET", "POST"])]

    async def follow(self, request: HttpRequest) -> Response:
        wants_page = _wants_page(request)
        if self.key is None:
            message = "this worker takes no answer links: it has no link key"
            return _refusal(404, message, wants_page)
        try:
            claims = self.key.read(request.path_params["token"])
        except BadLink as exc:
            return _refusal(exc.status, str(exc), wants_page)
        found = await self.find(claims)
        if isinstance(found, BadLink):
            return _refusal(found.status, str(found), wants_page)
        if request.method == "GET":
            if wants_page:
                return HTMLResponse(_page(found, claims, request.url.path))
            return JSONResponse(_description(found, claims))
        return await self.answer(request, found, claims, wants_page)

    async def find(self, claims: Claims) -> Open | BadLink:
        """The open request ``claims`` answer, or why the link cannot be used."""
        if claims.nonce in self.used:
            return BadLink(410, "this link was used already: it answers once")
        where = (claims.queue, claims.request_id)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(DELIVERY_GRACE_S):
                while not self.desk.closed and where not in (*self.desk.open, *self.desk.ended):
                    await self.desk.changed()
        held = self.desk.open.get(where)
        if held is None:
            note = self.desk.ended.get(where)
            if note is not None:
                return BadLink(410, f"this request is closed, no answer is needed: {note}")
            return BadLink(404, "this request is not open here: it may have ended already")
        if request_digest(held.pending.request) != claims.digest:
            return BadLink(403, "this link was made for another request")
        return held

    async def answer(
        self, request: HttpRequest, held: Open, claims: Claims, wants_page: bool
    ) -> Response:
        form = "application/x-www-form-urlencoded" in request.headers.get("content-type", "")
        action: Any
        data: Any
        if form:
            submitted = await read_form(request)
            if isinstance(submitted, Response):
                return submitted
            action = (submitted.get("action") or [""])[-1]
            fields = _fields(held)
            data = form_data(fields, submitted) if fields and action == "accept" else None
        else:
            body = await read_json(request)
            if isinstance(body, Response):
                return body
            action, data = body.get("action"), body.get("data")
        if action not in ACTIONS:
            return error(400, f"action must be one of {', '.join(ACTIONS)}", field="action")
        if claims.action is not None and action != claims.action:
            message = f"this link may only {claims.action}, not {action}"
            return _refusal(403, message, wants_page)
        if action != "accept" and data is not None:
            return error(400, f"{action} takes no data", field="data")
        if claims.nonce in self.used:  # another use of the link came first
            return _refusal(410, "this link was used already: it answers once", wants_page)
        now = time.time()
        self.used = {n: t for n, t in self.used.items() if t > now}
        self.used[claims.nonce] = claims.expires_at  # taken while the answer is sent
        sent = await settle(self.desk, held, action, data, claims.person, "through a link")
        if sent.status_code != 200:  # not taken (an invalid form, say): the link still works
            self.used.pop(claims.nonce, None)
        if not wants_page:
            return sent
        outcome = json.loads(bytes(sent.body))
        if sent.status_code != 200:
            return _refusal(sent.status_code, outcome["error"], True)
        done = {"accept": "approved", "decline": "declined", "dismiss": "dismissed"}[action]
        if outcome["outcome"] == "voted":
            done = f"counted as a vote ({outcome['approvals']})"
        return HTMLResponse(_frame("Thank you", f"<p>The request was {done}.</p>"))


def _fields(held: Open) -> list[Field]:
    """The form fields of ``held``'s schema (none without one, or for one that cannot be
    shown: the answer is then checked, and refused, by the schema itself)."""
    schema = held.pending.request.schema
    if not schema:
        return []
    try:
        return form_fields(schema)
    except InvalidRequest:
        return []


def _wants_page(request: HttpRequest) -> bool:
    return "text/html" in request.headers.get("accept", "")


def _description(held: Open, claims: Claims) -> dict[str, Any]:
    return {
        "request": held.view(),
        "recipient": claims.recipient,
        "action": claims.action,
        "expires_at": claims.expires_at,
    }


def _refusal(status: int, message: str, page: bool) -> Response:
    if not page:
        return error(status, message)
    text = message[0].upper() + message[1:] + "."
    return HTMLResponse(_frame("Nothing to do here", f"<p>{html.escape(text)}</p>"), status)


def _frame(title: str, body: str) -> str:
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f'<meta name="referrer" content="no-referrer"><title>{html.escape(title)}</title>'
        "<style>body{font-family:system-ui,sans-serif;max-width:40rem;margin:2rem auto;"
        "padding:0 1rem}label{display:block;margin:.6rem 0 .2rem}button{margin:.8rem .4rem 0 0;"
        "padding:.4rem 1rem}pre{background:#f4f4f4;padding:.5rem;overflow:auto}</style>"
        f"</head><body><h1>{html.escape(title)}</h1>{body}</body></html>"
    )


def _page(held: Open, claims: Claims, path: str) -> str:
    request = held.pending.request
    parts = [f"<p>{html.escape(line)}</p>" for line in header(request)]
    call = request.data.get("tool_call") if isinstance(request.data, dict) else None
    if isinstance(call, dict):
        arguments = json.dumps(call.get("arguments"), indent=2, ensure_ascii=False)
        parts.append(f"<p>Tool call: <code>{html.escape(str(call.get('name')))}</code></p>")
        parts.append(f"<pre>{html.escape(arguments)}</pre>")
    if request.url:
        parts.append(f"<p>Link: <code>{html.escape(request.url)}</code> (not opened here)</p>")
    fields = _fields(held) if claims.action in (None, "accept") else []
    inputs = "".join(_input(f) for f in fields)
    actions = [claims.action] if claims.action else ["accept", "decline"]
    buttons = "".join(f'<button name="action" value="{a}">{_LABELS[a]}</button>' for a in actions)
    parts.append(f'<form method="post" action="{html.escape(path)}">{inputs}{buttons}</form>')
    parts.append(f"<p><small>Sent to {html.escape(claims.recipient)}; works once.</small></p>")
    return _frame("A request for you", "".join(parts))


def _input(f: Field) -> str:
    text, chosen = f.state(None)
    label = f'<label for="{f.input_name}">{html.escape(f.title)}</label>'
    name = html.escape(f.input_name)
    attributes = "".join(f' {k}="{html.escape(v)}"' if v else f" {k}" for k, v in f.attributes)
    if f.widget in ("select", "checks"):
        kind = "radio" if f.widget == "select" else "checkbox"
        return label + "".join(
            f'<label><input type="{kind}" name="{name}" value="{i}"'
            f"{' checked' if i in chosen else ''}> {html.escape(title)}</label>"
            for i, (_, title) in enumerate(f.choices)
        )
    if f.widget == "checkbox":
        checked = " checked" if chosen else ""
        box = f'<input type="checkbox" name="{name}" value="1"{checked}>'
        return f"<label>{box} {html.escape(f.title)}</label>"
    kind = {"integer": "number", "date-time": "text"}.get(f.widget, f.widget)
    value = html.escape(text)
    return f'{label}<input id="{name}" type="{kind}" name="{name}" value="{value}"{attributes}>'
