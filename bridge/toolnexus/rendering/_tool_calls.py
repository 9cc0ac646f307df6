"""A request as people read it, whatever shows it: what kind it is (:func:`kind_label`),
and a tool approval's call (the tool, its arguments labelled by the tool's schema,
shortened where a line is short, and an edit as the changes from the proposal).

Every value is shown as JSON (``"ACME"``, ``10``, ``{"a": 1}``): the same for every
worker and language, and a string never passes for a number.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Final

from .._schema import validate_form
from ..errors import InvalidAnswer, InvalidRequest
from ..frameworks import TOOL_CALL, ToolCall, tool_call_of
from ..models import Request
from ._forms import Field, Submitted, form_data, form_fields

KIND_LABELS: Final[Mapping[str, str]] = MappingProxyType(
    {
        "input": "Question",
        "authorization": "Authorization",
        "approval": "Approval",
        TOOL_CALL: "Tool call",
    }
)
"""What each kind of request is called where people read it."""

SHORT_CHARS: Final = 60
"""How long a value's text may be before a summary shortens it (and a page folds it)."""


def kind_label(kind: str) -> str:
    """What a request of ``kind`` is called: ``"Tool call"`` for ``tool_call``; a kind of
    its own, capitalized (``"Survey"``); ``"Request"`` for none."""
    return KIND_LABELS.get(kind, kind.capitalize() or "Request")


def value_text(value: Any) -> str:
    """``value`` as shown: its JSON, non-ASCII kept (``"Zürich"``, ``10``, ``[1, 2]``)."""
    try:
        return json.dumps(value, ensure_ascii=False, sort_keys=False)
    except (TypeError, ValueError):  # not JSON: a repr says what it is
        return repr(value)


def shorten(text: str, limit: int = SHORT_CHARS) -> str:
    """``text`` on one line, cut to ``limit`` characters with ``…`` (and how many were
    left out) if longer."""
    flat = " ".join(text.split())
    if len(flat) <= limit:
        return flat
    kept = flat[: max(1, limit - 1)]
    return f"{kept}… ({len(flat) - len(kept)} more characters)"


@dataclass(frozen=True)
class Argument:
    """One proposed argument: property ``name``, labelled ``title`` (the schema's, else
    the name), its ``value`` and that value's ``text`` (JSON); ``long`` when the text does
    not fit a line (a page folds it, a summary shortens it: :attr:`short`)."""

    name: str
    title: str
    description: str
    value: Any
    text: str

    @property
    def long(self) -> bool:
        return len(self.text) > SHORT_CHARS or "\n" in self.text

    @property
    def short(self) -> str:
        return shorten(self.text)

    @property
    def label(self) -> str:
        """How a line of text names it: ``Amount (amount)``, or the name without a title."""
        return self.name if self.title == self.name else f"{self.title} ({self.name})"


@dataclass(frozen=True)
class ToolCallView:
    """A tool approval as people read it: the ``call`` and its ``arguments`` in the order
    the tool's schema names them (then the others)."""

    call: ToolCall
    arguments: tuple[Argument, ...]

    @property
    def origin(self) -> str:
        """Where the call comes from: ``pydantic-ai, run run-42``."""
        return ", ".join(
            [self.call.framework] + ([f"run {self.call.run}"] if self.call.run else [])
        )

    def lines(self, *, limit: int = SHORT_CHARS) -> list[str]:
        """The call as lines of text: ``Tool: transfer (pydantic-ai, run run-42)``, then
        one ``  Amount (amount) = 10`` per argument, each value shortened to ``limit``."""
        lines = [f"Tool: {self.call.name} ({self.origin})"]
        if not self.arguments:
            lines.append("  (no arguments)")
        lines += [f"  {a.label} = {shorten(a.text, limit)}" for a in self.arguments]
        return lines


def tool_call_view(request: Request) -> ToolCallView:
    """How the tool call ``request`` proposes reads.

    Raises:
        InvalidRequest: not a well-formed tool approval
            (:func:`toolnexus.frameworks.tool_call_of`).
    """
    call = tool_call_of(request)
    properties = _properties(request)
    order = [name for name in properties if name in call.arguments]
    order += [name for name in call.arguments if name not in properties]
    arguments = []
    for name in order:
        prop = properties.get(name) or {}
        value = call.arguments[name]
        arguments.append(
            Argument(
                name=name,
                title=str(prop.get("title") or name),
                description=str(prop.get("description") or ""),
                value=value,
                text=value_text(value),
            )
        )
    return ToolCallView(call, tuple(arguments))


