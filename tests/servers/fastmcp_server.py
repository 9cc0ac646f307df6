"""A fastmcp server whose tools ask the way fastmcp's documentation shows: ``ctx.elicit``.

    python fastmcp_server.py [--http PORT] [--name NAME] [--both-ways]

stdio by default; with ``--http`` it serves streamable HTTP on 127.0.0.1:PORT at /mcp.
With ``--both-ways`` a ``vote`` tool asks the 2026-07-28 way: it returns an
``InputRequiredResult``.
"""

from __future__ import annotations

import argparse
import json
from typing import Literal

import mcp_types
from fastmcp import Context, FastMCP
from pydantic import BaseModel, Field


class Booking(BaseModel):
    name: str = Field(title="Name", min_length=2)
    guests: int = Field(default=2, ge=1, le=10)
    vip: bool = False


def build(name: str, both_ways: bool = False) -> FastMCP:
    mcp = FastMCP(name)

    if both_ways:

        @mcp.tool
        async def vote(ctx: Context) -> str | mcp_types.InputRequiredResult:
            """Asks for a choice with an InputRequiredResult (2026-07-28 only)."""
            answer = (ctx.input_responses or {}).get("choice")
            if answer is None:
                schema = {"type": "object", "properties": {"value": {"type": "string"}}}
                ask = mcp_types.ElicitRequest(
                    params=mcp_types.ElicitRequestFormParams(
                        message="Which colour?", requested_schema=schema
                    )
                )
                return mcp_types.InputRequiredResult(input_requests={"choice": ask})
            return json.dumps(answer.model_dump(mode="json", exclude_none=True))

    @mcp.tool
    async def book(ctx: Context) -> str:
        """Book a table: asks for the booking details with a form."""
        result = await ctx.elicit("Your booking details?", Booking)
        if result.action == "accept":
            return json.dumps({"action": "accept", "data": result.data.model_dump()})
        return json.dumps({"action": result.action})

    @mcp.tool
    async def count(ctx: Context) -> str:
        """Asks for a number."""
        result = await ctx.elicit("How many seats?", int)
        return json.dumps({"action": result.action, "data": getattr(result, "data", None)})

    @mcp.tool
    async def pick(ctx: Context) -> str:
        """Asks to choose a colour."""
        result = await ctx.elicit("Which colour?", ["red", "green", "blue"])
        return json.dumps({"action": result.action, "data": getattr(result, "data", None)})

    @mcp.tool
    async def confirm(ctx: Context, what: str) -> str:
        """Asks for a yes/no confirmation."""
        result = await ctx.elicit(f"Really {what}?", Literal["yes", "no"])
        return json.dumps({"action": result.action, "data": getattr(result, "data", None)})

    @mcp.tool
    def echo(text: str) -> str:
        """Says it back."""
        return text

    return mcp


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--http", type=int, default=None, metavar="PORT")
    parser.add_argument("--name", default="fastmcp-elicit")
    parser.add_argument("--both-ways", action="store_true")
    args = parser.parse_args()
    server = build(args.name, args.both_ways)
    if args.http is None:
        server.run(show_banner=False)
    else:
        server.run(
            transport="http",
            host="127.0.0.1",
            port=args.http,
            show_banner=False,
            log_level="warning",
        )


if __name__ == "__main__":
    main()
