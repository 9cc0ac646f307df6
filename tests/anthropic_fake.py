"""A local fake of the Anthropic Messages API (``POST /v1/messages``, streamed as server-sent
events or not), for the Claude Code CLI that the Claude Agent SDK drives: the API cannot
be reached from here, and the CLI takes another base URL (``ANTHROPIC_BASE_URL``).

It scripts one tool call: a request offering the tool ``tool`` is answered with a
``tool_use`` block calling it with ``arguments``; once the conversation holds that call's
``tool_result``, with a text block: the JSON list of every tool result's text. A request
that does not offer the tool (the CLI's side requests) gets a short text.
"""

from __future__ import annotations

import json
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

TOOL_USE_ID = "toolu_01"


def _results(messages: list[dict[str, Any]]) -> list[str]:
    """The text of every tool result in ``messages``."""
    texts = []
    for message in messages:
        content = message.get("content")
        for block in content if isinstance(content, list) else []:
            if block.get("type") != "tool_result":
                continue
            inner = block.get("content")
            if isinstance(inner, str):
                texts.append(inner)
            else:
                texts.append("".join(part.get("text", "") for part in inner or []))
    return texts


def reply(body: dict[str, Any], tool: str, arguments: dict[str, Any]) -> list[dict[str, Any]]:
    """The content blocks of the answer to ``body`` (a Messages API request)."""
    offered = any(t.get("name") == tool for t in body.get("tools") or [])
    if not offered:
        return [{"type": "text", "text": "ok"}]
    results = _results(body.get("messages", []))
    if not results:
        return [{"type": "tool_use", "id": TOOL_USE_ID, "name": tool, "input": arguments}]
    return [{"type": "text", "text": json.dumps(results)}]


def _message(body: dict[str, Any], content: list[dict[str, Any]]) -> dict[str, Any]:
    stop = "tool_use" if any(block["type"] == "tool_use" for block in content) else "end_turn"
    return {
        "id": "msg_fake",
        "type": "message",
        "role": "assistant",
        "model": body.get("model", "claude-fake"),
        "content": content,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": {"input_tokens": 1, "output_tokens": 1},
    }


def _events(message: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """The stream of server-sent events that delivers ``message``, as the API streams it."""
    start = {**message, "content": [], "stop_reason": None}
    yield "message_start", {"type": "message_start", "message": start}
    for index, block in enumerate(message["content"]):
        if block["type"] == "text":
            empty: dict[str, Any] = {"type": "text", "text": ""}
            delta = {"type": "text_delta", "text": block["text"]}
        else:
            empty = {**block, "input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
        yield "content_block_start", {"type": "content_block_start", "index": index,
                                      "content_block": empty}  # fmt: skip
        yield "content_block_delta", {"type": "content_block_delta", "index": index,
                                      "delta": delta}  # fmt: skip
        yield "content_block_stop", {"type": "content_block_stop", "index": index}
    end = {"stop_reason": message["stop_reason"], "stop_sequence": None}
    yield "message_delta", {"type": "message_delta", "delta": end, "usage": {"output_tokens": 1}}
    yield "message_stop", {"type": "message_stop"}


def app(tool: str, arguments: dict[str, Any]) -> Starlette:
    """The fake API calling ``tool`` with ``arguments``."""

    async def messages(request: Request) -> Response:
        body = await request.json()
        message = _message(body, reply(body, tool, arguments))
        if not body.get("stream"):
            return JSONResponse(message)

        async def stream() -> AsyncIterator[str]:
            for name, event in _events(message):
                yield f"event: {name}\ndata: {json.dumps(event)}\n\n"

        return StreamingResponse(stream(), media_type="text/event-stream")

    async def other(request: Request) -> Response:  # token counting, and anything else
        return JSONResponse({"input_tokens": 1})

    routes = [
        Route("/v1/messages", messages, methods=["POST"]),
        Route("/{path:path}", other, methods=["GET", "POST"]),
    ]
    return Starlette(routes=routes)


class FakeAnthropic:
    """The fake served on 127.0.0.1 from a thread of its own (``url`` once started)."""

    def __init__(self, port: int, tool: str, arguments: dict[str, Any]) -> None:
        config = uvicorn.Config(
            app(tool, arguments), host="127.0.0.1", port=port, log_level="warning"
        )
        self.server = uvicorn.Server(config)
        self.url = f"http://127.0.0.1:{port}"
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> FakeAnthropic:
        self.thread.start()
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError("the fake Anthropic API did not start")
            self.thread.join(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)
