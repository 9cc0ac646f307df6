"""``toolnexus worker http``: the HTTP answering API, for people and systems that answer
from any language (issue #29; :mod:`toolnexus_workers.http.app`, ``GET /openapi.json``).

Every request of the served queues is held open by this worker until a call answers it:
``GET /v1/requests`` lists them, ``POST /v1/requests/{id}/answer`` accepts (with data),
declines or dismisses one, ``GET /v1/events`` follows changes by long polling. Callers
authenticate with bearer tokens from a tokens file (stored as SHA-256 digests, scoped to
queues, revocable); the worker answers as the person the token names (``http:NAME``),
signed with its key. Given a link key (``--link-secret`` or ``--link-key``), it takes the
single-use answer links of the webhook and email workers too (``/v1/links/TOKEN``). Needs
``pip install 'toolnexus-bridge[http]'``.

    toolnexus worker http tokens add alice --queue ops --tokens tokens.toml   # prints it once
    toolnexus worker http tokens list --tokens tokens.toml
    toolnexus worker http tokens revoke alice --tokens tokens.toml
    toolnexus worker http --url redis://127.0.0.1:6379/0 --queue ops --also-queue billing \\
        --tokens tokens.toml --signing-key /etc/toolnexus/http.key --host 0.0.0.0
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from contextlib import AsyncExitStack
from pathlib import Path

from toolnexus import Broker
from toolnexus.cli import failed
from toolnexus.errors import ConfigurationError

from ..links import add_link_flags, link_key
from ..options import (
    add_listen_flags,
    broker_options,
    require_extra,
    run_checked,
    watch_service,
    worker_parser,
)
from .tokens import EVERY_QUEUE, Tokens, add_token, read_grants, revoke_tokens

_EXTRA = ("starlette", "uvicorn")
_TOKENS_HELP = "the tokens file (default: $TOOLNEXUS_HTTP_TOKENS_FILE)"


def _tokens_default() -> Path | None:
    value = os.environ.get("TOOLNEXUS_HTTP_TOKENS_FILE")
    return Path(value) if value else None


def parser() -> argparse.ArgumentParser:
    """The command line of ``toolnexus worker http``."""
    p = worker_parser(
        "http",
        "Answer open requests over HTTP (JSON, bearer tokens); "
        "'toolnexus worker http tokens --help' manages the tokens.",
        group="http",
        concurrency=None,
    )
    api = p.add_argument_group("HTTP API")
    add_listen_flags(api, port=8720)
    api.add_argument("--tokens", type=Path, default=_tokens_default(), help=_TOKENS_HELP)
    api.add_argument(
        "--also-queue",
        action="append",
        default=[],
        metavar="QUEUE",
        help="serve this queue too, besides --queue (repeatable)",
    )
    api.add_argument(
        "--max-wait-s",
        type=float,
        default=60.0,
        help="the longest a long poll of GET /v1/events waits (60 s)",
    )
    links = p.add_argument_group(
        "answer links", "take the single-use links the webhook and email workers send"
    )
    add_link_flags(links, base=False)
    return p


def tokens_parser() -> argparse.ArgumentParser:
    """The command line of ``toolnexus worker http tokens``."""
    p = argparse.ArgumentParser(
        prog="toolnexus worker http tokens",
        description="Add, list or revoke the bearer tokens of the HTTP answering API.",
    )
    commands = p.add_subparsers(dest="command", required=True)
    add = commands.add_parser("add", help="make a token for NAME; it is printed once")
    add.add_argument("name", help="the person or system the token names")
    add.add_argument(
        "--queue",
        action="append",
        required=True,
        help=f"a queue the token may read and answer (repeatable; {EVERY_QUEUE!r}: all)",
    )
    commands.add_parser("list", help="list the tokens: name, queues, created, revoked")
    revoke = commands.add_parser("revoke", help="revoke every token of NAME")
    revoke.add_argument("name")
    for sub in commands.choices.values():
        sub.add_argument("--tokens", type=Path, default=_tokens_default(), help=_TOKENS_HELP)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``toolnexus worker http``; return its exit status (2 for a bad configuration)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["tokens"]:
        return tokens_main(argv[1:])
    args = parser().parse_args(argv)
    return run_checked(args, _check, _serve)


def tokens_main(argv: Sequence[str]) -> int:
    """Run ``toolnexus worker http tokens``; return its exit status."""
    args = tokens_parser().parse_args(argv)
    prog = f"toolnexus worker http tokens {args.command}"
    try:
        if args.tokens is None:
            raise ConfigurationError("give the tokens file: --tokens FILE")
        if args.command == "add":
            token = add_token(args.tokens, args.name, args.queue)
            sys.stdout.write(token + "\n")
            sys.stderr.write(f"token for {args.name!r} added to {args.tokens}: keep it secret\n")
        elif args.command == "list":
            for g in read_grants(args.tokens):
                state = "revoked" if g.revoked else "active"
                line = f"{g.name}\t{','.join(g.queues)}\t{g.created}\t{state}\t{g.sha256[:12]}"
                sys.stdout.write(line + "\n")
        else:
            count = revoke_tokens(args.tokens, args.name)
            sys.stderr.write(f"revoked {count} token(s) of {args.name!r}\n")
    except ConfigurationError as exc:
        return failed(prog, exc)
    return 0


def _check(args: argparse.Namespace) -> None:
    require_extra("http", _EXTRA)
    if args.tokens is None:
        raise ConfigurationError(
            "the HTTP API answers as the person a token names: give --tokens FILE "
            "(toolnexus worker http tokens add NAME --queue QUEUE --tokens FILE)"
        )
    if not args.max_wait_s > 0:
        raise ConfigurationError(f"--max-wait-s must be positive, not {args.max_wait_s}")
    if not args.tokens.is_file():
        raise ConfigurationError(f"tokens file {args.tokens} does not exist")
    args.http_tokens = Tokens(args.tokens)
    args.http_links = link_key(args.link_secret, args.link_key)
    args.http_queues = list(dict.fromkeys([args.queue, *args.also_queue]))


async def _serve(broker: Broker, args: argparse.Namespace) -> int:
    import toolnexus

    from .server import HttpServer

    options = broker_options(args)
    async with AsyncExitStack() as stack:
        brokers = {args.queue: broker}
        for queue in args.http_queues[1:]:
            more = toolnexus.connect(args.url, **{**options, "queue": queue})
            brokers[queue] = await stack.enter_async_context(more)
        server = HttpServer(
            brokers,
            args.http_tokens,
            host=args.host,
            port=args.port,
            group=args.group,
            consumer=args.consumer,
            drain_s=args.drain_s,
            heartbeat_ttl_s=args.heartbeat_ttl_s,
            max_wait_s=args.max_wait_s,
            links=args.http_links,
        )
        for service in server.services:
            watch_service(args, service)
        await server.run()
    return 0


__all__ = ["main", "parser", "tokens_parser"]
