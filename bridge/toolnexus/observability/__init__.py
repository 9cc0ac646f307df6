"""Observability (docs/how-to/operating.md): Prometheus metrics and trace context.

:class:`Metrics` counts what a broker and a worker do and serves them on ``/metrics``
(:mod:`._metrics`); :func:`traced` and :func:`inject` carry OpenTelemetry trace context
through a request, when OpenTelemetry is installed (:mod:`._tracing`).
"""

from ._metrics import Metrics
from ._tracing import inject, traced

__all__ = ["Metrics", "inject", "traced"]
