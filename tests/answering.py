"""What the answering channels' tests share (answer links, webhooks, email): a signed
fleet (an agent and the HTTP answering API, the links' home, on one queue of a real Redis,
each with its own key and trusting the other's, and the link key they share with the
senders); a webhook receiver verifying with ``standardwebhooks``; an SMTP inbox
(aiosmtpd); and the fixtures ``setup`` (a fleet on the test's namespace) and ``http`` (a
client), which a test module takes as its own by assigning them to those names
(``setup = answering.setup``: imported by name, they would be shadowed by the arguments
of the tests using them, which ruff reports)."""

from __future__ import annotations

import asyncio
import contextlib
import email
import email.policy
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
from aiosmtpd.smtp import SMTP, Envelope, Session
from standardwebhooks import Webhook
from starlette.applications import Starlette
from starlette.requests import Request as HttpRequest
from starlette.responses import Response
from starlette.routing import Route

import toolnexus
from conftest import FAST
from toolnexus import Answer, Broker, Request, Service, Source, new_id
from toolnexus.security import SigningKey
from toolnexus_workers.http.server import HttpServer
from toolnexus_workers.http.tokens import Tokens, add_token
from toolnexus_workers.links import LinkKey, link_url
from toolnexus_workers.serving import AppServer

QUEUE = "ops"
LINK_SECRET = "a link secret of at least 32 characters, for tests"
FORM = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "title": "Name", "minLength": 2},
        "guests": {"type": "integer", "title": "Guests", "minimum": 1, "maximum": 12},
    },
    "required": ["name"],
}


@dataclass
class Fleet:
    redis_url: str
    namespace: str
    keys: Path
    trusted_by_worker: Path
    asker: Broker
    server: HttpServer
    link_key: LinkKey
    bearer: str  # alice's token for the HTTP API

    def connect(self, key: str) -> Broker:
        """A responder's broker on the queue, signing with ``key`` (made here)."""
        return responder(self.redis_url, self.namespace, self.keys, self.trusted_by_worker, key)

    def delivered(self, request: Request) -> Request:
        """``request`` as published (signed, with its deadline): what a sender links to."""
        return self.server.desk.open[(QUEUE, request.id)].pending.request

    def link(self, request: Request, recipient: str, action: str | None = None) -> str:
        """A link for ``request`` (held by the API) to ``recipient``."""
        token = self.link_key.mint(QUEUE, self.delivered(request), recipient, action=action)
        return link_url(self.server.url, token)

    async def ask(self, request: Request, timeout_s: float = 60) -> asyncio.Task[Answer]:
        """Wait for ``request`` in the background, once the HTTP API holds it."""
        wait = asyncio.create_task(self.asker.wait_for(request, timeout_s=timeout_s))
        async with asyncio.timeout(15):
            while (QUEUE, request.id) not in self.server.desk.open:
                assert not wait.done(), wait
                await asyncio.sleep(0.02)
        return wait


@contextlib.asynccontextmanager
async def serving(setup: Fleet, worker: Any) -> AsyncIterator[None]:
    """Run ``worker`` (a webhook or email worker) on the fleet's queue with a key of its
    group's name; stop it and close it after the block."""
    async with setup.connect(f"{worker.group}-worker") as broker:
        service = Service(broker, worker, group=worker.group)
        run = asyncio.create_task(service.run())
        try:
            yield
        finally:
            service.stop()
            await run
            await worker.aclose()


def responder(redis_url: str, namespace: str, keys: Path, trusted: Path, key: str) -> Broker:
    if not (keys / f"{key}.key").exists():
        SigningKey.generate(key).save(keys)
    return toolnexus.connect(
        redis_url,
        namespace=namespace,
        queue=QUEUE,
        signing_key=keys / f"{key}.key",
        trusted_keys=trusted,
        require_signatures=True,
        **FAST,
    )


def form_request(**extra: Any) -> Request:
    return Request(
        id=extra.pop("id", None) or new_id("link"),
        kind=extra.pop("kind", "input"),
        prompt=extra.pop("prompt", "Book a table?"),
        data=extra.pop("data", {"schema": FORM}),
        source=extra.pop("source", Source(server="bookings", tool="book", agent="agent-1")),
        **extra,
    )


