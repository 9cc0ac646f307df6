"""SPEC §2: MCP elicitation params map to Requests, Answers map back to ElicitResults.

Runs on mcp 2.x (.venv) and on mcp 1.x (.venv-mcp1): the SDK's own models of either.
"""

from __future__ import annotations

import importlib.metadata
import re
import time
from types import SimpleNamespace
from typing import Any

import mcp.types
import pytest

from toolnexus import Answer, InvalidAnswer, InvalidRequest, Request, Source
from toolnexus.codec import MSGPACK
from toolnexus.mcp import answer_to_elicit_result, elicitation_to_request

SCHEMA = {
    "type": "object",
    "properties": {"postal_code": {"type": "string", "minLength": 3}},
    "required": ["postal_code"],
}
URL = "https://example.com/oauth/authorize?state=abc123"
MCP2 = int(importlib.metadata.version("mcp").split(".")[0]) >= 2


class CamelForm:
    """An mcp 1.x-style params object: camelCase attributes."""

    def __init__(self, message: str, requestedSchema: dict[str, Any]) -> None:
        self.mode = "form"
        self.message = message
        self.requestedSchema = requestedSchema
        self.url = None


class CamelUrl:
    """An mcp 1.x-style URL params object."""

    def __init__(self, message: str, url: str, elicitationId: str) -> None:
        self.mode = "url"
        self.message = message
        self.url = url
        self.elicitationId = elicitationId
        self.requestedSchema = None


FORM_SHAPES: dict[str, Any] = {
    "sdk-model-from-wire": mcp.types.ElicitRequestFormParams.model_validate(
        {"mode": "form", "message": "Postal code?", "requestedSchema": SCHEMA}
    ),
    "mcp1-camel-object": CamelForm("Postal code?", SCHEMA),
    "namespace-mode-none": SimpleNamespace(
        mode=None, message="Postal code?", requestedSchema=SCHEMA, url=None
    ),
    "namespace-snake": SimpleNamespace(
        mode="form", message="Postal code?", requested_schema=SCHEMA
    ),
    "wire-dict": {"mode": "form", "message": "Postal code?", "requestedSchema": SCHEMA},
    "wire-dict-no-mode": {"message": "Postal code?", "requestedSchema": SCHEMA},
    "snake-dict": {"message": "Postal code?", "requested_schema": SCHEMA},
}

URL_SHAPES: dict[str, Any] = {
    "sdk-model-from-wire": mcp.types.ElicitRequestURLParams.model_validate(
        {"mode": "url", "message": "Authorize?", "url": URL, "elicitationId": "el-7"}
    ),
    "mcp1-camel-object": CamelUrl("Authorize?", URL, "el-7"),
    "namespace-snake": SimpleNamespace(
        mode="url", message="Authorize?", url=URL, elicitation_id="el-7"
    ),
    "wire-dict": {"mode": "url", "message": "Authorize?", "url": URL, "elicitationId": "el-7"},
    "snake-dict": {"mode": "url", "message": "Authorize?", "url": URL, "elicitation_id": "el-7"},
}

if MCP2:  # snake_case constructors and the per-protocol-version models are 2.x's
    from mcp_types import _v2025_11_25

    FORM_SHAPES["mcp2-model"] = mcp.types.ElicitRequestFormParams(
        message="Postal code?", requested_schema=SCHEMA
    )
    FORM_SHAPES["protocol-2025-11-25-model"] = _v2025_11_25.ElicitRequestFormParams.model_validate(
        {"message": "Postal code?", "requestedSchema": SCHEMA}
    )
    URL_SHAPES["mcp2-model"] = mcp.types.ElicitRequestURLParams(
        message="Authorize?", url=URL, elicitation_id="el-7"
    )
    URL_SHAPES["protocol-2025-11-25-model"] = _v2025_11_25.ElicitRequestURLParams.model_validate(
        {"mode": "url", "message": "Authorize?", "url": URL, "elicitationId": "el-7"}
    )
else:  # mcp 1.x: its models' camelCase constructors
    FORM_SHAPES["mcp1-model"] = mcp.types.ElicitRequestFormParams(
        message="Postal code?", requestedSchema=SCHEMA
    )
    URL_SHAPES["mcp1-model"] = mcp.types.ElicitRequestURLParams(
        message="Authorize?", url=URL, elicitationId="el-7"
    )


@pytest.mark.parametrize("params", FORM_SHAPES.values(), ids=FORM_SHAPES.keys())
def test_form_mode_becomes_input_request(params: Any) -> None:
    req = elicitation_to_request(params)
    assert isinstance(req, Request)
    assert req.kind == "input"
    assert req.prompt == "Postal code?"
    assert req.data == {"schema": SCHEMA}
    assert req.schema == SCHEMA
    assert req.url is None
    assert req.meta == {}


@pytest.mark.parametrize("params", URL_SHAPES.values(), ids=URL_SHAPES.keys())
def test_url_mode_becomes_authorization_request(params: Any) -> None:
    req = elicitation_to_request(params)
    assert req.kind == "authorization"
    assert req.prompt == "Authorize?"
    assert req.url == URL
    assert req.data is None
    assert req.meta == {"elicitation_id": "el-7"}


def test_url_mode_without_elicitation_id_has_empty_meta() -> None:
    req = elicitation_to_request({"mode": "url", "message": "Go", "url": URL})
    assert req.meta == {}
    assert req.data is None


