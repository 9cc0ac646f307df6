"""An agent in its own process: one durable, task-backed tool call through load_mcp.

    python task_agent.py MCP_URL REDIS_URL NAMESPACE DURABLE_ID [TOOL]

Prints ``"calling"`` once connected, then the tool's text as one JSON line (or
``{"error": ...}``). Run it again with the same arguments after killing it: it goes on with
the same task.
"""

from __future__ import annotations

import asyncio
import json
import sys

import toolnexus


async def main(url: str, redis_url: str, namespace: str, durable: str, tool: str) -> None:
    async with (
        toolnexus.connect(redis_url, namespace=namespace, block_ms=100, lease_ms=600) as broker,
        toolnexus.load_mcp(
            url, wait_for=broker.wait_for, agent="agent-7", mode="2026-07-28", timeout_s=60
        ) as tools,
    ):
        print(json.dumps("calling"), flush=True)
        try:
            result = await tools[tool].call({}, durable=durable)
        except toolnexus.ToolnexusError as exc:
            print(json.dumps({"error": str(exc)}), flush=True)
            return
        print(json.dumps({"text": result.content[0].text}), flush=True)  # type: ignore[union-attr]


if __name__ == "__main__":
    tool = sys.argv[5] if len(sys.argv) > 5 else "book"
    asyncio.run(main(*sys.argv[1:5], tool))
