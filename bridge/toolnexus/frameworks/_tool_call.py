"""The tool-approval request: a framework's "may this tool run with these arguments?" as
one :class:`~toolnexus.Request` of ``kind="tool_call"``, and the typed decision its
:class:`~toolnexus.Answer` gives.

The request's ``data`` layout::

    {
      "schema": {...},        # the tool's JSON input schema, each property's "default" set
                              # to the proposed argument: a form opens pre-filled, and an
                              # answer that leaves it as it is approves the proposal
      "tool_call": {
        "name": "transfer_funds",
        "arguments": {"to": "ACME", "amount": 10},
        "framework": "pydantic-ai",
        "run": "run-42",      # the run it belongs to
        "call_id": "call_1",  # the framework's id of this call
        "digest": "sha256:...",  # digest(name, arguments): see tool_call_digest
      },
    }

An answer ``ok=True`` approves: with ``data`` None (the proposal) or the arguments to run,
which the broker checks against ``data["schema"]`` (a form answer: an edit that breaks the
tool's schema is refused to the responder with :class:`~toolnexus.InvalidAnswer`, and the
request stays open). ``ok=False`` denies; a text ``data`` (or ``meta["message"]``) is the
message the framework gives the model. :func:`decide` turns the answer into a
:class:`ToolDecision`.

Binding: with signatures in use, the answer's signature covers the digest of the exact
request (its id, its ``tool_call`` and its digest included), so a signed approval cannot
approve another call, not even one with the same arguments (a new call is a new request
id). The audit record keeps the request (the proposed digest) and the signed answer (the
approved arguments): :func:`audit_digests` reads both back.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeVar

import msgspec
import rfc8785
from msgspec import UNSET, UnsetType

from .._broker import Broker, Store
from .._schema import validate_form
from ..codec import JSON, MSGPACK
from ..errors import (
    ConfigurationError,
    DecodeError,
    InvalidAnswer,
    InvalidRequest,
    SignatureError,
    ToolnexusError,
)
from ..keys import TOOL_CALLS_STORE
from ..models import Answer, Request, Signature, Source, WaitFor, new_id
from ..protocol import PROTOCOL, stamp, stamped
from ..security import SigningKey
from ..security._audit import AuditRecord
from ..security._signing import sign_own, verify_own

log = logging.getLogger(__name__)


class RunNotFound(ToolnexusError):
    """No resumable run of this name is kept (it finished, or never stopped to ask)."""


class RemoteAgentError(ToolnexusError):
    """A remote agent (A2A) could not be reached, or refused a call; the framework's error is
    the cause."""


def missing_extra(module: str, needs: str, extra: str) -> ConfigurationError:
    """The error adapter ``module`` raises on import when what it ``needs`` (its framework,
    the optional extra ``extra``) is not installed."""
    return ConfigurationError(f"{module} needs {needs}: pip install 'toolnexus-bridge[{extra}]'")


TOOL_CALL: Final = "tool_call"
"""The ``kind`` of a tool-approval request."""

DIGEST_PREFIX: Final = "sha256:"


def tool_call_digest(name: str, arguments: dict[str, Any]) -> str:
    """``"sha256:" + hex(SHA-256(RFC 8785 canonical JSON of {"name", "arguments"}))``: the
    same for every framework and language that canonicalizes by RFC 8785.

    Raises:
        InvalidRequest: the arguments are not JSON (a float that is not finite, a key that
            is not a string, an object JSON has no form for).
    """
    try:
        canonical = rfc8785.dumps({"name": name, "arguments": arguments})
    except (rfc8785.CanonicalizationError, TypeError, ValueError) as exc:
        raise InvalidRequest(f"tool {name!r}: its arguments are not JSON ({exc})") from exc
    return DIGEST_PREFIX + hashlib.sha256(canonical).hexdigest()


class ToolCall(msgspec.Struct, frozen=True, kw_only=True):
    """A tool call a framework proposes: ``data["tool_call"]`` of a tool-approval request."""

    name: str
    arguments: dict[str, Any]
    framework: str
    run: str | None = None
    call_id: str | None = None
    digest: str = ""


def _prefilled(
    schema: dict[str, Any] | None, arguments: dict[str, Any], editable: bool
) -> dict[str, Any]:
    """The tool's schema with each proposed argument as its property's ``default`` (and,
    not ``editable``, its ``const``: an edit fails the schema)."""
    filled = copy.deepcopy(schema) if schema else {"type": "object", "properties": {}}
    properties = filled.setdefault("properties", {})
    if not isinstance(properties, dict):
        raise InvalidRequest("a tool's input schema must have an object of 'properties'")
    for name, value in arguments.items():
        field = properties.get(name)
        if field is None:  # an argument the schema does not name: shown, kept as proposed
            field = properties[name] = {}
        if not isinstance(field, dict):
            raise InvalidRequest(f"tool input schema: property {name!r} must be an object")
        field["default"] = copy.deepcopy(value)
        if not editable:
            field["const"] = copy.deepcopy(value)
    return filled


def tool_call_request(
    name: str,
    arguments: dict[str, Any],
    *,
    framework: str,
    schema: dict[str, Any] | None = None,
    run: str | None = None,
    call_id: str | None = None,
    prompt: str | None = None,
    request_id: str | None = None,
    agent: str | None = None,
    expires_at: float | None = None,
    durable: bool = False,
    editable: bool = True,
) -> Request:
    """The request asking whether tool ``name`` may run with ``arguments``.

    ``editable=False`` for a framework that cannot run edited arguments: each property of
    the schema is then also a ``const`` of its proposed value, so that the broker refuses
    an edit to the responder (approve or deny only).

    ``schema`` is the tool's JSON input schema (None: any object); ``run`` and ``call_id``
    name the framework's run and call. ``request_id`` defaults to a fresh id: give a stable
    one (:func:`call_request_id`) for a durable wait that another process attaches to.

    Raises:
        InvalidRequest: ``arguments`` is not a JSON object, or the schema has no object of
            ``properties``.
    """
    if not isinstance(arguments, dict):
        raise InvalidRequest(
            f"tool {name!r}: its arguments must be an object, got {type(arguments).__name__}"
        )
    call = ToolCall(
        name=name,
        arguments=arguments,
        framework=framework,
        run=run,
        call_id=call_id,
        digest=tool_call_digest(name, arguments),
    )
    return Request(
        id=request_id or new_id("tool"),
        kind=TOOL_CALL,
        prompt=prompt or f"Run the tool {name}?",
        data={
            "schema": _prefilled(schema, arguments, editable),
            "tool_call": msgspec.to_builtins(call),
        },
        source=Source(tool=name, agent=agent),
        expires_at=expires_at,
        durable=durable,
    )


def call_request_id(framework: str, run: str, call_id: str) -> str:
    """A stable request id for call ``call_id`` of run ``run``: the same in every process,
    so a durable wait for it attaches instead of asking again."""
    digest = hashlib.sha256(f"{framework}\0{run}\0{call_id}".encode()).hexdigest()[:32]
    return f"tool-{digest}"


def tool_call_of(request: Request) -> ToolCall:
    """The :class:`ToolCall` a tool-approval request proposes.

    Raises:
        InvalidRequest: ``request`` is not a ``tool_call`` request, or its ``tool_call`` is
            malformed, or its digest is not the digest of its name and arguments.
    """
    if request.kind != TOOL_CALL or not isinstance(request.data, dict):
        raise InvalidRequest(f"request {request.id!r} is not a {TOOL_CALL!r} request")
    try:
        call = msgspec.convert(request.data.get("tool_call"), ToolCall)
    except msgspec.ValidationError as exc:
        raise InvalidRequest(f"request {request.id!r}: malformed tool_call ({exc})") from exc
    if call.digest != tool_call_digest(call.name, call.arguments):
        raise InvalidRequest(
            f"request {request.id!r}: its tool_call digest is not that of its name and arguments"
        )
    return call


@dataclass(frozen=True)
class ToolDecision:
    """What an answer decided for a tool call.

    ``approved``: run it, with ``arguments`` (the proposal, or the responder's ``edited``
    ones); ``digest`` is theirs (:func:`tool_call_digest`). Denied: ``message`` says why,
    for the model (and ``reason`` is the answer's). ``answered_by`` names who decided.
    """

    approved: bool
    arguments: dict[str, Any] | None
    edited: bool
    message: str | None
    reason: str | None
    digest: str | None
    answered_by: str | None


def _denied(message: str, answered_by: str | None = None) -> ToolDecision:
    """A denial that no answer gave as it stands (an invalid approval, an edit the
    framework cannot run): ``message`` tells the model why."""
    return ToolDecision(
        approved=False,
        arguments=None,
        edited=False,
        message=message,
        reason=None,
        digest=None,
        answered_by=answered_by,
    )


def _message(answer: Answer, call: ToolCall) -> str:
    for text in (answer.data, answer.meta.get("message")):
        if isinstance(text, str) and text.strip():
            return text
    who = answer.answered_by
    if answer.reason == "expired":
        return f"No approval for {call.name} before the deadline: the call was not run."
    if answer.reason == "withdrawn":
        return f"The approval request for {call.name} was withdrawn: the call was not run."
    if answer.reason == "unavailable":
        return f"No approver could be reached for {call.name}: the call was not run."
    by = f" by {who}" if who else ""
    return f"The call to {call.name} was denied{by} ({answer.reason or 'declined'})."


def decide(request: Request, answer: Answer) -> ToolDecision:
    """The decision ``answer`` gives on the tool call ``request`` proposes.

    An accepting answer approves its ``data`` (None: the proposal), checked against the
    request's schema; an expiry's default (``defaulted``) never approves: it is a denial
    with the deadline's message.

    Raises:
        InvalidRequest: ``request`` is not a tool-approval request (:func:`tool_call_of`).
        InvalidAnswer: the answer is not for this request, or its arguments fail the
            tool's schema.
    """
    call = tool_call_of(request)
    if answer.id != request.id:
        raise InvalidAnswer(f"answer {answer.id!r} does not answer request {request.id!r}")
    if not answer.ok or answer.defaulted:
        if answer.ok:  # an OnExpiry default: nobody approved
            answer = msgspec.structs.replace(answer, ok=False, reason="expired", data=None)
        return ToolDecision(
            approved=False,
            arguments=None,
            edited=False,
            message=_message(answer, call),
            reason=answer.reason,
            digest=None,
            answered_by=answer.answered_by,
        )
    if answer.data is None:
        arguments = call.arguments
    else:
        schema = request.schema or {"type": "object", "properties": {}}
        arguments = validate_form(schema, answer.data)
    digest = tool_call_digest(call.name, arguments)
    return ToolDecision(
        approved=True,
        arguments=arguments,
        edited=digest != call.digest,
        message=None,
        reason=None,
        digest=digest,
        answered_by=answer.answered_by,
    )


def checked_decision(request: Request, answer: Answer, *, editable: bool = True) -> ToolDecision:
    """:func:`decide` as an adapter applies it: an answer that fails it (one no broker
    checked) is a denial, never a run; and, for a framework that cannot run edited arguments
    (``editable=False``), so is an edit."""
    try:
        decision = decide(request, answer)
    except InvalidAnswer as exc:
        return _denied(f"The approval of {tool_call_of(request).name} was invalid: {exc}")
    if decision.edited and not editable:
        message = "Edited arguments cannot be run by this framework."
        return _denied(message, decision.answered_by)
    return decision


@dataclass(frozen=True)
class AuditDigests:
    """A tool call's digests as its audit record proves them: ``proposed`` (the request's),
    ``approved`` (of the arguments the signed answer approved; None: not approved)."""

    proposed: str
    approved: str | None


def audit_digests(record: AuditRecord) -> AuditDigests:
    """The proposed and approved digests of the tool call ``record`` resolved.

    Raises:
        DecodeError: the record holds no whole request (it was cut) or answer.
        InvalidRequest: the record is not of a tool-approval request.
    """
    codec = JSON if record.format == "json" else MSGPACK
    if record.request is None or record.cut:
        raise DecodeError(f"audit record {record.id!r} does not hold the whole request")
    request = codec.decode(record.request)
    if not isinstance(request, Request):
        raise DecodeError(f"audit record {record.id!r}: its request is not a request")
    call = tool_call_of(request)
    approved = None
    if record.answer is not None:
        answer = codec.decode(record.answer)
        if isinstance(answer, Answer):
            try:
                decision = decide(request, answer)
            except InvalidAnswer:
                decision = None
            approved = decision.digest if decision is not None else None
    return AuditDigests(proposed=call.digest, approved=approved)


STATE_TTL_S: Final = 7 * 24 * 3600.0
"""How long an adapter keeps a paused run's state in its broker store."""
LEDGER_TTL_S: Final = STATE_TTL_S
"""How long a :class:`Ledger` keeps a call's digests."""
LEDGER_STORE: Final = TOOL_CALLS_STORE
"""The name of the agent store (``broker.store(LEDGER_STORE, agent=True)``) an adapter keeps
its :class:`Ledger` in."""

