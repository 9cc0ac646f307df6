"""The Tasks extension (``io.modelcontextprotocol/tasks``) driven under ``load_mcp`` (SPEC §2).

A 2026-07-28 server may answer ``tools/call`` with ``resultType: "task"`` (a
``CreateTaskResult``) instead of the tool's result. The caller of ``load_mcp``'s tool still
gets the tool's result: the extension is declared on every request (the SDK's per-request
client capabilities), and a task is driven here to its end:

- ``tasks/get`` is polled at the task's ``pollIntervalMs`` (1 s when it gives none);
- in ``input_required``, every input request not yet asked is asked at once through the
  session's ``wait_for`` (the same mapping as any elicitation); each answer goes back with
  ``tasks/update`` as soon as it comes, in any order: ``inputResponses`` holds only the keys
  answered since the last update (answered keys are never sent again), and the newest
  ``requestState`` the server gave is echoed with it;
- the task's TTL (``createdAt`` + ``ttlMs``) bounds every question's deadline;
- ``completed`` is the call's result, ``failed`` raises :class:`~toolnexus.mcp.McpError`
  with the task's JSON-RPC error, ``cancelled`` raises :class:`TaskCancelled`;
- ``tasks/cancel`` is sent when the call is cancelled or ends with an error, or when a
  question is withdrawn (which raises :class:`TaskCancelled`).

Field names follow the extension's published schema (``ttlMs``, ``pollIntervalMs``,
``inputRequests``, ``inputResponses``): modelcontextprotocol/experimental-ext-tasks,
``schema/draft/schema.ts``. That schema gives a task no ``requestState``; a server that
adds one (as a 2026-07-28 ``InputRequiredResult`` does) gets its newest one echoed.

Durable (``tool.call(..., durable="an id")``): the task id, the newest ``requestState`` and
the keys answered are kept in the agent's own store (``broker.store("mcp-tasks",
agent=True)``), keyed by agent, server, tool and that id, and every question is a durable
request whose id follows from the same names, the task and the key. A process of the same
agent that makes the same call again — after the first one was killed — finds the task,
polls it, attaches to the questions still open (a person's answer given meanwhile is not
lost) and returns the task's result. Cancelling a durable call leaves its task to whoever
calls again.

Redis is not trusted with that record (docs/security.md, S3): with a signing key the agent
signs it (:func:`~toolnexus.security._signing.sign_own`) over its store key (agent, server,
tool, durable id), a digest of the tool's arguments, the task id, ``requestState``, the keys
answered and the task's end, and a process going on with it verifies it with its own key
first. A record that does not verify is never used: it is removed and the call raises
:class:`~toolnexus.errors.SignatureError` saying why; one made for other arguments raises
:class:`~toolnexus.errors.InvalidRequest` and is kept; one past the task's end is stale and
the call starts anew.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, Protocol

import anyio
import anyio.abc
import msgspec
from mcp.client import ClaimContext, ClientExtension, ClientSession, ResultClaim
from mcp.shared.exceptions import MCPError
from mcp_types import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    METHOD_NOT_FOUND,
    CallToolResult,
    ElicitResult,
    ErrorData,
    Request,
    RequestParams,
    Result,
)
from pydantic import ConfigDict
from pydantic.alias_generators import to_camel

from ..errors import ConfigurationError, DecodeError, InvalidRequest, SignatureError
from ..keys import MCP_TASKS_STORE
from ..models import WITHDRAWN, Answer, Signature
from ..models import Request as Question
from ..protocol import PROTOCOL, stamp, stamped
from ..security._signing import sign_own, verify_own
from ._calls import Call, current_call
from ._errors import McpError
from ._source import input_request_meta

if TYPE_CHECKING:
    from .._broker import Broker

log = logging.getLogger(__name__)

__all__ = ["TASKS_EXTENSION", "TaskCancelled", "Tasks"]

TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
STORE_NAME = MCP_TASKS_STORE
"""The agent store that keeps durable calls' tasks."""

DEFAULT_POLL_S = 1.0
MIN_POLL_S = 0.05
MAX_POLL_S = 60.0
UNLIMITED_TTL_S = 7 * 24 * 3600.0
"""How long a durable call's record is kept for a task with no TTL."""
CANCEL_TIMEOUT_S = 5.0


