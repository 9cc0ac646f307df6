"""A Claude Agent SDK agent whose ``transfer`` tool (an in-process SDK MCP tool) asks for
approval, its CLI pointed at the fake Anthropic API of tests/anthropic_fake.py (no
network). The tests import :func:`options`; tests/test_frameworks_claude_agent_sdk.py also
runs this file as the agent process that is killed and resumed:

    python claude_agent.py URL NAMESPACE RUN API_URL HOME MODE

MODE: ``start`` (run_resumable) or ``resume``. Prints the session's
final text; the tool appends each call it runs to HOME/ran.jsonl.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from claude_agent_sdk import ClaudeAgentOptions, create_sdk_mcp_server, tool

import toolnexus
from toolnexus.frameworks.claude_agent_sdk import resume, run_resumable

TOOL = "mcp__bank__transfer"
"""The tool's name as Claude calls it: ``mcp__<server>__<tool>``."""
SCHEMA = {
    "type": "object",
    "properties": {"to": {"type": "string"}, "amount": {"type": "integer", "maximum": 100}},
    "required": ["to", "amount"],
}


def options(api_url: str, home: Path, **more: Any) -> ClaudeAgentOptions:
    """Options running the bundled CLI against the fake API at ``api_url``, its config and
    sessions in ``home`` (its cwd too), with the ``bank`` server's ``transfer`` tool."""

    @tool("transfer", "Send an amount of euros to someone", SCHEMA)
    async def transfer(arguments: dict[str, Any]) -> dict[str, Any]:
        with (home / "ran.jsonl").open("a") as ran:
            ran.write(json.dumps(arguments) + "\n")
        text = f"sent {arguments['amount']} to {arguments['to']}"
        return {"content": [{"type": "text", "text": text}]}

    env = {
        "ANTHROPIC_BASE_URL": api_url,
        "ANTHROPIC_API_KEY": "sk-ant-dummy",
        "CLAUDE_CONFIG_DIR": str(home / "claude"),
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "ENABLE_TOOL_SEARCH": "false",  # MCP tools offered to the model up front
    }
    bank = create_sdk_mcp_server("bank", tools=[transfer])
    return ClaudeAgentOptions(mcp_servers={"bank": bank}, env=env, cwd=home, **more)


async def main() -> None:
    url, namespace, run, api_url, home, mode = sys.argv[1:7]
    agent = options(api_url, Path(home))
    async with toolnexus.connect(url, namespace=namespace, block_ms=100) as broker:
        schemas = {TOOL: SCHEMA}
        if mode == "start":
            result = await run_resumable(
                "Pay ACME", options=agent, broker=broker, run=run, schemas=schemas
            )
        else:
            result = await resume(options=agent, broker=broker, run=run, schemas=schemas)
    print(result.result, flush=True)


if __name__ == "__main__":
    asyncio.run(main())
