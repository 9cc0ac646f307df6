"""An MCP server whose tool asks the guest for a booking form, then a deposit authorization.

    python examples/booking_server.py               # over stdio
    python examples/booking_server.py --http 8000   # streamable HTTP at http://127.0.0.1:8000/mcp

The server is the SDK's high-level ``MCPServer``; ``book_table`` works with every
protocol version (``elicitation/create`` mid-call on 2025-11-25, ``InputRequiredResult``
rounds on 2026-07-28). Its code lives in ``toolnexus.demo`` so that ``toolnexus demo``
runs from an installed package; read it there.
"""

from __future__ import annotations

import argparse

from toolnexus.cli import booking_server

mcp = booking_server()


def main() -> None:
    """Serve ``book_table`` over stdio, or over streamable HTTP with ``--http PORT``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--http", type=int, metavar="PORT", help="serve streamable HTTP")
    parser.add_argument("--host", default="127.0.0.1")
    args = parser.parse_args()
    if args.http is None:
        mcp.run("stdio")
    else:
        mcp.run("streamable-http", host=args.host, port=args.http)


if __name__ == "__main__":
    main()
