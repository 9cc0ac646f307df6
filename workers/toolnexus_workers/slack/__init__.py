"""``toolnexus worker slack``: each request a message in a Slack channel (SPEC §12).

Who asks, the prompt and the time left, with buttons (approval, single choice), a
menu and Send (multiple choice), a modal built from the schema (forms), or the link,
its domain and warnings with Done / Decline (authorization). Only the allowed Slack
user ids may answer; the answer's person is ``slack:<user id>``. Needs
``pip install 'toolnexus-bridge[slack]'``.

    SLACK_BOT_TOKEN=xoxb-... SLACK_SIGNING_SECRET=... \\
        toolnexus worker slack --channel C0123 --allow-user U0456 --port 3000

Interactions come to ``http://host:port/slack/events`` (the app's Request URL), or
over Socket Mode with ``--app-token`` / ``SLACK_APP_TOKEN`` instead of a signing secret.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

from toolnexus import Broker
from toolnexus.errors import ConfigurationError

from ..chat import add_chat_flags, server_options, split_ids
from ..options import add_listen_flags, require_extra, run_checked, worker_parser
from ..reminders import add_reminder_flag

API_URL = "https://slack.com/api/"


def parser() -> argparse.ArgumentParser:
    """The command line of ``toolnexus worker slack``."""
    p = worker_parser("slack", "Post requests to a Slack channel, answered there.", group="slack")
    slack = p.add_argument_group("slack")
    env = os.environ.get
    slack.add_argument(
        "--bot-token", default=env("SLACK_BOT_TOKEN"), help="bot token xoxb-… ($SLACK_BOT_TOKEN)"
    )
    slack.add_argument(
        "--signing-secret",
        default=env("SLACK_SIGNING_SECRET"),
        help="signing secret, for interactions over HTTP ($SLACK_SIGNING_SECRET)",
    )
    slack.add_argument(
        "--app-token",
        default=env("SLACK_APP_TOKEN"),
        help="app-level token xapp-…, for Socket Mode instead of HTTP ($SLACK_APP_TOKEN)",
    )
    slack.add_argument(
        "--channel",
        default=env("TOOLNEXUS_SLACK_CHANNEL"),
        help="channel id to post in ($TOOLNEXUS_SLACK_CHANNEL)",
    )
    slack.add_argument(
        "--allow-user",
        action="append",
        default=split_ids(env("TOOLNEXUS_SLACK_USERS")),
        metavar="ID",
        help="Slack user id who may answer, repeatable; '*' for anyone ($TOOLNEXUS_SLACK_USERS, "
        "comma-separated)",
    )
    add_listen_flags(slack, port=3000)  # the HTTP endpoint's
    slack.add_argument("--path", default="/slack/events", help="HTTP endpoint path")
    slack.add_argument(
        "--api-url",
        default=env("TOOLNEXUS_SLACK_API_URL") or API_URL,
        help=f"Slack Web API base URL ({API_URL}; $TOOLNEXUS_SLACK_API_URL)",
    )
    add_chat_flags(slack, "Slack")
    add_reminder_flag(slack, "post a reminder of")
    return p


def check(args: argparse.Namespace) -> None:
    """Raises: ConfigurationError for a missing extra, token, secret, channel or user."""
    require_extra("slack", ("slack_bolt", "slack_sdk", "aiohttp"))
    if not args.bot_token:
        raise ConfigurationError("no Slack bot token: pass --bot-token or set SLACK_BOT_TOKEN")
    from .server import require_verification

    require_verification(args.signing_secret, args.app_token)
    if not args.channel:
        raise ConfigurationError("no Slack channel: pass --channel or set TOOLNEXUS_SLACK_CHANNEL")
    if not args.allow_user:
        raise ConfigurationError(
            "nobody may answer: pass --allow-user ID (repeatable, '*' for anyone) "
            "or set TOOLNEXUS_SLACK_USERS"
        )


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``toolnexus worker slack``; return its exit status (2 for a bad configuration)."""
    return run_checked(parser().parse_args(argv), check, _serve)


async def _serve(broker: Broker, args: argparse.Namespace) -> int:
    from .server import SlackServer

    server = SlackServer(
        broker,
        bot_token=args.bot_token,
        signing_secret=args.signing_secret,
        app_token=args.app_token,
        channel=args.channel,
        allowed=args.allow_user,
        host=args.host,
        port=args.port,
        path=args.path,
        api_url=args.api_url,
        **server_options(args),
    )
    await server.run()
    return 0


__all__ = ["main", "parser"]
