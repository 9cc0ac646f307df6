"""Tool calls in flight on one ``load_mcp`` session, and the clocks that stop while a person
answers one of their questions."""

from __future__ import annotations

import contextvars
import math
from dataclasses import dataclass, field
from typing import Any

import anyio

from ..models import new_id

current_call: contextvars.ContextVar[Call | None] = contextvars.ContextVar(
    "toolnexus_mcp_call", default=None
)


class Clock:
    """A read timeout spent only while no person is being asked: the budget left moves
    the deadline of the call's cancel scope, and is frozen while paused."""

    def __init__(self, timeout_s: float, scope: anyio.CancelScope) -> None:
        self._budget = timeout_s
        self._scope = scope
        self._pauses = 0
        scope.deadline = anyio.current_time() + timeout_s

    def pause(self) -> None:
        if not self._pauses:
            self._budget = max(0.0, self._scope.deadline - anyio.current_time())
            self._scope.deadline = math.inf
        self._pauses += 1

    def resume(self) -> None:
        self._pauses -= 1
        if not self._pauses:
            self._scope.deadline = anyio.current_time() + self._budget


@dataclass(eq=False)
class Wait:
    """One elicitation waiting for a person, on behalf of the calls still in ``calls``."""

    scope: anyio.CancelScope
    calls: set[Call]


@dataclass(eq=False)
class Call:
    """One ``tools/call`` in flight."""

    name: str
    timeout_s: float | None
    clock: Clock | None = None
    durable: str | None = None
    """The caller's id for a task-backed call that outlives this process (see ``_tasks``)."""
    arguments: dict[str, Any] = field(default_factory=dict)
    group: str = field(default_factory=lambda: new_id("call"))
    """Names the input requests this call asks together (``Request.meta["input_group"]``)."""
    active: bool = True
    waits: set[Wait] = field(default_factory=set)

    def attach(self, wait: Wait) -> None:
        self.waits.add(wait)
        if self.clock is not None:
            self.clock.pause()

    def detach(self, wait: Wait) -> None:
        self.waits.discard(wait)
        if self.active and self.clock is not None:
            self.clock.resume()

    def end(self) -> None:
        """The call is over: cancel the waits that no other call still needs."""
        self.active = False
        for wait in self.waits:
            wait.calls.discard(self)
            if not wait.calls:
                wait.scope.cancel()
