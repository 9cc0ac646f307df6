"""The ``toolnexus`` command (SPEC §13). ``toolnexus demo`` runs a whole round trip.

Configuration comes from flags, then ``TOOLNEXUS_*`` environment variables
(``TOOLNEXUS_URL`` for the broker), then the embedded default ``memory://``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence

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
    return parser


async def _demo(args: argparse.Namespace) -> int:
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


_COMMANDS = {"demo": _demo}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``toolnexus`` command line; the exit status is returned (and used by the script)."""
    args = _parser().parse_args(argv)
    try:
        return asyncio.run(_COMMANDS[args.command](args))
    except ToolnexusError as exc:
        print(f"toolnexus: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
