"""A request as the answering channels show it to programs (the HTTP API's JSON, the
webhooks' payloads): one layout for all of them."""

from __future__ import annotations

import time
from typing import Any

import msgspec

from toolnexus import Pending

__all__ = ["request_view", "time_left"]


def request_view(queue: str, pending: Pending) -> dict[str, Any]:
    """``pending``'s request, of ``queue``, as JSON-ready data: what it asks and who asks
    (``signer``: the trusted agent key whose signature on it was verified, or None)."""
    request = pending.request
    return {
        "id": request.id,
        "queue": queue,
        "kind": request.kind,
        "prompt": request.prompt,
        "data": msgspec.to_builtins(request.data),
        "url": request.url,
        "source": msgspec.to_builtins(request.source),
        "created_at": request.created_at,
        "expires_at": request.expires_at,
        "allow": request.allow,
        "quorum": msgspec.to_builtins(request.quorum) if request.quorum else None,
        "signer": pending.signer,
    }


def time_left(expires_at: float | None, now: float | None = None) -> str:
    """``12 min left`` (or ``no deadline``): what a person is told of a request's time."""
    if expires_at is None:
        return "no deadline"
    left = max(0, int(expires_at - (now or time.time())))
    if left >= 7200:
        return f"{left // 3600} h left"
    if left >= 120:
        return f"{left // 60} min left"
    return f"{left} s left"
