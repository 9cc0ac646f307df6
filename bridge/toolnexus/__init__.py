"""toolnexus: pause an AI agent for a person anywhere in a fleet.

Every suspension is one :class:`Request` answered by one :class:`Answer`
(SPEC §10), carried by a broker (SPEC §11) to responders and back.

This namespace holds what an agent author and a worker author need first. The contract
sits beside it as public modules: :mod:`toolnexus.models`, :mod:`toolnexus.codec`,
:mod:`toolnexus.errors`, :mod:`toolnexus.keys` (every Redis key name),
:mod:`toolnexus.lifecycle` (statuses, reasons, event types) and :mod:`toolnexus.settings`
(how a process reaches its broker). The rest is grouped by concept, each behind its own ``__all__``:
:mod:`toolnexus.redis_broker` (the waiter side, the responder side, the Lua scripts),
:mod:`toolnexus.mcp`, :mod:`toolnexus.security` (signatures, keyrings, audit),
:mod:`toolnexus.responders` (the responder SDK) with :mod:`toolnexus.rendering` (forms,
links and notes as workers show them), :mod:`toolnexus.cli` and
:mod:`toolnexus.observability` (metrics, traces). Modules named ``_like_this`` are the
implementation.
"""

import typing as _typing

from . import codec as codec
from . import errors as errors
from . import keys as keys
from . import lifecycle as lifecycle
from . import models as models
from . import settings as settings
from ._broker import Broker, EventStream, Pending, Responder, Store, connect
from ._compat import install as _install_compat
from ._question import QUESTION_TOOL, QuestionResult, question, question_tool
from .errors import (
    AlreadyResolved,
    BrokerUnavailable,
    ConfigurationError,
    InvalidAnswer,
    InvalidRequest,
    NotResolved,
    ToolnexusError,
)
from .models import (
    Answer,
    Approval,
    Event,
    Hop,
    OnExpiry,
    Quorum,
    Request,
    Source,
    WaitFor,
    new_id,
)
from .responders import Service, Worker, serve
from .settings import RedisSettings

if _typing.TYPE_CHECKING:
    from . import cli as cli
    from . import mcp as mcp
    from . import observability as observability
    from .mcp import McpTools, elicitation_callback, load_mcp

_LAZY = {
    "McpTools": "mcp",
    "elicitation_callback": "mcp",
    "load_mcp": "mcp",
}
"""Names imported on first use: the MCP client SDK takes seconds to import, and a
responder or a plain waiter never needs it."""

_SUBPACKAGES = frozenset({"cli", "mcp", "observability"})
"""Public subpackages not imported with the package (``toolnexus.mcp`` needs the SDK)."""

_install_compat(__name__)


def __getattr__(name: str) -> _typing.Any:
    import importlib

    if name in _LAZY:
        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    if name in _SUBPACKAGES:
        return importlib.import_module(f".{name}", __name__)
    from ._compat import moved

    return moved(__name__, name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "QUESTION_TOOL",
    "AlreadyResolved",
    "Answer",
    "Approval",
    "Broker",
    "BrokerUnavailable",
    "ConfigurationError",
    "Event",
    "EventStream",
    "Hop",
    "InvalidAnswer",
    "InvalidRequest",
    "McpTools",
    "NotResolved",
    "OnExpiry",
    "Pending",
    "QuestionResult",
    "Quorum",
    "RedisSettings",
    "Request",
    "Responder",
    "Service",
    "Source",
    "Store",
    "ToolnexusError",
    "WaitFor",
    "Worker",
    "connect",
    "elicitation_callback",
    "load_mcp",
    "new_id",
    "question",
    "question_tool",
    "serve",
]
