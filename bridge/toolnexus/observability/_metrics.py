"""Prometheus metrics (SPEC §13), with ``pip install 'toolnexus-bridge[metrics]'``.

Agents wrap their ``wait_for``; workers get them with ``--metrics-port``:

    metrics = toolnexus.metrics.Metrics()
    metrics.serve(9100)                  # GET 127.0.0.1:9100/metrics (else with a token)
    wait_for = metrics.instrument(broker.wait_for, queue="default")

Every name, with its labels:

- ``toolnexus_requests_published_total{queue}``: requests this process waited for.
- ``toolnexus_requests_resolved_total{queue,outcome,reason}``: resolutions; ``outcome``
  ``answered``, ``expired``, ``withdrawn`` or ``unavailable``; ``reason`` ``accepted``,
  ``declined``, ``dismissed``, ... An agent counts its own requests; a worker counts the
  queue's (every worker sees every resolution event: aggregate workers with ``max``).
- ``toolnexus_time_to_answer_seconds{queue}``: from publishing to an answer (agents).
- ``toolnexus_open_requests{queue}``: waits in progress in this agent process.
- ``toolnexus_queue_entries{queue}`` and ``toolnexus_dead_letters{queue}``: entries in the
  queue's request and dead-letter streams (workers, read every ``poll_s``).
- ``toolnexus_answers_refused_total`` and ``toolnexus_answers_unreadable_total``: answers
  this agent's waiter refused (forged, or by a key or person not allowed) and reply-stream
  entries it could not read (:meth:`Metrics.watch_broker`).
- ``toolnexus_worker_requests_total{group,consumer,state}``: a worker's requests by
  ``state`` ``shown``, ``answered``, ``refused`` (its answer lost or was invalid),
  ``skipped``, ``errors``; ``toolnexus_worker_holding{group,consumer}``: shown now.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import socket
import threading
import time
from collections.abc import Iterable, Iterator
from socketserver import ThreadingMixIn
from typing import TYPE_CHECKING, Any, Protocol
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from .._broker import Broker
from .._listening import check_listen, check_token
from ..errors import ConfigurationError, ToolnexusError
from ..lifecycle import Reason, Status
from ..models import Answer, AnsweredEvent, ExpiredEvent, Request, WaitFor, WithdrawnEvent

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIApplication, WSGIEnvironment

    from ..responders._serve import Service

log = logging.getLogger("toolnexus.metrics")

TIME_TO_ANSWER_BUCKETS_S = (0.5, 1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 4 * 3600)
"""Histogram buckets of the time to answer: people take seconds to hours."""

_NOT_ANSWERED: dict[str, str] = {
    Reason.EXPIRED: Status.EXPIRED,
    Reason.WITHDRAWN: Status.WITHDRAWN,
    Reason.UNAVAILABLE: Reason.UNAVAILABLE,
}


class Counted(Protocol):
    """Anything with counters, like :meth:`RedisBroker.statistics
    <toolnexus.redis_broker.RedisBroker.statistics>`."""

    def statistics(self) -> dict[str, int]: ...


BROKER_COUNTERS = {
    "refused_answers": (
        "toolnexus_answers_refused",
        "Answers this process's waiter refused: forged, or by a key or person not allowed.",
    ),
    "unreadable_answers": (
        "toolnexus_answers_unreadable",
        "Reply-stream entries this process's waiter could not read (dead-lettered).",
    ),
}
"""The broker counters :meth:`Metrics.watch_broker` exports: statistic -> (name, help)."""


def outcome_of(answer: Answer) -> tuple[str, str]:
    """The ``outcome`` and ``reason`` labels of a resolution by ``answer``."""
    if answer.ok:
        return Status.ANSWERED, "accepted"
    reason = answer.reason or "unknown"
    return _NOT_ANSWERED.get(reason, Status.ANSWERED), reason


class Metrics:
    """The metrics of one process, in a registry of their own (``registry``).

    Raises:
        ConfigurationError: ``prometheus-client`` is not installed.
    """

    def __init__(self) -> None:
        self._p = p = _prometheus()
        self.registry = registry = p.CollectorRegistry()
        self.published = p.Counter(
            "toolnexus_requests_published",
            "Requests published by this process.",
            ["queue"],
            registry=registry,
        )
        self.resolved = p.Counter(
            "toolnexus_requests_resolved",
            "Requests resolved, by outcome (answered, expired, withdrawn, unavailable) "
            "and reason (accepted, declined, dismissed, ...).",
            ["queue", "outcome", "reason"],
            registry=registry,
        )
        self.time_to_answer = p.Histogram(
            "toolnexus_time_to_answer_seconds",
            "From publishing a request to its answer.",
            ["queue"],
            buckets=TIME_TO_ANSWER_BUCKETS_S,
            registry=registry,
        )
        self.open = p.Gauge(
            "toolnexus_open_requests",
            "Requests this process is waiting for.",
            ["queue"],
            registry=registry,
        )
        self.entries = p.Gauge(
            "toolnexus_queue_entries",
            "Entries in the queue's request stream (unresolved requests).",
            ["queue"],
            registry=registry,
        )
        self.dead_letters = p.Gauge(
            "toolnexus_dead_letters",
            "Entries in the queue's dead-letter stream.",
            ["queue"],
            registry=registry,
        )
        self._services: list[Service] = []
        self._brokers: list[Counted] = []
        registry.register(_ServiceCollector(self._services, self._brokers))
        self._server: Any = None

    def instrument(self, wait_for: WaitFor, *, queue: str = "default") -> WaitFor:
        """``wait_for``, counted: published, open, resolved and time to answer."""

        async def wait(request: Request) -> Answer:
            self.published.labels(queue).inc()
            started = time.monotonic()
            with self._open(queue):
                answer = await wait_for(request)
            outcome, reason = outcome_of(answer)
            self.resolved.labels(queue, outcome, reason).inc()
            if outcome == Status.ANSWERED:
                self.time_to_answer.labels(queue).observe(time.monotonic() - started)
            return answer

        return wait

    @contextlib.contextmanager
    def _open(self, queue: str) -> Iterator[None]:
        gauge = self.open.labels(queue)
        gauge.inc()
        try:
            yield
        finally:
            gauge.dec()

    def watch(self, service: Service) -> None:
        """Export ``service.statistics()`` as ``toolnexus_worker_*`` at every scrape."""
        self._services.append(service)

    def watch_broker(self, broker: Counted) -> None:
        """Export ``broker.statistics()``'s refused and unreadable answers (forgeries among
        them) as ``toolnexus_answers_*_total`` at every scrape."""
        self._brokers.append(broker)

    async def follow(self, broker: Broker, *, queue: str, poll_s: float = 15.0) -> None:
        """Count the queue's resolutions from ``broker.events()`` and read its stream
        lengths every ``poll_s``, until cancelled. Failures are logged and retried."""
        await asyncio.gather(self._follow_events(broker, queue), self._poll(broker, queue, poll_s))

    async def _follow_events(self, broker: Broker, queue: str) -> None:
        while True:
            try:
                async with broker.events() as events:
                    async for event in events:
                        match event:
                            case AnsweredEvent(answer=Answer() as answer):
                                self.resolved.labels(queue, *outcome_of(answer)).inc()
                            case ExpiredEvent() | WithdrawnEvent():
                                self.resolved.labels(queue, event.event, event.event).inc()
            except ToolnexusError as exc:
                log.warning("metrics: following events of %r: %s", queue, exc)
                await asyncio.sleep(1.0)

    async def _poll(self, broker: Broker, queue: str, poll_s: float) -> None:
        from ..redis_broker import RedisBroker

        if not isinstance(broker, RedisBroker):
            return
        while True:
            try:
                async with asyncio.timeout(broker.settings.command_timeout_s):
                    entries = await broker.redis.xlen(broker.keys.requests)
                    dead = await broker.redis.xlen(broker.keys.dead)
                self.entries.labels(queue).set(entries)
                self.dead_letters.labels(queue).set(dead)
            except Exception as exc:  # an outage or a refused command: try again later
                log.warning("metrics: reading stream lengths of %r: %s", queue, exc)
            await asyncio.sleep(poll_s)

    def serve(self, port: int, host: str = "127.0.0.1", *, token: str | None = None) -> int:
        """Serve ``GET /metrics`` on ``host:port`` in a thread; the port (0: a free one).

        With ``token``, every scrape must send ``Authorization: Bearer <token>`` (else
        401). Like the web page (:func:`toolnexus.responders.check_listen`), metrics
        without a token are served on loopback only.

        Raises:
            ConfigurationError: ``host`` is not loopback and there is no ``token``, the
                token is too short, or the port cannot be bound.
        """
        if token is not None:
            check_token(token, "the metrics token")
        check_listen(
            host,
            guarded=token is not None,
            what="serve metrics",
            how="give a token (workers: --metrics-token or TOOLNEXUS_METRICS_TOKEN)",
        )
        app = self._p.make_wsgi_app(self.registry)
        try:
            server = _serve_wsgi(host, port, app if token is None else _guarded(app, token))
        except OSError as exc:
            raise ConfigurationError(f"cannot serve metrics on {host}:{port}: {exc}") from exc
        self._server = server
        bound: int = server.server_address[1]
        return bound

    def close(self) -> None:
        """Stop serving ``/metrics``."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def text(self) -> str:
        """The metrics in Prometheus' text format."""
        text: bytes = self._p.generate_latest(self.registry)
        return text.decode()


