"""``toolnexus ask`` and ``toolnexus answer``: a human approval gate for shell pipelines.

``ask`` publishes one request and waits; its exit status says how it ended
(the ``EXIT_*`` codes of :mod:`toolnexus.cli._exits`). ``answer`` resolves a request by id
from anywhere, through :meth:`Broker.answer <toolnexus.Broker.answer>` (validated, and
signed when ``TOOLNEXUS_SIGNING_KEY`` is set), then watches what the waiter makes of it:
its ``answered`` event says it took it; its request's state opened again says it refused
it (a waiter checks signatures and allow-lists itself); neither in time, "not confirmed".
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import msgspec

from .._broker import Broker, EventStream, connect
from .._question import question_schema
from ..errors import (
    BrokerUnavailable,
    ConfigurationError,
    Contested,
    InvalidAnswer,
    InvalidRequest,
    NotResolved,
    Refused,
)
from ..models import (
    DECLINED,
    DISMISSED,
    UNAVAILABLE,
    Answer,
    AnsweredEvent,
    Hop,
    OnExpiry,
    Quorum,
    Request,
    Source,
    new_id,
)
from ..redis_broker import RedisBroker, answer_or_refusal
from ..responders._serve import approvals_line
from ._exits import (
    EXIT_ACCEPTED,
    EXIT_ANSWERED,
    EXIT_DECLINED,
    EXIT_NOT_ANSWERED,
    EXIT_NOT_CONFIRMED,
    EXIT_REFUSED,
    EXIT_UNREACHABLE,
    exit_code,
    failed,
)
from ._ops import stored_answer


def load_schema(path: str) -> dict[str, Any]:
    """The JSON Schema form in file ``path``.

    Raises:
        ConfigurationError: the file cannot be read or is not a JSON object.
    """
    try:
        schema = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ConfigurationError(f"--schema {path}: cannot read a JSON schema: {exc}") from exc
    except RecursionError:
        raise ConfigurationError(f"--schema {path}: the JSON is nested too deep") from None
    if not isinstance(schema, dict):
        raise ConfigurationError(f"--schema {path}: a form schema is a JSON object")
    return schema


DEFAULT_AGENT = "toolnexus ask"
"""The agent ``ask`` names in its requests' source unless ``--agent`` says."""


def build_request(
    prompt: str,
    *,
    schema: dict[str, Any] | None = None,
    choices: Sequence[str] | None = None,
    kind: str | None = None,
    url: str | None = None,
    data: Any = None,
    agent: str | None = None,
    server: str | None = None,
    tool: str | None = None,
    meta: dict[str, Any] | None = None,
    quorum: Quorum | None = None,
    request_id: str | None = None,
    on_expiry: OnExpiry | None = None,
    durable: bool = False,
    escalate: Sequence[Hop] | None = None,
) -> Request:
    """The request ``ask`` publishes: an ``input`` form for a schema or for choices (a
    one-field form named ``answer``), an ``authorization`` with ``url`` (the page the person
    goes to), else an ``approval``, or ``kind`` when given (a kind agreed on with the
    responders, carrying ``data``); its source names ``agent`` (by default
    :data:`DEFAULT_AGENT`), ``server`` and ``tool``; with ``request_id`` (a fresh one if
    None), ``meta``, ``quorum``, ``on_expiry``, ``durable`` and ``escalate``
    (its hops) as given (SPEC §14).

    Raises:
        InvalidRequest: the schema is not a flat MCP form schema, choices are empty, or the
            options contradict each other: a form with a ``kind`` other than ``input`` or
            with ``data``, an ``authorization`` without ``url``, ``input`` without a form.
    """
    form = schema is not None or bool(choices)
    implied = "input" if form else "authorization" if kind is None and url else "approval"
    kind = kind or implied
    if form and kind != "input":
        raise InvalidRequest(f"--kind {kind}: a form (--schema, --choice) is an input request")
    if form and data is not None:
        raise InvalidRequest("--data: an input request's data is its form (--schema, --choice)")
    if kind == "input" and not form:
        raise InvalidRequest("--kind input needs a form: --schema FILE or --choice OPTION")
    if kind == "authorization" and not url:
        raise InvalidRequest("--kind authorization needs --link URL: the page to go to")
    common: dict[str, Any] = {
        "id": request_id or new_id(),
        "prompt": prompt,
        "url": url,
        "source": Source(server=server, tool=tool, agent=agent or DEFAULT_AGENT),
        "meta": dict(meta or {}),
        "quorum": quorum,
        "on_expiry": on_expiry,
        "durable": durable,
        "escalate": list(escalate) if escalate else None,
    }
    if form:
        data = {
            "schema": question_schema(options=list(choices) if choices else None, schema=schema)
        }
    return Request(kind=kind, data=data, **common)


