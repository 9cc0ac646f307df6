"""The HTTP answering API running: uvicorn and one responder service per served queue, in
one event loop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Iterator, Mapping
from types import TracebackType
from typing import Self

import uvicorn

from toolnexus import Broker, Service
from toolnexus.responders import listen

from .app import MAX_WAIT_S, Desk, HttpApi, HttpWorker
from .tokens import Tokens

log = logging.getLogger("toolnexus.http")


class _Uvicorn(uvicorn.Server):
    """uvicorn without its own signal handlers: the responder services own SIGTERM."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class HttpServer:
    """Serves the API on ``host:port`` (``port=0``: a free one, see :attr:`url`) for the
    requests of ``brokers`` (by queue, each connected with ``queue=`` that queue), answering
    them as the person each bearer token of ``tokens`` names.

    A long poll of ``GET /v1/events`` waits at most ``max_wait_s`` seconds.
    Use ``async with HttpServer(...)`` or :meth:`run` (until SIGTERM/SIGINT). One server
    per consumer group: run replicas in groups of their own (``group``), as the web page's.

    Raises:
        ConfigurationError: the address cannot be listened on.
    """

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
    ) -> None:
        self.host, self.port = host, port
        self.desk = Desk()
        self.api = HttpApi(self.desk, tokens, list(brokers), max_wait_s=max_wait_s)
        self.services = [
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
        self._socket: socket.socket | None = None
        self._server: _Uvicorn | None = None
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def url(self) -> str:
        """The API's address, e.g. ``http://127.0.0.1:8720``."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def start(self, *, handle_signals: bool = False) -> None:
        """Listen, then serve and hold requests in the background.

        Raises:
            ConfigurationError: the address cannot be listened on.
        """
        self._socket = listen(self.host, self.port)
        self.port = self._socket.getsockname()[1]
        config = uvicorn.Config(
            self.api.app(),
            log_level="warning",
            lifespan="off",
            timeout_graceful_shutdown=2,
            access_log=False,
        )
        self._server = _Uvicorn(config)
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._server.serve(sockets=[self._socket]), name="toolnexus-http")
        ]
        for service in self.services:
            run = service.run(handle_signals=handle_signals)
            self._tasks.append(loop.create_task(run, name=f"http-service {service.group}"))
        log.info("HTTP answering API on %s (queues %s)", self.url, ", ".join(self.api.queues))

    async def wait(self) -> None:
        """Wait until one part ends (the services on SIGTERM), then stop the others."""
        await asyncio.wait(self._tasks, return_when=asyncio.FIRST_COMPLETED)
        await self.stop()

    async def stop(self) -> None:
        """Stop holding requests (held ones go back to the group), then stop serving."""
        for service in self.services:
            service.stop()
        self.desk.close()
        if self._server is not None:
            self._server.should_exit = True
        results = await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._socket is not None:
            self._socket.close()
        for result in results:
            if isinstance(result, BaseException) and not isinstance(result, asyncio.CancelledError):
                raise result

    async def run(self) -> None:
        """Serve until SIGTERM or SIGINT."""
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
