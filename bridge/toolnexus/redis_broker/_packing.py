"""Commands packed into the Redis protocol by hiredis (C) instead of by redis-py.

redis-py's asyncio connections pack every argument in Python (an ``Encoder.encode``
and a few ``bytes.join`` per argument); a toolnexus round trip sends about 45
arguments from the waiter and 30 from the responder, and packing them was the largest
single cost in the CPU profiles (``bench/PROFILE.md``). ``hiredis.pack_command`` packs
the same bytes about 7× faster. redis-py's synchronous client does the same when
hiredis is installed (``HiredisRespSerializer``); its asyncio client does not.

Same bytes, same refusals: a multi-word command name (``"CLIENT SETNAME"``) is split
as redis-py splits it, and arguments redis-py refuses (``bool``, ``None``) raise
``DataError`` here too. Strings are UTF-8, which is the only encoding toolnexus uses.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from redis.exceptions import DataError

_pack: Callable[[tuple[Any, ...]], bytes] | None
try:
    from hiredis import pack_command as _pack
except ImportError:  # redis[hiredis] is a dependency; without it, redis-py packs
    _pack = None


class _HiredisPacking:
    """Mixed into a redis-py asyncio connection class ahead of it."""

    def pack_command(self, *args: Any) -> list[bytes]:
        if isinstance(args[0], str):
            args = (*args[0].encode().split(), *args[1:])
        elif b" " in args[0]:
            args = (*args[0].split(), *args[1:])
        try:
            assert _pack is not None
            packed = _pack(args)
        except TypeError:
            bad = next((a for a in args if isinstance(a, bool) or a is None), None)
            raise DataError(
                f"Invalid input of type: {type(bad).__name__!r}. Convert to a bytes, string, "
                "int or float first."
            ) from None
        return [packed]


_CLASSES: dict[type[Any], type[Any]] = {}


def hiredis_packing(connection_class: type[Any]) -> type[Any]:
    """``connection_class`` packing with hiredis, or itself where hiredis is missing."""
    if _pack is None or issubclass(connection_class, _HiredisPacking):
        return connection_class
    fast = _CLASSES.get(connection_class)
    if fast is None:
        name = connection_class.__name__
        fast = _CLASSES[connection_class] = type(name, (_HiredisPacking, connection_class), {})
    return fast
