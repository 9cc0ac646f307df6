"""A remote A2A agent's paused tasks answered through toolnexus (extra ``a2a``).

An A2A agent pauses a task in ``input-required`` or ``auth-required``, its status message
saying what it needs. Calling the agent through :func:`send_message` (or
:func:`send_resumable`), each pause becomes one :class:`~toolnexus.Request` that every
responder can answer, and the answer continues the task with a message on the same task and
context ids, until the task ends. The status message decides the request:

- a data part ``{"tool_call": {"name", "arguments", "schema"?, "call_id"?}}``: a
  ``kind="tool_call"`` approval (:func:`~toolnexus.frameworks.tool_call_request`, editable);
- ``auth-required`` with a url part: ``kind="authorization"`` with that link;
- a data part ``{"schema": {...}}``: a form question (``kind="input"``) with that schema;
- else: a free-text question (``kind="input"``, one field ``answer``).

What the agent is sent (:func:`continuation`):

- an answer: the text (free text), a data part of the form's fields (form), a data part
  ``{"authorized": true}`` (a link), or ``{"tool_call": {"call_id", "name", "approved",
  "arguments", "edited", "message"}}`` (an approval: approved, denied, or not approved in
  time, with the message the agent gets);
- a decline (an explicit no): a data part ``{"declined": true, "message"?}`` with a text part:
  the agent decides what a refusal means for its task;
- no answer (expired, dismissed, withdrawn, unavailable): ``tasks/cancel``. Nobody can give
  the agent what it waits for, so its task is cancelled rather than left paused. A tool
  approval is the exception: no approval in time is a denial, sent as above.

Each request's id is derived from the agent, the task and the status message that paused it,
so :func:`resume` (in any process) attaches to the durable requests of a task
:func:`send_resumable` left waiting instead of asking again. :func:`watch` is a bridge for
the paused tasks no caller waits on: it lists them (``tasks/list``) and sees each through.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import math
import time
from collections.abc import Awaitable, Sequence
from typing import Any, Final, TypeVar

import msgspec

from .._broker import Broker
from .._question import question_schema
from .._schema import check_answer
from ..errors import InvalidAnswer, InvalidRequest
from ..models import Answer, Request, Source, WaitFor
from ._tool_call import (
    STATE_TTL_S,
    TOOL_CALL,
    RemoteAgentError,
    RunNotFound,
    decide,
    missing_extra,
    tool_call_of,
    tool_call_request,
)

try:
    import httpx
    from a2a.client import Client
    from a2a.helpers import get_data_parts, get_message_text, new_data_part
    from a2a.types import (
        CancelTaskRequest,
        GetTaskRequest,
        ListTasksRequest,
        Message,
        Part,
        Role,
        SendMessageRequest,
        Task,
        TaskState,
    )
    from a2a.utils.errors import A2AError
except ImportError as exc:  # pragma: no cover - the extra is installed in the tests
    raise missing_extra(__name__, "the A2A SDK", "a2a") from exc

__all__ = [
    "PAUSED",
    "STORE",
    "continuation",
    "pause_request",
    "resume",
    "send_message",
    "send_resumable",
    "watch",
]

logger = logging.getLogger(__name__)

FRAMEWORK: Final = "a2a"
STORE: Final = "a2a"
"""The broker store that keeps the task of each resumable call (:func:`send_resumable`)."""
PAUSED: Final = frozenset({TaskState.TASK_STATE_INPUT_REQUIRED, TaskState.TASK_STATE_AUTH_REQUIRED})
"""The states in which a task waits for its caller."""


def _ints(value: Any) -> Any:
    """A data part's JSON with whole floats as ints (protobuf keeps every number a double)."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {key: _ints(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_ints(item) for item in value]
    return value


def _data(message: Message) -> dict[str, Any]:
    """The message's data parts that are objects, merged (later keys win)."""
    merged: dict[str, Any] = {}
    for data in get_data_parts(message.parts):
        if isinstance(data, dict):
            merged.update(_ints(data))
    return merged


def _pause_id(remote: str, task: Task) -> str:
    status = task.status
    marker = status.message.message_id or status.timestamp.ToJsonString()
    digest = hashlib.sha256(f"{remote}\0{task.id}\0{marker}".encode()).hexdigest()[:32]
    return f"a2a-{digest}"


