"""LangGraph's and LangChain's interrupts through toolnexus (extra ``langgraph``).

A graph pauses with ``interrupt(value)`` and continues with ``Command(resume=...)``, one
resume value per interrupt id, its state kept by the graph's checkpointer under the
thread id. Each interrupt becomes toolnexus requests:

- LangChain v1's ``HumanInTheLoopMiddleware``, ``interrupt_mode="batched"`` (one
  interrupt per model turn, its ``action_requests`` answered by ``{"decisions": [...]}``)
  and ``"per_call"`` (one ``{"type": "tool_approval", ...}`` interrupt per call, answered
  by one decision): a ``kind="tool_call"`` request per action, with the tool's input
  schema. Approval is ``{"type": "approve"}``, an edit (where ``edit`` is allowed: else
  the request is not editable) ``{"type": "edit", "edited_action": ...}``, a denial,
  a deadline or a withdrawal ``{"type": "reject", "message": ...}`` (``respond`` with the
  message where ``reject`` is not allowed): never an approval.
- langgraph's ``HumanInterrupt`` list (``action_request`` and ``allow_accept`` /
  ``allow_edit`` / ``allow_respond`` / ``allow_ignore``): the same, answered by
  ``accept``, ``edit``, and ``response`` with the message (else ``ignore``).
- Any other ``interrupt()``: a question (a string, or ``{"question": ..., "options" |
  "schema": ...}`` as for :data:`~toolnexus.QUESTION_TOOL`), resumed with the
  question's result ``{"ok": True, "answer": ...}`` or ``{"ok": False, "reason": ...}``.

*Inline*: :func:`run_with_approvals` runs the graph and answers each interrupt through
``wait_for`` until none is left. *Resumable*: :func:`run_resumable` asks durably and keeps
the requests in ``broker.store("langgraph")`` under the thread id; should the process die,
:func:`resume` (any process sharing the checkpointer) attaches to them and sends the
``Command(resume=...)``. :class:`LedgerMiddleware` records each call's executed digest in
the :class:`~toolnexus.frameworks.Ledger` as the tool starts and refuses a second run.
The graph is run with ``ainvoke``: these helpers are async. The ``ainvoke`` that resumes
carries the digests the helpers' own decisions approved, by request id, in its config
(``configurable[APPROVED]``, kept in memory, never in a checkpoint): the middleware checks
the arguments about to run against them, not against the ledger's copy in Redis.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

import msgspec

from .._broker import Broker
from .._question import question
from ..codec import JSON
from ..errors import ConfigurationError, InvalidRequest
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
    from langchain.agents.middleware import AgentMiddleware, AgentState
    from langchain.agents.middleware.types import ToolCallRequest
    from langchain_core.messages import AIMessage, ToolMessage
    from langchain_core.runnables import RunnableConfig
    from langchain_core.tools import BaseTool
    from langchain_core.utils.function_calling import convert_to_openai_tool
    from langgraph.graph.state import CompiledStateGraph
    from langgraph.prebuilt import ToolNode
    from langgraph.types import Command, Interrupt
except ImportError as exc:  # pragma: no cover - the extra is installed in the tests
    raise missing_extra(__name__, "LangGraph and LangChain", "langgraph") from exc

FRAMEWORK: Final = "langgraph"
STORE: Final = "langgraph"
"""The broker store that keeps resumable runs' requests (:func:`run_resumable`)."""
APPROVED: Final = "toolnexus_approved"
"""The key of ``configurable`` in the config of the ``ainvoke`` that resumes a run: the
digest each decision of that resume approved, by request id, for :class:`LedgerMiddleware`
(a dict: LangGraph copies no such value into a checkpoint's metadata)."""

Graph = CompiledStateGraph[Any, Any, Any, Any]

_NONE: Final[frozenset[str]] = frozenset()
_REFUSALS: Final = frozenset({"reject", "respond", "ignore"})
_HUMAN_DECISIONS: Final = {  # HumanInterruptConfig's flags, as the decisions they allow
    "allow_accept": "approve",
    "allow_edit": "edit",
    "allow_respond": "respond",
    "allow_ignore": "ignore",
}


