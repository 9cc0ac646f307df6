"""The embedded broker (``memory://``): the Redis broker's semantics inside one process.

For demos, tests and single-process agents. Nothing survives the process: a durable wait
(SPEC §14) outlives its wait, and waiting again with its id attaches to it, but only
within this process. It has one queue, which every responder group reads: an escalating
request's hops (SPEC §14) are kept to the same rules and recorded (an ``escalated`` event
each, and the audit record), and the request stays where every group sees it.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec

from ._broker import (
    DEFAULT_TIMEOUT_S,
    RETENTION_S,
    Broker,
    EventStream,
    Pending,
    Responder,
    Store,
    check_audit_query,
    check_same_question,
    check_store_entry,
    check_store_replacement,
    deadline_of,
    default_consumer_name,
    reader_look_delay_s,
)
from ._hops import check_hops
from ._numeric import check_number
from ._outcomes import check_on_expiry, expired_answer
from ._schema import check_answer
from ._wire10 import Request10, as_request
from .codec import MSGPACK
from .errors import (
    AlreadyResolved,
    AlreadyVoted,
    BrokerClosed,
    ConfigurationError,
    InvalidRequest,
    NotAllowed,
    ToolnexusError,
    UnknownRequest,
)
from .keys import Keys, check_request_id
from .lifecycle import Item, Outcome, Status, admit
from .models import (
    WITHDRAWN,
    Answer,
    ApprovedEvent,
    CompletedEvent,
    EscalatedEvent,
    Event,
    Heartbeat,
    Hop,
    Request,
    ended_event,
)
from .protocol import check_write_protocol, default_write_protocol
from .security._audit import AuditRecord, audit_record
from .security._signatures import REQUIRE_ENV, SIGNING_OPTIONS, signatures_required
from .security._signing import allowed
from .security._voting import approvals_of, decides, voter_of
from .settings import RedisSettings

log = logging.getLogger("toolnexus.memory")

LOOK_EVERY_S = 10.0
"""How often at most a wait warns that no responder reads this broker (as on Redis)."""


@dataclass(eq=False)
class _State:
    request: Request
    waiter: asyncio.Future[Answer]
    status: Status = Status.OPEN
    answer: Answer | None = None
    votes: dict[str, Answer] = field(default_factory=dict)  # a quorum's, by voter (voter_of)
    waiting: bool = True  # a wait is in progress (a durable request may have none)
    escalated: list[Hop] = field(default_factory=list)  # the hops taken


@dataclass(eq=False)
class _Group:
    queue: asyncio.Queue[str] = field(default_factory=asyncio.Queue)


AUDIT_RECORDS = 10_000
"""Audit records the embedded broker keeps (the newest)."""


MEMORY_OPTIONS = ("default_timeout_s", "namespace", "queue", "retention_s", "write_protocol")
"""The options of the embedded broker. ``namespace``, ``queue`` and ``write_protocol`` are
accepted (the last one checked) so that the same options reach either broker: one embedded
broker is one namespace and one queue, and nothing in it is read by another process."""


class MemoryBroker(Broker):
    """In-process broker; ``connect("memory://")`` makes one. Options: ``default_timeout_s``
    and ``retention_s`` (as the Redis broker's), ``namespace`` and ``queue`` (see
    :data:`MEMORY_OPTIONS`), as keywords or as the same fields of a
    :class:`~toolnexus.RedisSettings` (``settings``), whose other fields must keep their
    defaults. It does not sign: everything in it is one process, so it
    refuses signature settings rather than run unsigned.

    Raises:
        ConfigurationError: an option it does not know or cannot honour (the Redis broker's
            leases, connections, codec, ...), a signing key, trusted keys, signatures
            required (``require_signatures=True`` or ``TOOLNEXUS_REQUIRE_SIGNATURES=1``),
            or a bad value; the message names them and the options it has.
    """

    def __init__(
        self,
        url: str = "memory://",
        *,
        settings: RedisSettings | None = None,
        default_timeout_s: float | None = None,
        retention_s: float | None = None,
        namespace: str | None = None,
        queue: str | None = None,
        write_protocol: int | None = None,
        **options: Any,
    ) -> None:
        self._write_protocol = (
            default_write_protocol()
            if write_protocol is None
            else check_write_protocol(write_protocol)
        )
        signing = [name for name in SIGNING_OPTIONS if options.pop(name, None) not in (None, False)]
        if signing or signatures_required():
            asked = ", ".join(signing) or f"{REQUIRE_ENV}=1"
            raise ConfigurationError(
                f"the embedded broker ({url}) cannot sign or verify ({asked}): everything in "
                "it is one process. Give a redis:// URL (or TOOLNEXUS_URL) for signatures, "
                "or leave them unset"
            )
        if settings is not None:  # the fields it honours, as if given one by one
            given = {
                "default_timeout_s": default_timeout_s,
                "retention_s": retention_s,
                "namespace": namespace,
                "queue": queue,
            }
            changed = settings.changed()
            twice = [name for name, value in given.items() if value is not None and name in changed]
            if twice:
                raise ConfigurationError(
                    f"{', '.join(twice)}: given both in settings= and as a keyword; give each once"
                )
            options.update((name, getattr(settings, name)) for name in changed)
            default_timeout_s = default_timeout_s or settings.default_timeout_s
            retention_s = retention_s or settings.retention_s
            namespace, queue = namespace or settings.namespace, queue or settings.queue
            if write_protocol is None:
                self._write_protocol = settings.write_protocol
            for name in MEMORY_OPTIONS:
                options.pop(name, None)
        if options:
            raise ConfigurationError(
                f"the embedded broker ({url}) cannot honour option"
                f"{'s' if len(options) > 1 else ''} {', '.join(sorted(options))}: its options "
                f"are {', '.join(MEMORY_OPTIONS)} (the others are the Redis broker's)"
            )
        if default_timeout_s is None:
            default_timeout_s = DEFAULT_TIMEOUT_S
        if retention_s is None:
            retention_s = RETENTION_S
        check_number("option default_timeout_s", default_timeout_s)
        check_number("option retention_s", retention_s)
        Keys(namespace or "toolnexus", queue or "default")  # names the Redis broker takes
        self.url = url
        self.default_timeout_s = default_timeout_s
        self.retention_s = retention_s
        self._states: dict[str, _State] = {}
        self._resolved: collections.OrderedDict[str, float] = collections.OrderedDict()
        self._groups: dict[str, _Group] = {}
        self._subscribers: set[asyncio.Queue[Event | None]] = set()
        self._responders: set[MemoryResponder] = set()
        self._audit: collections.deque[AuditRecord] = collections.deque(maxlen=AUDIT_RECORDS)
        self._heartbeats: dict[tuple[str, str], Heartbeat] = {}
        self._warned_at = -LOOK_EVERY_S
        self._looking: asyncio.TimerHandle | None = None
        self.namespace, self.queue = namespace or "toolnexus", queue or "default"
        self._stores: dict[str, MemoryStore] = {}

    @property
    def write_protocol(self) -> int:
        return self._write_protocol

    # -- waiter side --------------------------------------------------------------

    async def wait_for(
        self,
        request: Request | Request10,
        *,
        timeout_s: float | None = None,
        allow: Sequence[str] | None = None,
        durable: bool = False,
    ) -> Answer:
        """See :meth:`Broker.wait_for`. A durable wait attaches to a durable request of
        this broker with the same id; nothing of it outlives the process."""
        request = as_request(request)
        problem = check_request_id(request.id)
        if problem is not None:
            raise InvalidRequest(f"request id {request.id[:100]!r}: {problem}")
        check_on_expiry(request)
        if durable and not request.durable:
            request = msgspec.structs.replace(request, durable=True)
        MSGPACK.encode_request(request)  # the encoding and size limit the Redis broker has
        self._forget_old()
        state = self._states.get(request.id)
        attachable = state is not None and state.request.durable and request.durable
        if state is not None and state.status == Status.OPEN and (state.waiting or not attachable):
            raise InvalidRequest(f"request {request.id!r} is already being waited for")
        if state is not None and attachable:
            check_same_question(state.request, request)
            if state.answer is not None:
                return state.answer
            state.waiting = True
        else:
            deadline = deadline_of(request, timeout_s, self.default_timeout_s)
            check_hops(request, deadline, None)
            changes: dict[str, Any] = {"expires_at": deadline}
            if allow is not None:
                changes["allow"] = list(allow)
            request = msgspec.structs.replace(request, **changes)
            state = _State(request, asyncio.get_running_loop().create_future())
            self._states[request.id] = state
            for group in self._groups.values():
                group.queue.put_nowait(request.id)
            self._look_for_readers(state)
        deadline = state.request.expires_at or time.time()
        loop = asyncio.get_running_loop()
        taken = {hop.queue for hop in state.escalated}
        hops = [
            loop.call_later(
                max(0.0, state.request.created_at + hop.after_s - time.time()),
                self._hop,
                state,
                hop,
            )
            for hop in state.request.escalate or ()
            if hop.queue not in taken
        ]
        try:
            async with asyncio.timeout(max(0.0, deadline - time.time())):
                return await asyncio.shield(state.waiter)
        except TimeoutError:
            return self._resolve_by_waiter(state, Status.EXPIRED)
        except asyncio.CancelledError:
            if not state.request.durable:
                self._resolve_by_waiter(state, Status.WITHDRAWN)
            raise
        finally:
            state.waiting = False
            for handle in hops:
                handle.cancel()

    def _look_for_readers(self, state: _State) -> None:
        """Unless a look is due or warned less than :data:`LOOK_EVERY_S` ago, look after
        the grace (:func:`~toolnexus._broker.reader_look_delay_s`) whether a responder of this
        broker has a fresh heartbeat, and warn if none has and ``state`` is still open."""
        if self._looking is not None or time.monotonic() - self._warned_at < LOOK_EVERY_S:
            return
        delay_s = reader_look_delay_s(state.request.expires_at or time.time())
        self._looking = asyncio.get_running_loop().call_later(delay_s, self._look, state)

    def _look(self, state: _State) -> None:
        self._looking = None
        now = time.time()
        if state.status != Status.OPEN:  # answered: somebody reads; or withdrawn
            return
        if any(beat.expires_at > now for beat in self._heartbeats.values()):
            return
        self._warned_at = time.monotonic()
        log.warning(
            "nobody reads queue %r of namespace %r on the embedded broker (%s): no responder "
            "of this process has a fresh heartbeat, so request %s waits for one until its "
            "deadline (an embedded broker is seen by this process alone: give responders "
            "elsewhere a redis:// URL)",
            self.queue,
            self.namespace,
            self.url,
            state.request.id,
        )

    def _hop(self, state: _State, hop: Hop) -> None:
        """An escalation hop is due: record it if the request is still open."""
        if state.status == Status.OPEN:
            taken = Hop(round(time.time() - state.request.created_at, 3), hop.queue)
            state.escalated.append(taken)
            self._publish(EscalatedEvent(id=state.request.id, queue=hop.queue))

    def _resolve_by_waiter(
        self, state: _State, status: Literal[Status.EXPIRED, Status.WITHDRAWN]
    ) -> Answer:
        if state.answer is None:
            answer = (
                expired_answer(state.request)
                if status == Status.EXPIRED
                else Answer(id=state.request.id, ok=False, reason=WITHDRAWN)
            )
            self._settle(state, status, answer)
        assert state.answer is not None
        return state.answer

    # -- resolution ---------------------------------------------------------------

    def _settle(self, state: _State, status: Status, answer: Answer) -> None:
        state.status, state.answer = status, answer
        if not state.waiter.done():
            state.waiter.set_result(answer)
        self._resolved[answer.id] = time.monotonic()
        self._publish(ended_event(status, answer.id, answer))
        votes = [MSGPACK.encode(vote) for vote in state.votes.values()]
        record = audit_record(
            state.request, status, answer, verified=None, escalated=state.escalated, votes=votes
        )
        self._audit.append(record)

    def _vote(self, state: _State, vote: Answer) -> ApprovedEvent | None:
        """Count ``vote`` towards the request's quorum (SPEC §14; the rule is
        :mod:`toolnexus.security._voting`'s, as on the Redis broker): resolve it with the vote that
        decides, or publish and return the ``approved`` event."""
        quorum = state.request.quorum
        assert quorum is not None
        voter = voter_of(vote)
        stored = state.votes.get(voter)
        if stored is not None and stored != vote:
            raise AlreadyVoted(vote.id, voter)
        state.votes[voter] = vote  # (the same vote again counts as before, as on Redis)
        accepts = {name: v for name, v in state.votes.items() if v.ok}
        if stored is None and decides(quorum, vote, len(accepts), len(state.votes) - len(accepts)):
            approvals = approvals_of(accepts.values())
            self._settle(state, Status.ANSWERED, msgspec.structs.replace(vote, approvals=approvals))
            return None
        event = ApprovedEvent(
            id=vote.id, count=len(accepts), need=quorum.need, approvers=[*accepts]
        )
        self._publish(event)
        return event

    def _resolve(self, answer: Answer, responder: str | None) -> ApprovedEvent | None:
        """Resolve with ``answer`` (or count it, for a quorum) what the admission rule
        admits: the rule both brokers follow (:func:`toolnexus.lifecycle.admit`; the Redis
        broker's ``ADMIT`` script says the same). Nothing here is forged or contested: the
        state is this process's own, and every wait that ended withdrew its request (a
        durable one stays open for the next), so the waiter counts as alive.

        Raises:
            UnknownRequest: no such request (no deadline is known without it).
            AlreadyResolved: resolved before (unless by this very answer: a retry, which
                returns None as it did), or late (expired here first).
        """
        state = self._states.get(answer.id)
        same = state is not None and state.answer is not None and _same(state, answer, responder)
        deadline = state.request.expires_at if state is not None else None
        admission = admit(
            Item.VOTE if state is not None and state.request.quorum is not None else Item.ANSWER,
            state.status if state is not None else None,
            stored_same=None if state is None or state.answer is None else same,
            now_ms=int(time.time() * 1000),
            deadline_ms=int(deadline * 1000) if deadline is not None else 0,
            alive=True,
            durable=state is not None and state.request.durable,
        )
        match admission.outcome:
            case None:
                assert state is not None
            case Outcome.LATE:
                assert state is not None
                self._resolve_by_waiter(state, Status.EXPIRED)
                raise AlreadyResolved(answer.id, Status.EXPIRED)
            case Outcome.ANSWERED | Outcome.EXPIRED | Outcome.WITHDRAWN:
                if same:
                    return None  # this very answer resolved it: a retry
                raise AlreadyResolved(answer.id, Status(admission.outcome.value))
            case Outcome.CONTESTED if state is not None:  # the state is genuine: it lost
                raise AlreadyResolved(answer.id, state.status)
            case _:  # unknown (never contested without a deadline, which needs a state)
                raise UnknownRequest(answer.id)
        checked = check_answer(state.request, answer, responder)
        MSGPACK.encode_answer(checked)  # the size limit the Redis broker has
        if not allowed(state.request.allow, checked.responder, checked.person):
            raise NotAllowed(answer.id)
        if state.request.quorum is not None:
            return self._vote(state, checked)
        self._settle(state, Status.ANSWERED, checked)
        return None

    def _forget_old(self) -> None:
        horizon = time.monotonic() - self.retention_s
        while self._resolved:
            request_id, resolved_at = next(iter(self._resolved.items()))
            if resolved_at > horizon:
                break
            del self._resolved[request_id]
            self._states.pop(request_id, None)

    async def answer(self, answer: Answer) -> ApprovedEvent | None:
        return self._resolve(answer, None)

    async def audit(
        self, *, since: float | None = None, request_id: str | None = None, limit: int = 10_000
    ) -> list[AuditRecord]:
        check_audit_query(since, limit)
        records = [
            r
            for r in self._audit
            if (since is None or r.resolved_at >= since)
            and (request_id is None or r.id == request_id)
        ]
        return records[:limit]

    async def complete(self, request_id: str) -> None:
        if request_id in self._states:
            self._publish(CompletedEvent(id=request_id))

    # -- responder side -----------------------------------------------------------

    def responder(
        self, group: str, consumer: str | None = None, *, until_idle: bool = False
    ) -> MemoryResponder:
        if group not in self._groups:
            self._groups[group] = created = _Group()
            for request_id, state in self._states.items():
                if state.status == Status.OPEN:
                    created.queue.put_nowait(request_id)
        return MemoryResponder(
            self, group, consumer or default_consumer_name(), until_idle=until_idle
        )

    # -- events -------------------------------------------------------------------

    def _publish(self, event: Event) -> None:
        for subscriber in self._subscribers:
            subscriber.put_nowait(event)

    def events(self) -> MemoryEvents:
        return MemoryEvents(self)

    # -- heartbeats ---------------------------------------------------------------

    async def heartbeat(
        self,
        group: str,
        consumer: str,
        *,
        ttl_s: float,
        info: Mapping[str, str | int | float] | None = None,
    ) -> None:
        check_number("ttl_s", ttl_s, minimum=None)
        if ttl_s <= 0:
            self._heartbeats.pop((group, consumer), None)
            return
        beat = Heartbeat.fresh(group, consumer, ttl_s, info, writes=self._write_protocol)
        MSGPACK.encode(beat)  # what the Redis broker cannot store is refused here too
        self._heartbeats[group, consumer] = beat

    async def heartbeats(self) -> list[Heartbeat]:
        now = time.time()
        for key in [k for k, beat in self._heartbeats.items() if beat.expires_at <= now]:
            del self._heartbeats[key]
        return list(self._heartbeats.values())

    # -- stores -------------------------------------------------------------------

    def store(self, name: str, *, agent: bool = False) -> MemoryStore:
        Keys().store(name)  # the names the Redis broker takes
        return self._stores.setdefault(f"agent:{name}" if agent else name, MemoryStore(name))

    async def aclose(self) -> None:
        """Withdraw the waits still open (they end with ``BrokerClosed``, and their ends are
        audited, as on the Redis broker), then stop. A durable request stays open."""
        for state in list(self._states.values()):
            if state.waiting and state.status == Status.OPEN and not state.waiter.done():
                state.waiter.set_exception(BrokerClosed("the broker was closed during the wait"))
                if state.request.durable:  # its next wait attaches to it
                    state.waiter = asyncio.get_running_loop().create_future()
                else:
                    self._resolve_by_waiter(state, Status.WITHDRAWN)
        if self._looking is not None:
            self._looking.cancel()
            self._looking = None
        for queue in self._subscribers:
            queue.put_nowait(None)
        for responder in list(self._responders):
            await responder.aclose()


def _same(state: _State, answer: Answer, responder: str | None) -> bool:
    """Whether ``answer`` is the one ``state`` stores (sent again): as stored, checked and
    without the approvals a quorum's outcome gains."""
    try:
        checked = check_answer(state.request, answer, responder)
    except ToolnexusError:
        return False
    return (
        state.answer is not None
        and msgspec.structs.replace(state.answer, approvals=None) == checked
    )


