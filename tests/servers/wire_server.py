"""An MCP server written against the wire alone (no SDK), speaking one protocol era over stdio.

    python wire_server.py 2026-07-28   # modern only: refuses the initialize handshake
    python wire_server.py 2026-07-28 no-initialize    # ... as a method it does not have
    python wire_server.py 2026-07-28 modern-result    # ... answering it at 2026-07-28
    python wire_server.py 2025-06-18   # handshake only: no server/discover

Tools: ``book`` asks for a name (2026-07-28: an ``InputRequiredResult`` round, then the
result; 2025-06-18: an ``elicitation/create`` request mid-call), ``bare`` returns a
2026-07-28 result without ``resultType`` (which the spec reads as complete), ``bad``
returns a result that is not a ``CallToolResult`` at all.
"""

from __future__ import annotations

import json
import sys
from typing import Any

MODERN = "2026-07-28"
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
TOOLS = [
    {"name": name, "description": text, "inputSchema": {"type": "object", "properties": {}}}
    for name, text in [
        ("book", "Asks for a name, then books."),
        ("bare", "A result without resultType."),
        ("bad", "A malformed result."),
    ]
]


def send(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", **message}) + "\n")
    sys.stdout.flush()


def receive() -> dict[str, Any] | None:
    line = sys.stdin.readline()
    return json.loads(line) if line else None


def text(value: str) -> list[dict[str, str]]:
    return [{"type": "text", "text": value}]


def modern(method: str, params: dict[str, Any]) -> dict[str, Any]:
    """The result of one 2026-07-28 request (raises KeyError for unknown methods)."""
    cache = {"ttlMs": 0, "cacheScope": "private"}
    if method == "server/discover":
        capabilities = {"tools": {}}
        return {"supportedVersions": [MODERN], "capabilities": capabilities, **cache}
    if method == "tools/list":
        return {"tools": TOOLS, **cache}
    if method != "tools/call":
        raise KeyError(method)
    name = params["name"]
    if name == "bare":
        return {"content": text("no resultType here"), "__bare__": True}
    if name == "bad":
        return {"content": "not a list"}
    responses = params.get("inputResponses") or {}
    if "who" not in responses:
        ask = {
            "method": "elicitation/create",
            "params": {"message": "Name?", "requestedSchema": SCHEMA},
        }
        return {"resultType": "input_required", "inputRequests": {"who": ask}, "requestState": "s1"}
    return {"content": text("booked: " + json.dumps(responses["who"]))}


def serve_modern(refusal: str) -> None:
    while (message := receive()) is not None:
        if "id" not in message:
            continue  # notifications
        method, params = message["method"], message.get("params") or {}
        if method == "initialize" and refusal == "modern-result":
            info = {"name": "wire", "version": "1"}
            result = {"protocolVersion": MODERN, "capabilities": {}, "serverInfo": info}
            send({"id": message["id"], "result": result})
            continue
        if method == "initialize" and refusal == "-32022":
            error = {
                "code": -32022,
                "message": "only 2026-07-28 is served here",
                "data": {"supported": [MODERN], "requested": params.get("protocolVersion")},
            }
            send({"id": message["id"], "error": error})
            continue
        try:
            result = modern(method, params)
        except KeyError:
            send({"id": message["id"], "error": {"code": -32601, "message": f"no {method}"}})
            continue
        if not result.pop("__bare__", False):
            result.setdefault("resultType", "complete")
        send({"id": message["id"], "result": result})


def serve_legacy(version: str) -> None:
    while (message := receive()) is not None:
        if "id" not in message:
            continue
        method, params = message["method"], message.get("params") or {}
        if method == "initialize":
            info = {"name": "wire-legacy", "version": "1"}
            result = {"protocolVersion": version, "capabilities": {"tools": {}}, "serverInfo": info}
        elif method == "tools/list":
            result = {"tools": TOOLS[:1]}
        elif method == "tools/call" and params["name"] == "book":
            ask = {"message": "Name?", "requestedSchema": SCHEMA}
            send({"id": "ask-1", "method": "elicitation/create", "params": ask})
            while (reply := receive()) is not None and reply.get("id") != "ask-1":
                pass
            answer = (reply or {}).get("result", {})
            result = {"content": text("booked: " + json.dumps(answer))}
        else:
            send({"id": message["id"], "error": {"code": -32601, "message": f"no {method}"}})
            continue
        send({"id": message["id"], "result": result})


if __name__ == "__main__":
    era = sys.argv[1]
    serve_modern(sys.argv[2] if len(sys.argv) > 2 else "-32022") if era == MODERN else serve_legacy(
        era
    )
