"""What a responder shows a person, for every worker that renders requests (the web
page, the Slack and Telegram bots, yours): a request's form (:mod:`._forms`: the fields its
schema asks for, and the data a submitted form stands for), what an authorization link
really points at (:mod:`._links`), the notes that follow a request (:mod:`._notes`), and
what a request is called and a tool approval's call, its arguments and an edit's changes
(:mod:`._tool_calls`).

    from toolnexus.rendering import check_link, form_fields

    fields = form_fields(request.schema or {})   # one Field per property
    link = check_link(request.url or "")         # its domain and the warnings to show
"""

from __future__ import annotations

from ._forms import (
    FIELD_PREFIX,
    Field,
    Submitted,
    Widget,
    field_errors,
    form_data,
    form_fields,
    message_for_field,
)
from ._links import KNOWN_DOMAINS, Link, check_link
from ._notes import escalated_note, gone_note, standing_notes
from ._tool_calls import (
    KIND_LABELS,
    SHORT_CHARS,
    Argument,
    ArgumentChange,
    ToolCallView,
    argument_changes,
    kind_label,
    page_link,
    request_anchor,
    shorten,
    tool_call_fields,
    tool_call_view,
    value_text,
)

__all__ = [
    "FIELD_PREFIX",
    "KIND_LABELS",
    "KNOWN_DOMAINS",
    "SHORT_CHARS",
    "Argument",
    "ArgumentChange",
    "Field",
    "Link",
    "Submitted",
    "ToolCallView",
    "Widget",
    "argument_changes",
    "check_link",
    "escalated_note",
    "field_errors",
    "form_data",
    "form_fields",
    "gone_note",
    "kind_label",
    "message_for_field",
    "page_link",
    "request_anchor",
    "shorten",
    "standing_notes",
    "tool_call_fields",
    "tool_call_view",
    "value_text",
]
