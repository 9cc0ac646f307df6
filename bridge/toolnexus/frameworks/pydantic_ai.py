"""pydantic-ai's tool approvals through toolnexus (extra ``pydantic-ai``).

A tool registered with ``requires_approval=True`` (or raising ``ApprovalRequired``) makes
a run stop with ``DeferredToolRequests``. Two ways to answer them through ``wait_for``:

*Inline*: :func:`approvals` is a capability (a ``HandleDeferredToolCalls`` handler) that
asks one ``kind="tool_call"`` request per call, all at once, and continues the run with
``ToolApproved`` (``override_args`` for an edit) or ``ToolDenied(message)``:

    agent = Agent(model, capabilities=[approvals(broker.wait_for)])

*Resumable*: :func:`run_resumable` runs the agent; when it stops for approvals it keeps
the message history and the requests in ``broker.store("pydantic-ai")`` under the run's
name, asks durably and continues when answered. If the process dies meanwhile,
:func:`resume` (in any process) attaches to the same durable requests and finishes the
run; the :class:`~toolnexus.frameworks.Ledger` refuses to run a call twice.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import msgspec

from .._broker import Broker
from ..codec import JSON
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
    from pydantic_ai import Agent
    from pydantic_ai.capabilities import AbstractCapability
    from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter, ToolCallPart
    from pydantic_ai.run import AgentRunResult
    from pydantic_ai.tools import (
        DeferredToolRequests,
        DeferredToolResults,
        RunContext,
        ToolApproved,
        ToolDefinition,
        ToolDenied,
    )
except ImportError as exc:  # pragma: no cover - the extra is installed in the tests
    raise missing_extra(__name__, "pydantic-ai", "pydantic-ai") from exc

FRAMEWORK: Final = "pydantic-ai"
STORE: Final = "pydantic-ai"
"""The broker store that keeps resumable runs (:func:`run_resumable`)."""


def _request(
    ctx: RunContext[Any], call: ToolCallPart, run: str, agent: str | None, durable: bool
) -> Request:
    tool_def = ctx.tool_manager.get_tool_def(call.tool_name) if ctx.tool_manager else None
    schema = tool_def.parameters_json_schema if tool_def is not None else None
    return tool_call_request(
        call.tool_name,
        call.args_as_dict(),
        framework=FRAMEWORK,
        schema=schema,
        run=run,
        call_id=call.tool_call_id,
        request_id=call_request_id(FRAMEWORK, run, call.tool_call_id),
        agent=agent,
        durable=durable,
    )


async def _decide_all(
    wait_for: WaitFor, requests: Sequence[Request], ledger: Ledger | None
) -> dict[str, ToolDecision]:
    """Ask every request at once (cancelling withdraws those not durable); the decision
    for each call id."""
    decisions = await ask(wait_for, requests, ledger=ledger)
    return {tool_call_of(r).call_id or "": d for r, d in zip(requests, decisions, strict=True)}


def _results(decisions: dict[str, ToolDecision]) -> DeferredToolResults:
    """pydantic-ai's results of ``decisions``: ``ToolApproved`` (``override_args`` for an
    edit) or ``ToolDenied(message)`` by call id."""
    results: dict[str, ToolApproved | ToolDenied] = {}
    for call_id, decision in decisions.items():
        if decision.approved:
            override = decision.arguments if decision.edited else None
            results[call_id] = ToolApproved(override_args=override)
        else:
            results[call_id] = ToolDenied(decision.message or "Denied.")
    return DeferredToolResults(approvals=dict(results))


@dataclass
class Approvals(AbstractCapability[Any]):
    """The capability :func:`approvals` makes (see there)."""

    wait_for: WaitFor | None
    ledger: Ledger | None = None
    agent: str | None = None
    durable: bool = False
    run: str | None = None
    """The run's name in requests (None: pydantic-ai's ``run_id``)."""
    asked: dict[str, Request] = field(default_factory=dict)
    """Requests by the call id they ask about, of this capability's runs."""
    approved: dict[str, str] = field(default_factory=dict)
    """The digest each approved call may run with, by call id: from this process's own
    decisions, never from kept state."""

    def decided(self, decisions: dict[str, ToolDecision]) -> None:
        """Note the digests ``decisions`` approved (see :attr:`approved`)."""
        self.approved.update({c: d.digest for c, d in decisions.items() if d.digest is not None})

    @classmethod
    def get_serialization_name(cls) -> str | None:
        return None

    async def handle_deferred_tool_calls(
        self, ctx: RunContext[Any], *, requests: DeferredToolRequests
    ) -> DeferredToolResults | None:
        if not requests.approvals:
            return None
        run = self.run or ctx.run_id or "run"
        asked = [_request(ctx, call, run, self.agent, self.durable) for call in requests.approvals]
        self.asked.update({tool_call_of(r).call_id or "": r for r in asked})
        if self.wait_for is None:  # resumable: the caller asks, after the run stopped
            return None
        decisions = await _decide_all(self.wait_for, asked, self.ledger)
        self.decided(decisions)
        return _results(decisions)

    async def before_tool_execute(
        self,
        ctx: RunContext[Any],
        *,
        call: ToolCallPart,
        tool_def: ToolDefinition,
        args: dict[str, Any],
    ) -> dict[str, Any]:
        if self.ledger is not None and ctx.tool_call_approved:
            run = self.run or ctx.run_id or "run"
            asked = self.asked.get(call.tool_call_id)
            request_id = asked.id if asked else call_request_id(FRAMEWORK, run, call.tool_call_id)
            await self.ledger.executing(
                request_id,
                call.tool_name,
                call.args_as_dict(),
                approved=self.approved.get(call.tool_call_id),
            )
        return args


