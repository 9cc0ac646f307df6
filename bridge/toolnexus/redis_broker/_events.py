"""The events stream of a queue, followed by UIs and the responder SDK: ``answered``,
``expired``, ``withdrawn``, ``completed``. An event a reader cannot read (garbage, another
version's format) is copied to the dead letters and skipped; it stays in the stream for
every other reader, until the stream's age rule trims it."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque

from .._broker import EventStream
from ..errors import DecodeError
from ..models import Event
from ._connections import BlockingReader
from ._core import Backoff, Core, ms, run_to_completion, text

READ_COUNT = 1000
"""Events read at most by one ``XREAD``."""

GATHER_S = 0.01
"""After a read that found events but fewer than ``READ_COUNT``, how long the next read
waits for more to arrive: a busy stream (one event per answer) is read in batches, not
a few events per ``XREAD``. The first event after a quiet spell is read at once."""


class RedisEvents(EventStream):
    """Follows the events stream from the moment it was created; an event it cannot read
    is copied to the dead letters (one copy per reader that could not read it: the
    stream has no consumer groups) and skipped, never deleted: another reader (another
    version) may read it. ``unreadable`` counts them."""

    def __init__(self, core: Core) -> None:
        self._core = core
        # XREAD returns entries after this id: the last possible one of the previous
        # millisecond, so that an event added within this millisecond is not missed.
        self._last_id = f"{ms(time.time()) - 1}-18446744073709551615"
        self._reader: BlockingReader | None = None
        self._buffer: deque[Event] = deque()
        self._busy = False  # the last read found events: the next one gathers first
        self._closed = False
        self.unreadable = 0

    async def __anext__(self) -> Event:
        if not self._buffer:
            await self._fill()
        return self._buffer.popleft()

    async def _fill(self) -> None:
        """Read until there are events to return; StopAsyncIteration once closed."""
        core = self._core
        backoff = Backoff()
        while not self._buffer:
            if self._closed or core.closed:
                raise StopAsyncIteration
            if self._busy:
                self._busy = False
                await asyncio.sleep(GATHER_S)
                continue
            if self._reader is None:
                self._reader = core.blocking_reader()
            block_ms = core.settings.block_ms
            try:
                entries = await self._reader.xread(
                    core.keys.events, self._last_id, READ_COUNT, block_ms
                )
                backoff.reset()
            except Exception as exc:  # a lost connection, a timeout, WRONGTYPE: never die
                reader, self._reader = self._reader, None
                with contextlib.suppress(Exception):
                    await reader.aclose()
                await backoff.wait("reading events", exc)
                continue
            self._busy = 0 < len(entries) < READ_COUNT
            for entry_id, fields in entries:
                try:
                    payload = fields.get(b"e") if fields else None
                    if payload is None:
                        raise DecodeError("the entry has no 'e' field holding an event")
                    self._buffer.append(core.codec.decode_event(payload))
                except DecodeError as exc:
                    self.unreadable += 1
                    dead = text(entry_id)
                    core.copy_to_dead_letters(core.keys.events, dead, fields or {}, str(exc))
            if entries:
                self._last_id = text(entries[-1][0])

    async def aclose(self) -> None:
        self._closed = True
        if self._reader is not None:
            reader, self._reader = self._reader, None
            await run_to_completion(reader.aclose())
