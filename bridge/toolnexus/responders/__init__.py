"""The responder SDK: what a worker (a process answering requests) is built from.

:func:`serve` runs a :class:`Worker`'s handlers against a broker as a
:class:`Service` (:mod:`._serve`); :func:`approvals_line` renders a quorum's progress;
:func:`options`, :func:`check_schema` and :func:`validate_form` read and check a
request's form (:mod:`toolnexus._schema`); :class:`Terminal` prompts a person on a
terminal (:mod:`._terminal`); :func:`listen`, :func:`check_listen`,
:func:`check_token` and :func:`is_loopback` are the one rule for where a worker's
listener may bind and what its token must be (:mod:`toolnexus._listening`).
"""

from .._listening import check_listen, check_token, is_loopback, listen
from .._schema import check_schema, options, validate_form
from ._serve import Handler, Service, Worker, approvals_line, serve
from ._terminal import Terminal

__all__ = [
    "Handler",
    "Service",
    "Terminal",
    "Worker",
    "approvals_line",
    "check_listen",
    "check_schema",
    "check_token",
    "is_loopback",
    "listen",
    "options",
    "serve",
    "validate_form",
]
