"""``toolnexus worker terminal``: a person answering requests at this terminal.

One request at a time, asked as the demo asks (:class:`toolnexus.responders.Terminal`:
every field kind, each value checked as it is typed and asked again with the rule).
Ctrl-C dismisses the request being asked; Ctrl-C while none is (or twice within
``QUIT_WITHIN_S``) quits. SIGTERM quits too, handing an unanswered request back to
the group. A request answered elsewhere, expired or withdrawn mid-question is
dropped with a note why.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import time
from collections.abc import Callable, Sequence

from toolnexus import Broker, Pending, Service, Worker
from toolnexus.cli import EXIT_OK
from toolnexus.lifecycle import EventType
from toolnexus.models import ApprovedEvent, EndedEvent, EscalatedEvent
from toolnexus.responders import Terminal, approvals_line

from .options import configure_logging, run_main, service, worker_parser

QUIT_WITHIN_S = 2.0
"""A second Ctrl-C this soon after the first quits, even while a request is asked."""

WHY_GONE = {
    EventType.ANSWERED: "answered elsewhere",
    EventType.EXPIRED: "expired",
    EventType.WITHDRAWN: "withdrawn by the asker",
}


class TerminalWorker(Worker):
    """Shows each request on ``terminal`` and sends what the person answers."""

    group = "terminal"

    def __init__(self, terminal: Terminal) -> None:
        self.terminal = terminal
        self.asking: str | None = None  # the id of the request being asked
        self._told: set[str] = set()  # refusals the terminal already reported
        self._interrupted_at = float("-inf")

    async def show(self, pending: Pending) -> None:
        if self.terminal.stdin.isatty():
            self.terminal.discard_typed_ahead()  # typed before this request was on screen
        self.asking = pending.request.id
        try:
            if await self.terminal.handle(pending) is None:
                self._told.add(pending.request.id)
        finally:
            self.asking = None
        self.waiting()

    async def gone(self, pending: Pending, event: EndedEvent) -> None:
        if pending.request.id in self._told:
            self._told.discard(pending.request.id)
            return
        why = WHY_GONE.get(event.event, event.event)
        self.terminal.say("")
        self.terminal.say(f"  ✗ gone: {pending.request.prompt or pending.request.id} ({why})")
        self.terminal.discard_typed_ahead()
        self.waiting()

    async def progress(self, pending: Pending, event: ApprovedEvent) -> None:
        """A quorum's vote counted, here or elsewhere (SPEC §14): say how many approved."""
        if self.asking is None:
            prompt = pending.request.prompt or pending.request.id
            self.terminal.say(f"  🗳️ {prompt}: {approvals_line(event)}")

    async def escalated(self, pending: Pending, event: EscalatedEvent) -> None:
        what = pending.request.prompt or pending.request.id
        self.terminal.say(f"  ⏫ escalated to {event.queue}: {what} (still open here)")

    def interrupt(self) -> bool:
        """Ctrl-C: dismiss the request being asked (True), or ask to quit (False)."""
        now = time.monotonic()
        if self.asking is None or now - self._interrupted_at < QUIT_WITHIN_S:
            return False
        self._interrupted_at = now
        self.terminal.interrupt()
        return True

    def waiting(self) -> None:
        """Say that the worker waits for the next request."""
        self.terminal.say("waiting for requests (Ctrl-C quits)…", dim=True)


async def _serve(broker: Broker, args: argparse.Namespace) -> int:
    terminal = Terminal()
    worker = TerminalWorker(terminal)
    runner = service(broker, args, worker)
    loop = asyncio.get_running_loop()

    def on_interrupt() -> None:
        if worker.interrupt():
            terminal.say("  (dismissing; Ctrl-C again quits)", dim=True)
        else:
            terminal.say("\nbye")
            runner.stop()

    loop.add_signal_handler(signal.SIGINT, on_interrupt)
    loop.add_signal_handler(signal.SIGTERM, runner.stop)
    terminal.say(
        f"toolnexus: answering queue {args.queue!r} as group {runner.group!r}; "
        "Ctrl-C dismisses a request.",
        dim=True,
    )
    worker.waiting()
    ended = asyncio.ensure_future(terminal.end_of_input())
    ended.add_done_callback(_stop_unless_cancelled(runner))  # Ctrl-D quits
    try:
        await runner.run()
    finally:
        ended.cancel()
        loop.remove_signal_handler(signal.SIGINT)
        loop.remove_signal_handler(signal.SIGTERM)
    return EXIT_OK


def _stop_unless_cancelled(runner: Service) -> Callable[[asyncio.Future[None]], None]:
    def stop(done: asyncio.Future[None]) -> None:
        if not done.cancelled():
            runner.stop()

    return stop


def parser() -> argparse.ArgumentParser:
    """The command line of ``toolnexus worker terminal``."""
    return worker_parser(
        "terminal",
        "Answer requests at this terminal, one at a time: forms field by field, "
        "authorizations after seeing their URL. Ctrl-C dismisses the request being asked; "
        "Ctrl-C again quits.",
        group="terminal",
        concurrency=None,
        drain_s=0.0,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """``toolnexus worker terminal``: answer requests at this terminal."""
    args = parser().parse_args(argv)
    configure_logging(args, default=logging.WARNING)
    return run_main(args, lambda broker: _serve(broker, args))