class TaskCancelled(McpError):
    """A task-backed tool call ended as ``cancelled`` (by the server, or here because its
    question was withdrawn)."""

    def __init__(self, task_id: str, message: str, *, server: str | None = None) -> None:
        super().__init__(INTERNAL_ERROR, message, {"taskId": task_id}, server=server)
        self.task_id = task_id


# -- wire shapes ------------------------------------------------------------------------


class _Open(Result):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="allow")


class CreateTaskResult(_Open):
    """``resultType: "task"``: the task handle a server returns in lieu of the result."""

    result_type: Literal["task"] = "task"
    task_id: str
    status: str


class _Snapshot(_Open):
    """A ``tasks/get`` result (a ``DetailedTask``)."""

    task_id: str
    status: str
    status_message: str | None = None
    created_at: str | None = None
    ttl_ms: float | None = None
    poll_interval_ms: float | None = None
    input_requests: dict[str, Any] | None = None
    request_state: str | None = None
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None


class _TaskParams(RequestParams):
    task_id: str


class _UpdateParams(_TaskParams):
    input_responses: dict[str, Any]
    request_state: str | None = None


class _GetTask(Request[_TaskParams, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    name_param = "taskId"


class _UpdateTask(Request[_UpdateParams, Literal["tasks/update"]]):
    method: Literal["tasks/update"] = "tasks/update"
    name_param = "taskId"


class _CancelTask(Request[_TaskParams, Literal["tasks/cancel"]]):
    method: Literal["tasks/cancel"] = "tasks/cancel"
    name_param = "taskId"


# -- what the driver needs from load_mcp's session ----------------------------------------


class Shape(Protocol):
    """Adjusts the request made for one input request, and sees its answer."""

    def request(self, request: Question) -> Question: ...

    def answered(self, request: Question, answer: Answer) -> None: ...


class Asker(Protocol):
    """``load_mcp``'s session, as the task driver uses it."""

    server_name: str | None
    read_timeout_s: float | None

    async def answer(
        self, params: Any, hint: Call | None, shape: Shape | None = None
    ) -> ElicitResult | ErrorData: ...


class _Record(msgspec.Struct):
    """What a durable call keeps: enough for another process to go on with its task, signed
    by the agent's key where it has one (see the module docstring)."""

    task_id: str
    request_state: str | None = None
    answered: list[str] = msgspec.field(default_factory=list)
    call: str = ""
    """A digest of the tool's name and arguments: the call the task answers."""
    expires_at: float | None = None
    """When the task ends (its TTL); past it the record is stale."""
    signature: Signature | None = None
    protocol: int | msgspec.UnsetType = msgspec.UNSET
    """The protocol it was written in from protocol 2 on (absent: 1; see
    :func:`toolnexus.protocol.stamp`)."""

    def signed(self, store_key: str) -> dict[str, Any]:
        """What the signature covers: every field, and the store key it is kept under."""
        return {
            "store_key": store_key,
            "call": self.call,
            "task_id": self.task_id,
            "request_state": self.request_state,
            "answered": self.answered,
            "expires_at": None if self.expires_at is None else float(self.expires_at),
        }


@dataclass
class _Drive:
    """One task being driven for one call."""

    task_id: str
    call: Call
    session: ClientSession
    durable_key: str | None
    request_state: str | None = None
    answered: set[str] = field(default_factory=set)
    asked: set[str] = field(default_factory=set)
    interval_s: float = DEFAULT_POLL_S
    expires_at: float | None = None
    ttl_s: float | None = None
    kept_until: float | None = None
    """The end a durable record names for a task without a TTL (set once)."""
    terminal: bool = False
    given_up: bool = False
    """This side ends the task (a question withdrawn, one it cannot answer)."""
    saved: bytes = b""
    lock: anyio.Lock = field(default_factory=anyio.Lock)

    def observe(self, snapshot: _Snapshot) -> None:
        if snapshot.poll_interval_ms is not None and math.isfinite(snapshot.poll_interval_ms):
            self.interval_s = min(MAX_POLL_S, max(MIN_POLL_S, snapshot.poll_interval_ms / 1000))
        if snapshot.request_state is not None:
            self.request_state = snapshot.request_state
        if "ttl_ms" in snapshot.model_fields_set:
            ttl = snapshot.ttl_ms
            self.ttl_s = None if ttl is None or not math.isfinite(ttl) else max(0.0, ttl / 1000)
            start = _parse_time(snapshot.created_at)
            self.expires_at = None if self.ttl_s is None else (start or time.time()) + self.ttl_s
        self.terminal = snapshot.status in ("completed", "failed", "cancelled")


def _parse_time(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


def _digest(*parts: str | None) -> str:
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:32]


def _call_digest(call: Call) -> str:
    """A digest of ``call``'s tool name and arguments (as JSON, keys sorted; a value JSON
    cannot hold by its ``str``, as the SDK's own encoding may send it)."""
    return _digest(json.dumps([call.name, call.arguments], sort_keys=True, default=str))


class _QuestionShape:
    """The request of one input request of a task: durable with a stable id, bounded by
    the task's TTL, naming the task and key; remembers a withdrawal."""

    def __init__(self, drive: _Drive, key: str, agent: str | None, server: str | None) -> None:
        self._drive = drive
        self._key = key
        self._agent = agent
        self._server = server
        self.withdrawn = False

    def request(self, request: Question) -> Question:
        drive = self._drive
        meta = {
            **request.meta,
            "mcp_task": drive.task_id,
            **input_request_meta(drive.task_id, self._key),
        }
        expires_at = request.expires_at
        if drive.expires_at is not None:
            expires_at = (
                drive.expires_at if expires_at is None else min(expires_at, drive.expires_at)
            )
        changes: dict[str, Any] = {"meta": meta, "expires_at": expires_at}
        if drive.durable_key is not None:
            changes["durable"] = True
            if "asked_before" not in request.meta:  # asked again after a bad answer: fresh id
                key = _digest(
                    self._agent, self._server, drive.durable_key, drive.task_id, self._key
                )
                changes["id"] = f"elc-{key}"
        return msgspec.structs.replace(request, **changes)

    def answered(self, request: Question, answer: Answer) -> None:
        if not answer.ok and answer.reason == WITHDRAWN and self._drive.call.active:
            self.withdrawn = True


class Tasks:
    """The Tasks extension of one ``load_mcp`` session (see the module docstring)."""

    def __init__(self, asker: Asker, *, agent: str | None, broker: Broker | None) -> None:
        self._asker = asker
        self._agent = agent
        self._broker = broker
        self.extension = _Extension(self)

    # -- entry points ---------------------------------------------------------------------

    def check_durable(self, durable: str | None) -> None:
        """Refuse a durable id that is not a non-empty string, or one without a broker.

        Raises:
            ConfigurationError: naming what is wrong.
        """
        if durable is None:
            return
        if not isinstance(durable, str) or not durable:
            raise ConfigurationError(f"durable must be a non-empty string, got {durable!r}")
        if self._broker is None:
            raise ConfigurationError(
                "durable= needs load_mcp's wait_for to be a broker's wait_for: "
                "the task is kept in that broker's store"
            )

    async def resume(self, session: ClientSession, call: Call) -> CallToolResult | None:
        """The result of the task a durable call left, driven on; None if it left none."""
        if call.durable is None:
            return None
        key = self._durable_key(call)
        raw = await self._store().get(key)
        if raw is None:
            return None
        record = await self._admit(call, key, raw)
        if record is None:
            return None
        log.info("durable call %r: resuming task %s", call.durable, record.task_id)
        drive = _Drive(record.task_id, call, session, key, record.request_state)
        drive.answered = set(record.answered)
        drive.asked = set(record.answered)
        drive.kept_until = record.expires_at
        try:
            result = await self._run(drive, None)
        except* MCPError as errors:
            if any(getattr(e, "code", None) == INVALID_PARAMS for e in errors.exceptions):
                await self._store().delete(key)  # the server no longer knows the task
            raise
        if not result.is_error:  # as the SDK does for a claimed result
            await session.validate_tool_result(call.name, result)
        return result

    async def resolve(self, created: CreateTaskResult, context: ClaimContext) -> CallToolResult:
        """The SDK's claim resolver: drive the task ``created`` to the call's result."""
        call = current_call.get()
        if call is None:  # a tools/call made on the SDK client directly
            call = Call(context.tool_name, None)
        durable_key = self._durable_key(call) if call.durable is not None else None
        drive = _Drive(created.task_id, call, context.session, durable_key)
        first = _Snapshot.model_validate(created.model_dump(by_alias=True))
        return await self._run(drive, first)

    # -- the driver -----------------------------------------------------------------------

    async def _run(self, drive: _Drive, first: _Snapshot | None) -> CallToolResult:
        clock = drive.call.clock
        if clock is not None:  # the server's time is bounded per request, not per task
            clock.pause()
        try:
            return await self._poll(drive, first)
        except BaseException:
            # a durable call's task is left to the next call, unless this side gave it up
            if not drive.terminal and (drive.durable_key is None or drive.given_up):
                await self._cancel(drive)
                if drive.durable_key is not None:
                    await self._store().delete(drive.durable_key)
            raise
        finally:
            if clock is not None:
                clock.resume()

    async def _poll(self, drive: _Drive, snapshot: _Snapshot | None) -> CallToolResult:
        result: CallToolResult | None = None
        async with anyio.create_task_group() as group:
            while True:
                if snapshot is None:
                    snapshot = await self._send(
                        drive, _GetTask(params=_TaskParams(task_id=drive.task_id)), _Snapshot
                    )
                drive.observe(snapshot)
                await self._keep(drive)
                if snapshot.status == "completed":
                    result = CallToolResult.model_validate(snapshot.result or {})
                    break
                if snapshot.status == "failed":
                    error = snapshot.error or {}
                    code = error.get("code")
                    raise McpError(
                        code if isinstance(code, int) else INTERNAL_ERROR,
                        str(error.get("message") or snapshot.status_message or "the task failed"),
                        error.get("data"),
                        server=self._asker.server_name,
                    )
                if snapshot.status == "cancelled":
                    raise TaskCancelled(
                        drive.task_id,
                        snapshot.status_message or f"task {drive.task_id} was cancelled",
                        server=self._asker.server_name,
                    )
                if snapshot.status == "input_required":
                    for key, request in (snapshot.input_requests or {}).items():
                        if key not in drive.asked:
                            drive.asked.add(key)
                            group.start_soon(self._ask, drive, key, request)
                await anyio.sleep(drive.interval_s)
                snapshot = None
            group.cancel_scope.cancel()
        assert result is not None
        return result

    async def _ask(self, drive: _Drive, key: str, request: Any) -> None:
        """Ask one input request; send its answer with ``tasks/update``."""
        method = request.get("method") if isinstance(request, dict) else None
        params = request.get("params") if isinstance(request, dict) else None
        if method != "elicitation/create" or not isinstance(params, dict):
            drive.given_up = True
            raise McpError(
                METHOD_NOT_FOUND,
                f"task {drive.task_id} asks {method!r} (input {key!r}): only elicitation/create "
                "input requests are answered",
                server=self._asker.server_name,
            )
        shape = _QuestionShape(drive, key, self._agent, self._asker.server_name)
        response = await self._asker.answer(params, drive.call, shape)
        if isinstance(response, ErrorData):
            drive.given_up = True
            raise McpError(
                response.code, response.message, response.data, server=self._asker.server_name
            )
        if shape.withdrawn:
            drive.given_up = True
            raise TaskCancelled(
                drive.task_id,
                f"the question {key!r} of task {drive.task_id} was withdrawn: "
                "the task is cancelled",
                server=self._asker.server_name,
            )
        async with drive.lock:
            if drive.terminal:
                return
            params_out = _UpdateParams(
                task_id=drive.task_id,
                input_responses={
                    key: response.model_dump(mode="json", by_alias=True, exclude_none=True)
                },
                request_state=drive.request_state,
            )
            await self._send(drive, _UpdateTask(params=params_out), _Open)
            drive.answered.add(key)
            await self._save(drive)

    async def _send(self, drive: _Drive, request: Request[Any, Any], kind: type[_Open]) -> Any:
        return await drive.session.send_request(
            request, kind, request_read_timeout_seconds=self._asker.read_timeout_s
        )

    async def _cancel(self, drive: _Drive) -> None:
        """``tasks/cancel``, shielded from the cancellation that ended the call."""
        with anyio.CancelScope(shield=True), anyio.move_on_after(CANCEL_TIMEOUT_S):
            try:
                await self._send(
                    drive, _CancelTask(params=_TaskParams(task_id=drive.task_id)), _Open
                )
            except Exception as exc:  # the call's own outcome matters more
                log.warning("tasks/cancel of %s failed: %s", drive.task_id, exc)

    # -- durable records ------------------------------------------------------------------

    def _store(self) -> Any:
        assert self._broker is not None
        return self._broker.store(STORE_NAME, agent=True)

    async def _admit(self, call: Call, key: str, raw: bytes) -> _Record | None:
        """The record ``raw`` of durable call ``call`` (kept under ``key``) if it may be gone
        on with; None if it is stale or, unsigned, unreadable (both removed).

        Raises:
            SignatureError: with a signing key, it is unreadable, unsigned, signed by another
                key, or altered (made for another call among them): it is removed.
            InvalidRequest: it was made for this durable id with other arguments (kept).
        """
        signer = self._broker.signing_key if self._broker is not None else None
        what = (
            f"the task record of durable call {call.durable!r} of tool {call.name!r} (removed: "
            "calling again starts a new task)"
        )
        try:
            record = msgspec.json.decode(raw, type=_Record)
            stamped(record.protocol, "task record")
        except DecodeError as exc:  # a newer process's: left to it
            log.warning("durable call %r: %s: calling anew", call.durable, exc)
            return None
        except msgspec.DecodeError:
            await self._store().delete(key)
            if signer is not None:
                raise SignatureError(what, "unreadable") from None
            log.warning("unreadable task record for durable call %r: calling anew", call.durable)
            return None
        if signer is not None:
            try:
                verify_own(STORE_NAME, record.signed(key), record.signature, signer, what)
            except SignatureError:
                await self._store().delete(key)
                raise
        if record.call != _call_digest(call):
            raise InvalidRequest(
                f"durable call {call.durable!r} of tool {call.name!r} exists with other "
                "arguments: a durable id names one call (use another id)"
            )
        if record.expires_at is not None and record.expires_at < time.time():
            log.info("durable call %r: its task has ended: calling anew", call.durable)
            await self._store().delete(key)
            return None
        return record

    def _durable_key(self, call: Call) -> str:
        return _digest(self._agent, self._asker.server_name, call.name, call.durable)

    async def _keep(self, drive: _Drive) -> None:
        if drive.durable_key is None:
            return
        if drive.terminal:
            await self._store().delete(drive.durable_key)
        else:
            await self._save(drive)

    async def _save(self, drive: _Drive) -> None:
        if drive.durable_key is None or drive.terminal:
            return
        ttl_s = drive.ttl_s if drive.ttl_s else UNLIMITED_TTL_S
        if drive.kept_until is None:
            drive.kept_until = time.time() + ttl_s
        expires_at = drive.expires_at if drive.expires_at is not None else drive.kept_until
        record = _Record(
            drive.task_id,
            drive.request_state,
            sorted(drive.answered),
            _call_digest(drive.call),
            expires_at,
            protocol=stamp(self._broker.write_protocol if self._broker is not None else PROTOCOL),
        )
        unsigned = msgspec.json.encode(record)
        if unsigned == drive.saved:  # a poll that changed nothing writes nothing
            return
        signer = self._broker.signing_key if self._broker is not None else None
        if signer is not None:
            record.signature = sign_own(STORE_NAME, record.signed(drive.durable_key), signer)
        await self._store().set(drive.durable_key, msgspec.json.encode(record), ttl_s=ttl_s)
        drive.saved = unsigned


class _Extension(ClientExtension):
    """The SDK client extension: declares the Tasks extension and claims ``"task"`` results."""

    identifier = TASKS_EXTENSION

    def __init__(self, tasks: Tasks) -> None:
        self._tasks = tasks

    def claims(self) -> Sequence[ResultClaim[Any]]:
        resolve: Callable[[CreateTaskResult, ClaimContext], Awaitable[CallToolResult]]
        resolve = self._tasks.resolve
        return (ResultClaim(result_type="task", model=CreateTaskResult, resolve=resolve),)
