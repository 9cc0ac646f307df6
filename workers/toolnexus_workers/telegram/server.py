"""The Telegram bot running: aiogram's long polling and its responder service."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from aiogram import Bot, Dispatcher
from aiogram.client.session.aiohttp import AiohttpSession
from aiogram.client.telegram import TelegramAPIServer
from aiogram.utils.token import TokenValidationError

from toolnexus import Broker
from toolnexus.errors import ConfigurationError
from toolnexus.rendering import KNOWN_DOMAINS

from ..chat import Allowed, ChatServer, MessageMap
from .bot import TelegramBot

log = logging.getLogger("toolnexus.telegram")


class TelegramServer(ChatServer):
    """The Telegram worker: posts ``broker``'s requests to chat ``chat_id`` and reads
    clicks and replies by long polling the Bot API at ``api_url``.

    Raises:
        ConfigurationError: a malformed token, or no allowed user.
    """

    def __init__(
        self,
        broker: Broker,
        *,
        bot_token: str,
        chat_id: int,
        allowed: Sequence[str],
        api_url: str = "https://api.telegram.org",
        polling_timeout_s: int = 10,
        known_domains: tuple[str, ...] = KNOWN_DOMAINS,
        web_url: str | None = None,
        group: str = TelegramBot.group,
        consumer: str | None = None,
        concurrency: int = 100,
        drain_s: float = 10.0,
        heartbeat_ttl_s: float = 30.0,
        remind_after_s: float | None = None,
    ) -> None:
        session = AiohttpSession(api=TelegramAPIServer.from_base(api_url.rstrip("/")))
        try:
            self.telegram = Bot(bot_token, session=session)
        except TokenValidationError as exc:
            raise ConfigurationError(f"that is not a Telegram bot token: {exc}") from None
        self.dispatcher = Dispatcher()
        self.polling_timeout_s = polling_timeout_s
        telegram = TelegramBot(
            broker,
            MessageMap(broker.store(group)),
            Allowed("telegram", allowed),
            bot=self.telegram,
            dispatcher=self.dispatcher,
            chat_id=chat_id,
            known_domains=known_domains,
            web_url=web_url,
        )
        super().__init__(
            broker,
            telegram,
            group=group,
            consumer=consumer,
            concurrency=concurrency,
            drain_s=drain_s,
            heartbeat_ttl_s=heartbeat_ttl_s,
            remind_after_s=remind_after_s,
        )
        self._polling: asyncio.Task[None] | None = None

    async def open_transport(self) -> None:
        polling = self.dispatcher.start_polling(
            self.telegram,
            polling_timeout=self.polling_timeout_s,
            handle_as_tasks=False,  # in order (a form's replies), and done when polling stops
            handle_signals=False,
            close_bot_session=False,
        )
        self._polling = asyncio.get_running_loop().create_task(polling, name="telegram-polling")
        log.info(
            "telegram bot polling %s (group %r)", self.telegram.session.api.base, self.service.group
        )

    async def close_transport(self) -> None:
        polling = self._polling
        if polling is not None and not polling.done():
            try:
                await self.dispatcher.stop_polling()  # its own tasks end with it
            except RuntimeError:  # not started yet: nothing of it runs but this task
                polling.cancel()
        if polling is not None:
            await asyncio.gather(polling, return_exceptions=True)
        await self.telegram.session.close()
