"""The web worker running: the page (uvicorn) and its responder service in one event loop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Iterator
from types import TracebackType
from typing import Self

import uvicorn

from toolnexus import Broker, Service
from toolnexus.errors import ConfigurationError
from toolnexus.rendering import KNOWN_DOMAINS
from toolnexus.responders import listen

from .access import Access, check_listen
from .app import WebPage
from .board import Board, WebWorker

log = logging.getLogger("toolnexus.web")


class _Uvicorn(uvicorn.Server):
    """uvicorn without its own signal handlers: the responder service owns SIGTERM."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class WebServer:
    """The web worker: serves the page on ``host:port`` and shows ``broker``'s requests.

    ``port=0`` picks a free port (see :attr:`url`). Use ``async with WebServer(...)``
    (started on entry, stopped on exit) or :meth:`run` (until SIGTERM/SIGINT).

    One page per consumer group: a group hands each request to one of its consumers, so
    two pages in one group would each show part of the requests. :meth:`start` refuses
    when another consumer of the group keeps a fresh heartbeat; run replicas in groups of
    their own (every group sees every request) with one ``--session-secret``.

    Raises:
        ConfigurationError: ``access`` is open (no token, no users) on a non-loopback
            ``host``, or the address cannot be listened on.
    """

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
        self.broker, self.host, self.port = broker, host, port
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
        self._socket: socket.socket | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._server: _Uvicorn | None = None

    @property
    def url(self) -> str:
        """The page's address, e.g. ``http://127.0.0.1:8700/``."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/"

    async def start(self, *, handle_signals: bool = False) -> None:
        """Listen, then serve the page and show requests in the background.

        Raises:
            ConfigurationError: the address cannot be listened on, or another consumer of
                this page's group is alive (see the class).
            BrokerUnavailable: the broker cannot be reached.
        """
        await self._check_alone()
        self._socket = listen(self.host, self.port)
        self.port = self._socket.getsockname()[1]
        config = uvicorn.Config(
            self.page.app(),
            log_level="warning",
            lifespan="off",
            timeout_graceful_shutdown=2,
            access_log=False,
        )
        self._server = _Uvicorn(config)
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._server.serve(sockets=[self._socket]), name="toolnexus-web"),
            loop.create_task(self.service.run(handle_signals=handle_signals), name="web-service"),
        ]
        log.info("web page on %s (group %r of %s)", self.url, self.service.group, self.broker.url)

    async def _check_alone(self) -> None:
        group, me = self.service.group, self.service.consumer
        others = [
            beat
            for beat in await self.broker.heartbeats()
            if beat.group == group and beat.consumer != me
        ]
        if others:
            beat = min(others, key=lambda b: b.expires_at)
            raise ConfigurationError(
                f"group {group!r} already has a web page: consumer {beat.consumer!r} keeps a "
                f"heartbeat (until {max(0, int(beat.expires_at - time.time()))} s from now if "
                "it is gone). A group gives each request to one consumer, so two pages in it "
                "would each show part of them: give this replica a group of its own "
                f"(--group {group}-2) and every replica the same --session-secret"
            )

    async def wait(self) -> None:
        """Wait until either half ends (the service on SIGTERM), then stop the other."""
        await asyncio.wait(self._tasks, return_when=asyncio.FIRST_COMPLETED)
        await self.stop()

    async def stop(self) -> None:
        """Stop showing requests (held ones go back to the group), then stop the page."""
        self.service.stop()
        self.board.close()
        if self._server is not None:
            self._server.should_exit = True
        results = await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._socket is not None:
            self._socket.close()
        for result in results:
            if isinstance(result, BaseException) and not isinstance(result, asyncio.CancelledError):
                raise result

    async def run(self) -> None:
        """Serve until SIGTERM or SIGINT (running requests drain, held ones go back)."""
        await self.start(handle_signals=True)
        await self.wait()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()