def test_url_mode_ignores_a_schema_it_carries() -> None:
    req = elicitation_to_request(
        {"mode": "url", "message": "Go", "url": URL, "requestedSchema": SCHEMA}
    )
    assert req.data is None


def test_ids_are_fresh_and_prefixed() -> None:
    ids = {elicitation_to_request(FORM_SHAPES["wire-dict"]).id for _ in range(100)}
    assert len(ids) == 100
    assert all(re.fullmatch(r"elc-[0-9a-f]{32}", i) for i in ids)


def test_source_and_timeout() -> None:
    source = Source(server="shop", tool="checkout")
    before = time.time()
    req = elicitation_to_request(FORM_SHAPES["wire-dict"], source=source, timeout_s=30)
    assert req.source == source
    assert before <= req.created_at <= time.time()
    assert req.expires_at == req.created_at + 30


def test_defaults_without_source_or_timeout() -> None:
    req = elicitation_to_request(FORM_SHAPES["wire-dict"])
    assert req.source == Source()
    assert req.expires_at is None


def test_mapped_request_survives_the_wire() -> None:
    req = elicitation_to_request(URL_SHAPES["sdk-model-from-wire"], source=Source(server="cal"))
    assert MSGPACK.decode(MSGPACK.encode(req)) == req


@pytest.mark.parametrize(
    ("params", "match"),
    [
        ({"mode": "sms", "message": "x"}, r"unknown elicitation mode 'sms'"),
        (SimpleNamespace(mode="URL", message="x", url=URL), r"unknown elicitation mode 'URL'"),
        ({"requestedSchema": SCHEMA}, r"no message"),
        ({"message": 42, "requestedSchema": SCHEMA}, r"no message"),
        (SimpleNamespace(), r"no message"),
        ({"mode": "url", "message": "x"}, r"URL-mode .* no url"),
        ({"mode": "url", "message": "x", "url": ""}, r"URL-mode .* no url"),
        (SimpleNamespace(mode="url", message="x", url=None), r"URL-mode .* no url"),
        ({"message": "x"}, r"no requestedSchema object"),
        ({"mode": "form", "message": "x", "requestedSchema": None}, r"no requestedSchema object"),
        ({"message": "x", "requestedSchema": "object"}, r"no requestedSchema object"),
        (SimpleNamespace(mode=None, message="x", url=URL), r"mode must be 'url'"),
    ],
)
def test_unmappable_params_raise_invalid_request(params: Any, match: str) -> None:
    with pytest.raises(InvalidRequest, match=match) as info:
        elicitation_to_request(params)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("timeout_s", [0, -1, float("nan"), float("inf")])
def test_timeout_must_be_positive(timeout_s: float) -> None:
    with pytest.raises(InvalidRequest, match=r"timeout_s=.* must be positive"):
        elicitation_to_request(FORM_SHAPES["wire-dict"], timeout_s=timeout_s)


def test_accept_carries_data() -> None:
    result = answer_to_elicit_result(
        Answer(id="elc-1", ok=True, data={"code": "12345", "n": 3, "x": 1.5, "b": True, "l": ["a"]})
    )
    assert type(result) is mcp.types.ElicitResult
    assert result.action == "accept"
    assert result.content == {"code": "12345", "n": 3, "x": 1.5, "b": True, "l": ["a"]}
    assert type(result.content["n"]) is int
    assert type(result.content["b"]) is bool


@pytest.mark.parametrize("data", [None, {}])
def test_accept_without_data_has_empty_content(data: Any) -> None:
    result = answer_to_elicit_result(Answer(id="elc-2", ok=True, data=data))
    assert result.action == "accept"
    assert result.content == {}


def test_url_mode_accept_has_no_content() -> None:
    result = answer_to_elicit_result(Answer(id="elc-3", ok=True, data={"x": "y"}), url_mode=True)
    assert result.action == "accept"
    assert result.content is None
    assert "content" not in result.model_dump(by_alias=True, exclude_none=True)


def test_decline_only_for_declined() -> None:
    result = answer_to_elicit_result(Answer(id="elc-4", ok=False, reason="declined"))
    assert result.action == "decline"
    assert result.content is None


@pytest.mark.parametrize(
    "reason", ["dismissed", "expired", "withdrawn", "unavailable", "something-new", None]
)
def test_every_other_refusal_cancels(reason: str | None) -> None:
    result = answer_to_elicit_result(Answer(id="elc-5", ok=False, reason=reason))
    assert result.action == "cancel"
    assert result.content is None


def test_refusal_data_is_not_sent() -> None:
    result = answer_to_elicit_result(Answer(id="elc-6", ok=False, reason="declined", data={"a": 1}))
    assert result.content is None


@pytest.mark.parametrize(
    ("data", "match", "field"),
    [
        ("12345", r"must be an object of field values, got str", None),
        ([1, 2], r"must be an object of field values, got list", None),
        ({"nested": {"a": 1}}, r"field 'nested' is not a string", "nested"),
        ({"tags": [1, 2]}, r"field 'tags' is not a string", "tags"),
    ],
)
def test_accept_with_unsendable_data_raises(data: Any, match: str, field: str | None) -> None:
    with pytest.raises(InvalidAnswer, match=match) as info:
        answer_to_elicit_result(Answer(id="elc-7", ok=True, data=data))
    assert info.value.field == field
