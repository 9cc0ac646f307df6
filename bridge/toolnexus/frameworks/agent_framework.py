"""The Microsoft Agent Framework's tool approvals through toolnexus (extra ``agent-framework``).

A function tool with ``approval_mode="always_require"`` makes ``agent.run`` return with
``response.user_input_requests``: one ``function_approval_request`` per call. Each becomes a
``kind="tool_call"`` request; its answer becomes
``request.to_function_approval_response(approved)``. The framework refuses to run a call
whose arguments changed after approval, so these requests are not editable
(``editable=False``: the broker refuses an edit to the responder).

*Inline*: :func:`run_with_approvals` runs an agent until no approval is left, asking
through ``wait_for``; a denial's message goes to the model as text beside the rejection.

*Resumable*: :func:`run_resumable` keeps the serialized ``AgentSession`` (the
conversation and the framework's pending approvals) and the requests in
``broker.store("agent-framework")`` and asks durably; should the process die,
:func:`resume` (in any process) attaches to the same requests and continues in the
restored session.

*Workflows, resumable*: an agent in a workflow surfaces the same approvals as the
workflow's ``request_info`` events. :func:`run_workflow` runs a workflow with a checkpoint
storage (``FileCheckpointStorage``), keeps the pause's checkpoint id and the requests in
``broker.store("agent-framework")`` and asks durably; should the process die,
:func:`resume_workflow` (in any process, with a workflow built the same way) attaches to
the same requests and continues from the checkpoint. A workflow's response is the
approval alone: a denial's message is not given to the model there (the framework says
"Error: Tool call invocation was rejected by user.").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final, TypeVar

import msgspec

from .._broker import Broker
from ..codec import JSON
from ..errors import ConfigurationError, InvalidRequest
from ..models import Request, WaitFor
from ._tool_call import (
    STATE_TTL_S,
    RunNotFound,
    ToolDecision,
    ask,
    call_request_id,
    missing_extra,
    tool_call_request,
)

try:
    from agent_framework import (
        AgentResponse,
        AgentSession,
        CheckpointStorage,
        Content,
        Message,
        SupportsAgentRun,
        Workflow,
        WorkflowRunResult,
    )
except ImportError as exc:  # pragma: no cover - the extra is installed in the tests
    raise missing_extra(__name__, "the Microsoft Agent Framework", "agent-framework") from exc

FRAMEWORK: Final = "agent-framework"
STORE: Final = "agent-framework"
"""The broker store that keeps paused workflows (:func:`run_workflow`)."""
_K = TypeVar("_K", bound=msgspec.Struct)


def approval_request(
    content: Content, *, run: str, agent: str | None = None, durable: bool = False
) -> Request:
    """The ``tool_call`` request of a ``function_approval_request`` content.

    Raises:
        InvalidRequest: ``content`` is not a function approval request.
    """
    kind = content.type if isinstance(content, Content) else type(content).__name__
    call = getattr(content, "function_call", None)
    if kind != "function_approval_request" or call is None or content.id is None:
        raise InvalidRequest(
            f"only function approval requests are asked through toolnexus, not a {kind!r}"
        )
    arguments = call.parse_arguments() or {}
    return tool_call_request(
        call.name or "tool",
        dict(arguments),
        framework=FRAMEWORK,
        run=run,
        call_id=content.id,
        request_id=call_request_id(FRAMEWORK, run, content.id),
        agent=agent,
        durable=durable,
        editable=False,
    )


async def _decisions(wait_for: WaitFor, requests: Sequence[Request]) -> list[ToolDecision]:
    """The decisions on ``requests``, asked at once: an edit is a denial, never a run (the
    framework runs a call with its proposed arguments only)."""
    return await ask(wait_for, requests, editable=False)


def _approvals(asked: Sequence[Content], decisions: Sequence[ToolDecision]) -> Message:
    """The user message answering ``asked``: the function approval responses, and each
    denial's message as text for the model."""
    contents = [
        c.to_function_approval_response(d.approved) for c, d in zip(asked, decisions, strict=True)
    ]
    notes = [d.message or "Denied." for d in decisions if not d.approved]
    return Message(role="user", contents=contents + [Content.from_text(n) for n in notes])


