"""The requests the web page shows, and the pages that follow it live.

:class:`WebWorker` is the responder side (SPEC §12, on :mod:`toolnexus.responders._serve`): each
delivered request is put on the :class:`Board` and stays there, held by this
worker, until a person answers it on the page or it ends elsewhere.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

from toolnexus import Pending, Worker
from toolnexus.models import ApprovedEvent, EndedEvent, EscalatedEvent
from toolnexus.rendering import escalated_note, gone_note
from toolnexus.responders import approvals_line

FOLLOWER_BACKLOG = 1000
"""Changes a page may fall behind by; past it, its stream ends and it reloads the list."""


@dataclass(frozen=True)
class Change:
    """A request put on the board (``shown``), taken off it (``gone``, with a note why), or
    escalated to another queue while it stays (``escalated``, with a note saying where), or
    a quorum's progress on it (``progress``, the note ``1 of 2 approvals: ...``)."""

    kind: Literal["shown", "gone", "escalated", "progress"]
    pending: Pending
    note: str = ""


class Follower:
    """One page's stream of changes (see :meth:`Board.follow`)."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[Change | None] = asyncio.Queue()
        self.behind = False

    def push(self, change: Change | None) -> None:
        if self.queue.qsize() >= FOLLOWER_BACKLOG:
            self.behind = True
        if not self.behind:
            self.queue.put_nowait(change)

    def __aiter__(self) -> Follower:
        return self

    async def __anext__(self) -> Change:
        """The next change; ends when the board closes or this page fell too far behind."""
        if self.behind:
            raise StopAsyncIteration
        change = await self.queue.get()
        if change is None:
            raise StopAsyncIteration
        return change


class Board:
    """The open requests shown on the page, by request id."""

    def __init__(self) -> None:
        self._shown: dict[str, Pending] = {}
        self._approvals: dict[str, str] = {}  # a quorum's progress, by request id
        self._escalated: dict[str, list[str]] = {}  # request id -> queues it escalated to
        self._followers: set[Follower] = set()
        self.closed = False

    def show(self, pending: Pending) -> None:
        """Put ``pending`` on the board (again, after a redelivery: it replaces the old one)."""
        self._shown[pending.request.id] = pending
        self._publish(Change("shown", pending))

    def remove(self, request_id: str, note: str) -> bool:
        """Take request ``request_id`` off the board, telling pages ``note``; False if absent."""
        pending = self._shown.pop(request_id, None)
        self._approvals.pop(request_id, None)
        self._escalated.pop(request_id, None)
        if pending is None:
            return False
        self._publish(Change("gone", pending, note))
        return True

    def progress(self, event: ApprovedEvent) -> None:
        """A vote on a quorum request was counted (SPEC §14): pages show ``event``'s count
        and approvers on its card, which stays for other persons to vote on."""
        pending = self._shown.get(event.id)
        if pending is not None:
            self._approvals[event.id] = approvals_line(event)
            self._publish(Change("progress", pending, self._approvals[event.id]))

    def approvals(self, request_id: str) -> str | None:
        """The quorum's progress on ``request_id`` as shown (``1 of 2 approvals: ...``)."""
        return self._approvals.get(request_id)

    def escalate(self, request_id: str, queue: str) -> bool:
        """Mark request ``request_id`` escalated to ``queue`` (SPEC §14); False if absent."""
        pending = self._shown.get(request_id)
        if pending is None:
            return False
        queues = self._escalated.setdefault(request_id, [])
        if queue not in queues:
            queues.append(queue)
        self._publish(Change("escalated", pending, escalated_note(queues)))
        return True

    def escalations(self, request_id: str) -> list[str]:
        """The queues request ``request_id`` escalated to while on the board."""
        return list(self._escalated.get(request_id, ()))

    def get(self, request_id: str) -> Pending | None:
        """The shown pending for ``request_id``, if it is still on the board."""
        return self._shown.get(request_id)

    def __len__(self) -> int:
        return len(self._shown)

    def newest_first(self) -> list[Pending]:
        """Every shown request, newest first (by the time it was asked)."""
        return sorted(self._shown.values(), key=lambda p: p.request.created_at, reverse=True)

    @contextlib.contextmanager
    def follow(self) -> Iterator[Follower]:
        """Follow the board's changes from now on (``with board.follow() as changes``)."""
        follower = Follower()
        if self.closed:
            follower.push(None)
        self._followers.add(follower)
        try:
            yield follower
        finally:
            self._followers.discard(follower)

    def close(self) -> None:
        """End every follower's stream (the server is stopping)."""
        self.closed = True
        for follower in self._followers:
            follower.push(None)

    def _publish(self, change: Change) -> None:
        for follower in self._followers:
            follower.push(change)


class WebWorker(Worker):
    """Shows every delivered request on ``board``; answers come from the page."""

    group = "web"

    def __init__(self, board: Board) -> None:
        self.board = board

    async def show(self, pending: Pending) -> None:
        self.board.show(pending)

    def __repr__(self) -> str:
        return f"<WebWorker showing {len(self.board)}>"

    async def gone(self, pending: Pending, event: EndedEvent) -> None:
        self.board.remove(pending.request.id, gone_note(event))

    async def progress(self, pending: Pending, event: ApprovedEvent) -> None:
        self.board.progress(event)

    async def escalated(self, pending: Pending, event: EscalatedEvent) -> None:
        self.board.escalate(pending.request.id, event.queue or "another queue")