class MemoryStore(Store):
    """A :class:`~toolnexus.Store` in this process: a dict that expires as a
    whole, as the Redis broker's hash does."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._entries: dict[str, bytes] = {}
        self._expires_at = 0.0  # time.monotonic()

    def _live(self) -> dict[str, bytes]:
        if self._entries and time.monotonic() >= self._expires_at:
            self._entries.clear()
        return self._entries

    async def get(self, key: str) -> bytes | None:
        check_store_entry(key)
        return self._live().get(key)

    async def set(self, key: str, value: bytes | str, *, ttl_s: float) -> None:
        self._keep(key, value, ttl_s, replace=True)

    async def claim(self, key: str, value: bytes | str, *, ttl_s: float) -> bool:
        return self._keep(key, value, ttl_s, replace=False)

    async def replace(self, key: str, old: bytes | str, new: bytes | str, *, ttl_s: float) -> bool:
        expected, data = check_store_replacement(key, old, new)
        check_number("ttl_s", ttl_s)
        entries = self._live()
        held = entries.get(key)
        if held == data:
            return True  # (as on Redis: this replacement, retried)
        if held != expected:
            return False
        return self._keep(key, data, ttl_s, replace=True)

    def _keep(self, key: str, value: bytes | str, ttl_s: float, *, replace: bool) -> bool:
        """Keep ``value`` (unless ``key`` has one and not ``replace``), extending the
        store's life; whether ``key`` holds ``value`` now. Nothing awaits: atomic."""
        data = check_store_entry(key, value)
        check_number("ttl_s", ttl_s)
        assert data is not None
        entries = self._live()
        until = time.monotonic() + max(1, math.ceil(ttl_s))  # whole seconds, as on Redis
        self._expires_at = max(self._expires_at, until) if entries else until
        if replace or key not in entries:
            entries[key] = data
        return entries[key] == data

    async def delete(self, key: str) -> None:
        check_store_entry(key)
        self._live().pop(key, None)

    async def items(self) -> dict[str, bytes]:
        return dict(self._live())


