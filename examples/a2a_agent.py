"""A remote A2A agent built with the official a2a-sdk, in its own process (no LLM): the
agent side of docs/how-to/a2a.md, whose requirements the ``a2a`` extra installs
(``pip install 'toolnexus-bridge[a2a]'``).

    python examples/a2a_agent.py PORT

Its executor reads the first message of a task and pauses it, then completes the task with
what it was told:

- ``"name"``: ``input-required``, asking "What is your name?" (free text);
- ``"form"``: ``input-required``, asking "Your booking?" with a data part ``{"schema": ...}``;
- ``"tool"``: ``input-required``, asking "Run transfer?" with a data part ``{"tool_call": ...}``;
- ``"login"``: ``auth-required``, with the sign-in link as a url part.

The continuation's text and data are echoed in the completed task's status message (data as
JSON), so the caller reads exactly what reached the agent. ``tasks/cancel`` cancels.
tests/test_frameworks_a2a.py runs it.
"""

from __future__ import annotations

import json
import sys

import uvicorn
from a2a.helpers import get_data_parts, get_message_text, new_data_part, new_text_part
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    Message,
    Part,
    Role,
    Task,
    TaskState,
    TaskStatus,
)
from starlette.applications import Starlette

TRANSFER_SCHEMA = {
    "type": "object",
    "properties": {"to": {"type": "string"}, "amount": {"type": "integer", "maximum": 100}},
    "required": ["to", "amount"],
}
BOOKING_SCHEMA = {
    "type": "object",
    "properties": {"seats": {"type": "integer", "title": "Seats", "minimum": 1}},
    "required": ["seats"],
}


def _pause(kind: str) -> tuple[TaskState, list[Part]]:
    if kind == "form":
        parts = [new_text_part("Your booking?"), new_data_part({"schema": BOOKING_SCHEMA})]
        return TaskState.TASK_STATE_INPUT_REQUIRED, parts
    if kind == "tool":
        call = {"name": "transfer", "arguments": {"to": "ACME", "amount": 10}}
        call |= {"call_id": "call-1", "schema": TRANSFER_SCHEMA}
        return TaskState.TASK_STATE_INPUT_REQUIRED, [
            new_text_part("Run transfer?"),
            new_data_part({"tool_call": call}),
        ]
    if kind == "login":
        return TaskState.TASK_STATE_AUTH_REQUIRED, [
            new_text_part("Sign in to the calendar"),
            Part(url="https://calendar.example.com/oauth?state=1"),
        ]
    return TaskState.TASK_STATE_INPUT_REQUIRED, [new_text_part("What is your name?")]


class AskingExecutor(AgentExecutor):
    """Pauses each task once, then completes it with what the continuation said."""

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        assert context.task_id is not None and context.context_id is not None
        assert context.message is not None
        updater = TaskUpdater(event_queue, context.task_id, context.context_id)
        if context.current_task is None:
            task = Task(
                id=context.task_id,
                context_id=context.context_id,
                status=TaskStatus(state=TaskState.TASK_STATE_SUBMITTED),
                history=[context.message],
            )
            await event_queue.enqueue_event(task)
            state, parts = _pause(get_message_text(context.message).strip())
            await updater.update_status(state, updater.new_agent_message(parts))
            return
        told = get_message_text(context.message)
        data = get_data_parts(context.message.parts)
        echo = f"told: {told}" + (f" data: {json.dumps(data, sort_keys=True)}" if data else "")
        await updater.complete(updater.new_agent_message([new_text_part(echo)]))

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        assert context.task_id is not None and context.context_id is not None
        updater = TaskUpdater(event_queue, context.task_id, context.context_id)
        await updater.cancel(
            Message(role=Role.ROLE_AGENT, message_id="cancelled", parts=[new_text_part("ok")])
        )


def app(port: int) -> Starlette:
    card = AgentCard(
        name="asking-agent",
        description="Asks once, then completes with what it was told",
        version="1.0.0",
        supported_interfaces=[
            AgentInterface(
                url=f"http://127.0.0.1:{port}/", protocol_binding="JSONRPC", protocol_version="1.0"
            )
        ],
        capabilities=AgentCapabilities(streaming=True),
        default_input_modes=["text/plain", "application/json"],
        default_output_modes=["text/plain"],
        skills=[AgentSkill(id="ask", name="ask", description="asks", tags=["test"])],
    )
    handler = DefaultRequestHandler(
        agent_executor=AskingExecutor(), task_store=InMemoryTaskStore(), agent_card=card
    )
    routes = create_agent_card_routes(card) + create_jsonrpc_routes(handler, rpc_url="/")
    return Starlette(routes=routes)


if __name__ == "__main__":
    port = int(sys.argv[1])
    uvicorn.run(app(port), host="127.0.0.1", port=port, log_level="warning")
