"""The toolkit's §10 JSON form (toolnexus.wire10, SPEC §10 parity) and duck-typed waits.

The bytes are compared with what Node's ``JSON.stringify`` writes for the same object (the
JavaScript port's serializer); the toolkit's own Python package is compared in
tests/toolkit/ (run by ``./run test-toolkit``).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import time
from dataclasses import dataclass
from typing import Any

import pytest

from toolnexus import Answer, Broker, InvalidRequest, Request
from toolnexus._wire10 import iso_time, unix_time, wire_reason
from toolnexus.codec import (
    answer_from_json,
    answer_to_json,
    as_request,
    request_from_json,
    request_to_json,
)
from toolnexus.errors import DecodeError
from toolnexus.models import new_id

DEADLINE = 1_796_163_396.123  # 2026-12-01T22:16:36.123Z


def stringify(value: Any) -> bytes:
    """``JSON.stringify(value)`` as Node writes it."""
    node = shutil.which("node")
    if node is None:
        pytest.fail("these tests need Node (./run test installs Debian's nodejs)")
    script = "process.stdout.write(JSON.stringify(JSON.parse(require('fs').readFileSync(0))))"
    out = subprocess.run(
        [node, "-e", script], input=json.dumps(value).encode(), capture_output=True, check=True
    )
    return out.stdout


def test_a_request_has_the_toolkits_keys_in_order_and_nothing_else() -> None:
    request = Request(
        id="req-1",
        kind="input",
        prompt="Postal code? «ü» 🙂",
        url="https://example.com/a?b=c&d=é",
        data={"schema": {"type": "object"}, "n": [1, 2, None, True]},
        expires_at=DEADLINE,
        meta={"not": "on the wire"},
        allow=["ops-bot"],
    )
    body = request_to_json(request)
    assert (
        body
        == (
            '{"id":"req-1","kind":"input","prompt":"Postal code? «ü» 🙂",'
            '"url":"https://example.com/a?b=c&d=é","data":{"schema":{"type":"object"},'
            '"n":[1,2,null,true]},"expiresAt":"2026-12-01T22:16:36.123Z"}'
        ).encode()
    )
    assert body == stringify(json.loads(body))


def test_absent_optional_keys_are_left_out_not_null() -> None:
    body = request_to_json(Request(id="pnd-1", kind="approval", prompt="Deploy?"))
    assert body == b'{"id":"pnd-1","kind":"approval","prompt":"Deploy?"}'
    assert answer_to_json(Answer(id="pnd-1", ok=True)) == b'{"id":"pnd-1","ok":true}'


@pytest.mark.parametrize(
    ("reason", "on_wire", "kept"),
    [
        ("declined", "declined", None),
        ("expired", "expired", None),
        ("cancelled", "cancelled", None),
        ("dismissed", "cancelled", "dismissed"),
        ("withdrawn", "cancelled", "withdrawn"),
        ("unavailable", "cancelled", "unavailable"),
        ("out of office", "cancelled", "out of office"),
    ],
)
def test_reasons_travel_in_the_toolkits_vocabulary_with_the_precise_one_kept(
    reason: str, on_wire: str, kept: str | None
) -> None:
    assert wire_reason(reason) == on_wire
    body = answer_to_json(Answer(id="r", ok=False, reason=reason))
    values = json.loads(body)
    assert list(values)[:3] == ["id", "ok", "reason"]
    assert values["reason"] == on_wire
    assert values.get("bridge") == ({"reason": kept} if kept else None)
    assert answer_from_json(body).reason == reason  # the bridge reads the precise one back


def test_an_answer_keeps_who_answered_beside_the_section_10_keys() -> None:
    answer = Answer(id="r", ok=True, data={"code": "12345"}, responder="ops-bot", person="web:ana")
    body = answer_to_json(answer)
    assert body == (
        b'{"id":"r","ok":true,"data":{"code":"12345"},'
        b'"bridge":{"responder":"ops-bot","person":"web:ana"}}'
    )
    back = answer_from_json(body)
    assert (back.id, back.ok, back.data, back.responder, back.person) == (
        "r",
        True,
        {"code": "12345"},
        "ops-bot",
        "web:ana",
    )
    defaulted = Answer(id="r", ok=True, reason="expired", defaulted=True)
    assert (
        answer_to_json(defaulted)
        == b'{"id":"r","ok":true,"reason":"expired","bridge":{"defaulted":true}}'
    )
    assert answer_from_json(answer_to_json(defaulted)).defaulted


@pytest.mark.parametrize(
    "body",
    [
        b'{"id":"pnd-18f-1","kind":"approval","prompt":"Deploy?"}',
        '{"id":"a","kind":"input","prompt":"","url":"https://x.test/é","data":{"k":[1,{"z":null}]},'
        '"expiresAt":"2026-12-01T22:16:36.000Z"}'.encode(),
        b'{"id":"a","kind":"authorization","prompt":"Go","expiresAt":"1999-12-31T23:59:59.999Z"}',
    ],
)
def test_a_section_10_request_comes_back_to_the_same_bytes(body: bytes) -> None:
    assert request_to_json(request_from_json(body)) == body


@pytest.mark.parametrize(
    "body",
    [
        b'{"id":"a","ok":true}',
        b'{"id":"a","ok":true,"data":{"output":"done"}}',
        b'{"id":"a","ok":false,"reason":"declined"}',
        b'{"id":"a","ok":false,"reason":"cancelled"}',
        b'{"id":"a","ok":false,"reason":"expired"}',
        b'{"id":"a","ok":false}',
    ],
)
def test_a_section_10_answer_comes_back_to_the_same_bytes(body: bytes) -> None:
    assert answer_to_json(answer_from_json(body)) == body


def test_expires_at_is_read_in_any_iso_form_with_a_time_zone() -> None:
    assert iso_time(DEADLINE) == "2026-12-01T22:16:36.123Z"
    assert unix_time("2026-12-01T22:16:36.123Z") == pytest.approx(DEADLINE)
    assert unix_time("2026-12-02T00:16:36.123+02:00") == pytest.approx(DEADLINE)
    assert unix_time("2026-12-01T22:16:36.123456+00:00") == pytest.approx(DEADLINE + 0.000456)
    with pytest.raises(InvalidRequest, match="expiresAt '2026-12-01T22:16:36' has no time zone"):
        unix_time("2026-12-01T22:16:36")
    with pytest.raises(InvalidRequest, match="expiresAt 'tomorrow' is not an ISO 8601"):
        unix_time("tomorrow")


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"[1]", "the body must be a JSON object"),
        (b"{", "the body is not JSON"),
        (b'{"kind":"input","prompt":"p"}', "id is missing; it must be a string"),
        (b'{"id":7,"kind":"input","prompt":"p"}', "id must be a string, not int"),
        (b'{"id":"a","kind":"","prompt":"p"}', "kind must not be empty"),
        (b'{"id":"a","kind":"input"}', "prompt is missing"),
        (b'{"id":"a","kind":"input","prompt":"p","url":1}', "url must be a string, not int"),
        (b'{"id":"a","kind":"input","prompt":"p","data":[1]}', "data must be an object or absent"),
        (b'{"id":"a","kind":"input","prompt":"p","expiresAt":5}', "expiresAt must be a string"),
    ],
)
def test_a_bad_request_is_refused_naming_the_key(body: bytes, message: str) -> None:
    with pytest.raises(InvalidRequest, match=message):
        request_from_json(body)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"ok":true}', "id must be a non-empty string"),
        (b'{"id":"a","ok":"yes"}', "ok must be true or false"),
        (b'{"id":"a","ok":true,"data":"x"}', "data must be an object, not str"),
        (b'{"id":"a","ok":false,"reason":3}', "reason must be a string"),
        (b'{"id":"a","ok":false,"bridge":{"reason":3}}', "bridge.reason must be a string"),
    ],
)
def test_a_bad_answer_is_refused_naming_the_key(body: bytes, message: str) -> None:
    with pytest.raises(DecodeError, match=message):
        answer_from_json(body)


@dataclass
class ToolkitShapedRequest:
    """The toolkit's ``Request`` dataclass, field for field (tests/toolkit/ uses the real
    one): the §10 keys as attributes, ``expiresAt`` camelCase and a string."""

    id: str
    kind: str
    prompt: str
    url: str | None = None
    data: dict[str, Any] | None = None
    expiresAt: str | None = None


def test_any_object_with_the_section_10_attributes_is_a_request() -> None:
    asked = ToolkitShapedRequest(
        "pnd-1", "authorization", "Sign in", url="https://x.test", expiresAt=iso_time(DEADLINE)
    )
    request = as_request(asked)
    assert (request.id, request.kind, request.prompt, request.url, request.data) == (
        "pnd-1",
        "authorization",
        "Sign in",
        "https://x.test",
        None,
    )
    assert request.expires_at == pytest.approx(DEADLINE)
    with pytest.raises(InvalidRequest, match="kind is missing"):
        as_request(ToolkitShapedRequest("pnd-2", None, "x"))  # type: ignore[arg-type]


async def test_wait_for_takes_a_toolkit_shaped_request(broker: Broker) -> None:
    deadline = time.time() + 30
    form = {"type": "object", "properties": {"code": {"type": "string"}}}
    asked = ToolkitShapedRequest(
        new_id("pnd"), "input", "Code?", data={"schema": form}, expiresAt=iso_time(deadline)
    )
    async with broker.responder("web") as web:
        wait = asyncio.create_task(broker.wait_for(asked))
        try:
            async with asyncio.timeout(10):
                pending = await anext(web)
            assert (pending.request.id, pending.request.kind, pending.request.prompt) == (
                asked.id,
                "input",
                "Code?",
            )
            assert pending.request.expires_at == pytest.approx(deadline, abs=0.001)
            await pending.accept({"code": "1"})
            answer = await asyncio.wait_for(wait, 10)
        finally:
            wait.cancel()
            await asyncio.gather(wait, return_exceptions=True)
    # every attribute a toolkit loop reads
    assert (answer.id, answer.ok, answer.data, answer.reason) == (
        asked.id,
        True,
        {"code": "1"},
        None,
    )


async def test_wait_for_refuses_an_object_without_the_section_10_attributes(
    broker: Broker,
) -> None:
    with pytest.raises(InvalidRequest, match="prompt is missing"):
        await broker.wait_for(ToolkitShapedRequest("pnd-3", "input", None))  # type: ignore[arg-type]