@dataclass(frozen=True)
class ArgumentChange:
    """One argument an edit changed: ``before`` (proposed) and ``after`` (to run), each
    None when absent there (``added`` / ``removed``)."""

    name: str
    title: str
    before: str | None
    after: str | None

    def __str__(self) -> str:
        before = self.before if self.before is not None else "(absent)"
        after = self.after if self.after is not None else "(absent)"
        return f"{self.title}: {shorten(before, 40)} → {shorten(after, 40)}"


def argument_changes(request: Request, arguments: Mapping[str, Any]) -> list[ArgumentChange]:
    """How ``arguments`` differ from the call ``request`` proposes, argument by argument
    (in the schema's order; empty: they are the proposal). An argument the call leaves out
    stands for the tool schema's own default, which an answer's check fills in. Values
    compare as JSON, so ``1`` and ``1.0`` are the same and ``1`` and ``true`` are not.

    Raises:
        InvalidRequest: ``request`` is not a well-formed tool approval.
    """
    view = tool_call_view(request)
    titles = {a.name: a.title for a in view.arguments}
    properties = _properties(request)
    for name, prop in properties.items():
        titles.setdefault(name, str((prop or {}).get("title") or name))
    proposed = {
        name: prop["default"] for name, prop in properties.items() if "default" in prop
    } | view.call.arguments
    names = list(titles) + [n for n in arguments if n not in titles]
    changes = []
    for name in names:
        before = _json(proposed[name]) if name in proposed else None
        after = _json(arguments[name]) if name in arguments else None
        if before != after:
            changes.append(
                ArgumentChange(
                    name, titles.get(name, name), _text(proposed, name), _text(arguments, name)
                )
            )
    return changes


def tool_call_fields(request: Request) -> list[Field] | None:
    """The form that edits the arguments of the call ``request`` proposes: a field per
    property of the tool's schema, each holding its proposed value, such that the form
    sent untouched approves exactly the proposal. None when the schema is richer than a
    form (nested objects) or a field cannot hold its value exactly (a free list, an
    argument the schema does not type): the call is then approved as proposed, or denied.

    Raises:
        InvalidRequest: ``request`` is not a well-formed tool approval.
    """
    tool_call_of(request)
    schema = request.schema
    if schema is None:
        return None
    try:
        fields = form_fields(schema)
        untouched = validate_form(schema, form_data(fields, _untouched(fields)))
        proposal = validate_form(schema, {})
    except (InvalidRequest, InvalidAnswer):
        return None
    if any(f.widget == "checks" and not f.choices for f in fields):
        return None
    if _json(untouched) != _json(proposal):
        return None
    return fields


def _untouched(fields: list[Field]) -> Submitted:
    """The form as a browser sends it when nobody changed it."""
    sent: dict[str, list[str]] = {}
    for f in fields:
        text, chosen = f.state(None)
        if f.widget == "checkbox":
            sent[f.input_name] = ["true"] if chosen else []
        elif f.widget in ("select", "checks"):
            sent[f.input_name] = [str(i) for i in sorted(chosen)]
        else:
            sent[f.input_name] = [text]
    return sent


def request_anchor(request_id: str) -> str:
    """The web page's anchor (and DOM id) of a request's card: ``r-`` and a digest, as
    a request id may be any text."""
    return "r-" + hashlib.sha256(request_id.encode()).hexdigest()[:20]


def page_link(base_url: str, request_id: str) -> str:
    """The address of request ``request_id``'s card on the web page at ``base_url``."""
    return f"{base_url.rstrip('/')}/#{request_anchor(request_id)}"


def _properties(request: Request) -> dict[str, Any]:
    schema = request.schema or {}
    properties = schema.get("properties") if isinstance(schema, dict) else None
    if properties is not None and not isinstance(properties, dict):
        raise InvalidRequest(f"request {request.id!r}: its schema's 'properties' is not an object")
    return {k: v for k, v in (properties or {}).items() if isinstance(v, dict)}


def _json(value: Any) -> str:
    """``value``'s canonical text for comparing: numbers by value, keys sorted."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, dict):
        return "{" + ",".join(f"{json.dumps(k)}:{_json(v)}" for k, v in sorted(value.items())) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_json(v) for v in value) + "]"
    return value_text(value)


def _text(arguments: Mapping[str, Any], name: str) -> str | None:
    return value_text(arguments[name]) if name in arguments else None