def pause_request(
    task: Task,
    *,
    remote: str,
    agent: str | None = None,
    timeout_s: float | None = None,
    durable: bool = False,
) -> Request:
    """The request asking what the paused ``task`` of the agent ``remote`` waits for.

    ``remote`` names the remote agent (its URL): shown to responders as the server, and part
    of the request id, which is the same for the same pause in every process. ``agent``
    names the agent that called it. ``meta["a2a"]`` holds the task's ids and state.

    Raises:
        InvalidRequest: ``task`` is not paused, its tool call is malformed, or its schema is
            not a flat form (the MCP subset :func:`toolnexus.question` asks too).
    """
    if task.status.state not in PAUSED:
        state = TaskState.Name(task.status.state)
        raise InvalidRequest(f"A2A task {task.id!r} is not waiting for input ({state})")
    message = task.status.message
    text = get_message_text(message).strip()
    data = _data(message)
    request_id = _pause_id(remote, task)
    expires_at = None if timeout_s is None else time.time() + timeout_s
    meta: dict[str, Any] = {
        "a2a": {
            "agent": remote,
            "task_id": task.id,
            "context_id": task.context_id,
            "state": TaskState.Name(task.status.state),
        }
    }
    call = data.get("tool_call")
    if isinstance(call, dict) and isinstance(call.get("name"), str):
        arguments = call.get("arguments", {})
        schema = call.get("schema")
        request = tool_call_request(
            call["name"],
            arguments,
            framework=FRAMEWORK,
            schema=schema if isinstance(schema, dict) else None,
            run=task.id,
            call_id=str(call.get("call_id") or call["name"]),
            prompt=text or None,
            request_id=request_id,
            agent=agent,
            expires_at=expires_at,
            durable=durable,
        )
        source = Source(server=remote, tool=call["name"], agent=agent)
        return msgspec.structs.replace(request, source=source, meta=meta)
    urls = [part.url for part in message.parts if part.HasField("url")]
    common: dict[str, Any] = {
        "id": request_id,
        "source": Source(server=remote, agent=agent),
        "expires_at": expires_at,
        "durable": durable,
        "meta": meta,
    }
    if task.status.state == TaskState.TASK_STATE_AUTH_REQUIRED and urls:
        prompt = text or f"Sign in for {remote}"
        return Request(kind="authorization", prompt=prompt, url=urls[0], **common)
    schema = data.get("schema")
    if not isinstance(schema, dict):
        meta["a2a"]["answer_as"] = "text"  # a free-text question: its answer goes as text
        schema = None
    prompt = text or f"{remote} needs your input"
    return Request(
        kind="input", prompt=prompt, data={"schema": question_schema(schema=schema)}, **common
    )


def _reply(task: Task, request: Request, parts: Sequence[Part], answer: Answer) -> Message:
    meta = {"request": request.id, "ok": answer.ok}
    if answer.reason:
        meta["reason"] = answer.reason
    if answer.answered_by:
        meta["answered_by"] = answer.answered_by
    message = Message(
        message_id=f"{request.id}-answer",
        task_id=task.id,
        context_id=task.context_id,
        role=Role.ROLE_USER,
        parts=list(parts),
    )
    message.metadata.update({"toolnexus": meta})
    return message


def continuation(task: Task, request: Request, answer: Answer) -> Message | None:
    """The message that continues ``task`` with ``answer`` to ``request``
    (:func:`pause_request`), or None where the task is to be cancelled (no answer came).

    Raises:
        InvalidAnswer: the answer is not for this request, or its data fails the request's
            schema (a broker never lets one through).
    """
    if answer.id != request.id:
        raise InvalidAnswer(f"answer {answer.id!r} does not answer request {request.id!r}")
    if request.kind == TOOL_CALL:
        call = tool_call_of(request)
        decision = decide(request, answer)
        result = {
            "call_id": call.call_id,
            "name": call.name,
            "approved": decision.approved,
            "arguments": decision.arguments,
            "edited": decision.edited,
            "message": decision.message,
        }
        text = "Approved." if decision.approved else f"Denied: {decision.message}"
        return _reply(
            task, request, [Part(text=text), new_data_part({"tool_call": result})], answer
        )
    if not answer.ok:
        if answer.reason != "declined":
            return None
        said = answer.data if isinstance(answer.data, str) else answer.meta.get("message")
        declined: dict[str, Any] = {"declined": True}
        if isinstance(said, str) and said.strip():
            declined["message"] = said
        text = "Declined." + (f" {declined['message']}" if "message" in declined else "")
        return _reply(task, request, [Part(text=text), new_data_part(declined)], answer)
    if request.kind == "authorization":
        return _reply(
            task, request, [Part(text="Done."), new_data_part({"authorized": True})], answer
        )
    fields = check_answer(request, answer, None).data
    if request.meta.get("a2a", {}).get("answer_as") == "text":
        return _reply(task, request, [Part(text=str(fields["answer"]))], answer)
    return _reply(task, request, [new_data_part(fields)], answer)


