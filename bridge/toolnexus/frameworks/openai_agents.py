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

import asyncio
import json
from collections.abc import Sequence
from typing import Any, Final

import msgspec

from .._broker import Broker
from ..codec import JSON
from ..errors import ConfigurationError, InvalidAnswer
from ..models import Request, WaitFor
from ._tool_call import (
    Ledger,
    RunNotFound,
    ToolDecision,
    call_request_id,
    decide,
    tool_call_of,
    tool_call_request,
)

try:
    from agents.items import ToolApprovalItem
    from agents.run_context import RunContextWrapper
    from agents.tool import Tool
    from agents.tool_context import ToolContext

    from agents import Agent, FunctionTool, RunHooks, Runner, RunResult, RunState
except ImportError as exc:  # pragma: no cover - the extra is installed in the tests
    raise ConfigurationError(
        "toolnexus.frameworks.openai_agents needs the OpenAI Agents SDK: "
        "pip install 'toolnexus[openai-agents]'"
    ) from exc

FRAMEWORK: Final = "openai-agents"
STORE: Final = "openai-agents"
"""The broker store that keeps resumable runs (:func:`run_resumable`)."""
STATE_TTL_S: Final = 7 * 24 * 3600.0


def _raw(item: ToolApprovalItem, key: str) -> Any:
    raw = item.raw_item
    return raw.get(key) if isinstance(raw, dict) else getattr(raw, key, None)


def approval_request(
    agent: Agent[Any], item: ToolApprovalItem, run: str, *, durable: bool = False
) -> Request:
    """The ``tool_call`` request of ``item``, with the schema of ``agent``'s tool."""
    name = item.name or "tool"
    text = _raw(item, "arguments")
    try:
        arguments = json.loads(text) if isinstance(text, str) and text else {}
    except json.JSONDecodeError:
        arguments = {"arguments": text}
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
        arguments if isinstance(arguments, dict) else {"arguments": arguments},
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
    """Records each asked call's executed digest in the ledger as its tool starts."""

    def __init__(self, ledger: Ledger, run: str) -> None:
        self.ledger = ledger
        self.run = run

    async def on_tool_start(
        self, context: RunContextWrapper[Any], agent: Agent[Any], tool: Tool
    ) -> None:
        if not isinstance(context, ToolContext):
            return
        request_id = call_request_id(FRAMEWORK, self.run, context.tool_call_id)
        if not await self.ledger.get(request_id):
            return  # a call nobody was asked about
        arguments = json.loads(context.tool_arguments or "{}")
        await self.ledger.executing(request_id, tool.name, arguments)


def _denied(message: str) -> ToolDecision:
    return ToolDecision(
        approved=False,
        arguments=None,
        edited=False,
        message=message,
        reason=None,
        digest=None,
        answered_by=None,
    )


async def _decisions(
    wait_for: WaitFor, requests: Sequence[Request], ledger: Ledger | None
) -> list[ToolDecision]:
    answers = await asyncio.gather(*(wait_for(request) for request in requests))
    decisions = []
    for request, answer in zip(requests, answers, strict=True):
        try:
            decision = decide(request, answer)
        except InvalidAnswer as exc:  # an answer no broker checked: never run it
            name = tool_call_of(request).name
            decision = ToolDecision(
                False, None, False, f"Invalid approval of {name}: {exc}", None, None, None
            )
        if decision.edited:  # the SDK cannot run other arguments: never run the proposal
            decision = _denied("Edited arguments cannot be run by this framework.")
        if ledger is not None:
            await ledger.decided(request, decision)
        decisions.append(decision)
    return decisions


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
    result = await Runner.run(agent, input, hooks=hooks, **run_kwargs)
    while result.interruptions:
        state = result.to_state()
        items = list(result.interruptions)
        requests = [approval_request(agent, item, run) for item in items]
        _apply(state, items, requests, await _decisions(wait_for, requests, ledger))
        result = await Runner.run(agent, state, hooks=hooks, **run_kwargs)
    return result


class _State(msgspec.Struct):
    state: str  # RunState.to_string()
    requests: list[bytes]  # each tool_call request, as JSON


async def _finish(
    agent: Agent[Any],
    broker: Broker,
    run: str,
    result: RunResult,
    ledger: Ledger,
    **run_kwargs: Any,
) -> RunResult:
    hooks = _Executed(ledger, run)
    while result.interruptions:
        state = result.to_state()
        requests = [approval_request(agent, i, run, durable=True) for i in result.interruptions]
        kept = _State(state.to_string(), [JSON.encode(r) for r in requests])
        await broker.store(STORE).set(run, msgspec.json.encode(kept), ttl_s=STATE_TTL_S)
        decisions = await _decisions(broker.wait_for, requests, ledger)
        _apply(state, list(result.interruptions), requests, decisions)
        result = await Runner.run(agent, state, hooks=hooks, **run_kwargs)
    await broker.store(STORE).delete(run)
    return result


async def run_resumable(
    agent: Agent[Any], input: str, *, broker: Broker, run: str, **run_kwargs: Any
) -> RunResult:
    """Run ``agent`` on ``input``, stopping the world at each tool approval: the
    serialized ``RunState`` and the requests are kept under ``run`` (unique to this run)
    in ``broker.store("openai-agents")``, the requests asked durably. Should this process
    die, :func:`resume` finishes the run."""
    ledger = Ledger(broker.store("tool-calls"))
    result = await Runner.run(agent, input, hooks=_Executed(ledger, run), **run_kwargs)
    return await _finish(agent, broker, run, result, ledger, **run_kwargs)


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
    ledger = Ledger(broker.store("tool-calls"))
    decisions = await _decisions(broker.wait_for, requests, ledger)
    _apply(state, state.get_interruptions(), requests, decisions)
    result = await Runner.run(agent, state, hooks=_Executed(ledger, run), **run_kwargs)
    return await _finish(agent, broker, run, result, ledger, **run_kwargs)
