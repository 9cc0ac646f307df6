"""A LangChain agent (``create_agent``) with a scripted model (langchain_core's fake chat
model: no network) whose ``transfer`` tool the ``HumanInTheLoopMiddleware`` gates, for
tests/test_frameworks_langgraph.py; run as a process of its own it keeps the graph's state
in a SQLite checkpointer, so that another process resumes it:

    python langgraph_agent.py URL NAMESPACE THREAD RAN_FILE DB MODE

MODE: ``start`` (run_resumable) or ``resume``. Prints the tool results of the final state
as a JSON list; the tool appends each call it runs to RAN_FILE.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from langchain.agents import create_agent
from langchain.agents.middleware import AgentMiddleware, HumanInTheLoopMiddleware
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import BaseTool, tool
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

import toolnexus
from toolnexus.frameworks import Ledger
from toolnexus.frameworks.langgraph import Graph, LedgerMiddleware, resume, run_resumable

ARGS = {"to": "ACME", "amount": 10}


class Scripted(GenericFakeChatModel):
    """The fake chat model, its tools bound as a real model's are (it ignores them)."""

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Scripted:
        return self


def calls(*arguments: dict[str, Any], first: int = 1) -> list[AIMessage]:
    """One AI message calling ``transfer`` with each of ``arguments``, ids from ``first``."""
    return [
        AIMessage(
            "",
            tool_calls=[
                {"name": "transfer", "args": args, "id": f"call_{first + n}"}
                for n, args in enumerate(arguments)
            ],
        )
    ]


def transfer_tool(ran_file: Path) -> BaseTool:
    @tool
    def transfer(to: str, amount: int) -> str:
        """Send ``amount`` euros to ``to``."""
        with ran_file.open("a") as f:
            f.write(json.dumps({"to": to, "amount": amount}) + "\n")
        return f"sent {amount} to {to}"

    return transfer


def bank(
    ran_file: Path,
    checkpointer: BaseCheckpointSaver[Any],
    script: Iterable[AIMessage | str],
    *,
    ledger: Ledger | None = None,
    allowed: Sequence[str] = ("approve", "edit", "reject", "respond"),
    mode: str = "batched",
    tools: Sequence[BaseTool] = (),
) -> Graph:
    """The agent: ``script`` is what the model says in turn, ``transfer`` gated."""
    gate = HumanInTheLoopMiddleware(
        {"transfer": {"allowed_decisions": list(allowed)}},  # type: ignore[typeddict-item]
        interrupt_mode=mode,  # type: ignore[arg-type]
    )
    middleware: list[AgentMiddleware[Any, Any]] = [gate]
    if ledger is not None:
        middleware.append(LedgerMiddleware(ledger))
    return create_agent(
        Scripted(messages=iter(script)),
        tools=[transfer_tool(ran_file), *tools],
        middleware=middleware,
        checkpointer=checkpointer,
    )


def tool_results(values: dict[str, Any]) -> list[str]:
    """What each tool call gave the model, in order."""
    return [str(m.content) for m in values["messages"] if isinstance(m, ToolMessage)]


async def main() -> None:
    url, namespace, thread, ran_file, db, mode = sys.argv[1:7]
    config: Any = {"configurable": {"thread_id": thread}}
    async with (
        AsyncSqliteSaver.from_conn_string(db) as checkpointer,
        toolnexus.connect(url, namespace=namespace, block_ms=100) as broker,
    ):
        ledger = Ledger.of(broker)
        if mode == "start":
            agent = bank(Path(ran_file), checkpointer, calls(ARGS), ledger=ledger)
            values = await run_resumable(
                agent, {"messages": [("user", "Pay ACME")]}, broker=broker, config=config
            )
        else:  # the model's next turn, after the tool ran
            agent = bank(Path(ran_file), checkpointer, ["done"], ledger=ledger)
            values = await resume(agent, broker=broker, config=config)
    print(json.dumps(tool_results(values)), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