PROTOCOL_KEY: Final = "protocol"
"""The key of a ledger entry that says its protocol, from protocol 2 on (absent: 1)."""
CLAIM_KIND: Final = "tool-call-claim"
"""What a signed claim of a call's run is, to :func:`~toolnexus.security._signing.sign_own`."""


class Ledger:
    """The digests of each tool call an adapter saw: ``proposed``, ``approved`` and
    ``executed`` (the arguments the framework ran the tool with), by request id, kept in a
    broker :class:`~toolnexus.Store` (:meth:`of`: the agent's own store ``tool-calls``,
    ``broker.store("tool-calls", agent=True)``) beside the audit record, which proves the
    first two. An adapter runs a call only with the arguments its approval approved, and
    only once: :meth:`executing` claims the call in one atomic step of the store, so of
    several resumers racing for one answered approval, in any processes of the agent,
    exactly one runs the tool.

    The store is Redis, shared and untrusted: the digests it keeps are a record, not a
    proof (the audit record is that). The agent's own store lies among its own waiter keys,
    which the shipped ACL lets that agent's Redis user alone write (a responder, which may
    write every queue store, can neither delete nor write a claim there): a claim deleted
    goes unseen (a signature cannot tell a deletion), so only those who may write the store
    could make an approved call run twice. The arguments a call may run with come from the
    caller's own decision (``approved=`` of :meth:`executing`), never from the store.

    With a ``signing_key`` (the broker's: :meth:`of`), each claim is signed by it, bound to
    the request id, the digest and the claim's own id, and a claim found in the store counts
    only if it verifies: one that does not (forged, garbage, another key's) is replaced and
    the call runs; it costs a few round trips, never the run. The processes that resume an
    agent's runs share its name (the broker option ``agent``, as its durable requests need)
    and its key, as for its durable MCP task records. Without a key (no
    signatures in use) any value under the claim refuses the run, as it always did: whoever
    may write the store can then stop an approved call (never make it run).
    """

    def __init__(
        self, store: Store, *, signing_key: SigningKey | None = None, protocol: int = PROTOCOL
    ) -> None:
        self.store = store
        self.signing_key = signing_key
        self.protocol = protocol
        """The protocol its records are written in (:mod:`toolnexus.protocol`): from 2 on
        each carries the number (an entry's key ``protocol``, a claim's field)."""

    @classmethod
    def of(cls, broker: Broker) -> Ledger:
        """The ledger an adapter keeps for ``broker``: in its agent's own store
        (``broker.store("tool-calls", agent=True)``: any process of the agent finds it),
        its claims signed by the broker's own key if it has one
        (:attr:`~toolnexus.Broker.signing_key`; a broker that requires signatures always
        has one: without it, :func:`~toolnexus.connect` raises ``ConfigurationError``)."""
        return cls(
            broker.store(LEDGER_STORE, agent=True),
            signing_key=broker.signing_key,
            protocol=broker.write_protocol,
        )

    async def _entry(self, request_id: str) -> dict[str, str]:
        """The digests recorded for ``request_id`` (in protocol 1 or 2); none for an entry
        of a newer protocol (logged: it is left for the newer process that wrote it)."""
        entry = _decoded(await self.store.get(request_id), dict[str, str]) or {}
        number = entry.pop(PROTOCOL_KEY, None)
        try:
            stamped(int(number) if number is not None and number.isdigit() else UNSET, "entry")
        except DecodeError as exc:
            log.warning("tool call %s: its ledger %s", request_id, exc)
            return {}
        return entry

    async def get(self, request_id: str) -> dict[str, str]:
        """The digests recorded for ``request_id`` (empty: none)."""
        entry = await self._entry(request_id)
        claim = _decoded(await self.store.get(_executed_key(request_id)), _Claim)
        if claim is not None:
            entry["executed"] = claim.digest
        return entry

    async def decided(self, request: Request, decision: ToolDecision) -> None:
        """Record the proposed digest of ``request`` and the approved one of ``decision``."""
        entry = await self._entry(request.id)
        entry["proposed"] = tool_call_of(request).digest
        if decision.digest is not None:
            entry["approved"] = decision.digest
        if stamp(self.protocol) is not UNSET:
            entry[PROTOCOL_KEY] = str(self.protocol)
        await self.store.set(request.id, msgspec.json.encode(entry), ttl_s=LEDGER_TTL_S)

    async def executing(
        self,
        request_id: str,
        name: str,
        arguments: dict[str, Any],
        *,
        approved: str | None = None,
    ) -> str:
        """Claim ``request_id``'s call, which runs now with ``arguments``, and record their
        digest, which this returns. The claim is atomic: the first caller gets it, every
        other (racing or later, in any process) is refused.

        ``approved`` is the digest the caller's own decision approved
        (:attr:`ToolDecision.digest`); without it the digest recorded by :meth:`decided`
        is taken, which whoever may write the store can change.

        With a signing key, a claim found in the store refuses the run only if it is this
        key's for ``request_id``; any other is replaced by this caller's in one atomic step
        (:meth:`~toolnexus.Store.replace` of the exact bytes read: of several callers
        replacing one forged claim, exactly one wins) and the run goes on, with a warning.

        Raises:
            InvalidAnswer: ``arguments`` are not the approved ones (nothing is claimed), or
                the call was claimed already: an approval is used once.
        """
        digest = tool_call_digest(name, arguments)
        if approved is None:
            approved = (await self.get(request_id)).get("approved")
        if approved != digest:
            raise InvalidAnswer(
                f"tool call {request_id!r}: the arguments about to run are not the approved "
                f"ones (approved {approved or 'none'}, about to run {digest}): the run's "
                "kept state may have been altered; the call is not run"
            )
        key, ours = _executed_key(request_id), self._claim(request_id, digest)
        if not await self.store.claim(key, ours, ttl_s=LEDGER_TTL_S):
            await self._take_over(request_id, key, ours)
        return digest

    def _claim(self, request_id: str, digest: str) -> bytes:
        """A claim of ``request_id``'s run with ``digest``, of a fresh id, signed with the
        signing key if there is one."""
        claim = _Claim(digest=digest, by=new_id("run"), protocol=stamp(self.protocol))
        if self.signing_key is not None:
            signature = sign_own(CLAIM_KIND, claim.signed(request_id), self.signing_key)
            claim = msgspec.structs.replace(claim, signature=signature)
        return msgspec.json.encode(claim)

    async def _take_over(self, request_id: str, key: str, ours: bytes) -> None:
        """The claim of ``request_id``'s run was lost: replace the claim held if it is not
        genuine (only with a signing key), else refuse the run.

        Raises:
            InvalidAnswer: the claim held is this key's (or, without a key, any value).
        """
        ran = InvalidAnswer(f"tool call {request_id!r} ran already: an approval is used once")
        if self.signing_key is None:
            raise ran
        pause_s = 0.01
        while True:  # each turn: another write came between this caller's read and write
            held = await self.store.get(key)
            if held is None:  # gone meanwhile: claim it again
                if await self.store.claim(key, ours, ttl_s=LEDGER_TTL_S):
                    return
                continue
            problem = self._forged(request_id, held)
            if problem is None:
                raise ran
            if await self.store.replace(key, held, ours, ttl_s=LEDGER_TTL_S):
                log.warning(
                    "tool call %s: the claim of its run in the store does not verify (%s): "
                    "a forged claim was replaced and the approved call runs",
                    request_id,
                    problem[:200],  # (a key name in it is the writer's, repr'd: bounded)
                )
                return
            await asyncio.sleep(pause_s)  # a writer that keeps rewriting costs time only
            pause_s = min(2 * pause_s, 0.5)

    def _forged(self, request_id: str, held: bytes) -> str | None:
        """Why the claim ``held`` of ``request_id``'s run is not this key's (None: it is)."""
        assert self.signing_key is not None
        try:
            claim = msgspec.json.decode(held, type=_Claim)
        except msgspec.DecodeError:  # ValidationError is one
            return "unreadable"
        what = f"the claim of tool call {request_id!r}"
        try:
            stamped(claim.protocol, what)
        except DecodeError as exc:  # a newer process's: it counts, the run is refused
            log.warning("%s", exc)
            return None
        try:
            verify_own(
                CLAIM_KIND, claim.signed(request_id), claim.signature, self.signing_key, what
            )
        except SignatureError as exc:
            return exc.reason
        return None


