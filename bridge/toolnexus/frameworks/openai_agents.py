"""The OpenAI Agents SDK's tool approvals through toolnexus (extra ``openai-agents``).

A function tool with ``needs_approval`` makes ``Runner.run`` return with
``result.interruptions``: one ``ToolApprovalItem`` per call. Each becomes a
``kind="tool_call"`` request; its answer becomes ``state.approve(item)`` or
``state.reject(item, rejection_message=...)``. The SDK runs an approved call with the
arguments the model gave, so these requests are not editable (``editable=False``: the
broker refuses an edit to the responder).

*Inline*: :func:`run_with_approvals` runs the agent until no interruption is left,
asking through ``wait_for``. *Resumable*: :func:`run_resumable` keeps the serialized
``RunState`` and the requests in ``broker.store("openai-agents")`` and asks durably;
should the process die, :func:`resume` (in any process) attaches to the same requests
and finishes the run. With a :class:`~toolnexus.frameworks.Ledger`, the executed digest
is recorded as the tool starts, and a call the ledger says ran already is refused.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Final

import msgspec

from .._broker import Broker
from ..codec import JSON
from ..errors import InvalidAnswer, ToolnexusError
from ..models import Request, WaitFor
from ._tool_call import (
    STATE_TTL_S,
    Ledger,
    RunNotFound,
    ToolDecision,
    ask,
    call_request_id,
    missing_extra,
    tool_call_of,
    tool_call_request,
)

try:
    from agents import Agent, FunctionTool, RunHooks, Runner, RunResult, RunState
    from agents.exceptions import AgentsException
    from agents.items import ToolApprovalItem
    from agents.run_context import RunContextWrapper
    from agents.tool import Tool
    from agents.tool_context import ToolContext
except ImportError as exc:  # pragma: no cover - the extra is installed in the tests
    raise missing_extra(__name__, "the OpenAI Agents SDK", "openai-agents") from exc

FRAMEWORK: Final = "openai-agents"
STORE: Final = "openai-agents"
"""The broker store that keeps resumable runs (:func:`run_resumable`)."""


def _raw(item: ToolApprovalItem, key: str) -> Any:
    raw = item.raw_item
    return raw.get(key) if isinstance(raw, dict) else getattr(raw, key, None)


def _arguments(text: object) -> dict[str, Any]:
    """A call's arguments as the SDK holds them (JSON text), as an object: text that is not
    a JSON object is kept whole as ``{"arguments": ...}``."""
    try:
        arguments = json.loads(text) if isinstance(text, str) and text else {}
    except json.JSONDecodeError:
        arguments = text
    return arguments if isinstance(arguments, dict) else {"arguments": arguments}


def approval_request(
    agent: Agent[Any], item: ToolApprovalItem, run: str, *, durable: bool = False
) -> Request:
    """The ``tool_call`` request of ``item``, with the schema of ``agent``'s tool."""
    name = item.name or "tool"
    call_id = str(_raw(item, "call_id") or _raw(item, "id") or name)
    schema = next(
        (
            t.params_json_schema
            for t in agent.tools
            if isinstance(t, FunctionTool) and t.name == name
        ),
        None,
    )
    return tool_call_request(
        name,
        _arguments(_raw(item, "arguments")),
        framework=FRAMEWORK,
        schema=schema,
        run=run,
        call_id=call_id,
        request_id=call_request_id(FRAMEWORK, run, call_id),
        agent=agent.name,
        durable=durable,
        editable=False,
    )


class _Executed(RunHooks[Any]):
    """As a tool starts: a call that needs approval runs only if this process's own
    decision approved it with these arguments, and only once (the ledger claims it)."""

    def __init__(self, ledger: Ledger, run: str) -> None:
        self.ledger = ledger
        self.run = run
        self.approved: dict[str, str] = {}
        """The digest each approved call may run with, by request id: from this
        process's decisions, never from the kept ``RunState``."""

    def decided(self, requests: Sequence[Request], decisions: Sequence[ToolDecision]) -> None:
        for request, decision in zip(requests, decisions, strict=True):
            if decision.digest is not None:
                self.approved[request.id] = decision.digest

    async def on_tool_start(
        self, context: RunContextWrapper[Any], agent: Agent[Any], tool: Tool
    ) -> None:
        if not isinstance(context, ToolContext):
            return
        request_id = call_request_id(FRAMEWORK, self.run, context.tool_call_id)
        arguments = _arguments(context.tool_arguments)
        approved = self.approved.get(request_id)
        if approved is None:
            if not await _needs_approval(tool, context, arguments):
                return  # a call nobody has to be asked about
            raise InvalidAnswer(
                f"tool call {context.tool_call_id!r} of {tool.name}: no approval of this run "
                "approved it (the run's kept state may have been altered); the call is not run"
            )
        await self.ledger.executing(request_id, tool.name, arguments, approved=approved)