def exit_status(answer: Answer) -> int:
    """The exit status of ``ask`` for ``answer``."""
    if answer.ok:
        return EXIT_ACCEPTED
    if answer.reason == DECLINED or answer.defaulted:  # declined, or by default on expiry
        return EXIT_DECLINED
    if answer.reason == UNAVAILABLE:
        return EXIT_UNREACHABLE
    return EXIT_NOT_ANSWERED


def answer_json(answer: Answer) -> str:
    """``answer`` as one JSON object (every field; a signature's bytes in base64)."""
    return json.dumps(msgspec.to_builtins(answer))


async def ask(
    url: str,
    options: dict[str, Any],
    request: Request,
    *,
    timeout_s: float | None,
    allow: Sequence[str] | None,
    as_json: bool,
) -> int:
    """Publish ``request``, wait up to ``timeout_s`` (None: the broker's default, or for a
    request that escalates the last hop's time plus that) and print the outcome; the exit
    status.

    Accepted: the answer's data as JSON on stdout (the whole answer with ``as_json``).
    Otherwise one line on stderr says why (and ``as_json`` prints the answer too). A
    responder that refuses the request (a missing or bad signature, ...) is reported on
    stderr at once; ``ask`` waits on while another group with a live heartbeat on the queue
    could still take it, and ends with :data:`EXIT_REQUEST_REFUSED` once none could
    (:class:`~toolnexus.errors.Refused`, see :meth:`RedisBroker.refusal`). The broker's
    warnings (nobody reads the queue, a refusal, one that does not verify) are printed on
    stderr as they come.
    """
    with _warnings_on_stderr():
        return await _ask(url, options, request, timeout_s=timeout_s, allow=allow, as_json=as_json)


@contextlib.contextmanager
def _warnings_on_stderr() -> Iterator[None]:
    """While ``ask`` waits, toolnexus's warnings go to stderr as ``toolnexus ask: ...``."""
    logger = logging.getLogger("toolnexus")
    handler = logging.StreamHandler(sys.stderr)
    handler.setLevel(logging.WARNING)
    handler.setFormatter(logging.Formatter("toolnexus ask: %(message)s"))
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)


async def _ask(
    url: str,
    options: dict[str, Any],
    request: Request,
    *,
    timeout_s: float | None,
    allow: Sequence[str] | None,
    as_json: bool,
) -> int:
    try:
        async with connect(url, **options) as broker:
            durably = "durably " if request.durable else ""
            hops = "".join(
                f", then {h.queue} after {h.after_s:g} s" for h in request.escalate or ()
            )
            up_to = "" if timeout_s is None else f", up to {timeout_s:g} s"
            print(
                f"toolnexus ask: waiting {durably}for an answer to {request.id} "
                f"(queue {options.get('queue', 'default')}{hops}{up_to})",
                file=sys.stderr,
                flush=True,
            )
            waiting = broker.wait_for(request, timeout_s=timeout_s, allow=allow or None)
            outcome = await answer_or_refusal(broker, request.id, waiting)
    except BrokerUnavailable as exc:
        return failed("toolnexus ask", exc, url)
    if isinstance(outcome, Refused):
        unverified = "" if outcome.verified else " (unverified)"
        left = "the durable request stays open" if request.durable else "withdrawn"
        print(f"toolnexus ask: {outcome}{unverified}: {left}", file=sys.stderr)
        return exit_code(outcome)
    return _said(request, outcome, as_json)


def _said(request: Request, answer: Answer, as_json: bool) -> int:
    """Print what ``ask`` says of ``answer`` to ``request``; its exit status."""
    if as_json:
        print(answer_json(answer))
    elif answer.ok:
        print(json.dumps(answer.data))
    if answer.defaulted:
        outcome = "accepted" if answer.ok else "declined"
        print(f"toolnexus ask: {request.id} expired: {outcome} by default", file=sys.stderr)
    elif not answer.ok:
        by = f" by {answer.answered_by}" if answer.answered_by else ""
        print(f"toolnexus ask: {request.id} {answer.reason}{by}", file=sys.stderr)
    return exit_status(answer)


