"""The protocol: what one toolnexus process writes to Redis for another to read, numbered.

Every message (request, answer, event, heartbeat) travels as ``[protocol, message]``
(:mod:`toolnexus.codec`); what has no envelope (a request's state, its route, a reply
entry, a liveness mark, a dead letter, a record in a store) carries the number in a field
or value of its own from protocol 2 on, and its absence means protocol 1 (the layout of
the release before numbers were written: see :mod:`toolnexus.redis_broker._layout`).

A process reads :data:`READS`, the current protocol and the one before it, and writes
:data:`PROTOCOL` unless its ``write_protocol`` setting says :data:`PREVIOUS_PROTOCOL`:
during a rolling upgrade, new processes keep writing the previous protocol until every
reader has been upgraded, then the operator flips it. What a process writes *about a
request* (its answer, a refusal, its events, its audit record) is written in that
request's protocol, whatever the setting, so that the waiter reads it.

    >>> from toolnexus.protocol import PROTOCOL, READS, check_write_protocol
    >>> check_write_protocol(1) in READS and PROTOCOL == 2
    True
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
from typing import Final

import msgspec

from .errors import ConfigurationError, DecodeError

PROTOCOL: Final = 2
"""The protocol this toolnexus writes by default."""

PREVIOUS_PROTOCOL: Final = 1
"""The protocol before it, which this toolnexus still reads and can write."""

READS: Final = (PREVIOUS_PROTOCOL, PROTOCOL)
"""The protocols this toolnexus reads."""

WRITE_PROTOCOL_VARIABLE: Final = "TOOLNEXUS_WRITE_PROTOCOL"
"""The environment variable of the ``write_protocol`` setting when none is given."""

PREVIOUS_RELEASE: Final = "previous"
"""The version shown for a process of the release before versions were written (its
heartbeat says none: it reads and writes protocol 1)."""


def check_write_protocol(value: object, *, what: str = "write_protocol") -> int:
    """``value`` as a protocol this toolnexus may write (``"2"`` from the environment or a
    flag counts as 2).

    Raises:
        ConfigurationError: ``value`` is not one of :data:`READS`; names it and ``what``.
    """
    number: object = value
    if isinstance(value, str) and value.strip().isdigit():
        number = int(value.strip())
    if not isinstance(number, int) or isinstance(number, bool) or number not in READS:
        allowed = " or ".join(str(p) for p in READS)
        raise ConfigurationError(
            f"{what}={value!r} is not a protocol this toolnexus writes: give {allowed} "
            f"({PROTOCOL}, the current one, by default; {PREVIOUS_PROTOCOL} while readers of "
            "the previous release remain)"
        )
    assert isinstance(number, int)
    return number


def default_write_protocol() -> int:
    """``TOOLNEXUS_WRITE_PROTOCOL`` if set, else :data:`PROTOCOL`.

    Raises:
        ConfigurationError: the variable holds anything but a protocol of :data:`READS`.
    """
    value = os.environ.get(WRITE_PROTOCOL_VARIABLE, "").strip()
    if not value:
        return PROTOCOL
    return check_write_protocol(value, what=WRITE_PROTOCOL_VARIABLE)


def check_read(protocol: object, what: str) -> int:
    """``protocol``, the number ``what`` (an entry, a value) was written in, if this
    toolnexus reads it.

    Raises:
        DecodeError: a number newer than :data:`READS` ("upgrade this process"), or not
            a protocol number at all.
    """
    if isinstance(protocol, int) and not isinstance(protocol, bool):
        if protocol in READS:
            return protocol
        if protocol > PROTOCOL:
            raise DecodeError(newer(protocol, what))
    raise DecodeError(f"{what}: {protocol!r} is not a protocol number")


def stamp(protocol: int) -> int | msgspec.UnsetType:
    """The number a record of a store written in ``protocol`` carries in its field
    ``protocol``: none in protocol 1 (``msgspec.UNSET``: the field is left out, as the
    previous release wrote the record), else the number."""
    return msgspec.UNSET if protocol == PREVIOUS_PROTOCOL else protocol


def stamped(value: int | msgspec.UnsetType, what: str) -> int:
    """The protocol of ``what``, a record of a store whose field ``protocol`` holds
    ``value`` (absent: 1).

    Raises:
        DecodeError: a protocol newer than this toolnexus reads, or not a number.
    """
    return check_read(PREVIOUS_PROTOCOL if value is msgspec.UNSET else value, what)


def newer(protocol: int, what: str) -> str:
    """The message for ``what``, written in ``protocol``, newer than this toolnexus reads."""
    reads = ", ".join(str(p) for p in READS)
    return (
        f"{what}: protocol {protocol} is newer than this toolnexus reads ({reads}): "
        "upgrade this process"
    )


@functools.cache
def version() -> str:
    """This toolnexus's version (of the installed ``toolnexus-bridge`` package)."""
    try:
        return importlib.metadata.version("toolnexus-bridge")
    except importlib.metadata.PackageNotFoundError:  # (run from a source tree)
        return "unknown"


__all__ = [
    "PREVIOUS_PROTOCOL",
    "PREVIOUS_RELEASE",
    "PROTOCOL",
    "READS",
    "WRITE_PROTOCOL_VARIABLE",
    "check_read",
    "check_write_protocol",
    "default_write_protocol",
    "newer",
    "stamp",
    "stamped",
    "version",
]
