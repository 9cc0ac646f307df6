"""CrewAI flows' ``@human_feedback`` through toolnexus (extra ``crewai``).

A flow method decorated with ``@human_feedback(message=..., emit=["approved", "rejected"],
llm=..., provider=Feedback())`` stops after it ran for a person's review of its output.
:class:`Feedback` is that provider: the review becomes a ``kind="tool_call"`` request
(the method's name, ``{"output": <its output>}``, the flow's id as the run, the decorator's
message as the prompt), approve or deny only (CrewAI routes on the feedback; the output
under review cannot be edited). An approval is the feedback ``"approved"``; a denial is
``"rejected: <the person's message>"`` (a deadline: its message), which CrewAI's collapse
LLM maps onto the ``emit`` outcomes, and the flow goes on at the matching ``@listen``.

*Inline*: :func:`kickoff` runs a flow, its :class:`Feedback` steps asking through
``wait_for``. *Resumable*: :func:`run_resumable` runs a flow with persistence; at each
review CrewAI persists the paused flow (``HumanFeedbackPending``), the request is kept in
``broker.store("crewai")`` under the flow's id and asked durably, and the flow resumes with
``Flow.from_pending(...).resume_async(feedback)`` when answered. Should the process die,
:func:`resume` (in any process) attaches to the same request and resumes the flow; the
:class:`~toolnexus.frameworks.Ledger` refuses to resume an approved review twice.
"""

from __future__ import annotations

import contextvars
from typing import Any, Final, cast

from .._broker import Broker
from ..codec import JSON
from ..errors import ConfigurationError
from ..models import Request, WaitFor
from ._tool_call import (
    STATE_TTL_S,
    Ledger,
    RunNotFound,
    ToolDecision,
    ask,
    call_request_id,
    missing_extra,
    tool_call_request,
)

try:
    from crewai.flow import Flow
    from crewai.flow.async_feedback import HumanFeedbackPending, PendingFeedbackContext
    from crewai.flow.persistence.base import FlowPersistence
    from crewai.llms.base_llm import BaseLLM
except ImportError as exc:  # pragma: no cover - the extra is installed in the tests
    raise missing_extra(__name__, "CrewAI", "crewai") from exc

FRAMEWORK: Final = "crewai"
STORE: Final = "crewai"
"""The broker store that keeps paused flows' requests (:func:`run_resumable`)."""

_WAIT_FOR: contextvars.ContextVar[WaitFor | None] = contextvars.ContextVar(
    "toolnexus_crewai_wait_for", default=None
)


def feedback_request(
    context: PendingFeedbackContext, *, durable: bool = False, agent: str | None = None
) -> Request:
    """The ``tool_call`` request asking a person to review ``context``'s method output
    (one request per review: its id is made of the flow's id, the method's name and the
    time CrewAI asked)."""
    kept = context.to_dict()  # CrewAI's JSON form of the output
    call_id = f"{context.method_name}@{kept['requested_at']}"
    return tool_call_request(
        context.method_name,
        {"output": kept["method_output"]},
        framework=FRAMEWORK,
        run=context.flow_id,
        call_id=call_id,
        prompt=context.message or None,
        request_id=call_request_id(FRAMEWORK, context.flow_id, call_id),
        agent=agent,
        durable=durable,
        editable=False,
    )


class Feedback:
    """A CrewAI ``HumanFeedbackProvider`` asking through the ``wait_for`` that
    :func:`kickoff` gives the run; under :func:`run_resumable` (or a plain
    ``kickoff_async``) it pauses the flow for CrewAI to persist instead.

    ``approve`` and ``deny`` are the decorator's ``emit`` outcomes an approval and a
    denial stand for (both must be among them).
    """

    def __init__(self, *, approve: str = "approved", deny: str = "rejected") -> None:
        self.approve = approve
        self.deny = deny

    def check(self, context: PendingFeedbackContext) -> None:
        """Raises ConfigurationError: the decorator's ``emit`` lacks an outcome."""
        missing = [o for o in (self.approve, self.deny) if o not in (context.emit or [])]
        if missing:
            raise ConfigurationError(
                f"@human_feedback of {context.method_name!r}: emit must list the outcomes "
                f"{self.approve!r} and {self.deny!r} (missing {', '.join(map(repr, missing))})"
            )

    def feedback(self, decision: ToolDecision) -> str:
        """The feedback text ``decision`` gives CrewAI: the approve outcome, or the deny
        outcome and the message."""
        if decision.approved:
            return self.approve
        return f"{self.deny}: {decision.message or 'Denied.'}"

    async def request_feedback(self, context: PendingFeedbackContext, flow: Flow[Any]) -> str:
        self.check(context)
        wait_for = _WAIT_FOR.get()
        if wait_for is None:
            raise HumanFeedbackPending(context=context)
        request = feedback_request(context, agent=flow.name or type(flow).__name__)
        [decision] = await ask(wait_for, [request], editable=False)
        return self.feedback(decision)


