"""Run by the toolkit's own Python (.venv-toolkit, `toolnexus==0.21.0` from the package index),
never by this project's: both import as ``toolnexus``. It speaks JSON on stdin and stdout.

    python toolkit_side.py fixtures   # §10 JSON of objects the toolkit's constructors made
    python toolkit_side.py read       # [{"type", "json"}] in: the toolkit's objects built
                                      # from each, written back, and what its loop reads
    python toolkit_side.py where      # the toolkit's version and the file of its types
    python toolkit_side.py agent      # {"gateway", "token", "environment", "expires_in_s"}
                                      # in: a toolkit agent run whose tool suspends, its
                                      # wait_for the bridge's wait gateway; the run out

The toolkit has no JSON writer of its own for Request and Answer (its ports send them as
they are: JavaScript's JSON.stringify); the §10 form written here is its dataclasses' fields
in declaration order, absent (None) ones left out, as compact UTF-8 JSON.
"""

from __future__ import annotations

import asyncio
import dataclasses
import http.server
import importlib.metadata
import json
import sys
import threading
import urllib.request
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar

from toolnexus.types import pending_of

import toolnexus
from toolnexus import (
    Answer,
    Request,
    ToolContext,
    answer_declined,
    answer_output,
    auth_required,
    create_client,
    create_toolkit,
    define_tool,
    pending,
)


def section10_json(value: Any) -> str:
    fields = {
        f.name: getattr(value, f.name)
        for f in dataclasses.fields(value)
        if getattr(value, f.name) is not None
    }
    return json.dumps(fields, separators=(",", ":"), ensure_ascii=False)


def fixtures() -> list[dict[str, str]]:
    made: list[tuple[str, str, Any]] = [
        (
            "approval",
            "request",
            pending(kind="approval", prompt="Deploy to production?", id="pnd-1"),
        ),
        (
            "input with schema and deadline",
            "request",
            pending(
                kind="input",
                prompt="Postal code? «ü» 🙂",
                id="pnd-2",
                data={"schema": {"type": "object", "properties": {"code": {"type": "string"}}}},
                expiresAt="2026-12-01T22:16:36.123Z",
            ),
        ),
        ("authorization", "request", auth_required("https://example.com/oauth?state=é&x=1")),
        # auth_required gives a fresh id each time: made fixed below, for stable names
        ("accept", "answer", Answer(id="pnd-1", ok=True)),
        ("accept with data", "answer", Answer(id="pnd-2", ok=True, data={"code": "12345"})),
        ("output", "answer", answer_output("pnd-3", "done")),
        ("declined", "answer", answer_declined("pnd-1")),
        ("cancelled", "answer", answer_declined("pnd-1", "cancelled")),
        ("expired", "answer", answer_declined("pnd-1", "expired")),
        ("no reason", "answer", Answer(id="pnd-1", ok=False)),
    ]
    out = []
    for name, kind, value in made:
        if kind == "request":
            value = pending_of(value)
            assert isinstance(value, Request), name
            value.id = value.id if value.id in ("pnd-1", "pnd-2") else "pnd-4"
        out.append({"name": name, "type": kind, "json": section10_json(value)})
    return out


def read(items: list[dict[str, str]]) -> list[dict[str, Any]]:
    out = []
    for item in items:
        values = json.loads(item["json"])
        cls = Request if item["type"] == "request" else Answer
        names = [f.name for f in dataclasses.fields(cls)]
        value = cls(**{k: v for k, v in values.items() if k in names})
        seen: dict[str, Any] = {"json": section10_json(value)}
        seen["ignored"] = [k for k in values if k not in names]
        if isinstance(value, Answer):
            if not value.ok and value.reason is not None:
                answer_declined(value.id, value.reason)  # raises outside its vocabulary
            seen["elicit"] = toolnexus.answer_to_elicit_result(value).action
        out.append(seen)
    return out


# -- a toolkit agent whose wait_for is the bridge's wait gateway -----------------------

GATEWAY = TOKEN = ""