def approvals(
    wait_for: WaitFor,
    *,
    ledger: Ledger | None = None,
    agent: str | None = None,
    run: str | None = None,
) -> Approvals:
    """A capability that answers an agent's tool approvals inline through ``wait_for``:
    one ``tool_call`` request per call (all asked at once), the run continuing with the
    decisions. With a ``ledger``, each call's proposed, approved and executed digests are
    recorded, and a call runs only with its approved arguments, once.

    ``run`` names the run in its requests (``tool_call.run``, shown to the people who
    answer, and the stable request ids derive from it): a name a responder can tie to the
    run, such as a job's or a ticket's. None: pydantic-ai's ``run_id``, a random id."""
    return Approvals(wait_for, ledger=ledger, agent=agent, run=run)


class _State(msgspec.Struct):
    messages: bytes  # pydantic-ai's JSON of the message history
    requests: list[bytes]  # each tool_call request, as JSON


async def _save(broker: Broker, run: str, messages: bytes, requests: Sequence[Request]) -> None:
    state = _State(messages, [JSON.encode(r, broker.write_protocol) for r in requests])
    await broker.store(STORE).set(run, msgspec.json.encode(state), ttl_s=STATE_TTL_S)


async def _finish(
    agent: Agent[Any, Any],
    broker: Broker,
    run: str,
    result: AgentRunResult[Any],
    capability: Approvals,
    ledger: Ledger,
    **run_kwargs: Any,
) -> AgentRunResult[Any]:
    """Answer each stop of the run for approvals, keeping its state while it waits, and
    forget the state once the run ends."""
    while isinstance(result.output, DeferredToolRequests):
        requests = [capability.asked[call.tool_call_id] for call in result.output.approvals]
        await _save(broker, run, result.all_messages_json(), requests)
        result, capability = await _step(
            agent, broker, run, result.all_messages(), requests, ledger, **run_kwargs
        )
    await broker.store(STORE).delete(run)
    return result


async def _step(
    agent: Agent[Any, Any],
    broker: Broker,
    run: str,
    messages: list[ModelMessage],
    requests: Sequence[Request],
    ledger: Ledger,
    **run_kwargs: Any,
) -> tuple[AgentRunResult[Any], Approvals]:
    """Wait for ``requests`` (durably) and continue the run from ``messages``."""
    decisions = await _decide_all(broker.wait_for, requests, ledger)
    capability = Approvals(None, ledger=ledger, durable=True, run=run)
    capability.asked.update({tool_call_of(r).call_id or "": r for r in requests})
    capability.decided(decisions)
    result = await agent.run(
        message_history=messages,
        deferred_tool_results=_results(decisions),
        capabilities=[capability],
        **run_kwargs,
    )
    return result, capability


async def run_resumable(
    agent: Agent[Any, Any], prompt: str, *, broker: Broker, run: str, **run_kwargs: Any
) -> AgentRunResult[Any]:
    """Run ``agent`` on ``prompt``, stopping the world at each tool approval: the message
    history and the ``tool_call`` requests are kept under ``run`` (a name unique to this
    run) in ``broker.store("pydantic-ai")``, the requests asked durably; the run goes on
    when they are answered. Should this process die, :func:`resume` finishes the run.

    The agent's ``output_type`` must admit ``DeferredToolRequests``.
    """
    ledger = Ledger.of(broker)
    capability = Approvals(None, ledger=ledger, durable=True, run=run)
    result = await agent.run(prompt, capabilities=[capability], **run_kwargs)
    return await _finish(agent, broker, run, result, capability, ledger, **run_kwargs)


async def resume(
    agent: Agent[Any, Any], *, broker: Broker, run: str, **run_kwargs: Any
) -> AgentRunResult[Any]:
    """Finish the run ``run`` that :func:`run_resumable` left waiting (in this process or
    one that died): wait for its requests (attaching to them: they are not asked again)
    and continue the run from its kept message history.

    Raises:
        RunNotFound: no run of this name is kept.
    """
    raw = await broker.store(STORE).get(run)
    if raw is None:
        raise RunNotFound(f"no resumable pydantic-ai run {run!r} is kept")
    state = msgspec.json.decode(raw, type=_State)
    requests = []
    for encoded in state.requests:
        request = JSON.decode(encoded)
        if not isinstance(request, Request):
            raise RunNotFound(f"the kept state of run {run!r} is malformed")
        requests.append(request)
    messages = ModelMessagesTypeAdapter.validate_json(state.messages)
    ledger = Ledger.of(broker)
    result, capability = await _step(agent, broker, run, messages, requests, ledger, **run_kwargs)
    return await _finish(agent, broker, run, result, capability, ledger, **run_kwargs)
