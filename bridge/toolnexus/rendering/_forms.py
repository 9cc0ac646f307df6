"""A request's form: the fields its schema asks for, and the data a submitted form stands for.

The schema is the MCP restricted subset (SPEC §2, :mod:`toolnexus._schema`): text
(with ``format`` email, uri, date, date-time and length limits), number and integer
with bounds, boolean, single- and multi-select enums (titled, untitled, legacy
``enumNames``) and defaults. Each field becomes one widget; a choice is submitted as
its position among the options, so option values of any JSON type come back exactly.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from .._schema import check_schema, options, validate_form
from ..errors import InvalidAnswer

Widget = Literal[
    "text", "email", "url", "date", "date-time", "number", "integer", "checkbox", "select", "checks"
]

FIELD_PREFIX = "field."
"""Form inputs are named ``field.<schema property>``, apart from the page's own inputs."""

Submitted = Mapping[str, Sequence[str]]
"""A submitted form: each input name with the values sent for it, in order."""

_FORMATS: dict[str, Widget] = {"email": "email", "uri": "url", "date": "date"}
_DATE_TIME_PATTERN = r"\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+\-]\d{2}:\d{2})"


@dataclass(frozen=True)
class Field:
    """One form field: schema property ``name``, shown as ``widget`` and labelled ``title``."""

    name: str
    title: str
    widget: Widget
    required: bool
    description: str = ""
    hint: str = ""
    choices: tuple[tuple[Any, str], ...] = ()
    has_default: bool = False
    default: Any = None
    attributes: tuple[tuple[str, str], ...] = field(default=())
    """HTML constraint attributes (``min``, ``maxlength``, ``required``, ...): the
    browser's own hints; the server checks every rule again."""

    @property
    def input_name(self) -> str:
        return FIELD_PREFIX + self.name

    def state(self, submitted: Submitted | None) -> tuple[str, frozenset[int]]:
        """What the widget shows: its text and the chosen option positions.

        ``submitted`` is the form as the person sent it (shown again beside its
        messages); ``None`` shows the schema's default.
        """
        if submitted is not None:
            sent = list(submitted.get(self.input_name, ()))
            chosen = frozenset(int(v) for v in sent if v.isdigit())
            if self.widget == "checkbox":
                chosen = frozenset({0}) if sent else frozenset()
            return (sent[-1] if sent else ""), chosen
        if not self.has_default:
            return "", frozenset()
        value = self.default
        if self.widget == "checkbox":
            return "", frozenset({0}) if value is True else frozenset()
        if self.choices:
            wanted = value if isinstance(value, list) else [value]
            return "", frozenset(
                i for i, (option, _) in enumerate(self.choices) if _within(option, wanted)
            )
        return ("" if value is None else str(value)), frozenset()


def form_fields(schema: dict[str, Any]) -> list[Field]:
    """The fields of ``schema``, in its property order.

    Raises:
        InvalidRequest: ``schema`` is not a flat MCP form schema (the message says why).
    """
    check_schema(schema)
    required = set(schema.get("required", []))
    return [
        _field(name, prop, name in required) for name, prop in schema.get("properties", {}).items()
    ]


def _field(name: str, prop: dict[str, Any], required: bool) -> Field:
    choices = tuple((value, str(label)) for value, label in options(prop))
    kind = prop.get("type")
    widget: Widget
    attributes: list[tuple[str, str]] = []
    if kind == "array":
        widget, hint = "checks", _count_hint(prop.get("minItems"), prop.get("maxItems"))
    elif choices:
        widget, hint = "select", ""
    elif kind == "boolean":
        widget, hint = "checkbox", ""
    elif kind in ("integer", "number"):
        widget = "integer" if kind == "integer" else "number"
        low, high = prop.get("minimum"), prop.get("maximum")
        attributes += [("min", str(low))] if low is not None else []
        attributes += [("max", str(high))] if high is not None else []
        attributes.append(("step", "1" if kind == "integer" else "any"))
        hint = _range_hint("a whole number" if kind == "integer" else "a number", low, high)
    else:
        fmt = prop.get("format")
        widget = "date-time" if fmt == "date-time" else _FORMATS.get(fmt or "", "text")
        low, high = prop.get("minLength"), prop.get("maxLength")
        attributes += [("minlength", str(low))] if low is not None else []
        attributes += [("maxlength", str(high))] if high is not None else []
        if widget == "date-time":
            attributes += [("pattern", _DATE_TIME_PATTERN), ("placeholder", "2026-05-01T09:30:00Z")]
        hint = _text_hint(widget, low, high)
    if required and widget not in ("checkbox", "checks"):
        attributes.append(("required", ""))
    return Field(
        name=name,
        title=str(prop.get("title") or name),
        widget=widget,
        required=required,
        description=str(prop.get("description") or ""),
        hint=hint,
        choices=choices,
        has_default="default" in prop,
        default=prop.get("default"),
        attributes=tuple(attributes),
    )