STATES = ("shown", "answered", "refused", "skipped", "errors")


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """No line on stderr per scrape."""


def _serve_wsgi(host: str, port: int, app: WSGIApplication) -> WSGIServer:
    """``app`` served on ``host:port`` (IPv4 or IPv6) by a daemon thread."""
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)

    class Server(ThreadingMixIn, WSGIServer):
        address_family = family[0][0]
        daemon_threads = True

    server = make_server(host, port, app, server_class=Server, handler_class=_QuietHandler)
    threading.Thread(target=server.serve_forever, name="toolnexus-metrics", daemon=True).start()
    return server


def _guarded(app: WSGIApplication, token: str) -> WSGIApplication:
    """``app`` for requests with ``Authorization: Bearer <token>``; 401 for the rest."""
    expected = f"Bearer {token}".encode()

    def guarded(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        given = str(environ.get("HTTP_AUTHORIZATION", "")).encode("latin-1", "replace")
        if hmac.compare_digest(given, expected):
            return app(environ, start_response)
        headers = [("Content-Type", "text/plain"), ("WWW-Authenticate", "Bearer")]
        start_response("401 Unauthorized", headers)
        return [b"a bearer token is needed\n"]

    return guarded


def _prometheus() -> Any:
    """The ``prometheus_client`` module.

    Raises:
        ConfigurationError: it is not installed.
    """
    try:
        import prometheus_client
    except ImportError as exc:
        raise ConfigurationError(
            "metrics need prometheus-client: pip install 'toolnexus-bridge[metrics]'"
        ) from exc
    return prometheus_client


class _ServiceCollector:
    """Reads the watched services' counters at every scrape."""

    def __init__(self, services: list[Service], brokers: list[Counted]) -> None:
        self.services = services
        self.brokers = brokers

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        requests = CounterMetricFamily(
            "toolnexus_worker_requests",
            "A worker's requests, by state.",
            labels=["group", "consumer", "state"],
        )
        holding = GaugeMetricFamily(
            "toolnexus_worker_holding",
            "Requests a worker shows now.",
            labels=["group", "consumer"],
        )
        for service in self.services:
            stats = service.statistics()
            names = [service.group, service.consumer or ""]
            for state in STATES:
                requests.add_metric([*names, state], stats[state])
            holding.add_metric(names, stats["holding"])
        yield requests
        yield holding
        if self.brokers:
            counts = [broker.statistics() for broker in self.brokers]
            for statistic, (name, help_text) in BROKER_COUNTERS.items():
                yield CounterMetricFamily(
                    name, help_text, value=sum(c.get(statistic, 0) for c in counts)
                )
