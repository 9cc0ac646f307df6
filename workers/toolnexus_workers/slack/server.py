"""The Slack bot running: Bolt's endpoint (aiohttp) or Socket Mode, and its responder service."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from aiohttp import web
from aiohttp.typedefs import Handler
from slack_bolt.async_app import AsyncApp
from slack_sdk.web.async_client import AsyncWebClient

from toolnexus import Broker
from toolnexus.errors import ConfigurationError
from toolnexus.rendering import KNOWN_DOMAINS
from toolnexus.responders import listen

from ..bodies import BadBody, form, json_object
from ..chat import Allowed, ChatServer, MessageMap
from .bot import SlackBot

log = logging.getLogger("toolnexus.slack")


class SlackServer(ChatServer):
    """The Slack worker: posts ``broker``'s requests to ``channel``, takes clicks on
    ``http://host:port/path`` (signed with ``signing_secret``) or, given an
    ``app_token``, over Socket Mode. ``port=0`` picks a free port (see :attr:`url`).

    Raises:
        ConfigurationError: neither ``signing_secret`` nor ``app_token`` (nothing could
            verify that a click came from Slack: see :func:`require_verification`), no
            allowed user, or the address cannot be listened on.
    """

    def __init__(
        self,
        broker: Broker,
        *,
        bot_token: str,
        channel: str,
        allowed: Sequence[str],
        signing_secret: str | None = None,
        app_token: str | None = None,
        host: str = "127.0.0.1",
        port: int = 3000,
        path: str = "/slack/events",
        api_url: str = "https://slack.com/api/",
        known_domains: tuple[str, ...] = KNOWN_DOMAINS,
        web_url: str | None = None,
        group: str = SlackBot.group,
        consumer: str | None = None,
        concurrency: int = 100,
        drain_s: float = 10.0,
        heartbeat_ttl_s: float = 30.0,
        remind_after_s: float | None = None,
    ) -> None:
        require_verification(signing_secret, app_token)
        client = AsyncWebClient(token=bot_token, base_url=api_url.rstrip("/") + "/")
        self.app = AsyncApp(
            client=client,
            signing_secret=signing_secret or "",
            request_verification_enabled=bool(signing_secret),
        )
        self.app_token = app_token if not signing_secret else None
        self.host, self.port, self.path = host, port, path
        bot = SlackBot(
            broker,
            MessageMap(broker.store(group)),
            Allowed("slack", allowed),
            app=self.app,
            channel=channel,
            known_domains=known_domains,
            web_url=web_url,
        )
        super().__init__(
            broker,
            bot,
            group=group,
            consumer=consumer,
            concurrency=concurrency,
            drain_s=drain_s,
            heartbeat_ttl_s=heartbeat_ttl_s,
            remind_after_s=remind_after_s,
        )
        self._runner: web.AppRunner | None = None
        self._socket_mode: object | None = None

    @property
    def url(self) -> str:
        """The interaction endpoint, e.g. ``http://127.0.0.1:3000/slack/events``."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}{self.path}"

    async def open_transport(self) -> None:
        if self.app_token:
            from slack_bolt.adapter.socket_mode.async_handler import AsyncSocketModeHandler

            handler = AsyncSocketModeHandler(self.app, self.app_token)
            await handler.connect_async()  # type: ignore[no-untyped-call]
            self._socket_mode = handler
            log.info("slack bot on Socket Mode (group %r)", self.service.group)
            return
        sock = listen(self.host, self.port)
        self.port = sock.getsockname()[1]
        app = self.app.web_app(path=self.path)
        app.middlewares.append(bounded)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.SockSite(self._runner, sock).start()
        log.info("slack bot serving on %s (group %r)", self.url, self.service.group)

    async def close_transport(self) -> None:
        if self._socket_mode is not None:
            from slack_bolt.adapter.socket_mode.async_handler import AsyncSocketModeHandler

            assert isinstance(self._socket_mode, AsyncSocketModeHandler)
            await self._socket_mode.close_async()  # type: ignore[no-untyped-call]
        if self._runner is not None:
            await self._runner.cleanup()


@web.middleware
async def bounded(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Bolt reads a post's body before it checks its signature: refuse a body the shared
    rule refuses (:mod:`toolnexus_workers.bodies`; an interaction's ``payload`` field must be
    a JSON object) with 400 or 413 and a one-line reason, before Bolt sees it."""
    if request.method == "POST":
        try:
            try:
                raw = await request.read()  # kept: Bolt reads it again
            except web.HTTPRequestEntityTooLarge:
                raise BadBody(413, f"the body is over {request.client_max_size} bytes") from None
            slack_body(raw, request.content_type)
        except BadBody as bad:
            return web.Response(status=bad.status, text=f"{bad.reason}\n")
    return await handler(request)


def slack_body(raw: bytes, content_type: str) -> None:
    """Check a post to the Slack receiver: a JSON object (an Events API call) or a form whose
    ``payload`` fields are JSON objects (an interaction).

    Raises:
        BadBody: 400, it is neither.
    """
    if content_type == "application/json":
        json_object(raw)
        return
    for payload in form(raw).get("payload", []):
        json_object(payload)


def require_verification(signing_secret: str | None, app_token: str | None) -> None:
    """Refuse to run unable to tell Slack's posts from anyone's: clicks over HTTP are
    verified with the signing secret, and Socket Mode needs the app token (Slack's own
    connection); with neither, anyone who reaches the endpoint could answer.

    Raises:
        ConfigurationError: neither is given (an empty one counts as none).
    """
    if not signing_secret and not app_token:
        raise ConfigurationError(
            "no way to verify that clicks come from Slack: give the signing secret "
            "(--signing-secret, SLACK_SIGNING_SECRET) for the HTTP endpoint, or an app-level "
            "token (--app-token, SLACK_APP_TOKEN) for Socket Mode"
        )
