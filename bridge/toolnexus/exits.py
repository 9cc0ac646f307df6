"""Every exit status of the ``toolnexus`` command, in one place (each command's ``--help``
says which of these it uses)."""

from __future__ import annotations

EXIT_OK = 0
"""Done as asked (``ask``: accepted; ``answer``: the waiter took the answer)."""

EXIT_ACCEPTED, EXIT_DECLINED, EXIT_NOT_ANSWERED = 0, 1, 2
"""``ask``: accepted (also by default on expiry); declined (also by default on expiry);
expired, dismissed or withdrawn (and bad usage, as argparse exits)."""

EXIT_ANSWERED, EXIT_REFUSED = 0, 1
"""``answer``: the answer resolved the request; it was refused (already resolved, unknown,
not allowed, or invalid for the form)."""

EXIT_NOT_DONE = 1
"""``dead-letters``: no dead letter has that id, or one asked for could not be requeued."""

EXIT_ERROR = 2
"""A bad option or file (argparse's status for bad usage)."""

EXIT_UNREACHABLE = 3
"""The broker cannot be reached."""

EXIT_INTERRUPTED = 130
"""Ctrl-C (128 + SIGINT), as a shell reports it."""
