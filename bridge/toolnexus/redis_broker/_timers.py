"""The shared timer heap (:mod:`toolnexus.timers`), under the name the waiter imports."""

from ..timers import Timers

__all__ = ["Timers"]
