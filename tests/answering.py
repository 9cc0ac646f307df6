"""A signed fleet for the answering channels' tests (answer links, webhooks, email): an
agent and the HTTP answering API (the links' home) on one queue of a real Redis, each
with its own key and trusting the other's, and the link key they share with the senders."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import toolnexus
from conftest import FAST
from toolnexus import Answer, Broker, Request, Source, new_id
from toolnexus.security import SigningKey
from toolnexus_workers.http.server import HttpServer
from toolnexus_workers.http.tokens import Tokens, add_token
from toolnexus_workers.links import LinkKey, link_url

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