@dataclass(frozen=True)
class _Pause:
    """One interrupt as toolnexus asks it: ``shape`` is ``"batched"``, ``"per_call"``,
    ``"human"`` (tool calls: one request per call, each with its ``allowed`` decisions)
    or ``"question"`` (``value``: what the graph asked)."""

    interrupt_id: str
    shape: str
    requests: list[Request]
    allowed: list[frozenset[str]]
    durable: bool
    value: Any = None


def _thread_of(config: RunnableConfig) -> str:
    """The thread id of ``config`` (``{"configurable": {"thread_id": ...}}``): the run's
    name in requests.

    Raises:
        ConfigurationError: ``config`` names no thread (a checkpointer needs one).
    """
    thread = config.get("configurable", {}).get("thread_id")
    if thread is None or thread == "":
        raise ConfigurationError(
            "a LangGraph run that pauses needs config={'configurable': {'thread_id': ...}}"
        )
    return str(thread)


def _graph_tools(graph: Graph) -> dict[str, BaseTool]:
    """The tools of ``graph``'s ``ToolNode`` nodes (``create_agent``'s ``tools``), by name."""
    tools: dict[str, BaseTool] = {}
    for node in graph.nodes.values():
        if isinstance(node.bound, ToolNode):
            tools.update(node.bound.tools_by_name)
    return tools


def _schema(tool: BaseTool | None) -> dict[str, Any] | None:
    """The JSON input schema the model sees for ``tool`` (None: no such tool)."""
    if tool is None:
        return None
    parameters = convert_to_openai_tool(tool)["function"].get("parameters")
    return parameters if isinstance(parameters, dict) else None


def _tool_ids(messages: Sequence[Any], actions: Sequence[Mapping[str, Any]]) -> list[str | None]:
    """The model's tool call id of each batched action request: the next unmatched call of
    the last AI message with the same name and arguments (None: none matches)."""
    last = next((m for m in reversed(messages) if isinstance(m, AIMessage)), None)
    calls = list(last.tool_calls) if last is not None else []
    ids: list[str | None] = []
    for action in actions:
        match = next(
            (c for c in calls if c["name"] == action["name"] and c["args"] == action["args"]),
            None,
        )
        if match is not None:
            calls.remove(match)
        ids.append(match["id"] if match is not None else None)
    return ids


def _decision_types(schema: Any) -> frozenset[str]:
    """The decision types a per-call interrupt's ``response_schema`` (JSON) admits."""
    if not isinstance(schema, dict):
        return frozenset()
    mapping = schema.get("discriminator", {}).get("mapping")
    if isinstance(mapping, dict):
        return frozenset(mapping)
    const = schema.get("properties", {}).get("type", {}).get("const")
    return frozenset([const]) if isinstance(const, str) else frozenset()


def _is_human(item: Any) -> bool:
    return isinstance(item, dict) and {"action_request", "config"} <= item.keys()


@dataclass(frozen=True)
class _Action:
    name: str
    args: Any
    call_id: str | None
    description: str | None
    allowed: frozenset[str]


def _actions(interrupt: Interrupt[Any], messages: Sequence[Any]) -> tuple[str, list[_Action]]:
    """The shape of ``interrupt`` and the tool calls it asks about (none: a question)."""
    value = interrupt.value
    if isinstance(value, dict) and isinstance(value.get("action_requests"), list):
        configs = value.get("review_configs", [])
        allowed = {c["action_name"]: frozenset(c["allowed_decisions"]) for c in configs}
        requests = value["action_requests"]
        ids = _tool_ids(messages, requests)
        return "batched", [
            _Action(a["name"], a["args"], i, a.get("description"), allowed.get(a["name"], _NONE))
            for a, i in zip(requests, ids, strict=True)
        ]
    if isinstance(value, dict) and value.get("type") == "tool_approval":
        allowed_types = _decision_types(interrupt.response_schema)
        action = _Action(
            value["name"],
            value["args"],
            value["tool_call_id"],
            value.get("description"),
            allowed_types,
        )
        return "per_call", [action]
    if isinstance(value, list) and value and all(_is_human(item) for item in value):
        return "human", [
            _Action(
                item["action_request"]["action"],
                item["action_request"]["args"],
                None,
                item.get("description"),
                frozenset(d for flag, d in _HUMAN_DECISIONS.items() if item["config"].get(flag)),
            )
            for item in value
        ]
    return "question", []