class MemoryPending(Pending):
    def __init__(self, responder: MemoryResponder, request: Request) -> None:
        self.request = request
        self.responder_name = f"{responder.group}/{responder.consumer}"
        self._responder = responder

    async def answer(self, answer: Answer) -> ApprovedEvent | None:
        try:
            progress = self._responder.broker._resolve(answer, self.responder_name)
        except (AlreadyResolved, UnknownRequest):
            self._responder.release(self)
            raise  # (NotAllowed and AlreadyVoted leave it held: another person may answer)
        if progress is None:  # a quorum's vote that did not decide leaves it held too
            self._responder.release(self)
        return progress

    async def skip(self) -> None:
        self._responder.release(self)


class MemoryResponder(Responder):
    def __init__(
        self, broker: MemoryBroker, group: str, consumer: str, *, until_idle: bool = False
    ) -> None:
        self.broker, self.group, self.consumer = broker, group, consumer
        self.until_idle = until_idle
        self._queue = broker._groups[group].queue
        self._held: dict[str, MemoryPending] = {}
        self._closed = False
        self._beating: asyncio.Future[None] | None = None
        broker._responders.add(self)

    async def _beat(self, ttl_s: float, info: Mapping[str, str | int | float]) -> None:
        await self.broker.heartbeat(self.group, self.consumer, ttl_s=ttl_s, info=info)

    async def __anext__(self) -> MemoryPending:
        if self._beating is None and not self._closed:
            self._beating = asyncio.ensure_future(self.keep_heartbeat(self._beat))
        while not self._closed:
            if self.until_idle and self._queue.empty():
                break
            getter = asyncio.ensure_future(self._queue.get())
            self._getter = getter
            try:
                request_id = await getter
            except asyncio.CancelledError:
                if self._closed:
                    break
                raise
            state = self.broker._states.get(request_id)
            if state is None or state.status != Status.OPEN or request_id in self._held:
                continue
            pending = MemoryPending(self, state.request)
            self._held[request_id] = pending
            return pending
        raise StopAsyncIteration

    def release(self, pending: MemoryPending) -> None:
        """Stop holding ``pending`` (answered or skipped)."""
        self._held.pop(pending.request.id, None)

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.broker._responders.discard(self)
        if self._beating is not None:  # it kept a heartbeat: it leaves
            self._beating.cancel()
            self.broker._heartbeats.pop((self.group, self.consumer), None)
        getter = getattr(self, "_getter", None)
        if getter is not None:
            getter.cancel()
        for request_id in self._held:  # at least once: what we held goes back to the group
            self._queue.put_nowait(request_id)
        self._held.clear()

    def __repr__(self) -> str:
        return f"<MemoryResponder {self.group}/{self.consumer} holding {len(self._held)}>"


class MemoryEvents(EventStream):
    def __init__(self, broker: MemoryBroker) -> None:
        self._broker = broker
        self._queue: asyncio.Queue[Event | None] = asyncio.Queue()
        broker._subscribers.add(self._queue)

    async def __anext__(self) -> Event:
        event = await self._queue.get()
        if event is None:
            raise StopAsyncIteration
        return event

    async def aclose(self) -> None:
        self._broker._subscribers.discard(self._queue)
        self._queue.put_nowait(None)
