"""``toolnexus worker web``: open requests on a web page, answered by a person (SPEC §12).

Every request of the queue appears live (server-sent events), newest first, with
who asks and the time left; forms are rendered from the request's schema; an
authorization shows its URL with the domain highlighted and warnings for
look-alikes, and is never loaded by the page. Access is a bearer token
(``--token`` / ``TOOLNEXUS_WEB_TOKEN``) or logins from a users file (``--users``);
without either the page listens on loopback only. Needs ``pip install 'toolnexus-bridge[web]'``.

    toolnexus worker web --url redis://127.0.0.1:6379/0 --token "$TOKEN" --host 0.0.0.0

In code: ``async with WebServer(broker, port=0) as web: print(web.url)``
(:mod:`toolnexus_workers.web.server`).
"""

from __future__ import annotations

import argparse
import getpass
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from toolnexus import Broker

from ..options import add_listen_flags, require_extra, run_checked, watch_service, worker_parser
from .access import SESSION_SECRET_ENV

_EXTRA = ("starlette", "uvicorn", "sse_starlette", "jinja2")


def parser() -> argparse.ArgumentParser:
    """The command line of ``toolnexus worker web``."""
    p = worker_parser(
        "web",
        "Show open requests on a web page, where a person answers them.",
        group="web",
        concurrency=None,
    )
    page = p.add_argument_group("web page")
    add_listen_flags(page, port=8700)
    page.add_argument(
        "--token",
        default=os.environ.get("TOOLNEXUS_WEB_TOKEN"),
        help="bearer token that signs people in (default: $TOOLNEXUS_WEB_TOKEN)",
    )
    page.add_argument(
        "--users",
        type=Path,
        default=os.environ.get("TOOLNEXUS_WEB_USERS"),
        help="TOML file of logins, [users] name = 'hash' (default: $TOOLNEXUS_WEB_USERS)",
    )
    page.add_argument(
        "--session-secret",
        default=os.environ.get(SESSION_SECRET_ENV),
        help="secret that signs sessions; give every replica the same one so each accepts "
        f"the others' sign-ins (default: ${SESSION_SECRET_ENV}; else one per process)",
    )
    page.add_argument(
        "--known-domain",
        action="append",
        default=[],
        metavar="DOMAIN",
        help="a domain to guard against look-alikes, besides the built-in list (repeatable)",
    )
    page.add_argument(
        "--hash-password",
        action="store_true",
        help="read a password, print its hash for a users file, and exit",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``toolnexus worker web``; return its exit status (2 for a bad configuration)."""
    args = parser().parse_args(argv)
    if args.hash_password:
        from .access import hash_password

        password = getpass.getpass("Password: ") if sys.stdin.isatty() else sys.stdin.readline()
        sys.stdout.write(hash_password(password.rstrip("\n")) + "\n")
        return 0
    if args.metrics_host is None:  # the metrics live where the page does, by its rule
        args.metrics_host = args.host
    return run_checked(args, lambda _args: require_extra("web", _EXTRA), _serve)


async def _serve(broker: Broker, args: argparse.Namespace) -> int:
    from toolnexus.rendering import KNOWN_DOMAINS

    from .access import Access, load_users
    from .server import WebServer

    users = load_users(args.users) if args.users else None
    web = WebServer(
        broker,
        host=args.host,
        port=args.port,
        access=Access(
            token=args.token or None, users=users, session_secret=args.session_secret or None
        ),
        known_domains=KNOWN_DOMAINS + tuple(d.lower() for d in args.known_domain),
        group=args.group,
        consumer=args.consumer,
        drain_s=args.drain_s,
        heartbeat_ttl_s=args.heartbeat_ttl_s,
    )
    watch_service(args, web.service)
    await web.run()
    return 0


__all__ = ["main", "parser"]