def _question(interrupt: Interrupt[Any]) -> dict[str, Any]:
    """A plain interrupt's value as :data:`~toolnexus.QUESTION_TOOL`'s arguments.

    Raises:
        InvalidRequest: the value is neither a string nor ``{"question": str, ...}``.
    """
    value = interrupt.value
    spec = dict(value) if isinstance(value, dict) else {"question": value}
    spec["question"] = spec.get("question", spec.pop("prompt", None))
    if not isinstance(spec["question"], str):
        raise InvalidRequest(
            f"interrupt {interrupt.id!r}: toolnexus asks a string or "
            f"{{'question': ..., 'options' | 'schema': ...}}, not {value!r}"
        )
    return spec


def _pause(
    interrupt: Interrupt[Any],
    messages: Sequence[Any],
    tools: Mapping[str, BaseTool],
    run: str,
    *,
    durable: bool,
    agent: str | None,
) -> _Pause:
    """How ``interrupt`` is asked (the module's docstring lists the shapes).

    Raises:
        ConfigurationError: a tool call's allowed decisions offer no way to approve it or
            none to refuse it (a denial, a deadline must never run it).
        InvalidRequest: a tool call's arguments are not a JSON object, or a plain
            interrupt's value is no question (:func:`_question`).
    """
    shape, actions = _actions(interrupt, messages)
    if shape == "question":
        return _Pause(interrupt.id, shape, [], [], durable, value=_question(interrupt))
    requests = []
    for index, action in enumerate(actions):
        if not action.allowed & {"approve", "edit"} or not action.allowed & _REFUSALS:
            raise ConfigurationError(
                f"tool {action.name!r}: its interrupt allows {sorted(action.allowed)}; "
                "toolnexus needs a way to approve it (approve, edit) and one to refuse it "
                "(reject, respond, ignore), so that a denial or a deadline never runs it"
            )
        if not isinstance(action.args, dict):
            raise InvalidRequest(f"tool {action.name!r}: its arguments must be an object")
        call_id = action.call_id or f"{interrupt.id}-{index}"
        requests.append(
            tool_call_request(
                action.name,
                action.args,
                framework=FRAMEWORK,
                schema=_schema(tools.get(action.name)),
                run=run,
                call_id=call_id,
                prompt=action.description,
                request_id=call_request_id(FRAMEWORK, run, call_id),
                agent=agent,
                durable=durable,
                editable="edit" in action.allowed,
            )
        )
    return _Pause(interrupt.id, shape, requests, [a.allowed for a in actions], durable)


def _decision(shape: str, request: Request, decision: ToolDecision, allowed: frozenset[str]) -> Any:
    """The framework's decision for one tool call: HITL's (batched, per-call) or a
    ``HumanResponse`` (human). A denial is never an approval."""
    name = tool_call_of(request).name
    if shape == "human":
        if decision.approved and not decision.edited and "approve" in allowed:
            return {"type": "accept", "args": None}
        if decision.approved:
            return {"type": "edit", "args": {"action": name, "args": decision.arguments}}
        if "respond" in allowed:
            return {"type": "response", "args": decision.message}
        return {"type": "ignore", "args": None}
    if decision.approved and not decision.edited and "approve" in allowed:
        return {"type": "approve"}
    if decision.approved:
        return {"type": "edit", "edited_action": {"name": name, "args": decision.arguments}}
    kind = "reject" if "reject" in allowed else "respond"
    return {"type": kind, "message": decision.message or f"The call to {name} was denied."}