T = TypeVar("T")


async def _call(what: str, remote: str, step: Awaitable[T]) -> T:
    try:
        return await step
    except (A2AError, httpx.HTTPError) as exc:
        raise RemoteAgentError(f"A2A agent {remote!r}: {what} failed: {exc}") from exc


async def _send(client: Client, message: Message, remote: str) -> Task | Message:
    """Send ``message`` and return the task as it stands when the agent stops streaming
    (paused or ended), or the agent's message where it made no task."""
    task_id = message.task_id or None
    try:
        async for event in client.send_message(SendMessageRequest(message=message)):
            if event.HasField("message"):
                return event.message
            if event.HasField("task"):
                task_id = event.task.id
            elif event.HasField("status_update"):
                task_id = event.status_update.task_id
    except (A2AError, httpx.HTTPError) as exc:
        raise RemoteAgentError(f"A2A agent {remote!r}: sending a message failed: {exc}") from exc
    if not task_id:
        raise RemoteAgentError(f"A2A agent {remote!r} answered with neither a task nor a message")
    return await _call("tasks/get", remote, client.get_task(GetTaskRequest(id=task_id)))


async def _drive(
    client: Client,
    result: Task | Message,
    *,
    wait_for: WaitFor,
    remote: str,
    agent: str | None,
    timeout_s: float | None,
    durable: bool,
) -> Task | Message:
    while isinstance(result, Task) and result.status.state in PAUSED:
        request = pause_request(
            result, remote=remote, agent=agent, timeout_s=timeout_s, durable=durable
        )
        answer = await wait_for(request)
        reply = continuation(result, request, answer)
        if reply is None:
            cancel = client.cancel_task(CancelTaskRequest(id=result.id))
            return await _call("tasks/cancel", remote, cancel)
        result = await _send(client, reply, remote)
    return result


async def send_message(
    client: Client,
    message: Message,
    *,
    wait_for: WaitFor,
    remote: str,
    agent: str | None = None,
    timeout_s: float | None = None,
) -> Task | Message:
    """Send ``message`` to the A2A agent behind ``client`` and see its task through: each
    time the task pauses (``input-required``, ``auth-required``) ask through ``wait_for``
    and continue it with the answer (:func:`continuation`), until it ends. Returns the
    ended task (``completed``, ``failed``, ``rejected``, ``canceled``), or the agent's
    message where it made no task.

    ``remote`` names the agent (its URL) for responders and request ids; ``timeout_s``
    bounds each question. Cancelling the call withdraws the open question; the task stays
    paused at the agent.

    Raises:
        RemoteAgentError: the agent could not be reached or refused a call.
    """
    result = await _send(client, message, remote)
    return await _drive(
        client,
        result,
        wait_for=wait_for,
        remote=remote,
        agent=agent,
        timeout_s=timeout_s,
        durable=False,
    )


class _Kept(msgspec.Struct):
    remote: str
    task_id: str
    agent: str | None = None
    timeout_s: float | None = None