def wait_for_blocking(request: Request) -> Answer:  # the §10 waitFor: ten lines of HTTP
    body = json.dumps({k: v for k, v in vars(request).items() if v is not None}).encode()
    post = urllib.request.Request(
        f"{GATEWAY}/v1/requests", data=body, headers={"Authorization": f"Bearer {TOKEN}"}
    )
    with urllib.request.urlopen(post, timeout=900) as response:  # a long poll
        got = json.load(response)  # keep-alive spaces first: JSON skips them
    return Answer(id=got["id"], ok=got["ok"], data=got.get("data"), reason=got.get("reason"))


class FakeModel(http.server.BaseHTTPRequestHandler):
    """An OpenAI-compatible chat completions endpoint scripting one tool call: the first
    turn calls the tool offered, the next ends the run quoting the tool's output."""

    calls: ClassVar[list[dict[str, Any]]] = []
    environment = ""

    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        payload = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        FakeModel.calls.append(payload)
        results = [m for m in payload["messages"] if m.get("role") == "tool"]
        if not results:
            (tool,) = [t["function"]["name"] for t in payload.get("tools", [])]
            arguments = json.dumps({"environment": FakeModel.environment})
            call = {
                "id": "call_1",
                "type": "function",
                "function": {"name": tool, "arguments": arguments},
            }
            message: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": [call]}
            finish = "tool_calls"
        else:
            message = {"role": "assistant", "content": f"done: {results[-1]['content']}"}
            finish = "stop"
        body = json.dumps(
            {
                "id": f"chatcmpl-{len(FakeModel.calls)}",
                "object": "chat.completion",
                "model": payload["model"],
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


async def agent(spec: dict[str, Any]) -> dict[str, Any]:
    global GATEWAY, TOKEN
    GATEWAY, TOKEN = spec["gateway"], spec["token"]
    FakeModel.environment = spec["environment"]
    model = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeModel)
    threading.Thread(target=model.serve_forever, daemon=True).start()
    executions: list[Any] = []
    answers: list[dict[str, Any]] = []

    async def wait_for(request: Request) -> Answer:
        answer = await asyncio.to_thread(wait_for_blocking, request)
        answers.append(dataclasses.asdict(answer))
        return answer

    def deploy(environment: str, ctx: ToolContext | None = None) -> Any:
        """Deploy the service to an environment, once a person approves."""
        executions.append(None if ctx is None or ctx.answer is None else ctx.answer.data)
        if ctx is None or ctx.answer is None:
            expires = datetime.now(UTC) + timedelta(seconds=spec["expires_in_s"])
            return pending(
                kind="approval",
                prompt=f"Deploy to {environment}?",
                id=f"pnd-{uuid.uuid4().hex}",
                expiresAt=expires.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            )
        return f"deployed to {environment} (ticket {ctx.answer.data['ticket']})"

    client = create_client(
        base_url=f"http://127.0.0.1:{model.server_address[1]}/v1",
        style="openai",
        model="fake-model",
        api_key="not-used",
        wait_for=wait_for,
    )
    toolkit = await create_toolkit(extra_tools=[define_tool(deploy)], builtins=False)
    try:
        result = await client.run(f"Deploy to {spec['environment']}", toolkit)
    finally:
        model.shutdown()
    return {
        "status": result.status,
        "text": result.text,
        "tools": [{"name": c.get("name"), "output": c.get("output")} for c in result.tool_calls],
        "executions": executions,
        "answers": answers,
        "model_calls": len(FakeModel.calls),
    }


def main() -> None:
    command = sys.argv[1]
    if command == "fixtures":
        result: Any = fixtures()
    elif command == "read":
        result = read(json.load(sys.stdin))
    elif command == "agent":
        result = asyncio.run(agent(json.load(sys.stdin)))
    elif command == "where":
        import toolnexus.types

        result = {
            "version": importlib.metadata.version("toolnexus"),
            "types": toolnexus.types.__file__,
        }
    else:
        raise SystemExit(f"unknown command {command!r}")
    json.dump(result, sys.stdout, ensure_ascii=False)


if __name__ == "__main__":
    main()
