"""W3C trace context across the broker (SPEC §13), with ``opentelemetry-api`` if installed.

The agent's current span context travels in :attr:`Request.trace <toolnexus.Request.trace>`
(``traceparent``/``tracestate``), so a responder's span is a child of the agent's:

    wait_for = toolnexus.tracing.traced(broker.wait_for)   # a span around every wait
    answer = await wait_for(request)                       # request.trace carries it

The responder SDK (:mod:`toolnexus.responders._serve`) runs each ``show()`` inside
:func:`responder_span`. Without ``pip install 'toolnexus-bridge[tracing]'`` (or with no tracer
provider configured) both do nothing, and cost nothing for requests without a trace.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import msgspec

from ..models import Answer, Request, WaitFor

try:
    from opentelemetry import propagate, trace

    ENABLED = True
except ImportError:  # the extra is not installed: tracing is off
    ENABLED = False

TRACER = "toolnexus"


def inject(request: Request) -> Request:
    """``request`` with the current span context in ``trace`` (unchanged when there is none)."""
    if not ENABLED:
        return request
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    if not carrier:
        return request
    return msgspec.structs.replace(request, trace={**(request.trace or {}), **carrier})


def traced(wait_for: WaitFor, *, name: str = "toolnexus.wait_for") -> WaitFor:
    """``wait_for`` inside a span ``name`` whose context each request carries."""

    async def wait(request: Request) -> Answer:
        with _span(name, None, request) as span:
            answer = await wait_for(inject(request))
            if span is not None:
                span.set_attribute("toolnexus.answer.ok", answer.ok)
                if answer.reason:
                    span.set_attribute("toolnexus.answer.reason", answer.reason)
            return answer

    return wait


def wants_span(request: Request) -> bool:
    """Whether :func:`responder_span` opens a span for ``request``: tracing is installed,
    and ``request`` carries a trace or a tracer provider is set.

    A responder asks it of every request before it enters ``responder_span``, a
    generator that costs more than this check. Whether a provider is set is asked of
    OpenTelemetry each time (one may be set at any moment; it offers no cheaper public
    way to know)."""
    return ENABLED and (
        request.trace is not None
        or not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
    )


@contextlib.contextmanager
def responder_span(request: Request, name: str = "toolnexus.show") -> Iterator[Any]:
    """A span ``name`` whose parent is the span context ``request.trace`` carries.

    Nothing at all (``None``) for a request that carries no trace while no tracer
    provider is set (see :func:`wants_span`): there is no span to record and no context
    to pass on, and the no-op span cost ~60 µs of every ``show()``."""
    if not wants_span(request):
        yield None
        return
    parent = propagate.extract(request.trace or {})
    with _span(name, parent, request) as span:
        yield span


@contextlib.contextmanager
def _span(name: str, parent: Any, request: Request) -> Iterator[Any]:
    if not ENABLED:
        yield None
        return
    attributes = {"toolnexus.request.id": request.id, "toolnexus.request.kind": request.kind}
    tracer = trace.get_tracer(TRACER)
    with tracer.start_as_current_span(name, context=parent, attributes=attributes) as span:
        yield span
