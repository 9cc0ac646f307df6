"""The HTTP answering API running: uvicorn and one responder service per served queue, in
one event loop."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from starlette.types import ASGIApp

from toolnexus import Broker, Service

from ..links import LinkKey
from ..serving import AppServer
from .app import MAX_WAIT_S, Desk, HttpApi, HttpWorker
from .linked import AnswerLinks
from .tokens import Tokens

log = logging.getLogger("toolnexus.http")


class HttpServer(AppServer):
    """Serves the API on ``host:port`` (``port=0``: a free one, see :attr:`url`) for the
    requests of ``brokers`` (by queue, each connected with ``queue=`` that queue), answering
    them as the person each bearer token of ``tokens`` names.

    A long poll of ``GET /v1/events`` waits at most ``max_wait_s`` seconds. With ``links``
    (the link key of the workers that send links) it is the home of the single-use answer
    links too (``/v1/links/TOKEN``, :mod:`toolnexus_workers.http.linked`).
    Use ``async with HttpServer(...)`` or :meth:`run` (until SIGTERM/SIGINT). One server
    per consumer group: run replicas in groups of their own (``group``), as the web page's.

    Raises:
        ConfigurationError: the address cannot be listened on.
    """

    name = "toolnexus-http"
    one_per_group = True
    what = "HTTP answering API"

    def __init__(
        self,
        brokers: Mapping[str, Broker],
        tokens: Tokens,
        *,
        host: str = "127.0.0.1",
        port: int = 8720,
        group: str = HttpWorker.group,
        consumer: str | None = None,
        drain_s: float = 10.0,
        heartbeat_ttl_s: float = 30.0,
        max_wait_s: float = MAX_WAIT_S,
        links: LinkKey | None = None,
    ) -> None:
        self.desk = Desk()
        self.api = HttpApi(self.desk, tokens, list(brokers), max_wait_s=max_wait_s)
        self.links = AnswerLinks(self.desk, links)
        services = [
            Service(
                broker,
                HttpWorker(self.desk, queue),
                group=group,
                consumer=consumer,
                drain_s=drain_s,
                heartbeat_ttl_s=heartbeat_ttl_s,
            )
            for queue, broker in brokers.items()
        ]
        super().__init__(host, port, services)

    def app(self) -> ASGIApp:
        return self.api.app(self.links.routes())

    async def start(self, *, handle_signals: bool = False) -> None:
        await super().start(handle_signals=handle_signals)
        log.info("HTTP answering API on %s (queues %s)", self.url, ", ".join(self.api.queues))
        if self.links.key is not None:
            log.info("answer links taken at %s/v1/links/", self.url)

    async def closing(self) -> None:
        self.desk.close()