async def run_with_approvals(
    agent: SupportsAgentRun,
    input: Any,
    *,
    wait_for: WaitFor,
    run: str,
    **run_kwargs: Any,
) -> AgentResponse:
    """Run ``agent`` on ``input`` until no approval is left, asking each
    ``function_approval_request`` through ``wait_for`` (all of one turn at once;
    cancelling withdraws them) and answering with the function approval responses, a
    denial's message beside them as text for the model. ``run`` names the run in the
    requests (unique to it); ``run_kwargs`` go to every ``agent.run`` (a ``session=``
    keeps the conversation: without one, the agent gets a session of its own)."""
    if run_kwargs.get("session") is None:
        run_kwargs["session"] = agent.create_session()
    response: AgentResponse = await agent.run(input, **run_kwargs)
    while asked := response.user_input_requests:
        requests = [approval_request(c, run=run, agent=agent.name) for c in asked]
        decisions = await _decisions(wait_for, requests)
        response = await agent.run(_approvals(asked, decisions), **run_kwargs)
    return response


async def _kept(broker: Broker, run: str, kind: type[_K]) -> _K:
    """The state kept for ``run``: an agent's (``_Session``) or a workflow's (``_Paused``).

    Raises:
        RunNotFound: none is kept, or the other kind is.
    """
    raw = await broker.store(STORE).get(run)
    if raw is None:
        raise RunNotFound(f"no resumable agent-framework run {run!r} is kept")
    try:
        return msgspec.json.decode(raw, type=kind)
    except msgspec.ValidationError as exc:
        other = "resume_workflow" if kind is _Session else "resume"
        raise RunNotFound(f"agent-framework run {run!r} is not this kind: {other} ({exc})") from exc


class _Session(msgspec.Struct):
    session: dict[str, Any]  # AgentSession.to_dict(): the conversation and pending approvals
    approvals: list[dict[str, Any]]  # each function_approval_request, as its to_dict()
    requests: list[bytes]  # each tool_call request, as JSON


async def _continue(
    agent: SupportsAgentRun,
    broker: Broker,
    run: str,
    response: AgentResponse,
    session: AgentSession,
) -> AgentResponse:
    while asked := response.user_input_requests:
        requests = [approval_request(c, run=run, agent=agent.name, durable=True) for c in asked]
        kept = _Session(
            session.to_dict(), [c.to_dict() for c in asked], [JSON.encode(r) for r in requests]
        )
        await broker.store(STORE).set(run, msgspec.json.encode(kept), ttl_s=STATE_TTL_S)
        decisions = await _decisions(broker.wait_for, requests)
        response = await agent.run(_approvals(asked, decisions), session=session)
    await broker.store(STORE).delete(run)
    return response


async def run_resumable(
    agent: SupportsAgentRun, input: Any, *, broker: Broker, run: str
) -> AgentResponse:
    """Run ``agent`` on ``input`` in a session of its own, stopping the world at each turn
    of approvals: the serialized session (its conversation and pending approvals, kept
    in memory by the framework's default history) and the requests are kept under
    ``run`` (unique to this run) in ``broker.store("agent-framework")``, the requests
    asked durably. Should this process die, :func:`resume` finishes the run."""
    session = agent.create_session()
    response = await agent.run(input, session=session)
    return await _continue(agent, broker, run, response, session)


async def resume(agent: SupportsAgentRun, *, broker: Broker, run: str) -> AgentResponse:
    """Finish the run ``run`` that :func:`run_resumable` left waiting (here or in a
    process that died): wait for its requests (attaching: they are not asked again) and
    continue ``agent`` in the restored session.

    Raises:
        RunNotFound: no run of this name is kept.
    """
    kept = await _kept(broker, run, _Session)
    session = AgentSession.from_dict(kept.session)
    requests = [JSON.decode_as(encoded, Request) for encoded in kept.requests]
    asked = [Content.from_dict(approval) for approval in kept.approvals]
    decisions = await _decisions(broker.wait_for, requests)
    response = await agent.run(_approvals(asked, decisions), session=session)
    return await _continue(agent, broker, run, response, session)


