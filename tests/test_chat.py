"""What the chat bots share: a request as a message, its layout, who may answer, key names."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import toolnexus_workers
from toolnexus import ConfigurationError, Request, Source
from toolnexus.keys import Keys
from toolnexus_workers.chat import Allowed, time_left, view_of
from toolnexus_workers.telegram.bot import read_reply


def form(**properties: dict[str, object]) -> Request:
    schema = {"type": "object", "properties": properties, "required": list(properties)}
    return Request(id="r1", kind="input", prompt="Pick", data={"schema": schema})


def test_the_layout_follows_the_request() -> None:
    assert view_of(Request(id="r1", kind="approval")).layout == "approval"
    assert view_of(form(size={"type": "string", "enum": ["S", "M"]})).layout == "choice"
    many = {"type": "string", "enum": [f"o{i}" for i in range(30)]}
    assert view_of(form(size=many)).layout == "form"  # too many options for buttons
    multi = {"type": "array", "items": {"type": "string", "enum": ["a", "b"]}}
    assert view_of(form(tags=multi)).layout == "multi"
    assert view_of(form(n={"type": "integer"}, s={"type": "string"})).layout == "form"
    broken = Request(id="r1", kind="input", data={"schema": {"type": "object", "properties": 3}})
    shown = view_of(broken)
    assert shown.problem is not None and "cannot be shown" in shown.text


def test_the_header_says_who_asks_and_the_time_left() -> None:
    request = Request(
        id="r1",
        kind="approval",
        prompt="Deploy?",
        source=Source(server="ci", agent="bot-1"),
        expires_at=1000.0 + 3725,
    )
    lines = view_of(request).lines
    assert lines[:2] == ("Approval from server ci, agent bot-1", "Deploy?")
    assert time_left(request, now_s=1000.0) == "Time left: 1 h 2 min 5 s (until 01:18:45 UTC)"
    assert time_left(request, now_s=9999.0).startswith("Time left: 0 s")
    assert "no deadline" in time_left(Request(id="r2", kind="approval"))


def test_only_configured_users_may_answer() -> None:
    allowed = Allowed("slack", ["U1", " U2 "])
    assert "U2" in allowed and "U3" not in allowed
    assert allowed.person("U1") == "slack:U1"
    assert 7 in Allowed("telegram", ["*"])
    with pytest.raises(ConfigurationError, match="--allow-user"):
        Allowed("slack", [])


def test_the_message_map_key_is_in_the_queues_slot() -> None:
    assert Keys("ns", "q").store("slack") == "{ns:q:q}:store:slack"
    with pytest.raises(ConfigurationError, match="store name"):
        Keys("ns", "q").store("sl:ack")


def test_a_reply_is_read_as_its_field_asks() -> None:
    request = form(
        menu={"type": "string", "enum": ["meat", "fish"]},
        ok={"type": "boolean"},
        tags={"type": "array", "items": {"type": "string", "enum": ["a", "b", "c"]}},
    )
    menu, ok, tags = view_of(request).fields
    assert read_reply(menu, "2") == {"field.menu": ["1"]}
    assert read_reply(menu, "Fish") == {"field.menu": ["1"]}
    assert read_reply(menu, "9") == {"field.menu": ["9"]}  # kept, for the check to refuse
    assert read_reply(ok, "yes") == {"field.ok": ["on"]}
    assert read_reply(ok, "no") == {"field.ok": []}
    with pytest.raises(ValueError, match="neither yes nor no"):
        read_reply(ok, "maybe")
    assert read_reply(tags, "1, c") == {"field.tags": ["0", "2"]}
    assert read_reply(tags, "-") is None


def test_workers_reach_redis_and_render_only_through_the_bridge() -> None:
    """No worker opens a Redis client of its own (the broker's store keeps their state, on
    every topology it speaks), and no chat bot imports the web worker: what they share
    for rendering is ``toolnexus.rendering``."""
    workers = Path(toolnexus_workers.__file__).parent
    own_redis, web_internals = [], []
    for path in sorted(workers.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [("." * node.level) + (node.module or "")]
            where = str(path.relative_to(workers))
            own_redis += [f"{where}: {n}" for n in names if n.split(".")[0] == "redis"]
            if not where.startswith("web/"):
                ours = [n.lstrip(".") for n in names if n.startswith((".", "toolnexus_workers"))]
                web_internals += [f"{where}: {n}" for n in ours if "web" in n.split(".")]
    assert own_redis == []
    assert web_internals == []
