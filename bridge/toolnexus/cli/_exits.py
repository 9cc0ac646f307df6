"""Every exit status of the ``toolnexus`` command and its workers, and the one map from the
error tree (:mod:`toolnexus.errors`) to them: every command and worker ends on an error
through :func:`failed` (each command's ``--help`` says which statuses it uses).

    ToolnexusError        2  EXIT_ERROR        a bad option, file or configuration
    ├── BrokerUnavailable 3  EXIT_UNREACHABLE  the broker cannot be reached
    ├── NotResolved       1  EXIT_REFUSED      an answer refused (and every subclass but)
    │   └── Refused       5  EXIT_REQUEST_REFUSED  a responder refused the request itself
    ├── InvalidAnswer     1  EXIT_REFUSED      an answer invalid for the request's form
    └── NotConfirmed      4  EXIT_NOT_CONFIRMED  an answer no replica confirmed in time
    KeyboardInterrupt   130  EXIT_INTERRUPTED  Ctrl-C
"""

from __future__ import annotations

import sys

from .._broker import redacted
from ..errors import (
    BrokerUnavailable,
    InvalidAnswer,
    NotConfirmed,
    NotResolved,
    Refused,
    ToolnexusError,
)

__all__ = [
    "EXIT_ACCEPTED",
    "EXIT_ANSWERED",
    "EXIT_CODES",
    "EXIT_DECLINED",
    "EXIT_ERROR",
    "EXIT_INTERRUPTED",
    "EXIT_NOT_ANSWERED",
    "EXIT_NOT_CONFIRMED",
    "EXIT_NOT_DONE",
    "EXIT_OK",
    "EXIT_REFUSED",
    "EXIT_REQUEST_REFUSED",
    "EXIT_UNREACHABLE",
    "exit_code",
    "failed",
    "one_line",
]

EXIT_OK = 0
"""Done as asked (``ask``: accepted; ``answer``: the waiter took the answer; a worker:
stopped)."""

EXIT_ACCEPTED, EXIT_DECLINED, EXIT_NOT_ANSWERED = 0, 1, 2
"""``ask``: accepted (also by default on expiry); declined (also by default on expiry);
expired, dismissed or withdrawn (and bad usage, as argparse exits)."""

EXIT_ANSWERED, EXIT_REFUSED, EXIT_NOT_CONFIRMED = 0, 1, 4
"""``answer``: the waiter took the answer (or a quorum counted the vote); it was refused
(by the broker: already resolved, unknown, not allowed, invalid for the form; or by the
waiter, which opened the request again); it was sent but no waiter took it in time (or,
with ``durability="wait"``, no replica confirmed it: :class:`~toolnexus.errors.NotConfirmed`)."""

EXIT_NOT_DONE = 1
"""``dead-letters``: no dead letter has that id, or one asked for could not be requeued."""

EXIT_REQUEST_REFUSED = 5
"""``ask``: a responder refused the request itself (a missing or bad signature, a key it
does not trust, bytes it cannot read): :class:`~toolnexus.errors.Refused`, said at once."""

EXIT_ERROR = 2
"""A bad option, file or configuration (argparse's status for bad usage)."""

EXIT_UNREACHABLE = 3
"""The broker cannot be reached."""

EXIT_INTERRUPTED = 130
"""Ctrl-C (128 + SIGINT), as a shell reports it."""

EXIT_CODES: dict[type[BaseException], int] = {
    ToolnexusError: EXIT_ERROR,
    BrokerUnavailable: EXIT_UNREACHABLE,
    NotResolved: EXIT_REFUSED,
    Refused: EXIT_REQUEST_REFUSED,
    InvalidAnswer: EXIT_REFUSED,
    NotConfirmed: EXIT_NOT_CONFIRMED,
    KeyboardInterrupt: EXIT_INTERRUPTED,
}
"""The exit status of a command or worker that an error stopped, by its class; a subclass
takes the status of its nearest listed ancestor."""


def exit_code(error: BaseException | type[BaseException]) -> int:
    """The exit status for ``error``, an error or its class (:data:`EXIT_CODES`; an error
    outside the tree: :data:`EXIT_ERROR`)."""
    kind = error if isinstance(error, type) else type(error)
    for cls in kind.__mro__:
        if cls in EXIT_CODES:
            return EXIT_CODES[cls]
    return EXIT_ERROR


def one_line(error: BaseException, url: str | None = None) -> str:
    """``error`` as one line, with the password of broker ``url`` replaced by ``***``
    (errors quote the URL, and a health check's output is kept by the container engine)."""
    text = str(error)
    if url:
        text = text.replace(url, redacted(url))
    return " ".join(text.split())


def failed(prog: str, error: BaseException, url: str | None = None) -> int:
    """Say on stderr, as ``prog: <one line>``, why a command or worker stopped (nothing
    for Ctrl-C), and return its exit status (:func:`exit_code`)."""
    if not isinstance(error, KeyboardInterrupt):
        sys.stderr.write(f"{prog}: {one_line(error, url)}\n")
    return exit_code(error)
