"""The client the MCP conformance package drives (tests/test_mcp_conformance.py): ``load_mcp``
with its defaults against the scenario's server, given as the last argument.

It lists the tools and calls the ones the scenario's context names (``MCP_CONFORMANCE_CONTEXT``,
``toolCalls``) or else each one, with arguments made from its input schema (a ``schema``
argument gets the other tools' input schema, as the JSON Schema scenarios echo it); every
question the server asks is accepted with an empty form, so the schema's defaults fill it.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

from toolnexus import Answer, Request, load_mcp
from toolnexus.mcp import McpError


async def accept(request: Request) -> Answer:
    """Every request accepted; a form with nothing filled in (its defaults apply)."""
    return Answer(id=request.id, ok=True, data={} if request.kind == "form" else None)


def sample(schema: dict[str, Any]) -> Any:
    """A value that fits a (simple) JSON Schema."""
    if "default" in schema:
        return schema["default"]
    if "enum" in schema:
        return schema["enum"][0]
    kind = schema.get("type")
    if kind in ("number", "integer"):
        return 1
    if kind == "boolean":
        return True
    if kind == "array":
        return []
    if kind == "object":
        properties = schema.get("properties", {})
        required = schema.get("required", list(properties))
        return {key: sample(properties[key]) for key in required if key in properties}
    return "test"


async def main(url: str) -> None:
    async with load_mcp(url, wait_for=accept, timeout_s=10) as tools:
        print(f"connected at {tools.protocol_version}: {', '.join(tools)}")
        context = json.loads(os.environ.get("MCP_CONFORMANCE_CONTEXT") or "{}")
        calls = [(c["name"], c.get("arguments", {})) for c in context.get("toolCalls", [])]
        if not calls:
            for tool in tools.values():
                arguments = sample(tool.input_schema)
                if "schema" in tool.input_schema.get("properties", {}):
                    others = [t.input_schema for t in tools.values() if t is not tool]
                    arguments["schema"] = others[0] if others else {}
                calls.append((tool.name, arguments))
        for name, arguments in calls:
            if name not in tools:
                print(f"{name}: not listed")
                continue
            try:
                result = await tools[name].call(arguments)
            except McpError as exc:  # the scenario's server may list a tool it does not serve
                print(f"{name}: {exc}")
            else:
                print(f"{name}: is_error={result.is_error}")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[-1]))
