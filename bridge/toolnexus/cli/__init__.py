"""The ``toolnexus`` command (SPEC §13): :func:`main` is its entry point.

:mod:`._main` holds the parser and the dispatch; :mod:`._ask` the ``ask`` and
``answer`` approval gate for scripts; :mod:`._ops` the operators' ``status``, ``check``
and ``audit``; :mod:`._acl` the fleet's Redis ACL file; :mod:`._demo` the ``demo``
round trip (and its booking server, which the examples reuse); :mod:`._exits` the exit
codes and the one map from the error tree to them, which workers share
(:func:`failed`, :func:`exit_code`, :func:`one_line`).
"""

import importlib
import typing as _typing

from ._exits import (
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_NOT_DONE,
    EXIT_OK,
    EXIT_UNREACHABLE,
    exit_code,
    failed,
    one_line,
)
from ._main import command_parser, main

if _typing.TYPE_CHECKING:
    from ._demo import auto_answer, booking_server, result_text

_LAZY = {
    "auto_answer": "_demo",
    "booking_server": "_demo",
    "result_text": "_demo",
}
"""Imported on first use: the demo needs the MCP SDK."""


def __getattr__(name: str) -> _typing.Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    from .._compat import forward

    return forward(__name__, f"{__name__}._main", name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "EXIT_ERROR",
    "EXIT_INTERRUPTED",
    "EXIT_NOT_DONE",
    "EXIT_OK",
    "EXIT_UNREACHABLE",
    "auto_answer",
    "booking_server",
    "command_parser",
    "exit_code",
    "failed",
    "main",
    "one_line",
    "result_text",
]
