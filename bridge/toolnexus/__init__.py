"""toolnexus: pause an AI agent for a person anywhere in a fleet.

Every suspension is one :class:`Request` answered by one :class:`Answer`
(SPEC §10), carried by a broker (SPEC §11) to responders and back.
"""

from .codec import JSON, MSGPACK, Codec
from .errors import (
    AlreadyResolved,
    BrokerUnavailable,
    ConfigurationError,
    DecodeError,
    InvalidAnswer,
    InvalidRequest,
    NotResolved,
    ToolnexusError,
    UnknownRequest,
)
from .models import Answer, Event, Request, Source, WaitFor

__all__ = [
    "JSON",
    "MSGPACK",
    "AlreadyResolved",
    "Answer",
    "BrokerUnavailable",
    "Codec",
    "ConfigurationError",
    "DecodeError",
    "Event",
    "InvalidAnswer",
    "InvalidRequest",
    "NotResolved",
    "Request",
    "Source",
    "ToolnexusError",
    "UnknownRequest",
    "WaitFor",
]