class _Paused(msgspec.Struct):
    checkpoint_id: str
    request_ids: list[str]  # the workflow's request ids, one per approval
    approvals: list[dict[str, Any]]  # each function_approval_request, as its to_dict()
    requests: list[bytes]  # each tool_call request, as JSON


def _paused(result: WorkflowRunResult, run: str, checkpoint_id: str) -> _Paused:
    events = result.get_request_info_events()
    requests = [approval_request(e.data, run=run, durable=True) for e in events]
    return _Paused(
        checkpoint_id,
        [e.request_id for e in events],
        [e.data.to_dict() for e in events],
        [JSON.encode(r) for r in requests],
    )


async def _responses(broker: Broker, paused: _Paused) -> dict[str, Content]:
    """Wait for the paused run's requests; the workflow's responses by request id."""
    requests = [JSON.decode_as(encoded, Request) for encoded in paused.requests]
    decisions = await _decisions(broker.wait_for, requests)
    return {
        request_id: Content.from_dict(approval).to_function_approval_response(d.approved)
        for request_id, approval, d in zip(
            paused.request_ids, paused.approvals, decisions, strict=True
        )
    }


async def _finish(
    workflow: Workflow,
    broker: Broker,
    run: str,
    result: WorkflowRunResult,
    storage: CheckpointStorage,
) -> WorkflowRunResult:
    while events := result.get_request_info_events():
        checkpoint_id = await workflow.resolve_pause_checkpoint_id(
            [e.request_id for e in events], checkpoint_storage=storage
        )
        if checkpoint_id is None:
            raise ConfigurationError(
                f"workflow run {run!r} paused without a checkpoint: give run_workflow a "
                "checkpoint storage the workflow can write"
            )
        paused = _paused(result, run, checkpoint_id)
        await broker.store(STORE).set(run, msgspec.json.encode(paused), ttl_s=STATE_TTL_S)
        responses = await _responses(broker, paused)
        result = await workflow.run(responses=responses, checkpoint_storage=storage)
    await broker.store(STORE).delete(run)
    return result


async def run_workflow(
    workflow: Workflow,
    message: Any,
    *,
    broker: Broker,
    run: str,
    checkpoint_storage: CheckpointStorage,
) -> WorkflowRunResult:
    """Run ``workflow`` on ``message``, stopping the world at each pause for approvals:
    the pause's checkpoint id and the ``tool_call`` requests are kept under ``run`` (a
    name unique to this run) in ``broker.store("agent-framework")``, the requests asked
    durably; the run goes on when they are answered. Should this process die,
    :func:`resume_workflow` finishes the run from the checkpoint.

    Raises:
        InvalidRequest: the workflow asked for something other than a function approval
            (a ``request_info`` of another type): the run stops there.
    """
    result = await workflow.run(message, checkpoint_storage=checkpoint_storage)
    return await _finish(workflow, broker, run, result, checkpoint_storage)


async def resume_workflow(
    workflow: Workflow, *, broker: Broker, run: str, checkpoint_storage: CheckpointStorage
) -> WorkflowRunResult:
    """Finish the run ``run`` that :func:`run_workflow` left paused (here or in a process
    that died): wait for its requests (attaching: they are not asked again) and continue
    ``workflow`` (built as the paused one was) from the kept checkpoint.

    Raises:
        RunNotFound: no paused run of this name is kept.
    """
    paused = await _kept(broker, run, _Paused)
    responses = await _responses(broker, paused)
    result = await workflow.run(
        checkpoint_id=paused.checkpoint_id,
        checkpoint_storage=checkpoint_storage,
        responses=responses,
    )
    return await _finish(workflow, broker, run, result, checkpoint_storage)
