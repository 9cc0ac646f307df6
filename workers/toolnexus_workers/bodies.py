"""The one rule for request bodies, shared by every HTTP server of the workers (the web page,
the HTTP answering API and its answer links, the wait gateway, the Slack receiver).

A body is read up to :data:`MAX_BODY_BYTES` (more: ``413``); it must be UTF-8, and JSON
must parse (not nested past Python's recursion limit) and be of the type the route takes,
a form must parse (at most :data:`MAX_FORM_FIELDS` fields): otherwise ``400``. Each
refusal is a :class:`BadBody` with its status and a one-line reason; nothing a client
sends becomes a ``500``.

    try:
        values = json_object(await read_body(request.stream()))
    except BadBody as bad:
        return error(bad.status, bad.reason)
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterable
from typing import Any
from urllib.parse import parse_qs

MAX_BODY_BYTES = 1024 * 1024
"""The largest body any server takes (the broker's limit on one encoded message)."""

MAX_FORM_FIELDS = 10_000
"""The most fields a form body may have."""

Form = dict[str, list[str]]
"""A parsed form: each field's values in order."""


class BadBody(ValueError):
    """A body refused: ``status`` (400 or 413) and a one-line ``reason``."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status, self.reason = status, reason


async def read_body(chunks: AsyncIterable[bytes], limit: int = MAX_BODY_BYTES) -> bytes:
    """The body the ``chunks`` carry.

    Raises:
        BadBody: 413, once it passes ``limit`` bytes (the rest is not read).
    """
    parts, size = [], 0
    async for chunk in chunks:
        size += len(chunk)
        if size > limit:
            raise BadBody(413, f"the body is over {limit} bytes")
        parts.append(chunk)
    return b"".join(parts)


def text(raw: bytes) -> str:
    """``raw`` as text.

    Raises:
        BadBody: 400, it is not UTF-8 (the message says where).
    """
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadBody(400, f"the body is not UTF-8 (byte {exc.start})") from None


def json_value(raw: bytes | str) -> Any:
    """The JSON value ``raw`` holds.

    Raises:
        BadBody: 400, it is not UTF-8, not JSON, or nested too deep to read.
    """
    body = text(raw) if isinstance(raw, bytes) else raw
    try:
        return json.loads(body)
    except RecursionError:
        raise BadBody(400, "the body is not JSON this server reads: nested too deep") from None
    except ValueError as exc:
        raise BadBody(400, f"the body is not JSON: {exc}") from None


def json_object(raw: bytes | str, example: str = "") -> dict[str, Any]:
    """The JSON object ``raw`` holds (``example``: one, for the message).

    Raises:
        BadBody: 400, as :func:`json_value`, or it is JSON but not an object.
    """
    value = json_value(raw)
    if not isinstance(value, dict):
        like = f": {example}" if example else ""
        raise BadBody(400, f"the body must be a JSON object, not {_kind(value)}{like}")
    return value


def form(raw: bytes) -> Form:
    """The URL-encoded form ``raw`` holds.

    Raises:
        BadBody: 400, it is not UTF-8 or has over :data:`MAX_FORM_FIELDS` fields.
    """
    decoded = text(raw)
    try:
        return parse_qs(decoded, keep_blank_values=True, max_num_fields=MAX_FORM_FIELDS)
    except ValueError:  # parse_qs: too many fields
        raise BadBody(400, f"the form has over {MAX_FORM_FIELDS} fields") from None


def _kind(value: Any) -> str:
    names = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
    return names.get(type(value), "a number")


__all__ = [
    "MAX_BODY_BYTES",
    "MAX_FORM_FIELDS",
    "BadBody",
    "Form",
    "form",
    "json_object",
    "json_value",
    "read_body",
    "text",
]
