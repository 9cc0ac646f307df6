"""The waiter side of the Redis broker: publish a request, wait for its answer.

A request's state hash is opened (a durable one's holds the request) and the request
``XADD``ed to the queue's request stream, its one home while it is open;
the publishes of one event-loop turn share one pipeline. Answers come back on this
process's reply stream, read by one blocking reader that wakes every concurrent wait
(a handful of connections for any number of waits) and renews this process's liveness
mark; one timer serves every deadline. The reply stream belongs to this waiter alone
and is read from its start, so an answer that arrives before the reader looks is never
missed. Every entry of it may be garbage: such an entry is dead-lettered, the reader
moves on, and the wait it names takes its outcome from the request's state. A responder
that dead-lettered the request says so on the reply stream (a refusal): one signed by a
trusted key, or any readable one when signatures are not required, is logged at once,
while the wait goes on: the refusing group settled the entry for itself only, and another
group may take the request (an operator may requeue it too). Once every group with a live
heartbeat on the request's queues has refused it, the refusal is given to whoever watches
for it (:meth:`Waiter.refusal`: ``toolnexus ask`` ends). With signatures required, any
other refusal is a hint that is logged.

Durable waits (SPEC §14) live under the agent's durable waiter of the queue, read by a second reader
of this code from the first durable wait on (:mod:`._durable`).

One of the three files that tell the architecture: the waiter side
(:mod:`toolnexus.redis_broker._waiter`), the responder side
(:mod:`toolnexus.redis_broker._responder`) and the key names (:mod:`toolnexus.keys`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Sequence
from typing import Any, Literal, TypeVar

import msgspec
import redis.exceptions

from .._broker import deadline_of
from .._hops import check_hops
from .._outcomes import check_on_expiry, expired_answer
from .._timers import Timers
from .._wire10 import Request10, as_request
from ..errors import BrokerClosed, DecodeError, InvalidRequest, Refused, SignatureError
from ..keys import Keys, check_request_id, new_waiter_id
from ..lifecycle import RESOLVED, Status
from ..models import (
    EXPIRED,
    UNAVAILABLE,
    WITHDRAWN,
    Answer,
    AnsweredEvent,
    Event,
    Request,
    Signature,
    ended_event,
)
from ..security._audit import Refusal
from ..security._signing import verify_refusal
from . import _durable as durable
from . import _quorum as quorum
from ._core import CONNECTION_ERRORS, Backoff, Core, ms, text
from ._durable import ReplyStream
from ._escalation import Escalator, parse_queues_field
from ._heartbeats import live_heartbeats
from ._layout import (
    ANSWER,
    ANSWER_B,
    CONTESTED_B,
    OPEN_B,
    REFUSAL_FIELDS,
    REPLY_ANSWER_B,
    REPLY_CONTESTED_B,
    REPLY_ID_B,
    STATUS,
    STATUS_B,
    RefusalFields,
    entry_protocol,
)
from ._publishing import Publisher
from ._scripts import REOPEN, TAKE
from ._wait import Wait, audit_of, ended, expire, status_of

log = logging.getLogger("toolnexus.redis")

T = TypeVar("T")

RESOLVE_PATIENCE_S = 2.0
"""How long a waiter retries recording its own expiry or withdrawal while Redis is away."""

ANOTHER_REQUEST = "signed for another request"
"""Why a refusal signed by a trusted key for another request than the one published does
not verify (see :func:`~toolnexus.security._signing.verify_refusal`)."""

REFUSAL_RECHECK_S = 5.0
"""While a refused request waits on for groups that have not refused it, how often its
waiter reads the heartbeats again: once none of those groups is alive, the refusal is
final (:meth:`Waiter.refusal`)."""

EXPIRY_SKEW_S = 2.0
"""An expiry recorded by a responder this close before the signed deadline (its clock a
little ahead of ours) is let be, not refused: this waiter's own deadline decides at once."""


