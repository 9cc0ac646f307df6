"""toolnexus: pause an AI agent for a person anywhere in a fleet.

Every suspension is one :class:`Request` answered by one :class:`Answer`
(SPEC §10), carried by a broker (SPEC §11) to responders and back.
"""

import typing as _typing

from .audit import AuditRecord
from .broker import Broker, EventStream, Pending, Responder, connect
from .codec import JSON, MSGPACK, Codec
from .errors import (
    AlreadyResolved,
    AlreadyVoted,
    BrokerClosed,
    BrokerUnavailable,
    ConfigurationError,
    Contested,
    DecodeError,
    InvalidAnswer,
    InvalidRequest,
    NotAllowed,
    NotResolved,
    Refused,
    ServerUnavailable,
    SignatureError,
    ToolnexusError,
    UnknownRequest,
)
from .lifecycle import EventType, Reason, Status
from .mcp_source import answer_to_elicit_result, elicitation_to_request
from .models import (
    Answer,
    AnsweredEvent,
    Approval,
    ApprovedEvent,
    CompletedEvent,
    EndedEvent,
    EscalatedEvent,
    Event,
    ExpiredEvent,
    Heartbeat,
    Hop,
    OnExpiry,
    Quorum,
    Request,
    Signature,
    Source,
    WaitFor,
    WithdrawnEvent,
    new_id,
)
from .question import QUESTION_TOOL, QuestionResult, question, question_tool
from .schema import validate_form
from .serve import Service, Worker, serve
from .settings import RedisSettings
from .signatures import Signatures
from .signing import Keyring, SigningKey

if _typing.TYPE_CHECKING:
    from .mcp_callback import ElicitationCallback, elicitation_callback, fastmcp_elicitation_handler
    from .mcp_client import McpTool, McpTools, load_mcp
    from .mcp_config import McpToolset
    from .mcp_errors import McpError, UrlElicitationRequired

_LAZY = {
    "ElicitationCallback": "mcp_callback",
    "McpError": "mcp_errors",
    "McpTool": "mcp_client",
    "McpTools": "mcp_client",
    "McpToolset": "mcp_config",
    "UrlElicitationRequired": "mcp_errors",
    "elicitation_callback": "mcp_callback",
    "fastmcp_elicitation_handler": "mcp_callback",
    "load_mcp": "mcp_client",
}
"""Names imported on first use: the MCP client SDK takes seconds to import, and a
responder or a plain waiter never needs it."""

_NEEDS_MCP2 = frozenset({"mcp_client", "mcp_config", "mcp_errors"})
"""The modules built on the 2.x SDK's client (``load_mcp``); the callbacks run on 1.x too."""


def __getattr__(name: str) -> _typing.Any:
    if name in _LAZY:
        import importlib

        if _LAZY[name] in _NEEDS_MCP2:
            from ._mcp_sdk import require_mcp2

            require_mcp2(f"toolnexus.{name}")
        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'toolnexus' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "JSON",
    "MSGPACK",
    "QUESTION_TOOL",
    "AlreadyResolved",
    "AlreadyVoted",
    "Answer",
    "AnsweredEvent",
    "Approval",
    "ApprovedEvent",
    "AuditRecord",
    "Broker",
    "BrokerClosed",
    "BrokerUnavailable",
    "Codec",
    "CompletedEvent",
    "ConfigurationError",
    "Contested",
    "DecodeError",
    "ElicitationCallback",
    "EndedEvent",
    "EscalatedEvent",
    "Event",
    "EventStream",
    "EventType",
    "ExpiredEvent",
    "Heartbeat",
    "Hop",
    "InvalidAnswer",
    "InvalidRequest",
    "Keyring",
    "McpError",
    "McpTool",
    "McpTools",
    "McpToolset",
    "NotAllowed",
    "NotResolved",
    "OnExpiry",
    "Pending",
    "QuestionResult",
    "Quorum",
    "Reason",
    "RedisSettings",
    "Refused",
    "Request",
    "Responder",
    "ServerUnavailable",
    "Service",
    "Signature",
    "SignatureError",
    "Signatures",
    "SigningKey",
    "Source",
    "Status",
    "ToolnexusError",
    "UnknownRequest",
    "UrlElicitationRequired",
    "WaitFor",
    "WithdrawnEvent",
    "Worker",
    "answer_to_elicit_result",
    "connect",
    "elicitation_callback",
    "elicitation_to_request",
    "fastmcp_elicitation_handler",
    "load_mcp",
    "new_id",
    "question",
    "question_tool",
    "serve",
    "validate_form",
]
