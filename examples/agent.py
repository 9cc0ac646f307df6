"""An agent that books a table through an MCP server's tool, while a person answers elsewhere.

    python examples/agent.py --url redis://127.0.0.1:6379/0   # answer with a responder worker
    python examples/agent.py                                  # memory:// answers itself

The booking server asks for a form and a deposit authorization mid-call; ``load_mcp``
turns each into a toolnexus request on the broker, and the tool call resumes when a
responder (a person at a web page or terminal, or a bot) has answered.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import sys
import uuid
from pathlib import Path

import anyio

import toolnexus
from toolnexus.cli import auto_answer, booking_server, result_text
from toolnexus.responders import Terminal

SERVER = shlex.join([sys.executable, str(Path(__file__).with_name("booking_server.py"))])


async def answer_here(broker: toolnexus.Broker, how: str, agent: str) -> None:
    """Answer this agent's requests in this process (``auto`` or ``terminal``)."""
    terminal = Terminal()
    async with broker.responder(f"example-{how}") as responder:
        async for pending in responder:
            if pending.request.source.agent != agent:
                await pending.skip()
            elif how == "auto":
                await pending.answer(auto_answer(pending.request))
            else:
                await terminal.handle(pending)


async def main(args: argparse.Namespace) -> int:
    url = args.url or os.environ.get("TOOLNEXUS_URL") or "memory://"
    respond = args.respond or ("auto" if url.startswith("memory:") else "none")
    agent = f"example-agent-{uuid.uuid4().hex[:6]}"
    server = booking_server() if args.inprocess else args.server
    async with (
        toolnexus.connect(url, namespace=args.namespace, queue=args.queue) as broker,
        anyio.create_task_group() as tasks,
    ):
        if respond != "none":
            tasks.start_soon(answer_here, broker, respond, agent)
        async with toolnexus.load_mcp(
            server, wait_for=broker.wait_for, agent=agent, timeout_s=args.timeout
        ) as tools:
            print(f"{tools.server_name}: tools {', '.join(tools)}", flush=True)
            result = await tools["book_table"](restaurant=args.restaurant)
        tasks.cancel_scope.cancel()
    print(result_text(result), flush=True)
    return 1 if result.is_error else 0


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="broker URL (default: $TOOLNEXUS_URL or memory://)")
    parser.add_argument("--namespace", default="toolnexus")
    parser.add_argument("--queue", default="default")
    parser.add_argument("--server", default=SERVER, help="MCP server: a command line or URL")
    parser.add_argument(
        "--inprocess", action="store_true", help="run the booking server in this process"
    )
    parser.add_argument(
        "--respond",
        choices=["auto", "terminal", "none"],
        help="answer here (default: auto on memory://, else none: a responder worker answers)",
    )
    parser.add_argument("--restaurant", default="Chez Toolnexus")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds a person has")
    return parser.parse_args()


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse_args())))
