"""``toolnexus worker webhook``: each request POSTed as JSON to the configured endpoints,
signed per the Standard Webhooks specification, retried with backoff, idempotent by id;
the end of each announced too; each carries a single-use answer link to the HTTP answering
API (:mod:`toolnexus_workers.webhook.sender`). Needs ``pip install
'toolnexus-bridge[webhook]'``.

    toolnexus worker webhook --new-secret                    # prints a whsec_ secret
    toolnexus worker webhook --url redis://127.0.0.1:6379/0 --queue ops \\
        --endpoint ci=https://ci.example.com/hooks/toolnexus --webhook-secret whsec_... \\
        --link-secret ... --link-base https://answers.example.com
"""

from __future__ import annotations

import argparse
import base64
import logging
import os
import secrets
import sys
from collections.abc import Sequence

from toolnexus import Broker, ConfigurationError
from toolnexus.cli import EXIT_OK

from ..links import add_link_flags, sender_links
from ..options import require_extra, run_checked, serve_worker, worker_parser
from ..reminders import add_reminder_flag

log = logging.getLogger("toolnexus.webhook")

SECRET_ENV = "TOOLNEXUS_WEBHOOK_SECRET"
_EXTRA = ("standardwebhooks", "httpx")


def parser() -> argparse.ArgumentParser:
    """The command line of ``toolnexus worker webhook``."""
    p = worker_parser(
        "webhook",
        "POST each request, signed per Standard Webhooks, with a single-use answer link.",
        group="webhook",
    )
    hooks = p.add_argument_group("webhooks")
    hooks.add_argument(
        "--endpoint",
        action="append",
        default=[],
        metavar="[NAME=]URL",
        help="where to POST (repeatable); NAME (default: the URL's host) is the recipient "
        "its links answer as (link:webhook:NAME)",
    )
    hooks.add_argument(
        "--webhook-secret",
        default=os.environ.get(SECRET_ENV) or None,
        help=f"the whsec_ secret that signs every message (default: ${SECRET_ENV})",
    )
    hooks.add_argument(
        "--new-secret", action="store_true", help="print a fresh whsec_ secret and exit"
    )
    hooks.add_argument("--attempts", type=int, default=8, help="deliveries tried per message (8)")
    hooks.add_argument(
        "--retry-delay-s",
        type=float,
        default=1.0,
        help="the wait before the first retry, doubled after each (1 s; at most 300 s)",
    )
    add_reminder_flag(hooks, "announce")
    links = p.add_argument_group("answer links", "the link key and the HTTP API that takes them")
    add_link_flags(links, base=True)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``toolnexus worker webhook``; return its exit status (2 for a bad configuration)."""
    args = parser().parse_args(argv)
    if args.new_secret:
        sys.stdout.write("whsec_" + base64.b64encode(secrets.token_bytes(32)).decode() + "\n")
        return EXIT_OK
    return run_checked(args, _check, _serve)


def _check(args: argparse.Namespace) -> None:
    require_extra("webhook", _EXTRA)
    from standardwebhooks import Webhook

    from ..delivery import Retry
    from .sender import Endpoint

    if not args.endpoint:
        raise ConfigurationError("give at least one --endpoint URL to POST to")
    if not args.webhook_secret:
        raise ConfigurationError(
            f"give --webhook-secret (or ${SECRET_ENV}); make one with "
            "`toolnexus worker webhook --new-secret`"
        )
    try:
        Webhook(args.webhook_secret)
    except Exception as exc:  # binascii.Error, or standardwebhooks' empty-secret error
        raise ConfigurationError(f"--webhook-secret is not a whsec_ secret: {exc}") from None
    args.webhook_links = sender_links(args.link_secret, args.link_key, args.link_base)
    if args.attempts < 1 or not args.retry_delay_s > 0:
        raise ConfigurationError("--attempts must be 1 or more and --retry-delay-s positive")
    args.webhook_endpoints = [Endpoint.parse(text) for text in args.endpoint]
    for endpoint in args.webhook_endpoints:
        if not endpoint.url.startswith(("http://", "https://")):
            raise ConfigurationError(f"--endpoint {endpoint.url!r} is not an http(s) URL")
    args.webhook_retry = Retry(args.attempts, args.retry_delay_s)


async def _serve(broker: Broker, args: argparse.Namespace) -> int:
    from .sender import WebhookWorker

    worker = WebhookWorker(
        args.queue,
        args.webhook_endpoints,
        args.webhook_secret,
        args.webhook_links,
        args.link_base,
        retry=args.webhook_retry,
        remind_after_s=args.remind_after_s,
    )
    names = ", ".join(e.name for e in args.webhook_endpoints)
    log.info("announcing queue %r to %s", args.queue, names)
    return await serve_worker(broker, args, worker, worker.aclose)


__all__ = ["main", "parser"]
