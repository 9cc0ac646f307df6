"""The toolnexus agent toolkit's §10 JSON form of :class:`Request` and :class:`Answer`.

The toolkit (``pip install toolnexus``, with ports in JavaScript, Go, Java, C#, Elixir and
Clojure) suspends a tool with a ``Request`` and resolves it with an ``Answer`` whose keys are
fixed across its ports::

    Request {"id", "kind", "prompt", "url"?, "data"?, "expiresAt"?}
    Answer  {"id", "ok", "data"?, "reason"?}     reason: declined | cancelled | expired

This module is the one home of the mapping between that wire and the bridge's messages:

- Keys come in that order, optional ones left out when absent (never ``null``), in
  compact UTF-8 JSON: what JavaScript's ``JSON.stringify`` and the Python port's
  ``json.dumps(..., separators=(",", ":"), ensure_ascii=False)`` give.
- ``expiresAt`` is ISO 8601. It is written as JavaScript's ``toISOString()`` writes it
  (``2026-12-01T22:16:36.123Z``, UTC, milliseconds) and read in any ISO 8601 form that
  carries a time zone; the bridge keeps it as :attr:`Request.expires_at` (Unix seconds).
- The bridge's reasons outside the toolkit's vocabulary travel as ``cancelled``
  (:func:`wire_reason`: ``dismissed``, ``withdrawn``, ``unavailable`` and any reason a
  responder chose); the precise one is kept under the key ``"bridge"``
  (:data:`EXTENSION_KEY`), last in the object, which the ports ignore. It holds only what
  the §10 keys cannot say: ``reason`` (when it differs from the wire's), ``responder``,
  ``person``, ``defaulted``. A toolkit's own JSON therefore decodes and encodes again to
  the same bytes.

:func:`as_request` takes any object with the §10 attributes (the toolkit's ``Request``
dataclass among them); ``broker.wait_for`` calls it, so a toolkit agent's request can be
waited for as it is. The bridge's :class:`Answer` has every attribute a toolkit loop reads
(``id``, ``ok``, ``data``, ``reason``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Final, Protocol

from .errors import DecodeError, InvalidRequest
from .models import DECLINED, EXPIRED, Answer, Request

CANCELLED: Final = "cancelled"
"""The toolkit's reason for every ``ok=False`` that is neither declined nor expired."""

WIRE_REASONS: Final = (DECLINED, CANCELLED, EXPIRED)
"""The reasons the toolkit's ports know."""

EXTENSION_KEY: Final = "bridge"
"""The key of an Answer's bridge-only details, which the toolkit's ports ignore."""

REQUEST_KEYS: Final = ("id", "kind", "prompt", "url", "data", "expiresAt")
ANSWER_KEYS: Final = ("id", "ok", "data", "reason")


