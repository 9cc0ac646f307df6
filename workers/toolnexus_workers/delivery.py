"""Delivering to the outside world, tried again with backoff (the webhook and email
workers): one rule for how often and how long."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

__all__ = ["Retry", "deliver"]

log = logging.getLogger("toolnexus.delivery")


@dataclass(frozen=True)
class Retry:
    """How failed deliveries are tried again: ``attempts`` in all, waiting ``first_delay_s``,
    then twice as long each time, at most ``max_delay_s``."""

    attempts: int = 8
    first_delay_s: float = 1.0
    max_delay_s: float = 300.0

    def delay_s(self, failures: int) -> float:
        return float(min(self.max_delay_s, self.first_delay_s * 2 ** (failures - 1)))


async def deliver(attempt: Callable[[], Awaitable[str | None]], retry: Retry, what: str) -> bool:
    """Call ``attempt`` (None: delivered; else why not) until it delivers or ``retry``'s
    attempts run out; each failure is logged with ``what`` and the wait before the next.
    Returns whether it was delivered."""
    why = ""
    for count in range(1, retry.attempts + 1):
        failure = await attempt()
        if failure is None:
            log.info("%s delivered", what)
            return True
        why = failure
        if count < retry.attempts:
            delay_s = retry.delay_s(count)
            log.warning("%s failed (%s): trying again in %g s", what, why, delay_s)
            await asyncio.sleep(delay_s)
    log.error("%s failed %d times (%s): giving up", what, retry.attempts, why)
    return False