async def _needs_approval(tool: Tool, context: ToolContext[Any], arguments: dict[str, Any]) -> bool:
    """Whether the SDK asks before ``tool`` runs this call (its ``needs_approval``)."""
    needs = getattr(tool, "needs_approval", False)
    if callable(needs):
        return bool(await needs(context, arguments, context.tool_call_id))
    return bool(needs)


def _apply(
    state: RunState[Any, Any],
    items: Sequence[ToolApprovalItem],
    requests: Sequence[Request],
    decisions: Sequence[ToolDecision],
) -> None:
    by_call = {tool_call_of(r).call_id: d for r, d in zip(requests, decisions, strict=True)}
    for item in items:
        decision = by_call.get(str(_raw(item, "call_id") or _raw(item, "id") or item.name))
        if decision is None:
            continue
        if decision.approved:
            state.approve(item)
        else:
            state.reject(item, rejection_message=decision.message)


async def _run(
    agent: Agent[Any],
    input: str | RunState[Any, Any],
    *,
    hooks: _Executed | None,
    **run_kwargs: Any,
) -> RunResult:
    """``Runner.run``; a toolnexus error the SDK wrapped (raised as a tool started: a call
    refused) is raised as itself."""
    try:
        return await Runner.run(agent, input, hooks=hooks, **run_kwargs)
    except AgentsException as exc:
        if isinstance(exc.__cause__, ToolnexusError):
            raise exc.__cause__ from None
        raise


async def run_with_approvals(
    agent: Agent[Any],
    input: str,
    *,
    wait_for: WaitFor,
    run: str,
    ledger: Ledger | None = None,
    **run_kwargs: Any,
) -> RunResult:
    """Run ``agent`` on ``input`` until no interruption is left, asking each tool approval
    through ``wait_for`` (all of one turn at once; cancelling withdraws them). ``run``
    names the run in the requests (unique to it)."""
    hooks = _Executed(ledger, run) if ledger is not None else None
    result = await _run(agent, input, hooks=hooks, **run_kwargs)
    while result.interruptions:
        state = result.to_state()
        items = list(result.interruptions)
        requests = [approval_request(agent, item, run) for item in items]
        decisions = await ask(wait_for, requests, ledger=ledger, editable=False)
        if hooks is not None:
            hooks.decided(requests, decisions)
        _apply(state, items, requests, decisions)
        result = await _run(agent, state, hooks=hooks, **run_kwargs)
    return result


class _State(msgspec.Struct):
    state: str  # RunState.to_string()
    requests: list[bytes]  # each tool_call request, as JSON


async def _finish(
    agent: Agent[Any],
    broker: Broker,
    run: str,
    result: RunResult,
    hooks: _Executed,
    **run_kwargs: Any,
) -> RunResult:
    while result.interruptions:
        state = result.to_state()
        requests = [approval_request(agent, i, run, durable=True) for i in result.interruptions]
        kept = _State(state.to_string(), [JSON.encode(r) for r in requests])
        await broker.store(STORE).set(run, msgspec.json.encode(kept), ttl_s=STATE_TTL_S)
        decisions = await ask(broker.wait_for, requests, ledger=hooks.ledger, editable=False)
        hooks.decided(requests, decisions)
        _apply(state, list(result.interruptions), requests, decisions)
        result = await _run(agent, state, hooks=hooks, **run_kwargs)
    await broker.store(STORE).delete(run)
    return result


async def run_resumable(
    agent: Agent[Any], input: str, *, broker: Broker, run: str, **run_kwargs: Any
) -> RunResult:
    """Run ``agent`` on ``input``, stopping the world at each tool approval: the
    serialized ``RunState`` and the requests are kept under ``run`` (unique to this run)
    in ``broker.store("openai-agents")``, the requests asked durably. Should this process
    die, :func:`resume` finishes the run."""
    hooks = _Executed(Ledger.of(broker), run)
    result = await _run(agent, input, hooks=hooks, **run_kwargs)
    return await _finish(agent, broker, run, result, hooks, **run_kwargs)


async def resume(agent: Agent[Any], *, broker: Broker, run: str, **run_kwargs: Any) -> RunResult:
    """Finish the run ``run`` that :func:`run_resumable` left waiting (here or in a
    process that died): wait for its requests (attaching: they are not asked again) and
    continue from its kept ``RunState``.

    Raises:
        RunNotFound: no run of this name is kept.
    """
    raw = await broker.store(STORE).get(run)
    if raw is None:
        raise RunNotFound(f"no resumable openai-agents run {run!r} is kept")
    kept = msgspec.json.decode(raw, type=_State)
    requests = [JSON.decode_as(encoded, Request) for encoded in kept.requests]
    state = await RunState.from_string(agent, kept.state)
    hooks = _Executed(Ledger.of(broker), run)
    decisions = await ask(broker.wait_for, requests, ledger=hooks.ledger, editable=False)
    hooks.decided(requests, decisions)
    _apply(state, state.get_interruptions(), requests, decisions)
    result = await _run(agent, state, hooks=hooks, **run_kwargs)
    return await _finish(agent, broker, run, result, hooks, **run_kwargs)
