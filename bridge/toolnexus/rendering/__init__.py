"""What a responder shows a person, for every worker that renders requests (the web
page, the Slack and Telegram bots, yours): a request's form (:mod:`._forms`: the fields its
schema asks for, and the data a submitted form stands for), what an authorization link
really points at (:mod:`._links`), and the notes that follow a request (:mod:`._notes`).

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

__all__ = [
    "FIELD_PREFIX",
    "KNOWN_DOMAINS",
    "Field",
    "Link",
    "Submitted",
    "Widget",
    "check_link",
    "escalated_note",
    "field_errors",
    "form_data",
    "form_fields",
    "gone_note",
    "message_for_field",
    "standing_notes",
]