@contextlib.asynccontextmanager
async def fleet(
    redis_url: str, namespace: str, tmp_path: Path, link_key: LinkKey | None = None
) -> AsyncIterator[Fleet]:
    keys, by_asker, by_worker = tmp_path / "k", tmp_path / "ta", tmp_path / "tw"
    for directory in (keys, by_asker, by_worker):
        directory.mkdir()
    for name, trusted in (("agent-1", by_worker), ("http-worker", by_asker)):
        SigningKey.generate(name).save(keys)
        (trusted / f"{name}.pub").write_text((keys / f"{name}.pub").read_text())
    tokens = tmp_path / "tokens.toml"
    bearer = add_token(tokens, "alice", [QUEUE])
    link_key = link_key or LinkKey(secret=LINK_SECRET)
    asker = toolnexus.connect(
        redis_url,
        namespace=namespace,
        queue=QUEUE,
        signing_key=keys / "agent-1.key",
        trusted_keys=by_asker,
        require_signatures=True,
        **FAST,
    )
    worker = responder(redis_url, namespace, keys, by_worker, "http-worker")
    server = HttpServer({QUEUE: worker}, Tokens(tokens), port=0, links=link_key)
    async with asker, worker, server:
        yield Fleet(redis_url, namespace, keys, by_worker, asker, server, link_key, bearer)


@pytest.fixture
async def setup(redis_url: str, namespace: str, tmp_path: Path) -> AsyncIterator[Fleet]:
    """A :func:`fleet` on the test's namespace."""
    async with fleet(redis_url, namespace, tmp_path) as made:
        yield made


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client, for the links and the answering API."""
    async with httpx.AsyncClient(timeout=30) as client:
        yield client


WEBHOOK_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


class Receiver(AppServer):
    """Serves a receiver's ASGI app on a free local port."""

    name = "test-receiver"

    def __init__(self, app: Starlette) -> None:
        super().__init__("127.0.0.1", 0)
        self._app = app

    def app(self) -> Starlette:
        return self._app


@dataclass
class Recording:
    """What a receiver got: every attempt's headers, and each verified message by id."""

    fail_first: int = 0
    attempts: list[dict[str, str]] = field(default_factory=list)
    messages: dict[str, dict[str, Any]] = field(default_factory=dict)

    def app(self) -> Starlette:
        hook = Webhook(WEBHOOK_SECRET)

        async def receive(request: HttpRequest) -> Response:
            body = await request.body()
            self.attempts.append(dict(request.headers))
            if len(self.attempts) <= self.fail_first:
                return Response("not now", status_code=503)
            message = hook.verify(body, dict(request.headers))  # raises when not genuine
            self.messages.setdefault(request.headers["webhook-id"], message)
            return Response(status_code=204)

        return Starlette(routes=[Route("/hook", receive, methods=["POST"])])

    async def message(self, message_id: str) -> dict[str, Any]:
        async with asyncio.timeout(20):
            while message_id not in self.messages:
                await asyncio.sleep(0.02)
        return self.messages[message_id]


class Inbox:
    """What the SMTP server received, one parsed message per recipient."""

    def __init__(self) -> None:
        self.mails: list[tuple[str, EmailMessage]] = []

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        assert isinstance(envelope.content, bytes)
        parsed = email.message_from_bytes(envelope.content, policy=email.policy.default)
        assert isinstance(parsed, EmailMessage)
        for address in envelope.rcpt_tos:
            self.mails.append((address, parsed))
        return "250 OK"

    async def mail(self, to: str, count: int = 1) -> EmailMessage:
        """The ``count``-th mail to ``to``, once it arrives."""
        async with asyncio.timeout(20):
            while len(found := [m for a, m in self.mails if a == to]) < count:
                await asyncio.sleep(0.02)
        return found[count - 1]


def text(mail: EmailMessage) -> str:
    body = mail.get_body(("plain",))
    assert body is not None
    content = body.get_content()
    assert isinstance(content, str)
    return content.replace("\r\n", "\n")


def links(mail: EmailMessage) -> dict[str, str]:
    return dict(re.findall(r"^(Approve|Decline|Open the form): (\S+)$", text(mail), re.M))


@contextlib.asynccontextmanager
async def smtp_server() -> AsyncIterator[tuple[Inbox, int]]:
    inbox = Inbox()
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: SMTP(inbox), "127.0.0.1", 0)
    try:
        yield inbox, server.sockets[0].getsockname()[1]
    finally:
        server.close()
        await server.wait_closed()
