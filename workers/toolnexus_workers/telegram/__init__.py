"""``toolnexus worker telegram``: each request a message in a Telegram chat (SPEC §12).

Who asks, the prompt and the time left, with inline buttons (approval, single choice),
toggles and Done (multiple choice), a guided reply sequence (forms: each field asked,
checked and asked again when wrong, defaults offered), or the link, its domain and
warnings with Done / Decline (authorization). Only the allowed Telegram user ids may
answer; the answer's person is ``telegram:<user id>``. Updates come by long polling
(``getUpdates``). Needs ``pip install 'toolnexus-bridge[telegram]'``.

    TELEGRAM_BOT_TOKEN=123456:ABC... toolnexus worker telegram --chat -1001234 --allow-user 555
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

from toolnexus import Broker
from toolnexus.errors import ConfigurationError

from ..chat import add_chat_flags, server_options, split_ids
from ..options import require_extra, run_checked, worker_parser
from ..reminders import add_reminder_flag

API_URL = "https://api.telegram.org"


def parser() -> argparse.ArgumentParser:
    """The command line of ``toolnexus worker telegram``."""
    p = worker_parser(
        "telegram", "Post requests to a Telegram chat, answered there.", group="telegram"
    )
    telegram = p.add_argument_group("telegram")
    env = os.environ.get
    telegram.add_argument(
        "--bot-token",
        default=env("TELEGRAM_BOT_TOKEN"),
        help="the bot's token from @BotFather ($TELEGRAM_BOT_TOKEN)",
    )
    telegram.add_argument(
        "--chat",
        default=env("TOOLNEXUS_TELEGRAM_CHAT"),
        help="chat id to post in, e.g. -1001234567890 ($TOOLNEXUS_TELEGRAM_CHAT)",
    )
    telegram.add_argument(
        "--allow-user",
        action="append",
        default=split_ids(env("TOOLNEXUS_TELEGRAM_USERS")),
        metavar="ID",
        help="Telegram user id who may answer, repeatable; '*' for anyone in the chat "
        "($TOOLNEXUS_TELEGRAM_USERS, comma-separated)",
    )
    telegram.add_argument(
        "--api-url",
        default=env("TOOLNEXUS_TELEGRAM_API_URL") or API_URL,
        help=f"Bot API server ({API_URL}; $TOOLNEXUS_TELEGRAM_API_URL)",
    )
    telegram.add_argument(
        "--polling-timeout-s",
        type=int,
        default=10,
        help="how long one getUpdates call waits for updates (10 s)",
    )
    add_chat_flags(telegram, "Telegram")
    add_reminder_flag(telegram, "post a reminder of")
    return p


def check(args: argparse.Namespace) -> None:
    """Raises: ConfigurationError for a missing extra, token, chat or user."""
    require_extra("telegram", ("aiogram",))
    if not args.bot_token:
        raise ConfigurationError(
            "no Telegram bot token: pass --bot-token or set TELEGRAM_BOT_TOKEN"
        )
    if not args.chat:
        raise ConfigurationError("no Telegram chat: pass --chat or set TOOLNEXUS_TELEGRAM_CHAT")
    try:
        args.chat = int(args.chat)
    except ValueError:
        raise ConfigurationError(f"a Telegram chat id is a number, not {args.chat!r}") from None
    if not args.allow_user:
        raise ConfigurationError(
            "nobody may answer: pass --allow-user ID (repeatable, '*' for anyone) "
            "or set TOOLNEXUS_TELEGRAM_USERS"
        )


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``toolnexus worker telegram``; return its exit status (2 for a bad configuration)."""
    return run_checked(parser().parse_args(argv), check, _serve)


async def _serve(broker: Broker, args: argparse.Namespace) -> int:
    from .server import TelegramServer

    server = TelegramServer(
        broker,
        bot_token=args.bot_token,
        chat_id=args.chat,
        allowed=args.allow_user,
        api_url=args.api_url,
        polling_timeout_s=args.polling_timeout_s,
        **server_options(args),
    )
    await server.run()
    return 0


__all__ = ["main", "parser"]