async def _resume_value(
    pause: _Pause, wait_for: WaitFor, ledger: Ledger | None, run: str
) -> tuple[Any, dict[str, str]]:
    """Ask ``pause`` through ``wait_for``: the value its interrupt resumes with, and the
    digest each of its approvals approved, by request id."""
    if pause.shape == "question":
        spec = pause.value
        result = await question(
            spec["question"],
            options=spec.get("options"),
            multiple=bool(spec.get("multiple", False)),
            schema=spec.get("schema"),
            wait_for=wait_for,
            request_id=call_request_id(FRAMEWORK, run, pause.interrupt_id),
            durable=pause.durable,
        )
        return result.to_dict(), {}
    decisions = await ask(wait_for, pause.requests, ledger=ledger)
    values = [
        _decision(pause.shape, request, decision, allowed)
        for request, decision, allowed in zip(pause.requests, decisions, pause.allowed, strict=True)
    ]
    approved = {
        request.id: decision.digest
        for request, decision in zip(pause.requests, decisions, strict=True)
        if decision.approved and decision.digest is not None
    }
    if pause.shape == "batched":
        return {"decisions": values}, approved
    return (values[0] if pause.shape == "per_call" else values), approved


async def _pauses(
    graph: Graph,
    config: RunnableConfig,
    tools: Mapping[str, BaseTool],
    *,
    durable: bool,
    agent: str | None,
) -> list[_Pause]:
    """Each interrupt the thread of ``config`` waits on, as toolnexus asks it."""
    snapshot = await graph.aget_state(config)
    values = snapshot.values if isinstance(snapshot.values, dict) else {}
    messages = values.get("messages", [])
    run = _thread_of(config)
    return [
        _pause(i, messages, tools, run, durable=durable, agent=agent) for i in snapshot.interrupts
    ]


async def _resume(
    graph: Graph,
    config: RunnableConfig,
    pauses: Sequence[_Pause],
    wait_for: WaitFor,
    ledger: Ledger | None,
    run: str,
) -> None:
    """Ask every pause at once (cancelling this cancels every wait, which withdraws a
    request that is not durable), then resume the graph with the ``Command`` that answers
    each interrupt by id, the digests approved in its config (:data:`APPROVED`)."""
    asked = await asyncio.gather(*(_resume_value(p, wait_for, ledger, run) for p in pauses))
    resumed = {p.interrupt_id: v for p, (v, _) in zip(pauses, asked, strict=True)}
    command: Command[Any] = Command(resume=resumed)
    approved = {request_id: d for _, digests in asked for request_id, d in digests.items()}
    configurable = {**config.get("configurable", {}), APPROVED: approved}
    await graph.ainvoke(command, {**config, "configurable": configurable})


def _known(graph: Graph, tools: Sequence[BaseTool]) -> dict[str, BaseTool]:
    return {**_graph_tools(graph), **{tool.name: tool for tool in tools}}


async def run_with_approvals(
    graph: Graph,
    input: Any,
    *,
    config: RunnableConfig,
    wait_for: WaitFor,
    ledger: Ledger | None = None,
    tools: Sequence[BaseTool] = (),
    agent: str | None = None,
) -> Any:
    """Run ``graph`` on ``input`` (``ainvoke``), answering each interrupt through
    ``wait_for`` and resuming with ``Command(resume={interrupt_id: value})`` until none is
    left; the thread's final state values. ``config`` names the thread (the run in
    requests); ``tools`` adds to the graph's own tools for their input schemas; with a
    ``ledger``, each call's proposed and approved digests are recorded (and the executed
    one by a :class:`LedgerMiddleware` in the agent). Cancelling withdraws the questions.

    Raises:
        ConfigurationError: ``config`` names no thread, or a tool's allowed decisions
            offer no way to approve or none to refuse.
    """
    run = _thread_of(config)
    known = _known(graph, tools)
    await graph.ainvoke(input, config)
    while pauses := await _pauses(graph, config, known, durable=False, agent=agent):
        await _resume(graph, config, pauses, wait_for, ledger, run)
    return (await graph.aget_state(config)).values


