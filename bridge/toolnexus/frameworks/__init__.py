"""Frameworks' own pauses through one ``wait_for``: a tool approval as a
``kind="tool_call"`` :class:`~toolnexus.Request` (see :mod:`._tool_call` for its layout),
and an adapter per framework in its own module (``toolnexus.frameworks.pydantic_ai``),
each an optional extra named after the framework."""

from ._tool_call import (
    TOOL_CALL,
    AuditDigests,
    Ledger,
    RemoteAgentError,
    RunNotFound,
    ToolCall,
    ToolDecision,
    audit_digests,
    call_request_id,
    decide,
    tool_call_digest,
    tool_call_of,
    tool_call_request,
)

__all__ = [
    "TOOL_CALL",
    "AuditDigests",
    "Ledger",
    "RemoteAgentError",
    "RunNotFound",
    "ToolCall",
    "ToolDecision",
    "audit_digests",
    "call_request_id",
    "decide",
    "tool_call_digest",
    "tool_call_of",
    "tool_call_request",
]
