"""The MCP elicitation bridge (SPEC §2): elicitations in as Requests, Answers out as ElicitResults.

A form elicitation becomes ``kind="input"`` with the requested schema in
``data["schema"]``; a URL elicitation becomes ``kind="authorization"`` with the
``url``. Params may be mcp 2.x models (snake_case), mcp 1.x models (camelCase),
any attribute object, or the wire dict.

Results are the installed SDK's ``ElicitResult``: ``mcp_types``' on mcp 2.x (the SDK
itself is not loaded), ``mcp.types``' on mcp 1.x. Either is imported on the first
answer mapped, not with ``toolnexus``: a responder never needs it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import pydantic

from .._numeric import check_number
from ..errors import InvalidAnswer, InvalidRequest
from ..models import DECLINED, Answer, Request, Source, new_id
from ._sdk import mcp_release

if TYPE_CHECKING:
    from mcp.types import ElicitResult


def elicitation_to_request(
    params: Any, *, source: Source | None = None, timeout_s: float | None = None
) -> Request:
    """Map MCP ``elicitation/create`` params to a fresh ``elc-`` :class:`Request`.

    The server's elicitation id, if any, goes to ``meta["elicitation_id"]``;
    ``timeout_s`` sets ``expires_at`` that many seconds after ``created_at``.

    Raises:
        InvalidRequest: an unknown mode, no message, URL mode without a url,
            form mode without a schema object, or a ``timeout_s`` that is not
            positive; the message names which.
    """
    mode = _field(params, "mode")
    message = _field(params, "message")
    if mode not in (None, "form", "url"):
        raise InvalidRequest(f"unknown elicitation mode {mode!r}: expected 'form' or 'url'")
    if not isinstance(message, str):
        raise InvalidRequest("elicitation params have no message to show the person")
    if timeout_s is not None:
        check_number("timeout_s", timeout_s, error=InvalidRequest)

    if mode == "url":
        url = _field(params, "url")
        if not isinstance(url, str) or not url:
            raise InvalidRequest("URL-mode elicitation params have no url")
        kind, data = "authorization", None
    else:
        schema = _field(params, "requested_schema", "requestedSchema")
        if isinstance(schema, pydantic.BaseModel):  # the per-protocol-version mcp_types models
            schema = schema.model_dump(mode="json", by_alias=True, exclude_none=True)
        if not isinstance(schema, dict):
            raise InvalidRequest(
                "form-mode elicitation params have no requestedSchema object "
                "(for a URL elicitation, mode must be 'url')"
            )
        kind, data, url = "input", {"schema": schema}, None

    elicitation_id = _field(params, "elicitation_id", "elicitationId")
    created_at = time.time()
    return Request(
        id=new_id("elc"),
        kind=kind,
        prompt=message,
        data=data,
        url=url,
        source=source or Source(),
        created_at=created_at,
        expires_at=None if timeout_s is None else created_at + timeout_s,
        meta={} if elicitation_id is None else {"elicitation_id": elicitation_id},
    )


def input_request_meta(group: str, key: str) -> dict[str, str]:
    """``Request.meta`` entries for one of several input requests asked together (the
    input requests of one 2026-07-28 ``InputRequiredResult`` or of one task): ``group``
    names what they belong to, ``key`` the server's key of this one. Responders may show
    the requests of a group together; each is answered on its own, in any order."""
    return {"input_group": group, "input_key": key}


def answer_to_elicit_result(answer: Answer, *, url_mode: bool = False) -> ElicitResult:
    """Map an :class:`Answer` to the SDK's ``ElicitResult``: accept, decline or cancel.

    ``ok`` accepts with ``content=answer.data`` (``{}`` if none; no content when
    ``url_mode``), a default on expiry too (SPEC §14); only ``reason="declined"`` and a
    decline by default on expiry decline; every other refusal (dismissed, expired,
    withdrawn, unavailable, no reason) cancels.

    Raises:
        InvalidAnswer: an accepted form answer whose data is not an object of
            MCP field values (strings, numbers, booleans, lists of strings).
    """
    elicit_result = elicit_result_type()
    if not answer.ok:
        declined = answer.reason == DECLINED or answer.defaulted  # or declined by default
        return elicit_result(action="decline" if declined else "cancel")
    if url_mode:
        return elicit_result(action="accept")
    content = {} if answer.data is None else answer.data
    if not isinstance(content, dict):
        raise InvalidAnswer(
            f"answer {answer.id!r}: accepted form data must be an object of field values, "
            f"got {type(content).__name__}",
            rule="type",
        )
    try:
        return elicit_result(action="accept", content=content)
    except pydantic.ValidationError as exc:
        field = str(exc.errors()[0]["loc"][1])
        raise InvalidAnswer(
            f"answer {answer.id!r}: field {field!r} is not a string, number, boolean, "
            "list of strings or null",
            field=field,
            rule="type",
        ) from exc


def elicit_result_type() -> type[ElicitResult]:
    """The installed SDK's ``ElicitResult`` class (the same class under both names on 2.x)."""
    if mcp_release()[0] < 2:
        from mcp.types import ElicitResult
    else:  # without loading the SDK
        from mcp_types import ElicitResult
    return ElicitResult


def _field(params: Any, *names: str) -> Any:
    """The first of ``names`` that ``params`` holds as a non-None key or attribute (the
    mcp 2.x name first: fastmcp makes the 1.x alias of a 2.x model warn)."""
    for name in names:
        value = params.get(name) if isinstance(params, Mapping) else getattr(params, name, None)
        if value is not None:
            return value
    return None
