"""A worker's HTTP side: an ASGI application served by uvicorn in the event loop of its
responder services (the web page, the HTTP answering API) or of its brokers (the gateway).
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
import signal
import socket
import time
from collections.abc import Iterator, Sequence
from types import TracebackType
from typing import Self

import uvicorn
from starlette.types import ASGIApp

from toolnexus import Service
from toolnexus.errors import ConfigurationError
from toolnexus.responders import listen

log = logging.getLogger("toolnexus.serving")


class _Uvicorn(uvicorn.Server):
    """uvicorn without its own signal handlers: the services (or :meth:`AppServer.run`)
    own SIGTERM and SIGINT."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class AppServer(abc.ABC):
    """Serves :meth:`app` on ``host:port`` (``port=0``: a free one, see :attr:`url`) beside
    ``services``, in one event loop.

    Use ``async with`` (started on entry, stopped on exit) or :meth:`run` (until SIGTERM or
    SIGINT: the services drain, held requests go back to their groups). When either half
    ends (a service on SIGTERM, or the server), :meth:`wait` stops the other.
    """

    name = "toolnexus-app"
    """The task's and the log's name for the server."""
    path = ""
    """What :attr:`url` ends with after the port (the web page's ``/``)."""
    one_per_group = False
    """Whether :meth:`start` refuses a group another live consumer serves: a group gives
    each request to one consumer, so two of these in one group would each hold part of
    the requests (replicas run in groups of their own: every group sees every request)."""
    what = "server"
    """What the refusal's message calls this server (``web page``)."""
    replicas_need = ""
    """What else replicas of this server must share, for the refusal's message."""

    def __init__(self, host: str, port: int, services: Sequence[Service] = ()) -> None:
        self.host, self.port = host, port
        self.services = list(services)
        self._socket: socket.socket | None = None
        self._server: _Uvicorn | None = None
        self._tasks: list[asyncio.Task[None]] = []

    @abc.abstractmethod
    def app(self) -> ASGIApp:
        """The ASGI application to serve."""

    async def closing(self) -> None:  # noqa: B027 (a hook: nothing to do by default)
        """Called by :meth:`stop` once the services stop, before the server does (end the
        live streams, withdraw what is still open)."""

    @property
    def url(self) -> str:
        """The address served, e.g. ``http://127.0.0.1:8700``."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}{self.path}"

    async def start(self, *, handle_signals: bool = False) -> None:
        """Listen, then serve and run the services in the background (``handle_signals``:
        the services stop on SIGTERM and SIGINT).

        Raises:
            ConfigurationError: the address cannot be listened on, or (with
                :attr:`one_per_group`) another consumer of a service's group is alive.
            BrokerUnavailable: the broker cannot be reached.
        """
        if self.one_per_group:
            for service in self.services:
                await self._check_alone(service)
        self._socket = listen(self.host, self.port)
        self.port = self._socket.getsockname()[1]
        config = uvicorn.Config(
            self.app(),
            log_level="warning",
            lifespan="off",
            timeout_graceful_shutdown=2,
            access_log=False,
        )
        self._server = _Uvicorn(config)
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._server.serve(sockets=[self._socket]), name=self.name)]
        for service in self.services:
            run = service.run(handle_signals=handle_signals)
            self._tasks.append(loop.create_task(run, name=f"{self.name} {service.group}"))

    async def _check_alone(self, service: Service) -> None:
        group, me = service.group, service.consumer
        others = [
            beat
            for beat in await service.broker.heartbeats()
            if beat.group == group and beat.consumer != me
        ]
        if others:
            beat = min(others, key=lambda b: b.expires_at)
            raise ConfigurationError(
                f"group {group!r} already has a {self.what}: consumer {beat.consumer!r} keeps a "
                f"heartbeat (until {max(0, int(beat.expires_at - time.time()))} s from now if "
                "it is gone). A group gives each request to one consumer, so two in it would "
                "each hold part of them: give this replica a group of its own "
                f"(--group {group}-2){self.replicas_need}"
            )

    async def wait(self) -> None:
        """Wait until one part ends (the services on SIGTERM), then stop the others."""
        await asyncio.wait(self._tasks, return_when=asyncio.FIRST_COMPLETED)
        await self.stop()

    async def stop(self) -> None:
        """Stop the services (held requests go back to their groups), then serving.

        Raises:
            Exception: what a part of it ended with, if not a cancellation.
        """
        for service in self.services:
            service.stop()
        await self.closing()
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
        if self.services:  # the services stop on the signals, and then the server does
            await self.start(handle_signals=True)
            await self.wait()
            return
        loop = asyncio.get_running_loop()
        stopping = asyncio.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stopping.set)
        await self.start()
        signalled = loop.create_task(stopping.wait())
        try:
            await asyncio.wait([signalled, *self._tasks], return_when=asyncio.FIRST_COMPLETED)
        finally:
            signalled.cancel()
            await self.stop()

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
