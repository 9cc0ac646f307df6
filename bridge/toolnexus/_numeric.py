"""The one check of every numeric option and argument: a real number, finite, in range.

A bare ``value > 0`` is not enough: NaN fails every comparison, so ``nan <= 0`` lets it
through, and infinity or a huge value overflows the milliseconds Redis takes (as
``ValueError`` or ``OverflowError``, far from where the value was given).
"""

from __future__ import annotations

import math
import reprlib
from typing import Final

from .errors import ConfigurationError, ToolnexusError

MAX_SECONDS: Final = 10 * 365 * 24 * 3600.0
"""The longest duration any option or argument may give, in seconds (ten years). Every
duration becomes milliseconds in Redis (a TTL, a deadline, a stream ID), where a longer
one means nothing a person waits for."""

MAX_COUNT: Final = int(MAX_SECONDS * 1000)
"""The largest integer option (milliseconds, or a count): :data:`MAX_SECONDS` in
milliseconds, well inside what Lua's numbers and Redis's integers hold exactly."""


def check_number(
    name: str,
    value: object,
    *,
    error: type[ToolnexusError] = ConfigurationError,
    integer: bool = False,
    minimum: float | None = 0.0,
    inclusive: bool = False,
    maximum: float = MAX_SECONDS,
) -> None:
    """Refuse ``value`` (of the option or argument ``name``) unless it is a real number
    (an ``int`` with ``integer``; never a ``bool``), finite, greater than ``minimum`` (at
    least it, with ``inclusive``; no lower bound when None) and at most ``maximum``.

    Raises:
        ToolnexusError: of class ``error``, naming ``name``, the value and the rule.
    """
    if (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and (isinstance(value, int) or not integer)
        and value <= maximum  # first: an int beyond a float's range fails here
        and math.isfinite(value)
        and (minimum is None or value > minimum or (inclusive and value == minimum))
    ):
        return
    if minimum is None:
        bound = ""
    elif minimum == 0 and not inclusive:
        bound = "positive: "
    else:
        bound = f"{'at least' if inclusive else 'greater than'} {minimum:g}: "
    what = "an integer" if integer else "a finite number"
    most = f" at most {maximum:g}" if maximum < math.inf else ""
    raise error(f"{name}={reprlib.repr(value)} must be {bound}{what}{most}")