class Request10(Protocol):
    """Any object with the §10 attributes of a request (the toolkit's ``Request`` is one)."""

    @property
    def id(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def prompt(self) -> str: ...


def wire_reason(reason: str | None) -> str | None:
    """The §10 reason for the bridge's ``reason``: declined and expired as they are, every
    other reason ``"cancelled"``; None stays None."""
    if reason is None or reason in WIRE_REASONS:
        return reason
    return CANCELLED


def iso_time(t: float) -> str:
    """``t`` (Unix seconds) as JavaScript's ``Date.prototype.toISOString()`` writes it."""
    millis = round(t * 1000)
    moment = datetime.fromtimestamp(millis // 1000, UTC)
    return f"{moment:%Y-%m-%dT%H:%M:%S}.{millis % 1000:03d}Z"


def unix_time(text: str, *, field: str = "expiresAt") -> float:
    """The Unix time of an ISO 8601 date and time with a time zone.

    Raises:
        InvalidRequest: naming ``field``, if ``text`` is not one.
    """
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        moment = None
    if moment is None:
        raise InvalidRequest(
            f"§10 request: {field} {text[:60]!r} is not an ISO 8601 date and time "
            "(e.g. 2026-12-01T22:16:36.000Z)"
        )
    if moment.tzinfo is None:
        raise InvalidRequest(
            f"§10 request: {field} {text[:60]!r} has no time zone; end it with Z or +hh:mm"
        )
    return moment.timestamp()


def _text(values: Mapping[str, Any], key: str, *, required: bool) -> str | None:
    value = values.get(key)
    if value is None:
        if required:
            raise InvalidRequest(f"§10 request: {key} is missing; it must be a string")
        return None
    if not isinstance(value, str):
        raise InvalidRequest(f"§10 request: {key} must be a string, not {type(value).__name__}")
    if required and key != "prompt" and not value:
        raise InvalidRequest(f"§10 request: {key} must not be empty")
    return value


def request_from_mapping(values: Mapping[str, Any]) -> Request:
    """The bridge's :class:`Request` for the §10 request ``values`` (keys as on the wire;
    others are ignored).

    Raises:
        InvalidRequest: naming the key that is missing or has the wrong type.
    """
    data = values.get("data")
    if data is not None and not isinstance(data, Mapping):
        raise InvalidRequest(
            f"§10 request: data must be an object or absent, not {type(data).__name__}"
        )
    expires = _text(values, "expiresAt", required=False)
    return Request(
        id=_text(values, "id", required=True) or "",
        kind=_text(values, "kind", required=True) or "",
        prompt=_text(values, "prompt", required=True) or "",
        url=_text(values, "url", required=False),
        data=dict(data) if data is not None else None,
        expires_at=unix_time(expires) if expires is not None else None,
    )


def as_request(request: Request | Request10) -> Request:
    """``request`` as the bridge's :class:`Request`: itself if it is one, else read from its
    §10 attributes (``id``, ``kind``, ``prompt``, ``url``, ``data``, ``expiresAt``).

    Raises:
        InvalidRequest: naming the attribute that is missing or has the wrong type.
    """
    if isinstance(request, Request):
        return request
    return request_from_mapping({key: getattr(request, key, None) for key in REQUEST_KEYS})


def _dumps(values: dict[str, Any], what: str) -> bytes:
    try:
        text = json.dumps(values, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidRequest(f"{what} {values.get('id')!r} has no JSON form: {exc}") from exc
    return text.encode()


def request_to_dict(request: Request) -> dict[str, Any]:
    """The §10 keys of ``request``, in wire order, absent ones left out."""
    values: dict[str, Any] = {"id": request.id, "kind": request.kind, "prompt": request.prompt}
    if request.url is not None:
        values["url"] = request.url
    if request.data is not None:
        values["data"] = request.data
    if request.expires_at is not None and math.isfinite(request.expires_at):
        values["expiresAt"] = iso_time(request.expires_at)
    return values


def request_to_json(request: Request) -> bytes:
    """``request`` in the §10 JSON form (UTF-8 bytes).

    Raises:
        InvalidRequest: its data is not JSON (NaN, a set, ...).
    """
    return _dumps(request_to_dict(request), "request")


def request_from_json(body: bytes | str) -> Request:
    """The bridge's :class:`Request` for a §10 JSON request.

    Raises:
        InvalidRequest: the body is not a JSON object, or names the key that is wrong.
    """
    try:
        values = json.loads(body)
    except ValueError as exc:
        raise InvalidRequest(f"§10 request: the body is not JSON: {exc}") from exc
    if not isinstance(values, dict):
        raise InvalidRequest("§10 request: the body must be a JSON object")
    return request_from_mapping(values)


def answer_to_dict(answer: Answer) -> dict[str, Any]:
    """The §10 keys of ``answer`` in wire order (absent ones left out), then
    :data:`EXTENSION_KEY` with the bridge's details if it has any."""
    values: dict[str, Any] = {"id": answer.id, "ok": answer.ok}
    if answer.data is not None:
        values["data"] = answer.data
    reason = wire_reason(answer.reason)
    if reason is not None:
        values["reason"] = reason
    details: dict[str, Any] = {}
    if answer.reason != reason:
        details["reason"] = answer.reason
    if answer.responder is not None:
        details["responder"] = answer.responder
    if answer.person is not None:
        details["person"] = answer.person
    if answer.defaulted:
        details["defaulted"] = True
    if details:
        values[EXTENSION_KEY] = details
    return values


def answer_to_json(answer: Answer) -> bytes:
    """``answer`` in the §10 JSON form (UTF-8 bytes), see :func:`answer_to_dict`.

    Raises:
        InvalidRequest: its data is not JSON.
    """
    return _dumps(answer_to_dict(answer), "answer")


def answer_from_json(body: bytes | str) -> Answer:
    """The bridge's :class:`Answer` for a §10 JSON answer; a precise reason under
    :data:`EXTENSION_KEY` wins over the wire's.

    Raises:
        DecodeError: the body is not a §10 answer; the message names the key.
    """
    try:
        values = json.loads(body)
    except ValueError as exc:
        raise DecodeError(f"§10 answer: the body is not JSON: {exc}") from exc
    if not isinstance(values, dict):
        raise DecodeError("§10 answer: the body must be a JSON object")
    answer_id, ok, data = values.get("id"), values.get("ok"), values.get("data")
    reason = values.get("reason")
    details = values.get(EXTENSION_KEY) or {}
    if not isinstance(answer_id, str) or not answer_id:
        raise DecodeError("§10 answer: id must be a non-empty string")
    if not isinstance(ok, bool):
        raise DecodeError("§10 answer: ok must be true or false")
    if data is not None and not isinstance(data, dict):
        raise DecodeError(f"§10 answer: data must be an object, not {type(data).__name__}")
    if reason is not None and not isinstance(reason, str):
        raise DecodeError("§10 answer: reason must be a string")
    if not isinstance(details, dict):
        raise DecodeError(f"§10 answer: {EXTENSION_KEY} must be an object")
    precise = details.get("reason", reason)
    responder, person = details.get("responder"), details.get("person")
    for key, value in (("reason", precise), ("responder", responder), ("person", person)):
        if value is not None and not isinstance(value, str):
            raise DecodeError(f"§10 answer: {EXTENSION_KEY}.{key} must be a string")
    return Answer(
        id=answer_id,
        ok=ok,
        data=data,
        reason=precise,
        responder=responder,
        person=person,
        defaulted=details.get("defaulted") is True,
    )
