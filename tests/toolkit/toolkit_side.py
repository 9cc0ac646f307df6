"""Run by the toolkit's own Python (.venv-toolkit, `toolnexus==0.21.0` from the package index),
never by this project's: both import as ``toolnexus``. It speaks JSON on stdin and stdout.

    python toolkit_side.py fixtures   # §10 JSON of objects the toolkit's constructors made
    python toolkit_side.py read       # [{"type", "json"}] in: the toolkit's objects built
                                      # from each, written back, and what its loop reads
    python toolkit_side.py where      # the toolkit's version and the file of its types

The toolkit has no JSON writer of its own for Request and Answer (its ports send them as
they are: JavaScript's JSON.stringify); the §10 form written here is its dataclasses' fields
in declaration order, absent (None) ones left out, as compact UTF-8 JSON.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import sys
from typing import Any

from toolnexus.types import pending_of

import toolnexus
from toolnexus import Answer, Request, answer_declined, answer_output, auth_required, pending


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


def main() -> None:
    command = sys.argv[1]
    if command == "fixtures":
        result: Any = fixtures()
    elif command == "read":
        result = read(json.load(sys.stdin))
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
