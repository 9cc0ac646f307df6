"""The ``toolnexus`` command (SPEC §13). ``toolnexus demo`` runs a whole round trip;
``toolnexus keygen NAME`` makes a signing key.
``toolnexus worker NAME`` runs a responder worker found by its ``toolnexus.workers``
entry point (so workers depend on this package, never the other way round).

Configuration comes from flags, then ``TOOLNEXUS_*`` environment variables
(``TOOLNEXUS_URL`` for the broker), then the embedded default ``memory://``.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import sys
from collections.abc import Callable, Sequence

from .errors import ToolnexusError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="toolnexus",
        description="Pause an AI agent for a person anywhere in a fleet.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    demo = commands.add_parser(
        "demo",
        help="run a whole round trip: an MCP server asks, a responder answers",
        description=(
            "Run the example MCP booking server, an agent calling its tool through "
            "load_mcp, and a responder answering the form and the authorization it asks "
            "for; then print the tool's result. Needs nothing but this package."
        ),
    )
    demo.add_argument(
        "--responder",
        choices=["terminal", "auto"],
        default="terminal",
        help="who answers: you, at this terminal (default), or an unattended bot",
    )
    demo.add_argument(
        "--url",
        default=None,
        help="broker URL: memory:// (default, or $TOOLNEXUS_URL) or redis://host:6379/0",
    )
    demo.add_argument("--namespace", default="toolnexus", help="Redis key namespace")
    demo.add_argument("--queue", default="demo", help="request queue")
    demo.add_argument("--restaurant", default="Chez Toolnexus", help="where to book")
    keygen = commands.add_parser(
        "keygen",
        help="make an Ed25519 signing key: NAME.key (private) and NAME.pub",
        description=(
            "Write NAME.key (the private key, mode 0600: give it to one process as "
            "TOOLNEXUS_SIGNING_KEY) and NAME.pub (its public line: add it to the "
            "TOOLNEXUS_TRUSTED_KEYS of the processes that verify this one). Existing "
            "files are never replaced."
        ),
    )
    keygen.add_argument("name", metavar="NAME", help="the key's name, e.g. agent-7 or ops-bot")
    keygen.add_argument("--dir", default=".", help="where to write the files (default: here)")
    names = ", ".join(sorted(_workers())) or "none installed"
    worker = commands.add_parser(
        "worker",
        help=f"run a responder worker ({names})",
        description=(
            f"Run a responder worker: {names}. "
            "`toolnexus worker NAME --help` shows the worker's own options."
        ),
    )
    worker.add_argument("name", metavar="NAME", help=f"which worker: {names}")
    worker.add_argument("args", nargs=argparse.REMAINDER, help="the worker's own options")
    return parser


def _keygen(args: argparse.Namespace) -> int:
    from .signing import SigningKey

    key = SigningKey.generate(args.name)
    key_path, pub_path = (path.resolve() for path in key.save(args.dir))
    print(f"private key: {key_path}  (mode 0600; TOOLNEXUS_SIGNING_KEY={key_path})")
    print(f"public key:  {pub_path}")
    print("trusted-keys line (add it to TOOLNEXUS_TRUSTED_KEYS of who verifies this key):")
    print(key.public_line())
    return 0


WORKERS_GROUP = "toolnexus.workers"
"""The entry-point group where workers register: ``NAME = "module:main"``."""


def _workers() -> dict[str, importlib.metadata.EntryPoint]:
    return {ep.name: ep for ep in importlib.metadata.entry_points(group=WORKERS_GROUP)}


def _extras() -> set[str]:
    try:
        return set(importlib.metadata.metadata("toolnexus").get_all("Provides-Extra") or [])
    except importlib.metadata.PackageNotFoundError:
        return set()


def _worker(args: argparse.Namespace) -> int:
    """Load worker ``args.name`` and run its ``main(argv)``."""
    workers = _workers()
    entry = workers.get(args.name)
    if entry is None:
        known = ", ".join(sorted(workers)) or "none"
        print(f"toolnexus: no worker named {args.name!r} (installed: {known})", file=sys.stderr)
        return 2
    try:
        main: Callable[[Sequence[str]], int] = entry.load()
    except ModuleNotFoundError as exc:
        missing = (exc.name or "").partition(".")[0]
        if missing in ("toolnexus", "toolnexus_workers") or not missing:
            raise
        extra = entry.name if entry.name in _extras() else None
        fix = f": pip install 'toolnexus[{extra}]'" if extra else ""
        print(
            f"toolnexus worker {entry.name} needs {missing!r}, which is not installed{fix}",
            file=sys.stderr,
        )
        return 2
    return main(args.args)


async def _demo(args: argparse.Namespace) -> int:
    from ._mcp_sdk import require_mcp2

    require_mcp2("toolnexus demo")
    from .demo import result_text, run_demo

    result = await run_demo(
        args.url,
        responder=args.responder,
        restaurant=args.restaurant,
        namespace=args.namespace,
        queue=args.queue,
    )
    print(f"\nTool result: {result_text(result)}")
    return 1 if result.is_error else 0


def _run_demo(args: argparse.Namespace) -> int:
    return asyncio.run(_demo(args))


_COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "demo": _run_demo,
    "keygen": _keygen,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``toolnexus`` command line; the exit status is returned (and used by the script)."""
    args = _parser().parse_args(argv)
    if args.command == "worker":
        return _worker(args)
    try:
        return _COMMANDS[args.command](args)
    except ToolnexusError as exc:
        print(f"toolnexus: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
