"""A scripted model for the OpenAI Agents SDK (no network): it calls ``transfer`` once,
then answers with what the tool returned, as a JSON list. The agent process of
tests/servers/openai_agents_agent.py and the tests that run the SDK in process use it."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from agents.items import ModelResponse, TResponseInputItem, TResponseStreamEvent
from agents.models.interface import Model
from agents.usage import Usage
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

ARGUMENTS = json.dumps({"to": "ACME", "amount": 10})


class Scripted(Model):
    """Calls ``transfer`` once, then answers with what the tool returned."""

    async def get_response(
        self, system_instructions: Any, input: str | list[TResponseInputItem], *args: Any, **kw: Any
    ) -> ModelResponse:
        items = [] if isinstance(input, str) else input
        outputs = [
            item.get("output")
            for item in items
            if isinstance(item, dict) and item.get("type") == "function_call_output"
        ]
        if not outputs:
            call = ResponseFunctionToolCall(
                type="function_call",
                call_id="call_1",
                name="transfer",
                arguments=ARGUMENTS,
                id="fc_1",
                status="completed",
            )
            return ModelResponse(output=[call], usage=Usage(), response_id=None)
        text = ResponseOutputText(type="output_text", text=json.dumps(outputs), annotations=[])
        message = ResponseOutputMessage(
            id="msg_1", type="message", role="assistant", status="completed", content=[text]
        )
        return ModelResponse(output=[message], usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kw: Any) -> AsyncIterator[TResponseStreamEvent]:
        raise NotImplementedError