def form_data(fields: Sequence[Field], submitted: Submitted) -> dict[str, Any]:
    """The answer data a submitted form stands for, each value typed as its field asks.

    An empty text or number input, or no choice in a single select, leaves its field
    out (so its default applies); a checkbox is always ``true`` or ``false``, a multiple
    choice always a list. A value that cannot be read as its kind (``"abc"`` for a
    number) is kept as sent, for the schema check to name.
    """
    data: dict[str, Any] = {}
    for f in fields:
        sent = list(submitted.get(f.input_name, ()))
        if f.widget == "checkbox":
            data[f.name] = bool(sent)
        elif f.widget == "checks":
            data[f.name] = [_choice(f, v) for v in sent]
        elif not sent or sent[-1] == "":
            continue
        elif f.widget == "select":
            data[f.name] = _choice(f, sent[-1])
        elif f.widget in ("integer", "number"):
            data[f.name] = _number(sent[-1], integer=f.widget == "integer")
        else:
            data[f.name] = sent[-1]
    return data


def field_errors(schema: dict[str, Any], fields: Sequence[Field], data: Any) -> dict[str, str]:
    """A message for each field of ``data`` that breaks its own rules, by field name.

    Every field is checked on its own (all messages at once, not only the first) with
    :func:`toolnexus.responders.validate_form`, whose words the messages are.
    """
    errors: dict[str, str] = {}
    properties = schema.get("properties", {})
    for f in fields:
        single = {"type": "object", "properties": {f.name: properties[f.name]}}
        if f.required:
            single["required"] = [f.name]
        try:
            validate_form(single, {f.name: data[f.name]} if f.name in data else {})
        except InvalidAnswer as exc:
            errors[f.name] = message_for_field(exc, f.name)
    return errors


def message_for_field(error: InvalidAnswer, name: str) -> str:
    """``error``'s message as shown beside field ``name``: without the leading
    ``field 'name': ``, which the place already says."""
    message = str(error)
    prefix = f"field {name!r}: "
    return message[len(prefix) :] if message.startswith(prefix) else message


def _within(option: Any, values: list[Any]) -> bool:
    # 1 == True in Python: compare types too, so a boolean default never picks option 1
    return any(type(option) is type(value) and option == value for value in values)


def _choice(f: Field, sent: str) -> Any:
    if sent.isdigit() and int(sent) < len(f.choices):
        return f.choices[int(sent)][0]
    return sent


def _number(text: str, *, integer: bool) -> Any:
    text = text.strip()
    try:
        return int(text)
    except ValueError:
        pass
    try:
        number = float(text)
    except ValueError:
        return text
    if not math.isfinite(number):
        return text
    return int(number) if integer and number.is_integer() else number


def _range_hint(what: str, low: Any, high: Any) -> str:
    if low is not None and high is not None:
        return f"{what} from {low} to {high}"
    if low is not None:
        return f"{what}, at least {low}"
    if high is not None:
        return f"{what}, at most {high}"
    return what


def _text_hint(widget: Widget, low: Any, high: Any) -> str:
    parts = {
        "email": ["an email address"],
        "url": ["a web address (https://…)"],
        "date": ["a date"],
        "date-time": ["a date and time with its zone, e.g. 2026-05-01T09:30:00+02:00"],
    }.get(widget, [])
    if low is not None and high is not None:
        parts.append(f"{low} to {high} characters")
    elif low is not None:
        parts.append(f"at least {low} characters")
    elif high is not None:
        parts.append(f"at most {high} characters")
    return "; ".join(parts)


def _count_hint(low: Any, high: Any) -> str:
    if low is not None and high is not None:
        return f"choose {low} to {high}" if low != high else f"choose {low}"
    if low is not None:
        return f"choose at least {low}"
    if high is not None:
        return f"choose up to {high}"
    return "choose any"
