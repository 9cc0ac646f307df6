"""Form answers checked against an MCP elicitation's requested schema (SPEC §2).

MCP restricts ``requestedSchema`` to a flat object: string (``format`` email,
uri, date, date-time; ``minLength``/``maxLength``), number and integer
(``minimum``/``maximum``), boolean, single-select enums (``enum``, titled
``oneOf`` of ``{const, title}``, legacy ``enumNames`` which only adds labels)
and multi-select arrays (``items`` with ``enum`` or ``anyOf`` of
``{const, title}``, ``minItems``/``maxItems``), plus ``required`` and
``default``. Standard keywords are checked by :mod:`jsonschema` (Draft 2020-12);
this module adds defaults, the formats jsonschema cannot check without extra
packages, and messages that name the field and the rule.

    >>> schema = {"type": "object", "properties": {"n": {"type": "integer", "default": 1}}}
    >>> validate_form(schema, {})
    {'n': 1}
"""

from __future__ import annotations

import collections
import contextlib
import copy
import json
import math
import re
import reprlib
from datetime import date
from typing import Any

import msgspec
from jsonschema import Draft202012Validator, FormatChecker
from jsonschema.exceptions import SchemaError, ValidationError

from .errors import InvalidAnswer, InvalidRequest
from .models import EXPIRED, UNAVAILABLE, WITHDRAWN, Answer, Request

_FIELD_TYPES = frozenset({"string", "number", "integer", "boolean", "array"})

# RFC 3986 absolute URI: a scheme, then only URI characters and valid %-escapes.
_URI = re.compile(
    r"[A-Za-z][A-Za-z0-9+.\-]*:(?:[A-Za-z0-9\-._~!$&'()*+,;=:@/?#\[\]]|%[0-9A-Fa-f]{2})*",
    re.ASCII,
)
# RFC 3339 date-time: full-date "T" full-time, with a time zone.
_DATE_TIME = re.compile(
    r"(\d{4}-\d{2}-\d{2})[Tt](\d{2}):(\d{2}):(\d{2})(?:\.\d+)?(?:[Zz]|[+-](\d{2}):(\d{2}))",
    re.ASCII,
)

# jsonschema's own checkers (email, date, ...) plus uri and date-time, which it
# only checks when optional packages are installed.
_FORMATS = FormatChecker(Draft202012Validator.FORMAT_CHECKER.checkers)


@_FORMATS.checks("uri")
def _is_uri(instance: object) -> bool:
    return not isinstance(instance, str) or _URI.fullmatch(instance) is not None


@_FORMATS.checks("date-time", raises=ValueError)
def _is_date_time(instance: object) -> bool:
    if not isinstance(instance, str):
        return True
    match = _DATE_TIME.fullmatch(instance)
    if match is None:
        return False
    day, hour, minute, second, offset_hour, offset_minute = match.groups()
    date.fromisoformat(day)  # raises ValueError for a day that does not exist
    return (
        int(hour) < 24
        and int(minute) < 60
        and int(second) <= 60  # a leap second
        and int(offset_hour or 0) < 24
        and int(offset_minute or 0) < 60
    )


# Sentences for keywords whose jsonschema message does not state the limit.
_MESSAGES = {
    "minLength": "{instance} is shorter than the minimum length of {value}",
    "maxLength": "{instance} is longer than the maximum length of {value}",
    "minItems": "{instance} has fewer than the minimum of {value} items",
    "maxItems": "{instance} has more than the maximum of {value} items",
    "format": "{instance} is not a valid {value}",
}

FORMAT_SHAPES = {"date": "YYYY-MM-DD", "date-time": "YYYY-MM-DDThh:mm:ssZ"}
"""How a value of a string format is written, where its name alone does not say it."""

_QUOTE = reprlib.Repr()
_QUOTE.maxstring = _QUOTE.maxother = 60
_QUOTE.maxlist = _QUOTE.maxdict = 6
_QUOTE.maxlevel = 2
MAX_QUOTE_CHARS = 100
"""An error message quotes at most about this many characters of a value."""

# Reasons only the broker gives: a responder saying them would pass for the broker.
BROKER_REASONS = frozenset({EXPIRED, WITHDRAWN, UNAVAILABLE})


def quote(value: Any) -> str:
    """``repr(value)``, shortened to about :data:`MAX_QUOTE_CHARS` characters."""
    text = _QUOTE.repr(value)
    return text if len(text) <= MAX_QUOTE_CHARS else text[: MAX_QUOTE_CHARS - 3] + "..."


