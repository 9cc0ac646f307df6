"""What a request's waiter receives when nobody answers in time (SPEC §14).

Every place that ends a request at its deadline (the Redis waiter, a responder finding a
late answer or sweeping a request past its deadline, the embedded broker) builds the
outcome here, so that a request's :class:`~toolnexus.models.OnExpiry` is applied the same
way everywhere: marked ``reason="expired"`` and ``defaulted=True``, never passed off as a
person's answer.

    >>> form = {"type": "object", "properties": {"n": {"type": "integer", "default": 3}}}
    >>> request = Request(id="r", kind="input", data={"schema": form},
    ...                   on_expiry=OnExpiry(ok=True))
    >>> answer = expired_answer(request)
    >>> (answer.ok, answer.data, answer.reason, answer.defaulted)
    (True, {'n': 3}, 'expired', True)
"""

from __future__ import annotations

import logging
from typing import Any

from ._schema import validate_form
from .errors import InvalidAnswer, InvalidRequest
from .models import EXPIRED, Answer, OnExpiry, Request

log = logging.getLogger("toolnexus")

__all__ = ["check_on_expiry", "expired_answer"]


def _default_data(request: Request, on_expiry: OnExpiry) -> Any:
    """The data a defaulted accept carries: ``on_expiry.data``, or the form's defaults,
    checked against the request's schema (with defaults filled in) when it has one.

    Raises:
        InvalidAnswer: the data (or the defaults alone) do not satisfy the schema.
    """
    schema = request.schema
    if schema is None:
        return on_expiry.data
    return validate_form(schema, on_expiry.data if on_expiry.data is not None else {})


def check_on_expiry(request: Request) -> None:
    """Check, before a request is published, that its default on expiry can be applied.

    Raises:
        InvalidRequest: ``on_expiry`` accepts with data (or the form's defaults) that do
            not satisfy the request's schema; the message names the field and the rule.
    """
    on_expiry = request.on_expiry
    if on_expiry is None or not on_expiry.ok:
        return
    try:
        _default_data(request, on_expiry)
    except InvalidAnswer as exc:
        raise InvalidRequest(f"request {request.id!r}: its default on expiry fails: {exc}") from exc


def expired_answer(request: Request) -> Answer:
    """The outcome of ``request`` at its deadline: ``Answer(ok=False, reason="expired")``,
    or with an :class:`~toolnexus.models.OnExpiry` its default, marked ``defaulted=True``
    (accept with its data or the form's defaults, or decline). Never raises: defaults that
    no longer satisfy the schema (a request no checked broker published) give the plain
    expiry, and are logged."""
    on_expiry = request.on_expiry
    if on_expiry is None:
        return Answer(id=request.id, ok=False, reason=EXPIRED)
    data = None
    if on_expiry.ok:
        try:
            data = _default_data(request, on_expiry)
        except (InvalidAnswer, InvalidRequest) as exc:
            log.error("request %s: its default on expiry fails (%s); expiring it", request.id, exc)
            return Answer(id=request.id, ok=False, reason=EXPIRED)
    return Answer(id=request.id, ok=on_expiry.ok, data=data, reason=EXPIRED, defaulted=True)
