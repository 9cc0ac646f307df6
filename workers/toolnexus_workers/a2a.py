"""``toolnexus worker a2a``: remote A2A agents' paused tasks continued with answers from
toolnexus responders.

Not a responder: a bridge that asks. For each ``--agent URL`` it lists, every ``--poll-s``
seconds, the agent's tasks in ``input-required`` and ``auth-required`` (those its caller
may list; with ``--context``, one conversation's) and asks each through the broker,
durably; the answer continues the task (:func:`toolnexus.frameworks.a2a.watch`). SIGTERM
or Ctrl-C stops it; the questions asked stay open, and a restarted worker attaches to
them. Needs ``pip install 'toolnexus-bridge[a2a]'``.

    toolnexus worker a2a --url redis://127.0.0.1:6379/0 --agent https://booking.example.com
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import math
import signal
from collections.abc import Sequence

from toolnexus import Broker, ConfigurationError
from toolnexus.cli import EXIT_OK
from toolnexus.frameworks import RemoteAgentError

from .options import require_extra, run_checked, worker_parser

log = logging.getLogger("toolnexus.worker.a2a")


def parser() -> argparse.ArgumentParser:
    """The command line of ``toolnexus worker a2a``."""
    p = worker_parser(
        "a2a",
        "Continue remote A2A agents' paused tasks with answers from toolnexus responders.",
        group="a2a",
        concurrency=None,
        queue="request queue the remote agents' questions are published to",
    )
    a2a = p.add_argument_group("a2a")
    a2a.add_argument(
        "--agent",
        action="append",
        metavar="URL",
        help="base URL of an A2A agent to watch (its card at URL/.well-known/agent-card.json); "
        "repeat for more",
    )
    a2a.add_argument("--context", default=None, help="only the tasks of this A2A context id")
    a2a.add_argument(
        "--poll-s", type=float, default=5.0, help="how often to list paused tasks (5 s)"
    )
    a2a.add_argument(
        "--timeout-s",
        type=float,
        default=None,
        help="how long each question waits before the task is cancelled (the broker's default)",
    )
    a2a.add_argument(
        "--name", default=None, help="the asking agent's name, shown to responders (none)"
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``toolnexus worker a2a``; return its exit status (2 for a bad configuration)."""
    args = parser().parse_args(argv)
    return run_checked(args, _check, _serve)


def _check(args: argparse.Namespace) -> None:
    require_extra("a2a", ("a2a", "httpx"))
    if not args.agent:
        raise ConfigurationError("give the A2A agents to watch: --agent URL (repeat for more)")
    for name in ("poll_s", "timeout_s"):
        value = getattr(args, name)
        if value is not None and not (math.isfinite(value) and value > 0):
            flag = "--" + name.replace("_", "-")
            raise ConfigurationError(f"{flag} must be a positive number of seconds, not {value}")


async def _serve(broker: Broker, args: argparse.Namespace) -> int:
    import httpx
    from a2a.client import create_client
    from a2a.utils.errors import A2AError

    from toolnexus.frameworks.a2a import watch

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    async with contextlib.AsyncExitStack() as clients:
        watchers = []
        for url in args.agent:
            try:
                client = await clients.enter_async_context(await create_client(url))
            except (A2AError, httpx.HTTPError) as exc:
                raise RemoteAgentError(f"A2A agent {url!r}: its agent card: {exc}") from exc
            watching = watch(
                client,
                broker=broker,
                remote=url,
                agent=args.name,
                timeout_s=args.timeout_s,
                poll_s=args.poll_s,
                context_id=args.context,
            )
            watchers.append(asyncio.create_task(watching))
        log.info("watching the paused tasks of %s", ", ".join(args.agent))
        stopping = asyncio.create_task(stop.wait())
        await asyncio.wait([*watchers, stopping], return_when=asyncio.FIRST_COMPLETED)
        for task in (*watchers, stopping):
            task.cancel()
        results = await asyncio.gather(*watchers, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException) and not isinstance(result, asyncio.CancelledError):
            raise result  # a ToolnexusError ends the worker with its exit status
    return EXIT_OK


__all__ = ["main", "parser"]
