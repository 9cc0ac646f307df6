"""SPEC §2: form answers are validated against the MCP restricted schema subset."""

from __future__ import annotations

import copy
import math
from datetime import timedelta, timezone
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from toolnexus import InvalidAnswer, InvalidRequest
from toolnexus.responders import check_schema, validate_form


def form(fields: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object", "properties": fields}
    if required is not None:
        schema["required"] = required
    return schema


COLORS = ["red", "green", "blue"]
TITLED = [{"const": c, "title": c.title()} for c in COLORS]

FIELDS: dict[str, dict[str, Any]] = {
    "string": {"type": "string"},
    "bounded-string": {"type": "string", "minLength": 2, "maxLength": 4},
    "email": {"type": "string", "format": "email"},
    "uri": {"type": "string", "format": "uri"},
    "date": {"type": "string", "format": "date"},
    "date-time": {"type": "string", "format": "date-time"},
    "number": {"type": "number", "minimum": 0.5, "maximum": 10},
    "integer": {"type": "integer", "minimum": 1, "maximum": 120},
    "boolean": {"type": "boolean"},
    "enum": {"type": "string", "enum": COLORS},
    "enum-names": {"type": "string", "enum": COLORS, "enumNames": ["Red", "Green", "Blue"]},
    "titled": {"type": "string", "oneOf": TITLED},
    "multi": {"type": "array", "items": {"type": "string", "enum": COLORS}, "maxItems": 2},
    "titled-multi": {"type": "array", "items": {"anyOf": TITLED}, "minItems": 1},
}

VALID: list[tuple[str, Any]] = [
    ("string", ""),
    ("string", "anything at all"),
    ("bounded-string", "ab"),
    ("bounded-string", "abcd"),
    ("email", "person@example.com"),
    ("uri", "https://example.com/a/b?c=d#e"),
    ("uri", "mailto:person@example.com"),
    ("uri", "urn:isbn:0451450523"),
    ("uri", "https://example.com/%20space"),
    ("date", "2024-02-29"),
    ("date-time", "2024-01-31T10:00:00Z"),
    ("date-time", "2024-01-31T10:00:00.123+05:30"),
    ("date-time", "2024-01-31t23:59:60z"),
    ("number", 0.5),
    ("number", 10),
    ("number", 3.25),
    ("integer", 1),
    ("integer", 120),
    ("integer", 7.0),
    ("boolean", True),
    ("boolean", False),
    ("enum", "red"),
    ("enum-names", "blue"),
    ("titled", "green"),
    ("multi", []),
    ("multi", ["red", "blue"]),
    ("titled-multi", ["green"]),
]

INVALID: list[tuple[str, Any, str, str]] = [
    ("string", 5, "type", "5 is not of type 'string'"),
    ("bounded-string", "a", "minLength", "'a' is shorter than the minimum length of 2"),
    ("bounded-string", "abcde", "maxLength", "'abcde' is longer than the maximum length of 4"),
    ("email", "person.example.com", "format", "'person.example.com' is not a valid email"),
    ("uri", "not a uri", "format", "'not a uri' is not a valid uri"),
    ("uri", "/relative/path", "format", "'/relative/path' is not a valid uri"),
    ("uri", "https://example.com/%zz", "format", "is not a valid uri"),
    ("uri", "https://exa mple.com", "format", "is not a valid uri"),
    ("date", "2024-02-30", "format", "'2024-02-30' is not a valid date"),
    ("date", "31/01/2024", "format", "is not a valid date"),
    ("date", "2024-01-31T10:00:00Z", "format", "is not a valid date"),
    ("date-time", "2024-01-31", "format", "'2024-01-31' is not a valid date-time"),
    ("date-time", "2024-01-31T10:00:00", "format", "is not a valid date-time"),
    ("date-time", "2024-01-31 10:00:00Z", "format", "is not a valid date-time"),
    ("date-time", "2024-02-30T10:00:00Z", "format", "is not a valid date-time"),
    ("date-time", "2024-01-31T24:00:00Z", "format", "is not a valid date-time"),
    ("date-time", "2024-01-31T10:60:00Z", "format", "is not a valid date-time"),
    ("date-time", "2024-01-31T10:00:00+24:00", "format", "is not a valid date-time"),
    ("number", 0.4, "minimum", "0.4 is less than the minimum of 0.5"),
    ("number", 11, "maximum", "11 is greater than the maximum of 10"),
    ("number", "3", "type", "'3' is not of type 'number'"),
    ("integer", 150, "maximum", "150 is greater than the maximum of 120"),
    ("integer", 0, "minimum", "0 is less than the minimum of 1"),
    ("integer", 1.5, "type", "1.5 is not of type 'integer'"),
    ("integer", True, "type", "True is not of type 'integer'"),
    ("boolean", "true", "type", "'true' is not of type 'boolean'"),
    ("boolean", 1, "type", "1 is not of type 'boolean'"),
    ("enum", "purple", "enum", "'purple' is not one of ['red', 'green', 'blue']"),
    ("enum-names", "Red", "enum", "'Red' is not one of ['red', 'green', 'blue']"),
    ("titled", "Green", "oneOf", "'Green' is not one of ['red', 'green', 'blue']"),
    ("multi", "red", "type", "'red' is not of type 'array'"),
    ("multi", ["red", "green", "blue"], "maxItems", "has more than the maximum of 2 items"),
    ("multi", ["red", "pink"], "enum", "item 1: 'pink' is not one of ['red', 'green', 'blue']"),
    ("titled-multi", [], "minItems", "[] has fewer than the minimum of 1 items"),
    ("titled-multi", ["Red"], "anyOf", "item 0: 'Red' is not one of ['red', 'green', 'blue']"),
]


@pytest.mark.parametrize(("kind", "value"), VALID, ids=[f"{k}={v!r}" for k, v in VALID])
def test_valid_values_pass(kind: str, value: Any) -> None:
    schema = form({"f": FIELDS[kind]}, ["f"])
    check_schema(schema)
    assert validate_form(schema, {"f": value}) == {"f": value}


@pytest.mark.parametrize(
    ("kind", "value", "rule", "text"), INVALID, ids=[f"{k}={v!r}" for k, v, _, _ in INVALID]
)
def test_invalid_values_name_field_and_rule(kind: str, value: Any, rule: str, text: str) -> None:
    schema = form({"my_field": FIELDS[kind]})
    with pytest.raises(InvalidAnswer) as info:
        validate_form(schema, {"my_field": value})
    error = info.value
    assert error.field == "my_field"
    assert error.rule == rule
    assert str(error).startswith("field 'my_field': ")
    assert text in str(error)


def test_message_example_from_the_contract() -> None:
    schema = form({"age": {"type": "integer", "maximum": 120}})
    with pytest.raises(
        InvalidAnswer, match=r"^field 'age': 150 is greater than the maximum of 120$"
    ):
        validate_form(schema, {"age": 150})


def test_required_field_missing() -> None:
    schema = form({"name": {"type": "string"}, "age": {"type": "integer"}}, ["name", "age"])
    with pytest.raises(InvalidAnswer, match=r"^field 'age' is required$") as info:
        validate_form(schema, {"name": "Ada"})
    assert (info.value.field, info.value.rule) == ("age", "required")


def test_optional_fields_may_be_absent() -> None:
    schema = form({"name": {"type": "string"}, "age": {"type": "integer"}})
    assert validate_form(schema, {}) == {}


def test_defaults_fill_absent_fields_without_mutating_input() -> None:
    schema = form(
        {
            "size": {"type": "integer", "default": 3},
            "tags": {"type": "array", "items": {"enum": COLORS}, "default": ["red"]},
            "note": {"type": "string", "default": "none"},
            "name": {"type": "string"},
        },
        ["size", "tags"],
    )
    pristine = copy.deepcopy(schema)
    data = {"note": "given"}
    result = validate_form(schema, data)
    assert result == {"size": 3, "tags": ["red"], "note": "given"}
    assert data == {"note": "given"}
    result["tags"].append("blue")
    assert schema == pristine


def test_an_invalid_default_is_reported_for_its_field() -> None:
    schema = form({"size": {"type": "integer", "maximum": 5, "default": 9}})
    with pytest.raises(InvalidAnswer, match="field 'size': 9 is greater") as info:
        validate_form(schema, {})
    assert info.value.rule == "maximum"


@pytest.mark.parametrize("extra", ["admin", "__proto__"])
def test_fields_the_form_does_not_have_are_refused_by_name(extra: str) -> None:
    with pytest.raises(InvalidAnswer, match=f"^field '{extra}' is not in the form") as info:
        validate_form(form({"a": {"type": "string"}}), {"a": "x", extra: True})
    assert (info.value.field, info.value.rule) == (extra, "additionalProperties")


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_non_finite_numbers_are_refused_even_within_bounds(value: float) -> None:
    schema = form({"n": {"type": "number", "minimum": 0, "maximum": 10}})
    with pytest.raises(InvalidAnswer, match="is not a finite number") as info:
        validate_form(schema, {"n": value})
    assert (info.value.field, info.value.rule) == ("n", "finite")


def test_error_messages_quote_at_most_about_a_hundred_characters_of_a_value() -> None:
    schema = form({"n": {"type": "integer"}, "s": {"type": "string", "maxLength": 3}})
    for data in ({"n": "x" * 10_000_000}, {"s": "y" * 10_000_000}):
        with pytest.raises(InvalidAnswer) as info:
            validate_form(schema, data)
        assert len(str(info.value)) < 300, str(info.value)[:400]


@pytest.mark.parametrize(("data", "name"), [(None, "NoneType"), ("x", "str"), ([1], "list")])
def test_non_object_answers_are_refused(data: Any, name: str) -> None:
    with pytest.raises(
        InvalidAnswer, match=f"must be an object of field values, got {name}"
    ) as info:
        validate_form(form({"a": {"type": "string"}}), data)
    assert (info.value.field, info.value.rule) == (None, "type")


def test_first_field_in_schema_order_is_reported_when_several_fail() -> None:
    schema = form({"z": {"type": "integer"}, "a": {"type": "integer"}})
    with pytest.raises(InvalidAnswer) as info:
        validate_form(schema, {"a": "x", "z": "y"})
    assert info.value.field == "z"


def test_a_schema_changed_after_use_is_checked_as_it_is_now() -> None:
    # Validators are cached by the schema's value, not the dict's identity.
    schema: dict[str, Any] = {"type": "object", "properties": {"n": {"type": "integer"}}}
    assert validate_form(schema, {"n": 50}) == {"n": 50}
    schema["properties"]["n"]["maximum"] = 10
    with pytest.raises(InvalidAnswer, match="greater than the maximum of 10"):
        validate_form(schema, {"n": 50})
    del schema["properties"]["n"]["maximum"]
    assert validate_form(schema, {"n": 50}) == {"n": 50}
    # 1 and 1.0 are one JSON number but two cache entries; each checks the same way.
    for bound in (1, 1.0):
        bounded = {"type": "object", "properties": {"n": {"type": "number", "maximum": bound}}}
        with pytest.raises(InvalidAnswer, match="maximum"):
            validate_form(bounded, {"n": 2})


@pytest.mark.parametrize(
    ("schema", "match"),
    [
        ("object", "must be an object, got str"),
        (
            {"type": "object", "properties": {"a": {"minimum": "one"}}},
            r"JSON Schema at \$\.properties\.a\.minimum",
        ),
        ({"type": "object", "required": "a"}, r"not valid JSON Schema at \$\.required"),
        ({"type": "object", "properties": {"a": {"default": {1, 2}}}}, "must be JSON"),
    ],
)
def test_a_bad_schema_is_an_invalid_request(schema: Any, match: str) -> None:
    with pytest.raises(InvalidRequest, match=match):
        validate_form(schema, {})
    with pytest.raises(InvalidRequest, match=match):
        check_schema(schema)


@pytest.mark.parametrize(
    ("schema", "match"),
    [
        ({"type": "array"}, "must have type 'object', not 'array'"),
        ({"type": "object", "properties": []}, "'properties' must be an object"),
        ({"type": "object", "properties": {"a": "string"}}, "field 'a': its schema must be"),
        (
            {"type": "object", "properties": {"a": {"type": "object"}}},
            "field 'a': type 'object' is not an MCP form field type",
        ),
        (
            {"type": "object", "properties": {"a": {"type": "strnig"}}},
            "type 'strnig' is not an MCP",
        ),
        (
            {"type": "object", "properties": {"a": {"enum": "x"}}},
            r"JSON Schema at \$\.properties\.a\.enum",
        ),
    ],
)
def test_check_schema_refuses_non_form_schemas(schema: Any, match: str) -> None:
    with pytest.raises(InvalidRequest, match=match):
        check_schema(schema)


def test_check_schema_is_lenient() -> None:
    check_schema({"properties": {"a": {"enum": [1, 2]}, "b": {"x-custom": True}}})
    check_schema({"type": "object"})
    check_schema(form(FIELDS))


# RFC 3339 offsets are whole minutes (historical zones in tzdata have seconds).
_offsets = st.integers(-23 * 60 - 59, 23 * 60 + 59).map(lambda m: timezone(timedelta(minutes=m)))

# A field schema and a strategy of values valid for it.
_field = st.one_of(
    st.tuples(
        st.integers(0, 5).flatmap(lambda lo: st.tuples(st.just(lo), st.integers(lo, lo + 5))),
    ).map(
        lambda b: (
            {"type": "string", "minLength": b[0][0], "maxLength": b[0][1]},
            st.text(min_size=b[0][0], max_size=b[0][1]),
        )
    ),
    st.tuples(st.integers(-1000, 1000), st.integers(0, 1000)).map(
        lambda b: (
            {"type": "integer", "minimum": b[0], "maximum": b[0] + b[1]},
            st.integers(b[0], b[0] + b[1]),
        )
    ),
    st.tuples(st.floats(-1e6, 1e6), st.floats(0, 1e6)).map(
        lambda b: (
            {"type": "number", "minimum": b[0], "maximum": b[0] + b[1]},
            st.floats(b[0], b[0] + b[1]),
        )
    ),
    st.just(({"type": "boolean"}, st.booleans())),
    st.just(({"type": "string", "format": "email"}, st.emails())),
    st.just(({"type": "string", "format": "date"}, st.dates().map(str))),
    st.just(
        (
            {"type": "string", "format": "date-time"},
            st.datetimes(timezones=_offsets).map(lambda d: d.isoformat()),
        )
    ),
    st.lists(st.text(min_size=1), min_size=1, max_size=5, unique=True).map(
        lambda options: ({"type": "string", "enum": options}, st.sampled_from(options))
    ),
    st.lists(st.text(min_size=1), min_size=1, max_size=5, unique=True).map(
        lambda options: (
            {"type": "string", "oneOf": [{"const": o, "title": o.upper()} for o in options]},
            st.sampled_from(options),
        )
    ),
    st.lists(st.text(min_size=1), min_size=1, max_size=5, unique=True).map(
        lambda options: (
            {"type": "array", "items": {"anyOf": [{"const": o, "title": o} for o in options]}},
            st.lists(st.sampled_from(options), unique=True),
        )
    ),
)


@st.composite
def _forms(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, Any]]:
    fields = draw(st.dictionaries(st.text(min_size=1, max_size=10), _field, max_size=6))
    schema = form({name: field for name, (field, _) in fields.items()})
    data = {name: draw(values) for name, (_, values) in fields.items()}
    return schema, data


@given(_forms())
@pytest.mark.slow
def test_generated_valid_answers_always_pass(case: tuple[dict[str, Any], dict[str, Any]]) -> None:
    schema, data = case
    assert validate_form(schema, data) == data
