"""The gateway running: its HTTP API (uvicorn) in the event loop of the agents' brokers."""

from __future__ import annotations

import logging

from starlette.types import ASGIApp

from toolnexus.responders import check_listen

from ..serving import AppServer
from .app import Gateway

log = logging.getLogger("toolnexus.gateway")


class GatewayServer(AppServer):
    """Serves ``gateway`` on ``host:port`` (``port=0``: a free one, see :attr:`url`).

    Use ``async with GatewayServer(...)`` or :meth:`run` (until SIGTERM/SIGINT). Stopping
    withdraws the requests still open and closes the agents' brokers.

    Raises:
        ConfigurationError: ``host`` is not loopback and the gateway has no tokens, or the
            address cannot be listened on.
    """

    name = "toolnexus-gateway"

    def __init__(self, gateway: Gateway, *, host: str = "127.0.0.1", port: int = 8710) -> None:
        check_listen(
            host,
            guarded=bool(gateway.tokens),
            what="serve the gateway",
            how="give agents tokens (--tokens or TOOLNEXUS_GATEWAY_TOKENS)",
        )
        self.gateway = gateway
        super().__init__(host, port)

    def app(self) -> ASGIApp:
        return self.gateway.app()

    async def start(self, *, handle_signals: bool = False) -> None:
        await super().start(handle_signals=handle_signals)
        log.info("wait gateway on %s", self.url)

    async def closing(self) -> None:
        """Withdraw the open requests (long polls get their answer)."""
        await self.gateway.aclose()