def options(field_schema: Any) -> list[tuple[Any, str]]:
    """The ``(value, label)`` choices of a single- or multi-select field; ``[]`` for others.

    Reads every MCP shape: ``enum`` (labels are the values, or legacy ``enumNames`` of
    the same length), titled ``oneOf`` / ``anyOf`` of ``{const, title}`` (a missing
    title is the value), and for ``type: "array"`` the same under ``items``.

        >>> options({"type": "string", "oneOf": [{"const": "eu", "title": "Europe"}]})
        [('eu', 'Europe')]
    """
    if not isinstance(field_schema, dict):
        return []
    source = field_schema.get("items") if field_schema.get("type") == "array" else field_schema
    if not isinstance(source, dict):
        return []
    titled = source.get("oneOf") or source.get("anyOf")
    if isinstance(titled, list):
        return [
            (option["const"], str(option.get("title", option["const"])))
            for option in titled
            if isinstance(option, dict) and "const" in option
        ]
    values = source.get("enum")
    if not isinstance(values, list):
        return []
    names = source.get("enumNames")
    labels = names if isinstance(names, list) and len(names) == len(values) else values
    return [(value, str(label)) for value, label in zip(values, labels, strict=True)]


def check_schema(schema: Any) -> None:
    """Check that ``schema`` is a flat object schema of MCP field kinds.

    Lenient: unknown keywords and untyped fields (a bare ``enum``) pass.

    Raises:
        InvalidRequest: not a dict, not ``type: "object"``, ``properties`` not
            an object of field schemas, a field of another type (nested objects),
            or not valid JSON Schema; the message names which.
    """
    if not isinstance(schema, dict):
        raise InvalidRequest(f"a requested schema must be an object, got {type(schema).__name__}")
    if schema.get("type", "object") != "object":
        raise InvalidRequest(f"a requested schema must have type 'object', not {schema['type']!r}")
    properties = schema.get("properties", {})
    if not isinstance(properties, dict):
        raise InvalidRequest("a requested schema's 'properties' must be an object")
    for name, field in properties.items():
        if not isinstance(field, dict):
            raise InvalidRequest(f"field {name!r}: its schema must be an object")
        kind = field.get("type")
        if kind is not None and (not isinstance(kind, str) or kind not in _FIELD_TYPES):
            raise InvalidRequest(
                f"field {name!r}: type {kind!r} is not an MCP form field type "
                f"(one of {sorted(_FIELD_TYPES)})"
            )
    _validator(schema)


def validate_form(schema: dict[str, Any], data: Any) -> dict[str, Any]:
    """Check the form answer ``data`` against ``schema``; return a copy with defaults filled in.

    An absent field takes its ``default`` before ``required`` is checked.
    ``data`` itself is never modified.

    Raises:
        InvalidAnswer: ``data`` is not an object, or a field breaks a rule (the
            first failing field in schema order is reported); ``field`` and ``rule``
            name them and the message says both in a sentence, e.g.
            "field 'age': 150 is greater than the maximum of 120".
        InvalidRequest: ``schema`` itself is not a valid JSON Schema object.
    """
    if not isinstance(data, dict):
        raise InvalidAnswer(
            f"a form answer must be an object of field values, got {type(data).__name__}",
            rule="type",
        )
    validator = _validator(schema)
    filled = dict(data)
    properties = schema.get("properties", {})
    for name, value in data.items():
        if name not in properties:
            raise InvalidAnswer(
                f"field {quote(name)} is not in the form (its fields: {sorted(properties)})",
                field=str(name)[:MAX_QUOTE_CHARS],
                rule="additionalProperties",
            )
        if not _finite(value):
            raise InvalidAnswer(
                f"field {quote(name)}: {quote(value)} is not a finite number",
                field=name,
                rule="finite",
            )
    for name, field in properties.items():
        if name not in filled and isinstance(field, dict) and "default" in field:
            filled[name] = copy.deepcopy(field["default"])
    for name in schema.get("required", []):
        if name not in filled:
            raise InvalidAnswer(f"field {name!r} is required", field=name, rule="required")
    error = next(validator.iter_errors(filled), None)
    if error is not None:
        raise _invalid(error)
    return filled


def _finite(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, list):
        return all(_finite(item) for item in value)
    return True


_KEY = msgspec.msgpack.Encoder()
_COMPILED: collections.OrderedDict[bytes, Draft202012Validator] = collections.OrderedDict()
_COMPILED_MAX = 256
"""Validators compiled, least recently used first, by the schema's msgpack encoding."""