def the_answer(
    request_id: str, *, accept: bool, data: Any, decline: bool, person: str | None
) -> Answer:
    """The answer ``toolnexus answer`` gives: accept (with ``data``), decline or dismiss."""
    if accept:
        return Answer(id=request_id, ok=True, data=data, person=person)
    reason = DECLINED if decline else DISMISSED
    return Answer(id=request_id, ok=False, reason=reason, person=person)


def reopened(why: str | None) -> str:
    """What ``answer`` says when the waiter refused the answer the broker stored, for reason
    ``why`` (as the waiter recorded it in the request's state; None: not known)."""
    because = f": {why}" if why else " (its log says why)"
    return f"the waiter refused it and opened the request again{because}"


CONFIRM_POLL_S = 0.1
"""How often ``answer`` looks whether the waiter opened the request again (refused it)."""


async def _fate(
    broker: Broker, given: Answer, stored: bytes | None, events: EventStream, within_s: float
) -> Answer | str | None:
    """What the waiter made of ``given``, which the broker stored as ``stored`` (None: not
    known here): the answer it took (its ``answered`` event), a refusal (the request opened
    again: the state no longer holds ``stored``), or None if neither was seen within
    ``within_s``."""

    async def taken() -> Answer | None:
        async for event in events:
            if isinstance(event, AnsweredEvent) and event.id == given.id:
                return event.answer
        return None

    seen = asyncio.create_task(taken())
    try:
        async with asyncio.timeout(within_s):
            while True:
                done, _ = await asyncio.wait({seen}, timeout=CONFIRM_POLL_S)
                if stored is not None and isinstance(broker, RedisBroker):
                    held, why = await stored_answer(broker, given.id)
                    if held != stored:
                        return reopened(why)
                if done:
                    return seen.result()
    except TimeoutError:
        return None
    finally:
        seen.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await seen


async def answer(url: str, options: dict[str, Any], given: Answer, *, confirm_s: float) -> int:
    """Resolve ``given.id`` with ``given``, wait up to ``confirm_s`` for its waiter to take
    or refuse it, and say what became of it; the exit status (see :mod:`toolnexus.cli._exits`).
    """
    try:
        async with connect(url, **options) as broker, broker.events() as events:
            fate: Answer | str | None = None
            stored: bytes | None = None
            try:
                progress = await broker.answer(given)
            except Contested:  # the waiter decides between them: see what it takes
                fate = await _fate(broker, given, None, events, confirm_s)
            else:
                if progress is not None:  # a quorum's vote (SPEC §14) that did not decide it
                    outcome = "accepted" if given.ok else str(given.reason)
                    print(f"{given.id}: {outcome}, counted: {approvals_line(progress)}")
                    return EXIT_ANSWERED
                if isinstance(broker, RedisBroker):
                    # the broker stored it: open again already means the waiter refused it
                    stored, why = await stored_answer(broker, given.id)
                    fate = reopened(why) if stored is None else None
                if fate is None:
                    fate = await _fate(broker, given, stored, events, confirm_s)
    except BrokerUnavailable as exc:
        return failed("toolnexus answer", exc, url)
    except NotResolved as exc:
        print(f"toolnexus answer: {given.id}: refused: {exc.reason}", file=sys.stderr)
        return exit_code(exc)
    except InvalidAnswer as exc:
        print(f"toolnexus answer: {given.id}: refused: {exc}", file=sys.stderr)
        return exit_code(exc)
    if isinstance(fate, str):
        print(f"toolnexus answer: {given.id}: refused: {fate}", file=sys.stderr)
        return EXIT_REFUSED
    if fate is None:
        print(
            f"toolnexus answer: {given.id}: sent, not confirmed: no waiter took it within "
            f"{confirm_s:g} s (it may yet: a busy or restarting waiter, or a durable request "
            "nobody waits for now)",
            file=sys.stderr,
        )
        return EXIT_NOT_CONFIRMED
    outcome = "accepted" if fate.ok else str(fate.reason)
    by = f" by {fate.answered_by}" if fate.answered_by else ""
    if (fate.ok, fate.reason) != (given.ok, given.reason):
        print(
            f"toolnexus answer: {given.id}: refused: the waiter took another answer "
            f"({outcome}{by})",
            file=sys.stderr,
        )
        return EXIT_REFUSED
    print(f"{given.id}: {outcome}{by}, taken by the waiter")
    return EXIT_ANSWERED
