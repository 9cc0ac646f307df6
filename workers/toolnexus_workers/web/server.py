"""The web worker running: the page (uvicorn) and its responder service in one event loop."""

from __future__ import annotations

import logging

from starlette.types import ASGIApp

from toolnexus import Broker, Service
from toolnexus.rendering import KNOWN_DOMAINS

from ..serving import AppServer
from .access import Access, check_listen
from .app import WebPage
from .board import Board, WebWorker

log = logging.getLogger("toolnexus.web")


class WebServer(AppServer):
    """The web worker: serves the page on ``host:port`` and shows ``broker``'s requests.

    ``port=0`` picks a free port (see :attr:`url`). Use ``async with WebServer(...)``
    (started on entry, stopped on exit) or :meth:`run` (until SIGTERM/SIGINT).

    One page per consumer group: a group hands each request to one of its consumers, so
    two pages in one group would each show part of the requests. :meth:`start` refuses
    when another consumer of the group keeps a fresh heartbeat; run replicas in groups of
    their own (every group sees every request) with one ``--session-secret``.
    See :class:`~toolnexus_workers.serving.AppServer`.

    Raises:
        ConfigurationError: ``access`` is open (no token, no users) on a non-loopback
            ``host``, or the address cannot be listened on.
    """

    name = "toolnexus-web"
    path = "/"
    one_per_group = True
    what = "web page"
    replicas_need = " and every replica the same --session-secret"

    def __init__(
        self,
        broker: Broker,
        *,
        host: str = "127.0.0.1",
        port: int = 8700,
        access: Access | None = None,
        group: str = WebWorker.group,
        consumer: str | None = None,
        known_domains: tuple[str, ...] = KNOWN_DOMAINS,
        ping_s: float = 15.0,
        drain_s: float = 10.0,
        heartbeat_ttl_s: float = 30.0,
    ) -> None:
        self.access = access or Access()
        check_listen(host, self.access)
        self.broker = broker
        self.board = Board()
        self.page = WebPage(self.board, self.access, known_domains=known_domains, ping_s=ping_s)
        self.service = Service(
            broker,
            WebWorker(self.board),
            group=group,
            consumer=consumer,
            drain_s=drain_s,
            heartbeat_ttl_s=heartbeat_ttl_s,
        )
        super().__init__(host, port, [self.service])

    def app(self) -> ASGIApp:
        return self.page.app()

    async def start(self, *, handle_signals: bool = False) -> None:
        await super().start(handle_signals=handle_signals)
        log.info("web page on %s (group %r of %s)", self.url, self.service.group, self.broker.url)
        if self.access.token is not None:  # the token itself is never logged
            log.info(
                "sign in by opening %s/?token=<the --token value> (or type the token on the page)",
                self.url.rstrip("/"),
            )

    async def closing(self) -> None:
        self.board.close()
