"""Reminders: a request still open after a while is announced again, every ``after_s``,
until it ends (the webhook, email and chat workers; docs/how-to/beyond.md#reminders)."""

from __future__ import annotations

import argparse
import asyncio
import itertools
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from toolnexus import Pending

__all__ = ["Reminders", "add_reminder_flag"]

log = logging.getLogger("toolnexus.reminders")

Remind = Callable[[Pending, int], Awaitable[None]]
"""Announce ``pending`` again: the ``count``-th reminder (1, 2, ...)."""


class Reminders:
    """Calls ``remind(pending, count)`` every ``after_s`` seconds for each request
    :meth:`start` was given, until :meth:`stop` for it (or :meth:`aclose`). ``after_s``
    None: never."""

    def __init__(self, after_s: float | None, remind: Remind) -> None:
        self.after_s, self.remind = after_s, remind
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self.sent = 0

    def start(self, pending: Pending) -> None:
        """Remind of ``pending`` (idempotent: a request delivered again keeps its timer)."""
        request_id = pending.request.id
        if self.after_s is None or request_id in self._tasks:
            return
        self._tasks[request_id] = asyncio.ensure_future(self._run(pending, self.after_s))

    def stop(self, request_id: str) -> None:
        """No more reminders of this request: it ended."""
        task = self._tasks.pop(request_id, None)
        if task is not None:
            task.cancel()

    async def _run(self, pending: Pending, after_s: float) -> None:
        for count in itertools.count(1):
            await asyncio.sleep(after_s)
            try:
                await self.remind(pending, count)
            except Exception:  # one failed reminder must not end the others
                log.exception("reminder %d of %s failed", count, pending.request.id)
            else:
                self.sent += 1

    async def aclose(self) -> None:
        """Stop every timer."""
        tasks = list(self._tasks.values())
        self._tasks.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def add_reminder_flag(group: Any, doing: str) -> None:
    """``--remind-after-s`` (positive) in the argument ``group``: ``doing`` (``mail``) a
    request still open again after that long, and so on."""
    group.add_argument(
        "--remind-after-s",
        type=_seconds,
        default=None,
        help=f"{doing} a request still open after this long, and so on (default: never)",
    )


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be positive, not {text}")
    return value