async def ask(
    wait_for: WaitFor,
    requests: Sequence[Request],
    *,
    ledger: Ledger | None = None,
    editable: bool = True,
) -> list[ToolDecision]:
    """Ask every request at once through ``wait_for`` (cancelling withdraws those not
    durable); the decision on each (:func:`checked_decision`), recorded in ``ledger``
    (:meth:`Ledger.decided`) if one is given."""
    answers = await asyncio.gather(*(wait_for(request) for request in requests))
    decisions = []
    for request, answer in zip(requests, answers, strict=True):
        decision = checked_decision(request, answer, editable=editable)
        if ledger is not None:
            await ledger.decided(request, decision)
        decisions.append(decision)
    return decisions


class _Claim(msgspec.Struct, frozen=True, omit_defaults=True):
    """Who claimed a call's run (``by``: an id of the claim) and with what digest; signed
    by the agent's key where it has one (:class:`Ledger`)."""

    digest: str
    by: str
    signature: Signature | None = None
    protocol: int | UnsetType = UNSET  # (none in protocol 1: see toolnexus.protocol.stamp)

    def signed(self, request_id: str) -> dict[str, str]:
        """What the signature covers: the call's request id, the digest, the claim's id."""
        return {"request_id": request_id, "digest": self.digest, "by": self.by}


def _executed_key(request_id: str) -> str:
    return f"{request_id}:executed"


T = TypeVar("T")


def _decoded(raw: bytes | None, kind: type[T]) -> T | None:
    """``raw`` JSON as ``kind``; None if absent or not of that shape (the store is
    untrusted: a mangled entry counts as none)."""
    if raw is None:
        return None
    try:
        return msgspec.json.decode(raw, type=kind)
    except msgspec.DecodeError:  # ValidationError is one
        return None
