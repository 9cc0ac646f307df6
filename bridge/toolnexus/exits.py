"""Every exit status of the ``toolnexus`` command, in one place (each command's ``--help``
says which of these it uses)."""

from __future__ import annotations

EXIT_OK = 0
"""Done as asked (``ask``: accepted; ``answer``: the waiter took the answer)."""

EXIT_ACCEPTED, EXIT_DECLINED, EXIT_NOT_ANSWERED = 0, 1, 2
"""``ask``: accepted (also by default on expiry); declined (also by default on expiry);
expired, dismissed or withdrawn (and bad usage, as argparse exits)."""

EXIT_ANSWERED, EXIT_REFUSED, EXIT_NOT_CONFIRMED = 0, 1, 4
"""``answer``: the waiter took the answer (or a quorum counted the vote); it was refused
(by the broker: already resolved, unknown, not allowed, invalid for the form; or by the
waiter, which opened the request again); it was sent but no waiter took it in time."""

EXIT_NOT_DONE = 1
"""``dead-letters``: no dead letter has that id, or one asked for could not be requeued."""

EXIT_REQUEST_REFUSED = 5
"""``ask``: a responder refused the request itself (a missing or bad signature, a key it
does not trust, bytes it cannot read): :class:`~toolnexus.errors.Refused`, said at once."""

EXIT_ERROR = 2
"""A bad option or file (argparse's status for bad usage)."""

EXIT_UNREACHABLE = 3
"""The broker cannot be reached."""

EXIT_INTERRUPTED = 130
"""Ctrl-C (128 + SIGINT), as a shell reports it."""
