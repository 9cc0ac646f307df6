"""The gateway running: its HTTP API (uvicorn) in the event loop of the agents' brokers."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
from collections.abc import Iterator
from types import TracebackType
from typing import Self

import uvicorn

from toolnexus.responders import check_listen, listen

from .app import Gateway

log = logging.getLogger("toolnexus.gateway")


class _Uvicorn(uvicorn.Server):
    """uvicorn without its own signal handlers: :meth:`GatewayServer.run` owns them."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class GatewayServer:
    """Serves ``gateway`` on ``host:port`` (``port=0``: a free one, see :attr:`url`).

    Use ``async with GatewayServer(...)`` or :meth:`run` (until SIGTERM/SIGINT). Stopping
    withdraws the requests still open and closes the agents' brokers.

    Raises:
        ConfigurationError: ``host`` is not loopback and the gateway has no tokens, or the
            address cannot be listened on.
    """

    def __init__(self, gateway: Gateway, *, host: str = "127.0.0.1", port: int = 8710) -> None:
        check_listen(
            host,
            guarded=bool(gateway.tokens),
            what="serve the gateway",
            how="give agents tokens (--tokens or TOOLNEXUS_GATEWAY_TOKENS)",
        )
        self.gateway, self.host, self.port = gateway, host, port
        self._socket: socket.socket | None = None
        self._server: _Uvicorn | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        """The gateway's address, e.g. ``http://127.0.0.1:8710``."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def start(self) -> None:
        """Listen, then serve in the background.

        Raises:
            ConfigurationError: the address cannot be listened on.
        """
        self._socket = listen(self.host, self.port)
        self.port = self._socket.getsockname()[1]
        config = uvicorn.Config(
            self.gateway.app(),
            log_level="warning",
            lifespan="off",
            timeout_graceful_shutdown=2,
            access_log=False,
        )
        self._server = _Uvicorn(config)
        self._task = asyncio.get_running_loop().create_task(
            self._server.serve(sockets=[self._socket]), name="toolnexus-gateway"
        )
        log.info("wait gateway on %s", self.url)

    async def stop(self) -> None:
        """Withdraw the open requests (long polls get their answer), then stop serving."""
        await self.gateway.aclose()
        if self._server is not None:
            self._server.should_exit = True
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)
        if self._socket is not None:
            self._socket.close()

    async def run(self) -> None:
        """Serve until SIGTERM or SIGINT."""
        stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stopping.set)
        await self.start()
        try:
            await stopping.wait()
        finally:
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
