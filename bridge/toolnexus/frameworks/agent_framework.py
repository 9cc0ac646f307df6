"""The Microsoft Agent Framework's tool approvals through toolnexus (extra ``agent-framework``).

A function tool with ``approval_mode="always_require"`` makes ``agent.run`` return with
``response.user_input_requests``: one ``function_approval_request`` per call. Each becomes a
``kind="tool_call"`` request; its answer becomes
``request.to_function_approval_response(approved)``. The framework refuses to run a call
whose arguments changed after approval, so these requests are not editable
(``editable=False``: the broker refuses an edit to the responder).

*Inline*: :func:`run_with_approvals` runs an agent until no approval is left, asking
through ``wait_for``; a denial's message goes to the model as text beside the rejection.

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

from typing import Any, Final

import msgspec

from .._broker import Broker
from ..codec import JSON
from ..errors import ConfigurationError, InvalidRequest
from ..models import Request, WaitFor
from ._tool_call import RunNotFound, call_request_id, decide_each, tool_call_request

try:
    from agent_framework import (
        AgentResponse,
        CheckpointStorage,
        Content,
        Message,
        SupportsAgentRun,
        Workflow,
        WorkflowRunResult,
    )
except ImportError as exc:  # pragma: no cover - the extra is installed in the tests
    raise ConfigurationError(
        "toolnexus.frameworks.agent_framework needs the Microsoft Agent Framework: "
        "pip install 'toolnexus-bridge[agent-framework]'"
    ) from exc

FRAMEWORK: Final = "agent-framework"
STORE: Final = "agent-framework"
"""The broker store that keeps paused workflows (:func:`run_workflow`)."""
STATE_TTL_S: Final = 7 * 24 * 3600.0


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
        contents: list[Content] = []
        notes = []
        for content, decision in zip(asked, await decide_each(wait_for, requests), strict=True):
            contents.append(content.to_function_approval_response(decision.approved))
            if not decision.approved:
                notes.append(decision.message or "Denied.")
        contents += [Content.from_text(note) for note in notes]
        response = await agent.run(Message(role="user", contents=contents), **run_kwargs)
    return response


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
    decisions = await decide_each(broker.wait_for, requests)
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
    raw = await broker.store(STORE).get(run)
    if raw is None:
        raise RunNotFound(f"no paused agent-framework workflow run {run!r} is kept")
    paused = msgspec.json.decode(raw, type=_Paused)
    responses = await _responses(broker, paused)
    result = await workflow.run(
        checkpoint_id=paused.checkpoint_id,
        checkpoint_storage=checkpoint_storage,
        responses=responses,
    )
    return await _finish(workflow, broker, run, result, checkpoint_storage)