def _validator(schema: Any) -> Draft202012Validator:
    """The compiled validator of ``schema``, compiled once per distinct schema.

    Looked up by value, never by identity: each request decoded from the wire holds a
    schema object of its own, and a dict changed after it was compiled must not find
    the old validator. The key is the schema's msgpack encoding (~1 µs, where
    ``json.dumps`` took ~12 µs); msgpack tells apart what JSON does (``1`` and ``1.0``,
    strings and bytes, NaN and null). A schema seen for the first time must be JSON
    (``json.dumps``) and is compiled from a copy, so later changes to the caller's dict
    never reach the cached validator.
    """
    if not isinstance(schema, dict):
        raise InvalidRequest(f"a requested schema must be an object, got {type(schema).__name__}")
    try:
        key = _KEY.encode(schema)
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidRequest(f"a requested schema must be JSON: {exc}") from exc
    validator = _COMPILED.get(key)
    if validator is not None:
        with contextlib.suppress(KeyError):  # another thread may have evicted it
            _COMPILED.move_to_end(key)
        return validator
    validator = _compile(schema)
    _COMPILED[key] = validator
    while len(_COMPILED) > _COMPILED_MAX:
        with contextlib.suppress(KeyError):
            _COMPILED.popitem(last=False)
    return validator


def _compile(schema: dict[str, Any]) -> Draft202012Validator:
    try:
        copied = json.loads(json.dumps(schema))
    except (TypeError, ValueError) as exc:
        raise InvalidRequest(f"a requested schema must be JSON: {exc}") from exc
    try:
        Draft202012Validator.check_schema(copied)
    except SchemaError as exc:
        raise InvalidRequest(
            f"the requested schema is not valid JSON Schema at {exc.json_path}: {exc.message}"
        ) from exc
    return Draft202012Validator(copied, format_checker=_FORMATS)


def _invalid(error: ValidationError) -> InvalidAnswer:
    rule = str(error.validator)
    value: Any = error.validator_value
    choices = options({rule: value}) if rule in ("oneOf", "anyOf") else []
    if choices and len(choices) == len(value):
        consts = [const for const, _ in choices]
        text = f"{quote(error.instance)} is not one of {quote(consts)}"
    elif rule in _MESSAGES:
        text = _MESSAGES[rule].format(instance=quote(error.instance), value=value)
        if rule == "format" and value in FORMAT_SHAPES:
            text += f" (write it as {FORMAT_SHAPES[value]})"
    else:
        text = error.message.replace(repr(error.instance), quote(error.instance))
        if len(text) > 3 * MAX_QUOTE_CHARS:
            text = text[: 3 * MAX_QUOTE_CHARS - 3] + "..."
    path = list(error.path)
    if not path:
        return InvalidAnswer(f"form answer: {text}", rule=rule)
    field = str(path[0])
    items = "".join(f"item {index}: " for index in path[1:])
    return InvalidAnswer(f"field {field!r}: {items}{text}", field=field, rule=rule)


def check_answer(request: Request, answer: Answer, responder: str | None) -> Answer:
    """The answer as it will be stored: form data validated with defaults filled in.

    Raises:
        InvalidAnswer: ``answer.id`` is not the request's, the reason is one only the
            broker gives (``expired``, ``withdrawn``, ``unavailable``), it claims to be a
            default on expiry (``defaulted``), or an accepted
            form's data fails the request's schema (the message names the field and rule).
    """
    if answer.id != request.id:
        raise InvalidAnswer(
            f"answer id {quote(answer.id)} does not match request id {request.id!r}", rule="id"
        )
    if answer.reason in BROKER_REASONS:  # accepted or not: "expired" is never a person's
        raise InvalidAnswer(
            f"reason {answer.reason!r} is the broker's to give: a responder may decline, "
            "dismiss, or give a reason of its own",
            rule="reason",
        )
    if answer.defaulted:
        raise InvalidAnswer(
            "defaulted=True marks the broker's default on expiry: a responder's answer "
            "is never a default",
            rule="defaulted",
        )
    changes: dict[str, Any] = {}
    schema = request.schema
    if answer.ok and schema is not None:
        changes["data"] = validate_form(schema, answer.data if answer.data is not None else {})
    if answer.responder is None and responder is not None:
        changes["responder"] = responder
    return msgspec.structs.replace(answer, **changes) if changes else answer
