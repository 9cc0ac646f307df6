"""§10 parity with the toolkit's own package (SPEC §10, issue #31): its JSON reads into the
bridge and comes back to the same bytes; the bridge's JSON reads into the toolkit's objects
and, but for the key the ports ignore, comes back to the same bytes; the toolkit's own
``Request`` is waited for by both brokers as it is."""

from __future__ import annotations

import asyncio
import json
from types import ModuleType
from typing import Any

import pytest
from toolkit_env import Toolkit

from toolnexus import Answer, Broker, Request
from toolnexus._wire10 import EXTENSION_KEY, iso_time
from toolnexus.codec import answer_from_json, answer_to_json, request_from_json, request_to_json
from toolnexus.models import new_id


@pytest.fixture(scope="module")
def fixtures(toolkit: Toolkit) -> list[dict[str, str]]:
    made: list[dict[str, str]] = toolkit.run("fixtures")
    assert {f["type"] for f in made} == {"request", "answer"} and len(made) >= 10
    return made


def test_the_toolkits_json_comes_back_from_the_bridge_to_the_same_bytes(
    fixtures: list[dict[str, str]],
) -> None:
    for fixture in fixtures:
        body = fixture["json"].encode()
        if fixture["type"] == "request":
            again = request_to_json(request_from_json(body))
        else:
            again = answer_to_json(answer_from_json(body))
        assert again == body, fixture["name"]


def test_the_toolkits_deadline_and_reasons_mean_the_same_in_the_bridge(
    fixtures: list[dict[str, str]],
) -> None:
    by_name = {f["name"]: f["json"] for f in fixtures}
    request = request_from_json(by_name["input with schema and deadline"])
    assert iso_time(request.expires_at or 0) == "2026-12-01T22:16:36.123Z"
    assert request.schema == {"type": "object", "properties": {"code": {"type": "string"}}}
    for reason in ("declined", "cancelled", "expired"):
        answer = answer_from_json(by_name[reason])
        assert (answer.ok, answer.reason) == (False, reason)


BRIDGE_REQUESTS = [
    Request(id="req-1", kind="approval", prompt="Deploy?"),
    Request(
        id="req-2",
        kind="input",
        prompt="Postal code? «ü» 🙂",
        data={"schema": {"type": "object"}, "n": [1, None, True, "x"]},
        expires_at=1_796_163_396.5,
        meta={"bridge": "only"},
        allow=["ops-bot"],
    ),
    Request(id="req-3", kind="authorization", prompt="Sign in", url="https://x.test/?a=é"),
]

BRIDGE_ANSWERS = [
    Answer(id="req-1", ok=True),
    Answer(id="req-2", ok=True, data={"code": "12345"}, responder="web", person="web:ana"),
    *(
        Answer(id="req-1", ok=False, reason=reason)
        for reason in ("declined", "expired", "dismissed", "withdrawn", "unavailable", "mine")
    ),
    Answer(id="req-1", ok=True, reason="expired", defaulted=True),
]


def test_the_bridges_json_reads_into_the_toolkits_objects_unchanged(toolkit: Toolkit) -> None:
    sent = [("request", request_to_json(r)) for r in BRIDGE_REQUESTS]
    sent += [("answer", answer_to_json(a)) for a in BRIDGE_ANSWERS]
    seen = toolkit.run("read", [{"type": t, "json": body.decode()} for t, body in sent])
    for (_type, body), read in zip(sent, seen, strict=True):
        values: dict[str, Any] = json.loads(body)
        extension = values.pop(EXTENSION_KEY, None)
        assert read["ignored"] == ([EXTENSION_KEY] if extension is not None else [])
        assert (
            read["json"].encode()
            == json.dumps(values, separators=(",", ":"), ensure_ascii=False).encode()
        )
    # what the toolkit's MCP bridge makes of each answer: decline only for "declined"
    actions = [read.get("elicit") for read in seen[len(BRIDGE_REQUESTS) :]]
    assert actions == [
        "accept",
        "accept",
        "decline",
        "cancel",
        "cancel",
        "cancel",
        "cancel",
        "cancel",
        "accept",
    ]


async def test_both_brokers_wait_for_the_toolkits_own_request(
    broker: Broker, toolkit_types: ModuleType
) -> None:
    form = {"type": "object", "properties": {"code": {"type": "string"}}}
    suspended = toolkit_types.pending(
        kind="input", prompt="Code?", id=new_id("pnd"), data={"schema": form}
    )
    asked = toolkit_types.pending_of(suspended)
    assert type(asked).__module__ == "toolkit_types"
    async with broker.responder("web") as web:
        wait = asyncio.create_task(broker.wait_for(asked, timeout_s=30))
        try:
            async with asyncio.timeout(10):
                pending = await anext(web)
            assert (pending.request.id, pending.request.schema) == (asked.id, form)
            await pending.accept({"code": "1"})
            answer = await asyncio.wait_for(wait, 10)
        finally:
            wait.cancel()
            await asyncio.gather(wait, return_exceptions=True)
    # the toolkit's loop reads ok, data (ctx.answer) and, advisory, reason
    assert (answer.id, answer.ok, answer.data, answer.reason) == (
        asked.id,
        True,
        {"code": "1"},
        None,
    )


async def test_a_toolkit_request_that_nobody_answers_expires(
    broker: Broker, toolkit_types: ModuleType
) -> None:
    asked = toolkit_types.Request(id=new_id("pnd"), kind="approval", prompt="Deploy?")
    answer = await broker.wait_for(asked, timeout_s=0.3)
    assert (answer.ok, answer.reason) == (False, "expired")
    assert json.loads(answer_to_json(answer)) == {"id": asked.id, "ok": False, "reason": "expired"}
