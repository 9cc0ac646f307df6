"""``toolnexus worker email``: each request mailed by SMTP to the addresses its queue
(``--to``) or a route (``--rules``) names, with the question, who asks, the time left and
signed single-use links (approve, decline, open the form) that the HTTP answering API takes
(:mod:`toolnexus_workers.mail.sender`). Needs ``pip install 'toolnexus-bridge[email]'``.

    toolnexus worker email --queue ops --smtp-host smtp.example.com --from toolnexus@example.com \\
        --to oncall@example.com --rules email-routes.toml \\
        --link-secret ... --link-base https://answers.example.com
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Sequence
from pathlib import Path

from toolnexus import Broker, ConfigurationError

from ..links import add_link_flags, sender_links
from ..options import require_extra, run_checked, serve_worker, worker_parser
from ..reminders import add_reminder_flag

log = logging.getLogger("toolnexus.email")

PASSWORD_ENV = "TOOLNEXUS_SMTP_PASSWORD"
_EXTRA = ("aiosmtplib",)


def parser() -> argparse.ArgumentParser:
    """The command line of ``toolnexus worker email``."""
    p = worker_parser(
        "email",
        "Mail each request with signed single-use links to approve, decline or open the form.",
        group="email",
        concurrency=20,
    )
    mail = p.add_argument_group("email")
    mail.add_argument("--from", dest="sender", help="the sender's address (required)")
    mail.add_argument(
        "--to",
        action="append",
        default=[],
        metavar="ADDRESS",
        help="mail every request to this address (repeatable)",
    )
    mail.add_argument(
        "--rules",
        type=Path,
        default=None,
        help="TOML file of [[route]]s: kind/server/tool/agent patterns and the addresses (to)",
    )
    add_reminder_flag(mail, "mail")
    smtp = p.add_argument_group("SMTP")
    smtp.add_argument("--smtp-host", default="127.0.0.1", help="the SMTP server (127.0.0.1)")
    smtp.add_argument("--smtp-port", type=int, default=None, help="its port (25, 465 with tls)")
    smtp.add_argument(
        "--smtp-tls",
        choices=("starttls", "tls", "none"),
        default="starttls",
        help="STARTTLS (default), TLS from the start, or none (a local relay only)",
    )
    smtp.add_argument("--smtp-user", default=None, help="log in as this user")
    smtp.add_argument(
        "--smtp-password",
        default=os.environ.get(PASSWORD_ENV) or None,
        help=f"the user's password (default: ${PASSWORD_ENV})",
    )
    links = p.add_argument_group("answer links", "the link key and the HTTP API that takes them")
    add_link_flags(links, base=True)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``toolnexus worker email``; return its exit status (2 for a bad configuration)."""
    return run_checked(parser().parse_args(argv), _check, _serve)


def _check(args: argparse.Namespace) -> None:
    require_extra("email", _EXTRA)
    from .sender import Smtp, checked_addresses, read_routes

    if not args.sender:
        raise ConfigurationError("give the sender's address: --from ADDRESS")
    args.email_to = checked_addresses(args.to, "--to")
    checked_addresses([args.sender], "--from")
    args.email_routes = read_routes(args.rules) if args.rules is not None else []
    if not args.email_to and not args.email_routes:
        raise ConfigurationError("name who gets mail: --to ADDRESS or --rules FILE")
    args.email_links = sender_links(args.link_secret, args.link_key, args.link_base)
    if args.smtp_user is not None and args.smtp_password is None:
        raise ConfigurationError(f"--smtp-user needs --smtp-password (or ${PASSWORD_ENV})")
    port = args.smtp_port or (465 if args.smtp_tls == "tls" else 25)
    args.email_smtp = Smtp(args.smtp_host, port, args.smtp_tls, args.smtp_user, args.smtp_password)


async def _serve(broker: Broker, args: argparse.Namespace) -> int:
    from .sender import EmailWorker

    worker = EmailWorker(
        args.queue,
        args.email_smtp,
        args.sender,
        args.email_links,
        args.link_base,
        to=args.email_to,
        routes=args.email_routes,
        remind_after_s=args.remind_after_s,
    )
    log.info("mailing queue %r through %s:%d", args.queue, args.smtp_host, args.email_smtp.port)
    return await serve_worker(broker, args, worker, worker.aclose)


__all__ = ["main", "parser"]
