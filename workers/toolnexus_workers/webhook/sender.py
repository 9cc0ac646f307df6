"""Webhooks out: each request of a queue POSTed as JSON to the configured endpoints, signed
as the Standard Webhooks specification describes, with a single-use answer link.

Every message has a ``webhook-id`` that is the same on every retry and on a delivery after
a restart (``REQUEST_ID.open``, ``REQUEST_ID.ended``, ``REQUEST_ID.reminder.N``), so a
receiver drops repeats by it; ``webhook-timestamp`` and ``webhook-signature`` (``v1,`` and
the base64 HMAC-SHA256 of ``ID.TIMESTAMP.BODY`` under the endpoint secret) are made anew
for each attempt. A delivery that fails (a network error, or a status other than 2xx) is
tried again after 1, 2, 4, ... seconds (at most ``max_delay_s``), ``attempts`` times in
all.

The body is ``{"type": ..., "timestamp": ..., "data": {...}}``:

- ``request.open``: ``data.request`` (as the HTTP API shows it), ``data.answer_link`` (POST
  ``{"action": "accept", "data": ...}`` to it: it answers once, as ``link:webhook:NAME``),
  ``data.time_left_s`` (None: no deadline);
- ``request.reminder``: the same, for a request still open after ``remind_after_s``;
- ``request.answered``, ``request.expired``, ``request.withdrawn``: ``data.id``,
  ``data.queue``, ``data.note`` (how it ended) and ``data.outcome`` (``ok``, ``reason``,
  ``person``, where known).
"""

from __future__ import annotations

import asyncio
import datetime
import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx
from standardwebhooks import Webhook

from toolnexus import Pending, Worker
from toolnexus.models import AnsweredEvent, EndedEvent, ExpiredEvent
from toolnexus.rendering import gone_note

from ..delivery import Retry, deliver
from ..links import LinkKey, link_url
from ..reminders import Reminders
from ..views import request_view

log = logging.getLogger("toolnexus.webhook")

TIMEOUT_S = 10.0
"""How long one delivery attempt may take."""


@dataclass(frozen=True)
class Endpoint:
    """Where messages go: ``url``, named ``name`` (its links' recipient, ``webhook:NAME``)."""

    url: str
    name: str

    @classmethod
    def parse(cls, text: str) -> Endpoint:
        """``NAME=URL``, or a bare ``URL`` named by its host."""
        name, sep, url = text.partition("=")
        if not sep or "://" in name:
            name, url = urlsplit(text).hostname or text, text
        return cls(url, name)


class WebhookWorker(Worker):
    """Announces every request of ``queue`` to ``endpoints`` (signed with ``secret``, a
    ``whsec_`` Standard Webhooks secret) with an answer link made by ``links`` for the HTTP
    answering API at ``link_base``; again after ``remind_after_s`` if given; and when it
    ends. Use :meth:`aclose` to stop the deliveries still being tried."""

    group = "webhook"

    def __init__(
        self,
        queue: str,
        endpoints: Sequence[Endpoint],
        secret: str,
        links: LinkKey,
        link_base: str,
        *,
        retry: Retry | None = None,
        remind_after_s: float | None = None,
    ) -> None:
        self.queue, self.endpoints = queue, list(endpoints)
        self.signer = Webhook(secret)
        self.links, self.link_base = links, link_base
        self.retry = retry or Retry()
        self.client = httpx.AsyncClient(timeout=TIMEOUT_S)
        self.reminders = Reminders(remind_after_s, self._remind)
        self._open: dict[str, list[asyncio.Task[None]]] = {}  # request id -> its deliveries
        self._ending: set[asyncio.Task[None]] = set()
        self.delivered = self.failed = 0

    async def show(self, pending: Pending) -> None:
        request_id = pending.request.id
        if request_id in self._open:  # delivered again (at least once): already announced
            return
        self._open[request_id] = self._announce(pending, "request.open", f"{request_id}.open")
        self.reminders.start(pending)

    async def gone(self, pending: Pending, event: EndedEvent) -> None:
        self.reminders.stop(pending.request.id)
        for task in self._open.pop(pending.request.id, []):
            task.cancel()
        answer = event.answer
        outcome = None
        if answer is not None:
            outcome = {"ok": answer.ok, "reason": answer.reason, "person": answer.person}
        kind = (
            "answered"
            if isinstance(event, AnsweredEvent)
            else "expired"
            if isinstance(event, ExpiredEvent)
            else "withdrawn"
        )
        data = {
            "id": pending.request.id,
            "queue": self.queue,
            "note": gone_note(event),
            "outcome": outcome,
        }
        message = f"{pending.request.id}.ended"
        for endpoint in self.endpoints:
            task = asyncio.ensure_future(self._deliver(endpoint, message, f"request.{kind}", data))
            self._ending.add(task)
            task.add_done_callback(self._ending.discard)

    async def _remind(self, pending: Pending, count: int) -> None:
        request_id = pending.request.id
        reminders = self._announce(pending, "request.reminder", f"{request_id}.reminder.{count}")
        self._open.setdefault(request_id, []).extend(reminders)

    def _announce(self, pending: Pending, kind: str, message: str) -> list[asyncio.Task[None]]:
        request = pending.request
        tasks = []
        left_s = None if request.expires_at is None else max(0, request.expires_at - time.time())
        for endpoint in self.endpoints:
            token = self.links.mint(self.queue, request, f"webhook:{endpoint.name}")
            data = {
                "request": request_view(self.queue, pending),
                "answer_link": link_url(self.link_base, token),
                "time_left_s": left_s,
            }
            tasks.append(asyncio.ensure_future(self._deliver(endpoint, message, kind, data)))
        return tasks

    async def _deliver(
        self, endpoint: Endpoint, message: str, kind: str, data: dict[str, Any]
    ) -> None:
        """POST one message to ``endpoint``, retried until it is taken or attempts run out."""
        now = datetime.datetime.now(datetime.UTC)
        body = json.dumps({"type": kind, "timestamp": now.isoformat(), "data": data})

        async def attempt() -> str | None:
            sent_at = datetime.datetime.fromtimestamp(time.time(), datetime.UTC)
            headers = {
                "content-type": "application/json",
                "webhook-id": message,
                "webhook-timestamp": str(int(sent_at.timestamp())),
                "webhook-signature": self.signer.sign(message, sent_at, body),
            }
            try:
                response = await self.client.post(endpoint.url, content=body, headers=headers)
            except httpx.HTTPError as exc:
                return f"{type(exc).__name__}: {exc}"
            ok = 200 <= response.status_code < 300
            return None if ok else f"status {response.status_code}"

        what = f"{kind} {message} to {endpoint.name}"
        if await deliver(attempt, self.retry, what):
            self.delivered += 1
        else:
            self.failed += 1

    async def aclose(self, grace_s: float = 5.0) -> None:
        """Let the end announcements under way finish (within ``grace_s``), stop the rest."""
        await self.reminders.aclose()
        for tasks in self._open.values():
            for task in tasks:
                task.cancel()
        if self._ending:
            await asyncio.wait(self._ending, timeout=grace_s)
        pending = [t for tasks in self._open.values() for t in tasks] + list(self._ending)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        self._open.clear()
        await self.client.aclose()

    def __repr__(self) -> str:
        return (
            f"<WebhookWorker {self.queue!r} endpoints={len(self.endpoints)} "
            f"delivered={self.delivered} failed={self.failed}>"
        )
