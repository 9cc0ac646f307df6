"""An eliciting server on the mcp 1.x SDK's FastMCP, asking the way its documentation shows:
``ctx.elicit`` with a pydantic model, ``ctx.elicit_url`` for URL mode. Runs in .venv-mcp1.

    python mcp1_server.py               # stdio
    python mcp1_server.py --http PORT   # streamable HTTP at http://127.0.0.1:PORT/mcp

 Each tool returns what it got as JSON: ``{"action": ..., "data": ...}``.
"""

from __future__ import annotations

import json
import sys

from mcp.server.fastmcp import Context, FastMCP
from pydantic import BaseModel, Field


class Booking(BaseModel):
    name: str = Field(title="Name", min_length=2)
    guests: int = Field(default=2, ge=1, le=10)
    vip: bool = False


class Guests(BaseModel):
    guests: int = Field(title="Guests", ge=1)


class Seats(BaseModel):
    value: int


class Confirmation(BaseModel):
    confirmed: bool


def build(port: int = 8000) -> FastMCP:
    server = FastMCP("mcp1-elicit", port=port)

    @server.tool()
    async def book_table(ctx: Context, restaurant: str) -> str:
        """Book a table at ``restaurant``: asks how many guests (the manual's examples)."""
        result = await ctx.elicit(f"Book {restaurant}?", Guests)
        if result.action == "accept":
            return json.dumps({"action": "accept", "data": result.data.model_dump()})
        return json.dumps({"action": result.action})

    @server.tool()
    async def book(ctx: Context) -> str:
        """Book a table: asks for the booking details with a form."""
        result = await ctx.elicit("Your booking details?", Booking)
        if result.action == "accept":
            return json.dumps({"action": "accept", "data": result.data.model_dump()})
        return json.dumps({"action": result.action})

    @server.tool()
    async def count(ctx: Context) -> str:
        """Asks for a number."""
        result = await ctx.elicit("How many seats?", Seats)
        return json.dumps({"action": result.action})

    @server.tool()
    async def confirm(ctx: Context, what: str) -> str:
        """Asks for a yes/no confirmation."""
        result = await ctx.elicit(f"Really {what}?", Confirmation)
        return json.dumps({"action": result.action})

    @server.tool()
    async def sign_in(ctx: Context) -> str:
        """Sends the person to a URL (URL mode)."""
        result = await ctx.elicit_url("Sign in to the calendar", URL, "el-cal-1")
        return json.dumps({"action": result.action})

    return server


URL = "https://calendar.example.com/oauth/authorize?state=s1"


if __name__ == "__main__":
    if sys.argv[1:2] == ["--http"]:
        build(int(sys.argv[2])).run("streamable-http")
    else:
        build().run()