async def kickoff(flow: Flow[Any], *, wait_for: WaitFor, **kickoff_kwargs: Any) -> Any:
    """``flow.kickoff_async(**kickoff_kwargs)``, each :class:`Feedback` review asked
    through ``wait_for`` while the flow waits (cancelling withdraws the question)."""
    token = _WAIT_FOR.set(wait_for)
    try:
        return await flow.kickoff_async(**kickoff_kwargs)
    finally:
        _WAIT_FOR.reset(token)


def _provider(flow_class: type[Flow[Any]], method: str) -> Feedback:
    """The :class:`Feedback` of ``flow_class``'s ``@human_feedback`` method ``method``."""
    step = getattr(flow_class, method, None)
    config = getattr(step, "__human_feedback_config__", None)
    provider = getattr(config, "provider", None)
    if not isinstance(provider, Feedback):
        raise ConfigurationError(
            f"{flow_class.__name__}.{method}: its @human_feedback provider is not a "
            "toolnexus.frameworks.crewai.Feedback"
        )
    return provider


async def _finish(
    flow_class: type[Flow[Any]],
    result: Any,
    broker: Broker,
    persistence: FlowPersistence | None,
    llm: BaseLLM | None,
    **flow_kwargs: Any,
) -> Any:
    """Answer each pause of the flow, keeping its request while it waits; forget it once
    the flow ends."""
    while isinstance(result, HumanFeedbackPending):
        request = feedback_request(result.context, durable=True)
        flow_id = result.context.flow_id
        kept = JSON.encode(request, broker.write_protocol)
        await broker.store(STORE).set(flow_id, kept, ttl_s=STATE_TTL_S)
        result = await _step(flow_class, flow_id, request, broker, persistence, llm, **flow_kwargs)
        await broker.store(STORE).delete(flow_id)
    return result


async def _step(
    flow_class: type[Flow[Any]],
    flow_id: str,
    request: Request,
    broker: Broker,
    persistence: FlowPersistence | None,
    llm: BaseLLM | None,
    **flow_kwargs: Any,
) -> Any:
    """Wait for ``request`` (durably) and resume the paused flow ``flow_id`` with it."""
    try:
        flow = flow_class.from_pending(flow_id, persistence, **flow_kwargs)
    except ValueError as exc:  # CrewAI: no pending feedback for this flow id
        raise RunNotFound(f"no paused CrewAI flow {flow_id!r} ({exc})") from exc
    context = flow.pending_feedback
    if context is None:
        raise RunNotFound(f"CrewAI flow {flow_id!r} is not waiting for feedback")
    ledger = Ledger.of(broker)
    [decision] = await ask(broker.wait_for, [request], ledger=ledger, editable=False)
    if decision.approved and decision.arguments is not None:  # resumed once, as approved
        await ledger.executing(
            request.id, context.method_name, decision.arguments, approved=decision.digest
        )
    if llm is not None:  # CrewAI rebuilds the decorator's LLM from its config otherwise
        context.llm = cast(Any, llm)  # typed as the config; CrewAI takes an LLM there too
    feedback = _provider(flow_class, context.method_name).feedback(decision)
    return await flow.resume_async(feedback)


async def run_resumable(
    flow: Flow[Any],
    *,
    broker: Broker,
    llm: BaseLLM | None = None,
    **kickoff_kwargs: Any,
) -> Any:
    """Run ``flow`` (give it a ``persistence``), stopping the world at each review: CrewAI
    persists the paused flow, the request is kept under the flow's id in
    ``broker.store("crewai")`` and asked durably, and the flow resumes when it is
    answered. Should this process die, :func:`resume` finishes the flow.

    ``llm`` is the collapse LLM of the decorators, when CrewAI cannot rebuild it from its
    config (a custom ``BaseLLM``).
    """
    token = _WAIT_FOR.set(None)  # each review pauses the flow, even inside a kickoff
    try:
        result = await flow.kickoff_async(**kickoff_kwargs)
        return await _finish(type(flow), result, broker, flow.persistence, llm)
    finally:
        _WAIT_FOR.reset(token)


async def resume(
    flow_class: type[Flow[Any]],
    *,
    broker: Broker,
    flow_id: str,
    persistence: FlowPersistence | None = None,
    llm: BaseLLM | None = None,
    **flow_kwargs: Any,
) -> Any:
    """Finish the flow ``flow_id`` that :func:`run_resumable` left paused (here or in a
    process that died): wait for its request (attaching: it is not asked again) and
    resume it from ``persistence`` (None: CrewAI's default), then go on as
    :func:`run_resumable` does. The request's ``tool_call.run`` is the flow's id.

    Raises:
        RunNotFound: no paused flow of this id is kept.
        InvalidAnswer: the review was approved and resumed already.
    """
    raw = await broker.store(STORE).get(flow_id)
    if raw is None:
        raise RunNotFound(f"no paused CrewAI flow {flow_id!r} is kept")
    request = JSON.decode_as(raw, Request)
    token = _WAIT_FOR.set(None)  # each further review pauses the flow, even inside a kickoff
    try:
        result = await _step(flow_class, flow_id, request, broker, persistence, llm, **flow_kwargs)
        await broker.store(STORE).delete(flow_id)
        return await _finish(flow_class, result, broker, persistence, llm, **flow_kwargs)
    finally:
        _WAIT_FOR.reset(token)