async def _finish(
    graph: Graph,
    broker: Broker,
    config: RunnableConfig,
    tools: Mapping[str, BaseTool],
    kept: dict[str, Request],
    agent: str | None,
) -> Any:
    """Answer each pause of the thread durably, keeping its requests while it waits (a
    kept request is asked as it was kept), and forget them once the run ends."""
    run = _thread_of(config)
    store = broker.store(STORE)
    ledger = Ledger.of(broker)
    while pauses := await _pauses(graph, config, tools, durable=True, agent=agent):
        pauses = [replace(p, requests=[kept.get(r.id, r) for r in p.requests]) for p in pauses]
        kept = {r.id: r for p in pauses for r in p.requests}
        encoded = msgspec.json.encode([JSON.encode(r) for r in kept.values()])
        await store.set(run, encoded, ttl_s=STATE_TTL_S)
        await _resume(graph, config, pauses, broker.wait_for, ledger, run)
    await store.delete(run)
    return (await graph.aget_state(config)).values


async def run_resumable(
    graph: Graph,
    input: Any,
    *,
    broker: Broker,
    config: RunnableConfig,
    tools: Sequence[BaseTool] = (),
    agent: str | None = None,
) -> Any:
    """Run ``graph`` on ``input``, its interrupts asked durably: the requests are kept
    under the thread id in ``broker.store("langgraph")`` while they wait, the graph's
    state in its checkpointer. Should this process die, :func:`resume` (in a process
    sharing the checkpointer) finishes the run. The thread's final state values.

    Raises:
        ConfigurationError: as :func:`run_with_approvals`.
    """
    _thread_of(config)
    await graph.ainvoke(input, config)
    return await _finish(graph, broker, config, _known(graph, tools), {}, agent)


async def resume(
    graph: Graph,
    *,
    broker: Broker,
    config: RunnableConfig,
    tools: Sequence[BaseTool] = (),
    agent: str | None = None,
) -> Any:
    """Finish the thread of ``config`` that :func:`run_resumable` left waiting (here or
    in a process that died): wait for its kept requests (attaching: nothing is asked
    again), then send ``Command(resume=...)`` through the shared checkpointer.

    Raises:
        RunNotFound: no run of this thread is kept (it finished, or never paused).
    """
    run = _thread_of(config)
    raw = await broker.store(STORE).get(run)
    if raw is None:
        raise RunNotFound(f"no resumable langgraph run of thread {run!r} is kept")
    kept = [
        JSON.decode_as(encoded, Request) for encoded in msgspec.json.decode(raw, type=list[bytes])
    ]
    return await _finish(
        graph, broker, config, _known(graph, tools), {r.id: r for r in kept}, agent
    )


class LedgerMiddleware(AgentMiddleware[AgentState[Any], Any]):
    """Records each asked tool call's executed digest in ``ledger`` as the tool starts,
    and refuses a call that ran already or with arguments other than approved
    (:meth:`~toolnexus.frameworks.Ledger.executing`). List it after the
    ``HumanInTheLoopMiddleware`` (inside it: it sees the edited arguments).

    The approved digest is the one this module's helpers decided, passed in the resuming
    ``ainvoke``'s config (:data:`APPROVED`). A graph resumed by other means has none
    there: a call the ledger knows of is then checked against the ledger's copy, which
    whoever may write the store can change (a refusal, never a run of other arguments
    than the graph's own)."""

    def __init__(self, ledger: Ledger) -> None:
        super().__init__()
        self.ledger = ledger

    async def awrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], Awaitable[ToolMessage | Command[Any]]],
    ) -> ToolMessage | Command[Any]:
        call_id = request.tool_call.get("id")
        thread = request.runtime.config.get("configurable", {}).get("thread_id")
        if call_id and thread is not None:
            request_id = call_request_id(FRAMEWORK, str(thread), call_id)
            call = request.tool_call
            decided = request.runtime.config.get("configurable", {}).get(APPROVED)
            approved = decided.get(request_id) if isinstance(decided, dict) else None
            if isinstance(approved, str):  # our own decision: it runs once, as approved
                await self.ledger.executing(
                    request_id, call["name"], call["args"], approved=approved
                )
            elif await self.ledger.get(request_id):  # asked about, resumed by other means
                await self.ledger.executing(request_id, call["name"], call["args"])
        return await handler(request)