class Waiter:
    """The waits of one broker object, with their reply stream and liveness mark."""

    def __init__(self, core: Core) -> None:
        self.core = core
        self.id = new_waiter_id(core.agent)
        self.answers_key = core.keys.answers(self.id)
        self.alive_key = core.keys.alive(self.id)
        self.waits: dict[str, Wait] = {}
        self.unreadable = 0  # reply-stream entries dead-lettered
        self.refused = 0  # answers refused by signature or allow-list checks
        self._refusals: dict[str, asyncio.Future[Refused]] = {}  # see refusal()
        self._own = ReplyStream(self.id, self.answers_key, self.alive_key, durable=False)
        shared = core.keys.durable_waiter(core.agent)
        self._durable = ReplyStream(
            shared, core.keys.answers(shared), core.keys.alive(shared), durable=True
        )
        self._durable_start = asyncio.Lock()
        self._deadlines: Timers[Wait] = Timers(expire, ended)  # one timer for every deadline
        self._escalator = Escalator(core)
        self.publisher = Publisher(core)
        self._background: set[asyncio.Task[Any]] = set()
        self.closing = False

    async def wait_for(
        self,
        request: Request | Request10,
        timeout_s: float | None,
        allow: Sequence[str] | None,
        durable_wait: bool = False,
    ) -> Answer:
        wait = self._open(request, timeout_s, allow, durable_wait)
        try:
            if wait.replies.durable and not await self._attach(wait):
                return Answer(id=wait.request_id, ok=False, reason=UNAVAILABLE)
            # The only wait sends its request itself, a turn sooner (see Pipeliner.sending).
            async with self.core.pipeliner.sending(len(self.waits) == 1):
                self._start(wait)
            answer = await wait.answer
        except asyncio.CancelledError:
            if not wait.replies.durable:  # a durable request outlives its waits
                self._spawn(self._end(wait, Status.WITHDRAWN))
            raise
        finally:
            del self.waits[wait.request_id]
            refusal = self._refusals.pop(wait.request_id, None)
            if refusal is not None and not refusal.done():
                refusal.cancel()
        if answer is not None:
            return self._answered(wait, answer)
        return await self._expired(wait)

    def refusal(self, request_id: str) -> asyncio.Future[Refused]:
        """A future set to the last refusal of request ``request_id`` (waited for by this
        waiter) once the refusals that count (see :meth:`_take_refusal`) leave no group
        alive that could still take it (see :meth:`_judge_refusals`); it is cancelled when
        the wait ends."""
        future = self._refusals.get(request_id)
        if future is None:
            future = self._refusals[request_id] = asyncio.get_running_loop().create_future()
        return future

    def _open(
        self,
        request: Request | Request10,
        timeout_s: float | None,
        allow: Sequence[str] | None,
        durable_wait: bool,
    ) -> Wait:
        """The checked, encoded and registered wait for ``request`` (a method of its own,
        so that what it computes does not live on in every waiting coroutine's frame)."""
        core = self.core
        if core.closed or self.closing:
            raise BrokerClosed("the broker is closed")
        request = as_request(request)
        problem = check_request_id(request.id)
        if problem is not None:
            raise InvalidRequest(f"request id {request.id[:100]!r}: {problem}")
        if request.id in self.waits:
            raise InvalidRequest(f"request {request.id!r} is already being waited for")
        check_on_expiry(request)
        if durable_wait and not request.durable:
            request = msgspec.structs.replace(request, durable=True)
        replies = self._durable if request.durable else self._own
        deadline = min(
            deadline_of(request, timeout_s, core.settings.default_timeout_s),
            time.time() + core.settings.stream_retention_s,
        )
        check_hops(request, deadline, core.keys.queue)
        published = self.publisher.as_published(request, deadline, allow, replies.waiter)
        signatures = core.signatures
        payload = core.codec.encode_request(signatures.sign_request(published))
        checked = self._checks(published)
        keeps = checked or replies.durable or signatures.key is not None
        wait = Wait(
            request.id,
            request,
            deadline,
            allow,
            ms(deadline),
            asyncio.get_running_loop().create_future(),
            checked,
            replies,
            payload,
            keeps,
            protocol=core.protocol,
        )
        wait.quorum = request.quorum is not None
        self.waits[request.id] = wait  # registered before it is published
        return wait

    def _start(self, wait: Wait) -> None:
        """Read answers, set the deadline, publish (unless an attach found an outcome) and
        plan the hops of ``wait``."""
        replies, loop = wait.replies, asyncio.get_running_loop()
        if not replies.durable and (replies.reader is None or replies.reader.done()):
            replies.reader = loop.create_task(self._read_replies(replies), name="toolnexus-answers")
        self._deadlines.add(loop.time() + wait.deadline_ms / 1000 - time.time(), wait)
        if wait.answer.done():
            return
        self.publisher.publish(wait)
        if wait.asked.escalate:  # as stored: an attached wait goes on with its hops
            publisher = self.publisher
            wait.escalation = self._escalator.plan(
                publisher.published(wait),
                wait,
                replies,
                publisher.payload(wait),
                wait.reached,
            )

    def _answered(self, wait: Wait, answer: Answer) -> Answer:
        """What the waiter of ``wait`` gets for ``answer``, which the state recorded. Its
        audit record and outcome event are made once the next commands are written
        (:meth:`_record`), and go out with the commands after."""
        self.core.pipeliner.after_send(functools.partial(self._record, wait, answer))
        if answer.reason == WITHDRAWN:  # not by us: Redis took us for dead
            return Answer(id=wait.request_id, ok=False, reason=UNAVAILABLE, meta=answer.meta)
        return answer

    def _record(self, wait: Wait, answer: Answer) -> None:
        """The audit record and the outcome event of ``wait``, ended with ``answer``."""
        status = status_of(answer)
        if status == Status.ANSWERED:
            if answer.reason == UNAVAILABLE and not wait.published:  # Redis refused it
                self._ended(wait, answer, "unavailable")
                return
            # The waiter tells responders: it is the one party sure to learn the answer
            # (a responder may die between resolving and saying so). Groups that have
            # not read the entry yet never will.
            event: Event = AnsweredEvent(id=wait.request_id, answer=answer)
            self._ended(wait, answer, status, event)
            return
        wait.recorded = True  # an expiry or withdrawal another party resolved, and recorded
        event = ended_event(status, wait.request_id, answer)
        # a responder recorded it on one queue; its hops learn of it here
        self._ended(wait, answer, status, event if wait.escalation is not None else None)

    async def _expired(self, wait: Wait) -> Answer:
        """The outcome of ``wait`` at its deadline: recorded as expired, unless an answer
        won the race. Cancelling this call leaves the recording to finish on its own."""
        if not wait.published:  # it may still land: make sure nobody answers it
            unavailable = Answer(id=wait.request_id, ok=False, reason=UNAVAILABLE)
            self._ended(wait, unavailable, Status.EXPIRED)
            self._spawn(self._resolve_by_waiter(wait, Status.EXPIRED))
            return unavailable
        return await asyncio.shield(self._spawn(self._end(wait, Status.EXPIRED)))

    async def _end(self, wait: Wait, status: Literal[Status.EXPIRED, Status.WITHDRAWN]) -> Answer:
        """Resolve the request of ``wait`` as ``status`` (its deadline passed, or it was
        cancelled or closed) and record how it ended: the answer that won."""
        outcome = await self._resolve_by_waiter(wait, status)
        self._ended(wait, outcome, status_of(outcome))
        return outcome

    def _ended(self, wait: Wait, answer: Answer, status: str, event: Event | None = None) -> None:
        """``wait`` ended with ``answer``: publish ``event`` (if any) and add the wait's
        audit record (as ``status``) unless its end has one.

        Every end of a wait has exactly one record (threat-model line S8). The waiter
        writes it for an end it resolved itself (expiry, withdrawal on cancellation or
        ``aclose()``), an answer it took, or a publish Redis refused. An expiry or
        withdrawal another party resolved (a responder's
        :func:`~toolnexus.redis_broker._answering.finish`, another process's wait on a
        durable request) was recorded by that party: the waiter marks the wait
        ``recorded`` when it learns of it, and writes none. A durable wait that ends
        without ending its request (cancelled, closed) writes none either."""
        core = self.core
        audit = None
        if not wait.recorded:
            wait.recorded = True
            audit = audit_of(core, wait, self.publisher.published(wait), status, answer)
        if audit is not None:  # the agent's own stream (S8), in the same pipeline
            core.record(audit)
        if event is not None:
            self._settle(wait, event)

    # -- publishing ---------------------------------------------------------------

    def _checks(self, published: Request) -> bool:
        """Whether answers to ``published`` are checked (signatures in use, an allow-list)."""
        signatures = self.core.signatures
        return signatures.required or bool(len(signatures.keyring)) or bool(published.allow)

    async def _attach(self, wait: Wait) -> bool:
        """Open the durable request of ``wait``, or attach to the one stored (SPEC §14):
        take over its published request and signed deadline, and a stored outcome, as far
        as signed material and this process's clock support it (SPEC §11, see
        :mod:`._durable`), as the wait's answer. False if Redis stayed away.

        Raises:
            InvalidRequest: the stored request with this id is not this process's own, or
                asks something else.
        """
        core, replies = self.core, wait.replies
        mine = self.publisher.published(wait)
        try:  # its reader first, so that no answer is missed from the attach on
            await durable.start_reader(core, replies, self._durable_start, self._read_replies)
            for _ in range(3):  # a stale state replaced by another wait meanwhile: read again
                payload = self.publisher.payload(wait)
                stored = await durable.attach(
                    core, replies.waiter, wait.request_id, payload, wait.deadline_ms
                )
                if stored is None:
                    return True  # opened by this wait
                request = durable.stored_request(core, stored, mine)
                if request is not None:
                    break
                log.warning("durable request %s is stale: asked afresh", wait.request_id)
                if await durable.renew(core, replies.waiter, stored, payload, wait.deadline_ms):
                    self.publisher.publish(wait, again=True)  # whatever its old route says
                    return True
            else:
                log.error("durable request %s keeps changing under this attach", wait.request_id)
                return False
            wait.payload = stored.payload  # (readable: stored_request read it)
            wait.protocol = core.codec.decode_with_protocol(stored.payload)[0]
            wait.deadline_ms = ms(request.expires_at or 0)  # signed (stored_request checks it)
            wait.checked = self._checks(request)
            wait.quorum = request.quorum is not None
            reached = parse_queues_field(stored.queues)  # hints: see Escalator.plan
            if stored.status == Status.OPEN:  # published already if its route says so
                wait.reached = reached
                wait.entry_id = next(
                    (e.encode() for q, e in reached if q == core.keys.queue and e), None
                )
                return True
            if await self._attach_ended(wait, request, stored):
                wait.reached = reached
                return True
            # Ended before its signed deadline with no answer it may take: a hint. Opened
            # again and published afresh, so that responders can answer.
            if await durable.renew(core, replies.waiter, stored, stored.payload, wait.deadline_ms):
                log.warning("durable request %s opened again", wait.request_id)
            self.publisher.publish(wait, again=True)  # on every queue: see Escalator.plan
        except (*CONNECTION_ERRORS, BrokerClosed, redis.exceptions.RedisError) as exc:
            log.error("attaching to %s failed: %s", wait.request_id, exc)  # e.g. NOPERM
            return False
        return True

    async def _attach_ended(self, wait: Wait, request: Request, stored: durable.Stored) -> bool:
        """Whether the durable state ``stored`` (not open) of ``request`` gives ``wait`` its
        outcome, or has it given: an answer the wait takes from the state (the stored one
        or one contested with it, each checked: :meth:`_from_state`; a quorum's votes,
        reopened if refused), or the deadline past by this process's clock (the outcome
        from the signed request). False: a hint, the wait goes on.

        Raises:
            redis-py connection errors, BrokerClosed: the state cannot be read.
        """
        if wait.quorum and stored.answer is not None:
            try:
                answer = self.core.codec.decode_as(stored.answer, Answer)
            except DecodeError as exc:
                log.error("the stored answer to %s is unreadable: %s", wait.request_id, exc)
            else:
                if answer.reason not in (EXPIRED, WITHDRAWN):
                    taken = await self._taken(wait, answer, stored.answer)
                    if taken is not None and not wait.answer.done():
                        wait.answer.set_result(taken)
                    return True  # taken, or refused and opened again if short
        elif not wait.quorum:
            taken = await self._from_state(wait)
            if taken is not None and not wait.answer.done():
                wait.answer.set_result(taken)
        if durable.expired_by_clock(request) and not wait.answer.done():
            wait.answer.set_result(expired_answer(request))
        return wait.answer.done()

    # -- resolving our own requests -----------------------------------------------

    async def _resolve_by_waiter(
        self, wait: Wait, status: Literal[Status.EXPIRED, Status.WITHDRAWN]
    ) -> Answer:
        """Resolve our own request as expired or withdrawn; the answer that won either way.

        If Redis stays unreachable for ``RESOLVE_PATIENCE_S``, the outcome is decided
        here: the resolve script refuses any answer after the deadline anyway. What is
        stored is signed with this process's key, if it has one, so that a responder
        answering afterwards can tell this end from an edited state (it trusts agents' keys)
        and is told at once that it lost; the answer returned names nobody. A plain
        request's plain end (no key to sign with, no default answer) stores no answer: the
        state's status says it all, and a late answer is told it (see
        :func:`~toolnexus.redis_broker._answering.resolve_answer`).
        """
        core = self.core
        published = self.publisher.published(wait)
        if status == Status.EXPIRED:
            answer = expired_answer(published)
        else:
            answer = Answer(id=wait.request_id, ok=False, reason=WITHDRAWN)
        signed = core.signatures.sign_answer(answer, published)
        # A plain end of a plain request (unsigned, no default): the state's status says it
        # all, and this process learns it from the script's reply (see RESOLVE).
        plain = signed.signature is None and not answer.defaulted and not wait.replies.durable
        payload = b"" if plain else core.codec.encode(signed, wait.protocol)
        backoff = Backoff(cap_s=0.5)
        give_up = time.monotonic() + RESOLVE_PATIENCE_S
        while True:
            try:
                outcome, stored, _ = await core.resolve(
                    wait.replies.waiter, answer.id, status, payload
                )
                break
            except BrokerClosed:
                return answer
            except CONNECTION_ERRORS as exc:
                if core.closed or time.monotonic() > give_up:
                    return answer
                await backoff.wait(f"resolving {answer.id} as {status}", exc)
            except redis.exceptions.RedisError as exc:
                log.error("resolving %s as %s failed: %s", answer.id, status, exc)
                return answer
        if outcome == "ok":
            self._settle(wait, ended_event(status, answer.id, answer))
            return answer
        try:
            if wait.quorum:
                taken = None
                if stored is not None:
                    decoded = core.codec.decode_as(stored, Answer)
                    taken = await self._taken(wait, decoded, stored, False)
            else:  # the stored answer, or one contested with it, if one is valid
                taken = await self._from_state(wait)
        except DecodeError as exc:
            log.error("the stored answer to %s is unreadable: %s", answer.id, exc)
        except (*CONNECTION_ERRORS, BrokerClosed, redis.exceptions.RedisError) as exc:
            log.error("the state of %s cannot be read: %s", answer.id, exc)
        else:
            if taken is not None:
                if taken.reason in (EXPIRED, WITHDRAWN):  # another party's end
                    wait.recorded = True  # and record (see _ended)
                escalated = wait.escalation is not None
                if escalated and outcome in RESOLVED:
                    self._settle(wait, ended_event(Status(outcome), answer.id, taken))
                return taken
        return answer  # what the state holds is unreadable or refused: the deadline's

    def _settle(self, wait: Wait, event: Event) -> None:
        """Publish the outcome ``event`` and delete the request's entry, on its queue and
        on every queue it escalated to."""
        self.core.settle(event, delete=wait.entry_id, protocol=wait.protocol)
        if wait.escalation is not None:
            self._escalator.settle(wait.escalation, event)

    # -- checking answers ---------------------------------------------------------

    def _accept(self, wait: Wait, answer: Answer, raw: bytes, reopen: bool = True) -> Answer | None:
        """``answer`` as the wait may take it (``responder`` the verified key name), or None
        if it is refused: a forgery, an answer to another request, an answer by a key not
        trusted or a responder the allow-list excludes. A refused answer is recorded, and
        with ``reopen`` the request is opened again if the state holds it.

        The broker's reasons are judged here whoever sent them (threat model S1, S2): an
        expiry only once this process's clock has passed the signed deadline, and then it is
        the signed request's default on expiry, whatever the answer carried; ``unavailable``
        is this waiter's own outcome, never another's; a withdrawal carries no answer and,
        with checks on, must be signed by a trusted key the allow-list admits."""
        refusal: str | None = None
        name: str | None = None
        if answer.reason == EXPIRED:
            left_s = wait.deadline_ms / 1000 - time.time()
            if left_s <= 0:
                return expired_answer(self.publisher.published(wait))
            if left_s < EXPIRY_SKEW_S:  # a responder's clock a little ahead: ours decides
                return None
            refusal = "expired before its deadline"
        elif answer.reason == UNAVAILABLE:
            refusal = "unavailable is the waiter's own outcome"
        elif answer.reason == WITHDRAWN and (answer.ok or answer.data is not None):
            refusal = "a withdrawal carries no answer"
        elif answer.reason == WITHDRAWN and wait.replies.durable:
            refusal = "a durable request is not withdrawn"
        elif wait.checked:
            try:
                name = self.core.signatures.admit_answer(answer, self.publisher.published(wait))
            except SignatureError as exc:
                refusal = exc.reason
        if refusal is not None:
            self.refused += 1
            log.warning("refused an answer to %s: %s", wait.request_id, refusal)
            if wait.refusals is None:
                wait.refusals = []
            wait.refusals.append(Refusal.of(answer, refusal))
            if reopen:
                self._spawn(self._reopen(wait, raw, refusal))
            return None
        if answer.defaulted or answer.approvals is not None:
            # Not signed, and never a responder's to give: a default is this waiter's own
            # (expired_answer above), approvals are counted from verified votes (quorum).
            answer = msgspec.structs.replace(answer, defaulted=False, approvals=None)
        if not wait.checked:
            return answer
        signatures = self.core.signatures
        if signatures.required or len(signatures.keyring):
            wait.verified = name is not None
        if name is not None and name != answer.responder:
            return msgspec.structs.replace(answer, responder=name)
        return answer

    async def _taken(
        self, wait: Wait, answer: Answer, raw: bytes, reopen: bool = True
    ) -> Answer | None:
        """As :meth:`_accept`; for a quorum (``raw`` a vote its reply stream brought: the
        deciding one, or a contested one), the outcome of its votes, each checked
        (:func:`._quorum.outcome`; with ``reopen``, reopened if short)."""
        if not wait.quorum:
            return self._accept(wait, answer, raw, reopen)
        request = self.publisher.published(wait)
        admit = functools.partial(self._accept, wait, reopen=False)
        republish = functools.partial(self.publisher.publish, wait, again=True) if reopen else None
        return await quorum.outcome(self.core, wait, request, raw, admit, republish)

    async def _reopen(self, wait: Wait, refused: bytes, why: str) -> None:
        """After ``refused``, the answer the state held, was refused (for reason ``why``):
        take an answer that was contested with it, if one is valid (threat model S4); else
        open the request again if its state still holds the refused answer, saying ``why``
        in the state, and publish it again (responders acknowledged its entry when they
        answered)."""
        core = self.core
        with contextlib.suppress(*CONNECTION_ERRORS, BrokerClosed, redis.exceptions.RedisError):
            if not wait.quorum:
                taken = await self._from_state(wait, refused)
                if taken is not None:
                    if not wait.answer.done():
                        wait.answer.set_result(taken)
                    return
            replies = wait.replies
            reopened = await core.pipeliner.batch(
                REOPEN,
                (replies.key, replies.alive_key),
                (),
                (core.keys.state(replies.waiter, wait.request_id),),
                (refused, why[:200]),
            )
            if reopened and not wait.answer.done():
                log.warning("request %s opened again after a refused answer", wait.request_id)
                self.publisher.publish(wait, again=True)

    async def _from_state(self, wait: Wait, refused: bytes | None = None) -> Answer | None:
        """The answer ``wait`` takes from its state, read now: the stored answer of a
        resolved state if it is valid, else the earliest valid answer contested with it
        (see the RESOLVE script), which the state then records (TAKE). Invalid ones are
        refused and recorded (but ``refused``, refused already), never reopened from here.

        Raises:
            redis-py connection errors, BrokerClosed: the state cannot be read.
        """
        core, replies = self.core, wait.replies
        state = core.keys.state(replies.waiter, wait.request_id)
        fields: dict[bytes, bytes] = await core.command("HGETALL", state)
        stored = fields.get(ANSWER_B) if fields.get(STATUS_B) != OPEN_B else None
        contested: list[tuple[float, Answer, bytes]] = []
        candidates: list[tuple[Answer, bytes]] = []
        for name, raw in fields.items():
            if (raw is not stored and not name.startswith(CONTESTED_B)) or raw == refused:
                continue
            try:
                answer = core.codec.decode_as(raw, Answer)
            except DecodeError as exc:
                log.error("an answer in the state of %s is unreadable: %s", wait.request_id, exc)
                continue
            if answer.id != wait.request_id:
                continue
            if raw is stored:
                candidates.insert(0, (answer, raw))
            else:
                contested.append((answer.answered_at, answer, raw))
        contested.sort(key=lambda item: item[0])
        candidates += [(answer, raw) for _, answer, raw in contested]
        for answer, raw in candidates:
            taken = self._accept(wait, answer, raw, reopen=False)
            if taken is not None:
                if raw is not stored:
                    self._record_taken(wait, raw)
                return taken
        return None

    def _record_taken(self, wait: Wait, raw: bytes) -> None:
        """Record in the state of ``wait`` the contested answer ``raw`` it took (threat
        model S4): later answers are refused as answered, an attach finds it, and the
        responder that sent it learns that it won."""
        core, replies = self.core, wait.replies
        core.pipeliner.post_batch(
            TAKE,
            (replies.key, replies.alive_key),
            (core.settings.retention_ms,),
            (core.keys.state(replies.waiter, wait.request_id),),
            (raw,),
            lazy=False,
        )

    # -- reading answers ----------------------------------------------------------

    async def _read_replies(self, replies: ReplyStream) -> None:
        """The one blocking reader of this process's reply stream (it renews the liveness
        mark), or of its queue's durable one. It never stops before the broker closes: any
        failure is logged and retried with backoff, from the position it had reached."""
        core = self.core
        settings = core.settings
        reader = None
        read_since_trim = 0
        backoff = Backoff()
        reconnected = False
        loop = asyncio.get_running_loop()
        renew_at = 0.0
        renew_s = settings.liveness_ms / 3000
        try:
            while not core.closed:
                try:
                    if reader is None:
                        reader = core.blocking_reader()
                    if reconnected:
                        await self._reconcile(replies)
                        reconnected = False
                    now = loop.time()
                    if not replies.durable and now >= renew_at:
                        renew_at = now + renew_s
                        core.pipeliner.post(
                            "SET", self.alive_key, core.liveness_value, "PX", settings.liveness_ms
                        )
                    # An idle reader blocks until the next renewal is due, not block_ms: an
                    # idle agent costs one XREAD and one SET per third of liveness_ms.
                    due = now + renew_s if replies.durable else renew_at
                    block_ms = max(1, int((due - now) * 1000))
                    entries = await reader.xread(replies.key, replies.last_id, 1000, block_ms)
                    backoff.reset()
                except BrokerClosed:
                    break
                except CONNECTION_ERRORS as exc:
                    reconnected = True
                    if reader is not None:  # its connection may be mid-reply: start afresh
                        await reader.aclose()
                        reader = None
                    await backoff.wait("reading answers", exc)
                    continue
                except Exception as exc:  # e.g. WRONGTYPE: the key was overwritten
                    log.exception("reading answers failed; retrying")
                    await backoff.wait("reading answers", exc)
                    continue
                for entry_id, fields in entries:
                    replies.last_id = text(entry_id)  # Redis entry ids are ASCII
                    self._take(replies, replies.last_id, fields or {})
                read_since_trim += len(entries)
                if read_since_trim >= 1000:  # others read a durable stream: trimmed by age
                    read_since_trim = 0
                    bound = durable.min_id() if replies.durable else replies.last_id
                    core.pipeliner.post("XTRIM", replies.key, "MINID", "~", bound)
                if entries:
                    # One turn for the waits just woken to run, one for the pipeline they
                    # started to go out: their next requests do not wait behind this read.
                    await asyncio.sleep(0)
                    await asyncio.sleep(0)
        finally:
            if reader is not None:
                await reader.aclose()

    def _take(self, replies: ReplyStream, entry_id: str, fields: dict[bytes, bytes]) -> None:
        """Hand the answer of one reply-stream entry (in protocol 1 or 2) to its wait;
        dead-letter garbage, and an entry of a newer protocol."""
        request_id: str | None = None
        try:
            names = REFUSAL_FIELDS[entry_protocol(fields, "reply entry")]
            if names.reason_b in fields:
                self._take_refusal(replies, fields, names)
                return
            raw_id = fields.get(REPLY_ID_B)
            if raw_id is None:
                raise DecodeError("the entry has no 'id' field")
            try:
                request_id = raw_id.decode()
            except UnicodeDecodeError:
                raise DecodeError("the entry's 'id' field is not UTF-8 text") from None
            payload = fields.get(REPLY_ANSWER_B)
            if payload is None:
                raise DecodeError("the entry has no 'a' field holding an answer")
            answer = self.core.codec.decode_as(payload, Answer)
            if answer.id != request_id:
                raise DecodeError(
                    f"the entry for {request_id[:100]!r} holds an answer to {answer.id[:100]!r}"
                )
        except DecodeError as exc:
            self.unreadable += 1
            self.core.copy_to_dead_letters(replies.key, entry_id, fields, str(exc))
            wait = self.waits.get(request_id) if request_id is not None else None
            if wait is not None and wait.replies is replies:
                self._spawn(self._take_from_state(wait))
            return
        wait = self.waits.get(request_id)
        if wait is None or wait.replies is not replies or wait.answer.done():
            return
        if wait.quorum:
            self._spawn(self._take_votes(wait, answer, payload))
        elif REPLY_CONTESTED_B in fields:  # contested (see RESOLVE): the state holds another
            taken = self._accept(wait, answer, payload, reopen=False)
            if taken is not None:
                wait.answer.set_result(taken)
                self._record_taken(wait, payload)
        else:
            taken = self._accept(wait, answer, payload)
            if taken is not None:
                wait.answer.set_result(taken)

    def _take_refusal(
        self, replies: ReplyStream, fields: dict[bytes, bytes], names: RefusalFields
    ) -> None:
        """A responder's refusal of a request (see :meth:`RedisResponder.refuse
        <toolnexus.redis_broker.RedisResponder.refuse>`): it counts (logged, and given to
        :meth:`refusal`) if signed by a trusted key for exactly the request this waiter
        published, or if signatures are not required; otherwise it is only logged, as a
        hint (Redis is untrusted). Either way the wait goes on."""
        try:
            request_id = fields.get(REPLY_ID_B, b"").decode()
            reason = fields[names.reason_b].decode()
            by = fields.get(names.by_b, b"").decode() or None
            key = fields[names.key_b].decode() if names.key_b in fields else None
        except UnicodeDecodeError:
            log.warning("an unreadable refusal on the reply stream was let be")
            return
        wait = self.waits.get(request_id)
        if wait is None or wait.replies is not replies or wait.answer.done():
            return
        signatures = self.core.signatures
        name: str | None = None
        problem = "missing signature"
        if key is not None and names.sig_b in fields:
            sig, digest = fields[names.sig_b], fields.get(names.digest_b)
            signature = Signature(key=key, sig=sig, digest=digest)
            try:
                payload = self.publisher.payload(wait)
                name = verify_refusal(request_id, payload, reason, signature, signatures.keyring)
            except SignatureError as exc:
                problem = exc.reason
        if problem == ANOTHER_REQUEST:
            self._publish_again(wait)
        if name is None and signatures.required:
            log.warning(
                "a refusal of request %s that does not verify (%s) was let be, the wait goes "
                "on; it said: %s (by %s)",
                request_id,
                problem,
                reason[:200],
                by or "nobody named",
            )
            return
        who = name or by
        log.warning(
            "request %s was refused by %s: %s%s; it waits on, for another responder or a "
            "requeue of its dead letter (toolnexus dead-letters)",
            request_id,
            who or "a responder",
            reason,
            "" if name is not None else " (unverified: not signed by a key this process trusts)",
        )
        # The consumer's name is "group/consumer"; a refusal that names none strikes every
        # group: it is final at once, as it was before groups were told apart.
        group = by.partition("/")[0] if by and "/" in by else ""
        first = wait.refused_by is None
        wait.refused_by = {**(wait.refused_by or {}), group: (reason, who, name is not None)}
        self._spawn(self._judge_refusals(wait, again_s=REFUSAL_RECHECK_S if first else None))

    async def _judge_refusals(self, wait: Wait, again_s: float | None) -> None:
        """Give the last refusal of ``wait`` to :meth:`refusal` once no group that could
        still take the request is alive: every group with a live heartbeat on its queues
        (this broker's, and the queues it escalates to) has refused it, or a refusal named
        no group. With ``again_s``, look again that often until then, or until the wait
        ends (a group that could answer may stop). Redis being away only postpones it."""
        told = False
        while not wait.answer.done() and wait.refused_by:
            others: set[str] | None = set()
            if "" not in wait.refused_by:
                others = None
                with contextlib.suppress(
                    *CONNECTION_ERRORS, BrokerClosed, redis.exceptions.RedisError
                ):
                    others = await self._live_groups(wait) - wait.refused_by.keys()
            if others is not None and not others and not wait.answer.done():
                reason, who, verified = list(wait.refused_by.values())[-1]
                future = self.refusal(wait.request_id)
                if not future.done():
                    future.set_result(Refused(wait.request_id, reason, who, verified))
                return
            if others and not told:
                told = True
                log.warning(
                    "request %s: group(s) %s, alive on its queue, may still take it",
                    wait.request_id,
                    ", ".join(sorted(others)),
                )
            if again_s is None:
                return
            await asyncio.wait({wait.answer}, timeout=again_s)  # wakes when the wait ends

    async def _live_groups(self, wait: Wait) -> set[str]:
        """The groups with a live heartbeat on the queues ``wait``'s request goes to."""
        core = self.core
        keys = [core.keys.heartbeats()]
        if wait.escalation is not None:
            namespace = core.settings.namespace
            hops = {hop.queue for hop in wait.escalation.hops} - {core.keys.queue}
            keys += [Keys(namespace, queue).heartbeats() for queue in sorted(hops)]
        groups: set[str] = set()
        for key in keys:
            groups.update(beat.group for beat in await live_heartbeats(core, key))
        return groups

    def _publish_again(self, wait: Wait) -> None:
        """A trusted responder refused, under this id, a request that is not the one
        ``wait`` published: its entry was replaced (a plain request's state does not hold
        it, so answering by id reads it from the entry its route names). Publish the
        genuine request again, once per wait, so that responders and answers by id find
        it: a new entry, and the route names it."""
        if wait.republished or not wait.published:
            return
        wait.republished = True
        log.warning(
            "request %s: a trusted responder saw another request under its id (its entry "
            "was replaced?): published again",
            wait.request_id,
        )
        self.publisher.publish(wait, again=True)

    async def _take_votes(self, wait: Wait, answer: Answer, raw: bytes) -> None:
        """Hand a quorum's outcome to its wait, once the votes are checked; if Redis is
        away, the wait takes it from the state later (reconnect or deadline)."""
        with contextlib.suppress(*CONNECTION_ERRORS, BrokerClosed, redis.exceptions.RedisError):
            taken = await self._taken(wait, answer, raw)
            if taken is not None and not wait.answer.done():
                wait.answer.set_result(taken)

    async def _take_from_state(self, wait: Wait) -> None:
        """The answer of ``wait`` from its state, after its reply-stream entry was unreadable.
        If nothing there is valid, the wait goes on to its deadline."""
        with contextlib.suppress(*CONNECTION_ERRORS, BrokerClosed, redis.exceptions.RedisError):
            if wait.quorum:
                state = self.core.keys.state(wait.replies.waiter, wait.request_id)
                status, stored = await self.core.command("HMGET", state, STATUS, ANSWER)
                if stored is None or status == OPEN_B:
                    return
                try:
                    answer = self.core.codec.decode_as(stored, Answer)
                except DecodeError as exc:
                    log.error("the stored answer to %s is unreadable: %s", wait.request_id, exc)
                    return
                taken = await self._taken(wait, answer, stored)
            else:
                taken = await self._from_state(wait)
            if taken is not None and not wait.answer.done():
                wait.answer.set_result(taken)

    async def _reconcile(self, replies: ReplyStream) -> None:
        """After a reconnect: take answers from state, republish requests Redis lost."""
        waits = [w for w in self.waits.values() if w.published and w.replies is replies]
        keys = [self.core.keys.state(replies.waiter, w.request_id) for w in waits]
        exists = await asyncio.gather(*(self.core.command("EXISTS", k) for k in keys))
        for wait, found in zip(waits, exists, strict=True):
            if not found:
                log.warning("request %s was lost by Redis; publishing it again", wait.request_id)
                self.publisher.publish(wait)
            elif not wait.answer.done():
                await self._take_from_state(wait)

    # -- lifecycle ----------------------------------------------------------------

    def _spawn(self, coro: Awaitable[T]) -> asyncio.Future[T]:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    async def aclose(self) -> None:
        """Withdraw the waits still open (they end with ``BrokerClosed``), then stop. Durable
        waits end too, but their requests stay open for the next wait (a deploy)."""
        self.closing = True
        open_waits = [w for w in self.waits.values() if not w.answer.done()]
        for wait in open_waits:
            wait.answer.set_exception(BrokerClosed("the broker was closed during the wait"))
            if not wait.replies.durable:
                self._spawn(self._end(wait, Status.WITHDRAWN))
        if self._background:
            await asyncio.wait(self._background, timeout=RESOLVE_PATIENCE_S + 1)
        if self._own.reader is not None:
            with contextlib.suppress(*CONNECTION_ERRORS, BrokerClosed):
                self.core.pipeliner.post("DEL", self.alive_key, lazy=False)
        for reader in (self._own.reader, self._durable.reader):
            if reader is not None and not reader.done():
                reader.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await reader
        self.publisher.close()
        self._deadlines.close()
        self._escalator.close()