async def send_resumable(
    client: Client,
    message: Message,
    *,
    broker: Broker,
    run: str,
    remote: str,
    agent: str | None = None,
    timeout_s: float | None = None,
) -> Task | Message:
    """:func:`send_message` with durable questions: the task's id is kept under ``run``
    (unique to this call) in ``broker.store("a2a")`` as soon as the agent names it. Should
    this process die while the task waits, :func:`resume` (in any process) attaches to the
    same request and continues the same task.

    Raises:
        RemoteAgentError: the agent could not be reached or refused a call.
    """
    result = await _send(client, message, remote)
    if isinstance(result, Task):
        kept = _Kept(remote=remote, task_id=result.id, agent=agent, timeout_s=timeout_s)
        await broker.store(STORE).set(run, msgspec.json.encode(kept), ttl_s=STATE_TTL_S)
    ended = await _drive(
        client,
        result,
        wait_for=broker.wait_for,
        remote=remote,
        agent=agent,
        timeout_s=timeout_s,
        durable=True,
    )
    await broker.store(STORE).delete(run)
    return ended


async def resume(client: Client, *, broker: Broker, run: str) -> Task | Message:
    """Continue the task :func:`send_resumable` kept under ``run`` (here or in a process
    that died): read it from the agent and, while it is paused, wait for its request
    (attaching: it is not asked again) and continue it.

    Raises:
        RunNotFound: no call of this name is kept.
        RemoteAgentError: the agent could not be reached or refused a call.
    """
    raw = await broker.store(STORE).get(run)
    if raw is None:
        raise RunNotFound(f"no resumable A2A call {run!r} is kept")
    kept = msgspec.json.decode(raw, type=_Kept)
    get = client.get_task(GetTaskRequest(id=kept.task_id))
    task = await _call("tasks/get", kept.remote, get)
    ended = await _drive(
        client,
        task,
        wait_for=broker.wait_for,
        remote=kept.remote,
        agent=kept.agent,
        timeout_s=kept.timeout_s,
        durable=True,
    )
    await broker.store(STORE).delete(run)
    return ended


async def _paused(client: Client, remote: str, context_id: str | None) -> list[Task]:
    """The tasks of the agent that ``client`` may list and that wait for input."""
    found: list[Task] = []
    for state in sorted(PAUSED):
        token = ""
        while True:
            listing = ListTasksRequest(status=state, page_token=token, context_id=context_id)
            page = await _call("tasks/list", remote, client.list_tasks(listing))
            found.extend(page.tasks)
            token = page.next_page_token
            if not token:
                break
    return found


async def watch(
    client: Client,
    *,
    broker: Broker,
    remote: str,
    agent: str | None = None,
    timeout_s: float | None = None,
    poll_s: float = 5.0,
    context_id: str | None = None,
) -> None:
    """Answer every paused task of the agent ``remote`` that ``client`` may list: every
    ``poll_s`` seconds, list the tasks in ``input-required`` and ``auth-required``
    (``tasks/list``, only those of ``context_id`` if given) and see each through as
    :func:`send_message` does, asking durably. Runs until cancelled; a restarted watcher
    attaches to the questions already asked (nothing is asked twice).

    For tasks no other caller continues: a task its own caller is seeing through is
    answered twice. A call the agent refuses for one task is logged, and the task is
    taken up again at the next listing if it still waits.

    Raises:
        RemoteAgentError: listing the agent's tasks failed.
        InvalidRequest: ``poll_s`` is not a positive number of seconds.
    """
    if not (isinstance(poll_s, int | float) and math.isfinite(poll_s) and poll_s > 0):
        raise InvalidRequest(f"poll_s must be a positive number of seconds, got {poll_s!r}")
    driving: dict[str, asyncio.Task[Task | Message]] = {}

    def ended(task_id: str, driver: asyncio.Task[Task | Message]) -> None:
        driving.pop(task_id, None)
        if not driver.cancelled() and (error := driver.exception()) is not None:
            logger.warning("A2A agent %r, task %r: %s", remote, task_id, error)

    try:
        while True:
            for task in await _paused(client, remote, context_id):
                if task.id in driving:
                    continue
                driver = asyncio.create_task(
                    _drive(
                        client,
                        task,
                        wait_for=broker.wait_for,
                        remote=remote,
                        agent=agent,
                        timeout_s=timeout_s,
                        durable=True,
                    )
                )
                driving[task.id] = driver
                driver.add_done_callback(functools.partial(ended, task.id))
            await asyncio.sleep(poll_s)
    finally:
        drivers = list(driving.values())
        for driver in drivers:
            driver.cancel()
        await asyncio.gather(*drivers, return_exceptions=True)
