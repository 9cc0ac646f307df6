"""What every worker takes on its command line, and running one until SIGTERM.

The broker flags are the ones every ``toolnexus`` command takes
(:func:`toolnexus.settings.connection_parser`: ``--url``, ``--namespace``, ``--queue`` and
the signature flags, each falling back to its ``TOOLNEXUS_*`` variable), and a worker ends
on an error with the status :mod:`toolnexus.cli._exits` maps it to. Besides: ``--metrics-port``,
``--metrics-host`` and ``--metrics-token`` to ``TOOLNEXUS_METRICS_PORT``, ``_HOST`` and
``_TOKEN``, ``--log-json`` to ``TOOLNEXUS_LOG_JSON``.

The metrics obey the web page's binding rule (:func:`toolnexus.responders.check_listen`):
without a token they are served on loopback only (127.0.0.1 by default; the web worker's
default is its page's ``--host``).

    parser = worker_parser("auto", "Answer requests by rules.", group="auto")
    args = parser.parse_args(argv)
    return run_main(args, lambda broker: serve_worker(broker, args, AutoWorker(...)))
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import importlib.util
import json
import logging
import os
import sys
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any

import toolnexus
from toolnexus import Broker, ConfigurationError, Service, ToolnexusError, Worker
from toolnexus.cli import failed
from toolnexus.observability import Metrics
from toolnexus.settings import connection_options, connection_parser

__all__ = [
    "JsonFormatter",
    "add_listen_flags",
    "broker_options",
    "configure_logging",
    "require_extra",
    "run_checked",
    "run_main",
    "serve_worker",
    "service",
    "watch_service",
    "worker_parser",
]


def worker_parser(
    name: str,
    description: str,
    *,
    group: str,
    concurrency: int | None = 100,
    drain_s: float = 10.0,
    queue: str = "request queue to answer",
) -> argparse.ArgumentParser:
    """A parser with the options every worker takes; ``concurrency=None`` offers none;
    ``queue`` is the help text of ``--queue``."""
    parser = argparse.ArgumentParser(
        prog=f"toolnexus worker {name}",
        description=description,
        parents=[connection_parser(queue=queue)],
    )
    worker = parser.add_argument_group("worker")
    worker.add_argument(
        "--group",
        default=group,
        help=f"consumer group: one per channel; every group sees every request ({group})",
    )
    worker.add_argument(
        "--lease-ms",
        type=_positive(int),
        default=None,
        help="how long a held request is leased before others may reclaim it (30000)",
    )
    worker.add_argument(
        "--consumer", default=None, help="consumer name in the group (default: host-pid-random)"
    )
    if concurrency is not None:
        worker.add_argument(
            "--concurrency",
            type=_positive(int),
            default=concurrency,
            help=f"requests handled at once ({concurrency})",
        )
    worker.add_argument(
        "--drain-s",
        type=_not_negative,
        default=drain_s,
        help=f"on SIGTERM, how long running answers may finish ({drain_s:g} s)",
    )
    worker.add_argument(
        "--heartbeat-ttl-s",
        type=_positive(float),
        default=30.0,
        help="how long a heartbeat says this worker is alive; renewed every third (30 s)",
    )
    worker.add_argument(
        "--metrics-port",
        type=_port,
        default=os.environ.get("TOOLNEXUS_METRICS_PORT") or None,  # parsed by type, too
        help="serve Prometheus metrics at :PORT/metrics (default: $TOOLNEXUS_METRICS_PORT, "
        "else none; needs toolnexus-bridge[metrics])",
    )
    worker.add_argument(
        "--metrics-host",
        default=os.environ.get("TOOLNEXUS_METRICS_HOST") or None,
        help="address to serve metrics on; off loopback only with --metrics-token "
        "(default: $TOOLNEXUS_METRICS_HOST, else 127.0.0.1; the web worker: its --host)",
    )
    worker.add_argument(
        "--metrics-token",
        default=os.environ.get("TOOLNEXUS_METRICS_TOKEN") or None,
        help="bearer token every scrape must send (default: $TOOLNEXUS_METRICS_TOKEN)",
    )
    parser.add_argument(
        "--uvloop",
        choices=("no", "auto", "yes"),
        default=os.environ.get("TOOLNEXUS_UVLOOP") or "no",
        help="run on uvloop's event loop: auto = if it is installed, yes = it must be "
        "(default: $TOOLNEXUS_UVLOOP, else no)",
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="log more (-vv: debug)")
    parser.add_argument("-q", "--quiet", action="store_true", help="log only warnings and errors")
    parser.add_argument(
        "--log-json",
        action="store_true",
        default=os.environ.get("TOOLNEXUS_LOG_JSON", "").lower() in ("1", "true", "yes"),
        help="log one JSON object per line: time, level, logger, message (for log shippers)",
    )
    parser.set_defaults(prog=parser.prog, metrics=None)
    return parser


def configure_logging(args: argparse.Namespace, *, default: int = logging.INFO) -> None:
    """Log to stderr, one line per record, at the level ``-v`` / ``-q`` ask for."""
    level = logging.WARNING if args.quiet else default
    level = max(logging.DEBUG, level - 10 * args.verbose)
    handler = logging.StreamHandler(sys.stderr)
    if getattr(args, "log_json", False):
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=level, handlers=[handler])


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ``time`` (ISO 8601, UTC), ``level``, ``logger``,
    ``message``, and ``error`` with the traceback when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["error"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def service(broker: Broker, args: argparse.Namespace, worker: Worker) -> Service:
    """The :class:`~toolnexus.Service` the parsed options describe (its counters exported
    when ``--metrics-port`` is given)."""
    runner = Service(
        broker,
        worker,
        group=args.group,
        consumer=args.consumer,
        concurrency=getattr(args, "concurrency", 1),
        heartbeat_ttl_s=args.heartbeat_ttl_s,
        drain_s=args.drain_s,
    )
    watch_service(args, runner)
    return runner


async def serve_worker(
    broker: Broker, args: argparse.Namespace, worker: Worker, close: Callable[[], Awaitable[None]]
) -> int:
    """Run ``worker`` as the parsed options say until SIGTERM or SIGINT, then ``close()``
    it (its own tasks, clients); return the exit status (0)."""
    try:
        await service(broker, args, worker).run(handle_signals=True)
    finally:
        await close()
    return 0


def watch_service(args: argparse.Namespace, runner: Service) -> None:
    """Export ``runner``'s counters on the worker's metrics endpoint, if it has one."""
    if args.metrics is not None:
        args.metrics.watch(runner)


def broker_options(args: argparse.Namespace) -> dict[str, Any]:
    """The options of :func:`toolnexus.connect` the parsed flags ask for."""
    options = connection_options(args)
    if args.lease_ms is not None:
        options["lease_ms"] = args.lease_ms
    return options


def run_main(args: argparse.Namespace, work: Callable[[Broker], Awaitable[int]]) -> int:
    """Connect as ``args`` say, run ``work(broker)`` and return an exit status for it.

    A :class:`~toolnexus.ToolnexusError` is printed as one line and mapped to its status by
    :func:`toolnexus.cli.failed` (3 when the broker cannot be reached, 2 for a bad option).
    """

    async def main() -> int:
        async with toolnexus.connect(args.url, **broker_options(args)) as broker:
            if args.metrics_port is None:
                return await work(broker)
            metrics = args.metrics = Metrics()
            host = args.metrics_host or "127.0.0.1"
            port = metrics.serve(args.metrics_port, host, token=args.metrics_token)
            logging.getLogger("toolnexus.metrics").info("metrics on %s:%d/metrics", host, port)
            following = asyncio.ensure_future(metrics.follow(broker, queue=args.queue))
            try:
                return await work(broker)
            finally:
                following.cancel()
                await asyncio.gather(following, return_exceptions=True)
                metrics.close()

    try:
        return _run(main(), getattr(args, "uvloop", "no"))
    except (ToolnexusError, KeyboardInterrupt) as exc:  # Ctrl-C: before the worker's own
        return failed(_prog(args), exc, args.url)  # signal handling was in place


def _run(main: Coroutine[Any, Any, int], use_uvloop: str) -> int:
    """``asyncio.run(main)``, on uvloop's event loop if ``use_uvloop`` asks for it.

    Raises:
        ConfigurationError: ``yes``, and uvloop is not installed.
    """
    if use_uvloop != "no":
        try:
            import uvloop
        except ImportError:
            if use_uvloop == "yes":
                main.close()
                raise ConfigurationError("--uvloop yes: uvloop is not installed") from None
        else:
            with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
                return runner.run(main)
    return asyncio.run(main)


def run_checked(
    args: argparse.Namespace,
    check: Callable[[argparse.Namespace], None],
    serve: Callable[[Broker, argparse.Namespace], Awaitable[int]],
) -> int:
    """A worker's ``main``: configure logging, refuse a bad configuration (``check`` raising
    :class:`~toolnexus.ConfigurationError`: one line, status 2), then :func:`run_main` with
    ``serve(broker, args)``."""
    configure_logging(args)
    try:
        check(args)
    except ConfigurationError as exc:
        return failed(_prog(args), exc)
    return run_main(args, lambda broker: serve(broker, args))


def require_extra(extra: str, modules: Sequence[str]) -> None:
    """Raises: ConfigurationError naming the install command when a module is missing."""
    missing = [name for name in modules if importlib.util.find_spec(name) is None]
    if missing:
        raise ConfigurationError(
            f"the {extra} worker needs {', '.join(missing)}: "
            f"pip install 'toolnexus-bridge[{extra}]'"
        )


def add_listen_flags(group: Any, *, port: int) -> None:
    """``--host`` (127.0.0.1) and ``--port`` (``port``) in the argument ``group``: where a
    worker that serves HTTP listens."""
    group.add_argument("--host", default="127.0.0.1", help="address to listen on (127.0.0.1)")
    group.add_argument("--port", type=int, default=port, help=f"port to listen on ({port})")


def _prog(args: argparse.Namespace) -> str:
    return str(getattr(args, "prog", "toolnexus worker"))


def _positive(kind: type[int] | type[float]) -> Callable[[str], Any]:
    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be positive, not {text}")
        return value

    return parse


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 0 to 65535, not {text}")
    return port


def _not_negative(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, not {text}")
    return value
