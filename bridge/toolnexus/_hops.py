"""Escalation hops (SPEC §14), as both brokers and every surface read them: durations
such as ``"15m"``, hop lists such as ``[("15m", "oncall"), ("1h", "managers")]``, and the
rules a request's :attr:`~toolnexus.models.Request.escalate` must follow.

    hops([("15m", "oncall"), (3600, "managers")])
    # [Hop(after_s=900.0, queue='oncall'), Hop(after_s=3600.0, queue='managers')]
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from typing import TypeAlias

from .errors import InvalidRequest
from .keys import name_problem
from .models import Hop, Request

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)?")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}

HopSpec: TypeAlias = "Hop | tuple[float | str, str]"
"""One hop as callers give it: a :class:`~toolnexus.models.Hop`, or ``(after, queue)`` with
``after`` in seconds or a duration string (``"90"``, ``"30s"``, ``"15m"``, ``"1h"``)."""


def parse_duration(text: str) -> float | None:
    """``"90"``, ``"30s"``, ``"10m"``, ``"1.5h"``, ``"2d"``, ``"500ms"`` in seconds, or None
    if ``text`` is not a positive duration."""
    match = _DURATION.fullmatch(text.strip())
    if match is None or float(match[1]) <= 0:
        return None
    return float(match[1]) * _UNIT_S[match[2]]


def hops(spec: Iterable[HopSpec]) -> list[Hop]:
    """``spec`` as :class:`~toolnexus.models.Hop` values, in the order given.

    Raises:
        InvalidRequest: a hop that is not ``(after, queue)``, or an ``after`` that is
            neither a number nor a duration string.
    """
    result = []
    for i, item in enumerate(spec, 1):
        if isinstance(item, Hop):
            result.append(item)
            continue
        if not isinstance(item, tuple) or len(item) != 2 or not isinstance(item[1], str):
            raise InvalidRequest(f"escalation hop {i} must be (after, queue), not {item!r}")
        after, queue = item
        if isinstance(after, str):
            seconds = parse_duration(after)
            if seconds is None:
                raise InvalidRequest(
                    f"escalation hop {i}: {after!r} is not a positive duration: "
                    "use e.g. 90, 30s, 15m or 1h"
                )
        elif isinstance(after, int | float) and not isinstance(after, bool):
            seconds = float(after)
        else:
            raise InvalidRequest(f"escalation hop {i}: after must be seconds or a duration")
        result.append(Hop(after_s=seconds, queue=queue))
    return result


def check_hops(request: Request, deadline: float, queue: str | None) -> None:
    """Refuse an escalation that cannot be followed: each hop's ``after_s`` (from the
    request's ``created_at``) positive, later than the one before and earlier than
    ``deadline`` (a Unix time); each hop's queue a valid queue name, neither ``queue``
    (where the request is published first; None where there is only one) nor an earlier
    hop's.

    Raises:
        InvalidRequest: the message names the hop and what is wrong with it.
    """
    if not request.escalate:
        return
    reached = {queue} if queue is not None else set()
    previous = 0.0
    for i, hop in enumerate(request.escalate or (), 1):
        where = f"request {request.id!r}: escalation hop {i} ({hop.after_s:g} s, {hop.queue!r})"
        if not math.isfinite(hop.after_s) or hop.after_s <= 0:
            raise InvalidRequest(f"{where}: after_s must be a positive number of seconds")
        if hop.after_s <= previous:
            raise InvalidRequest(f"{where}: hops must come in increasing order of after_s")
        problem = name_problem(hop.queue)
        if problem is not None:
            raise InvalidRequest(f"{where}: the queue name {problem}")
        if hop.queue in reached:
            raise InvalidRequest(f"{where}: the request reaches queue {hop.queue!r} already")
        if request.created_at + hop.after_s >= deadline:
            raise InvalidRequest(
                f"{where}: it is at or past the request's deadline, "
                f"{deadline - request.created_at:g} s after it was created"
            )
        reached.add(hop.queue)
        previous = hop.after_s
