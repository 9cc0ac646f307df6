"""A Google ADK agent with a scripted model (a ``BaseLlm`` that calls one tool, then
answers with what the tools returned as a JSON list; no network) and two tools that ask
for confirmation: ``transfer`` (``require_confirmation=True``) and ``book_leave``
(``tool_context.request_confirmation`` with a payload). The tests import :func:`runner`;
tests/test_frameworks_google_adk.py also runs this file as the agent process that is
killed and resumed, its sessions in a SQLite file:

    python adk_agent.py URL NAMESPACE HOME MODE [SESSION_ID]

MODE: ``start`` (run_resumable; prints the session id first) or ``resume``. Prints the
final text; each tool appends each call it runs to HOME/ran.jsonl.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

import pydantic
from google.adk.agents import LlmAgent
from google.adk.events import Event
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.runners import Runner
from google.adk.sessions import BaseSessionService, InMemorySessionService
from google.adk.sessions.sqlite_session_service import SqliteSessionService
from google.adk.tools.function_tool import FunctionTool
from google.adk.tools.tool_context import ToolContext
from google.genai import types

import toolnexus
from toolnexus.frameworks.google_adk import resume, run_resumable

APP = "bank"
USER = "u-1"
ARGS = {"to": "ACME", "amount": 10}


class Scripted(BaseLlm):
    """Calls ``tool`` with ``args`` once, then answers with every tool response so far."""

    model: str = "scripted"
    tool: str = "transfer"
    args: dict[str, Any] = pydantic.Field(default_factory=dict)

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        responses = [
            part.function_response.response
            for content in llm_request.contents
            for part in content.parts or []
            if part.function_response and part.function_response.name == self.tool
        ]
        if not responses:
            call = types.FunctionCall(name=self.tool, args=self.args, id="fc-1")
            part = types.Part(function_call=call)
        else:
            part = types.Part(text=json.dumps(responses))
        yield LlmResponse(content=types.Content(role="model", parts=[part]))


def runner(
    home: Path, tool: str = "transfer", sessions: BaseSessionService | None = None
) -> Runner:
    """A runner of the bank agent, its model calling ``tool`` (``transfer`` or
    ``book_leave``); the tools write what they run to ``home/ran.jsonl``."""

    def ran(entry: dict[str, Any]) -> None:
        with (home / "ran.jsonl").open("a") as file:
            file.write(json.dumps(entry) + "\n")

    def transfer(to: str, amount: int) -> str:
        """Send ``amount`` euros to ``to``."""
        ran({"to": to, "amount": amount})
        return f"sent {amount} to {to}"

    def book_leave(days: int, tool_context: ToolContext) -> dict[str, Any]:
        """Book ``days`` days of leave; the manager may approve fewer."""
        confirmation = tool_context.tool_confirmation
        if confirmation is None:
            tool_context.request_confirmation(
                hint=f"Approve {days} days of leave?", payload={"approved_days": days}
            )
            return {"status": "waiting for the manager"}
        approved = confirmation.payload["approved_days"]
        ran({"days": approved})
        return {"status": "booked", "days": approved}

    args = ARGS if tool == "transfer" else {"days": 5}
    agent = LlmAgent(
        name="bank_bot",
        model=Scripted(tool=tool, args=args),
        tools=[FunctionTool(transfer, require_confirmation=True), book_leave],
    )
    return Runner(app_name=APP, agent=agent, session_service=sessions or InMemorySessionService())


def final_text(events: list[Event]) -> Any:
    """The JSON the model answered last."""
    texts = [p.text for e in events if e.content for p in e.content.parts or [] if p.text]
    return json.loads(texts[-1])


async def main() -> None:
    url, namespace, home, mode = sys.argv[1:5]
    sessions = SqliteSessionService(str(Path(home) / "sessions.db"))
    bank = runner(Path(home), sessions=sessions)
    async with toolnexus.connect(url, namespace=namespace, block_ms=100) as broker:
        if mode == "start":
            session = await sessions.create_session(app_name=APP, user_id=USER)
            print(session.id, flush=True)
            message = types.Content(role="user", parts=[types.Part(text="Pay ACME")])
            events = await run_resumable(
                bank, user_id=USER, session_id=session.id, new_message=message, broker=broker
            )
        else:
            events = await resume(bank, session_id=sys.argv[5], broker=broker)
    print(json.dumps(final_text(events)), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
