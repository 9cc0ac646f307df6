"""A request as the answering channels show it to programs (the HTTP API's JSON, the
webhooks' payloads): one layout for all of them."""

from __future__ import annotations

from typing import Any

import msgspec

from toolnexus import Pending

__all__ = ["request_view"]


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
