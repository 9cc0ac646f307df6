"""Google ADK's tool confirmations through toolnexus (extra ``google-adk``).

A tool built with ``FunctionTool(func, require_confirmation=True)``, or one that calls
``tool_context.request_confirmation(hint=..., payload=...)``, pauses the invocation: the
run yields an ``adk_request_confirmation`` function call and ends. Each becomes a
``kind="tool_call"`` request; its answer becomes the ``ToolConfirmation`` function
response (``confirmed``, ``payload``) that resumes the invocation:

- ``require_confirmation``: the form is the tool's arguments (its declared schema,
  pre-filled); an approval may edit them, and the tool runs with the edited arguments.
- ``request_confirmation(payload=...)`` with a dict payload: the form is the payload,
  pre-filled with the tool's proposal; the answer's data is the ``payload`` the tool reads.
- A denial, a deadline, or an answer the broker did not check: ``confirmed=False``, and
  the model is told the person's message (or the deadline's) instead of ADK's generic
  rejection.

The adapter's plugin (:class:`Confirmations`, registered on the runner by the functions
below) applies edits and messages as the resumed call starts, and records the executed
digest in a :class:`~toolnexus.frameworks.Ledger`, refusing a call it says ran already.

*Inline*: :func:`run_with_confirmations` runs until no confirmation is left, asking
through ``wait_for``. *Resumable*: :func:`run_resumable` keeps the requests in
``broker.store("google-adk")`` under the session and asks durably; should the process
die, :func:`resume` (in any process whose runner reads the same sessions: a
``SqliteSessionService`` file, a ``DatabaseSessionService`` database, Vertex AI) attaches
to the same requests and resumes the invocation. ``InMemorySessionService`` sessions die
with their process: inline only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

import msgspec

from .._broker import Broker
from ..codec import JSON
from ..errors import InvalidAnswer
from ..models import Answer, Request, WaitFor
from ._tool_call import (
    STATE_TTL_S,
    Ledger,
    RunNotFound,
    ToolDecision,
    call_request_id,
    checked_decision,
    missing_extra,
    tool_call_of,
    tool_call_request,
)

try:
    from google.adk.events import Event
    from google.adk.plugins import BasePlugin
    from google.adk.runners import Runner
    from google.adk.tools.base_tool import BaseTool
    from google.adk.tools.tool_context import ToolContext
    from google.genai import types
except ImportError as exc:  # pragma: no cover - the extra is installed in the tests
    raise missing_extra(__name__, "Google ADK", "google-adk") from exc

FRAMEWORK: Final = "google-adk"
STORE: Final = "google-adk"
"""The broker store that keeps resumable sessions' requests (:func:`run_resumable`)."""
CONFIRMATION: Final = "adk_request_confirmation"
"""The function call by which ADK asks for a tool confirmation."""
PLUGIN: Final = "toolnexus_confirmations"

_JSON_TYPES: Final = ((bool, "boolean"), (int, "integer"), (float, "number"), (str, "string"))


def _payload_form(payload: dict[str, Any]) -> dict[str, Any]:
    """A form for ``payload``: a field per key, typed by its value, pre-filled with it."""
    properties: dict[str, Any] = {}
    for key, value in payload.items():
        field: dict[str, Any] = {"title": key, "default": value}
        kind = next((name for cls, name in _JSON_TYPES if isinstance(value, cls)), None)
        if kind is not None:
            field["type"] = kind
        properties[key] = field
    return {"type": "object", "properties": properties, "required": list(payload)}


@dataclass(frozen=True)
class _Decided:
    """What the resumed call does: run with ``arguments`` (None: as proposed) or, denied,
    answer the model with the decision's message."""

    request_id: str
    decision: ToolDecision
    arguments: dict[str, Any] | None


class Confirmations(BasePlugin):
    """The runner plugin that applies each decision as the confirmed call starts: denied,
    the model is told why; approved, the call runs with the approved arguments (recorded
    as executed in the ledger, if one is set). It also notes each tool's declared schema,
    which the requests carry."""

    def __init__(self, ledger: Ledger | None = None) -> None:
        super().__init__(name=PLUGIN)
        self.ledger = ledger
        self.schemas: dict[str, dict[str, Any]] = {}  # by "session id/function call id"
        self.decided: dict[str, _Decided] = {}  # the same

    async def before_tool_callback(
        self, *, tool: BaseTool, tool_args: dict[str, Any], tool_context: ToolContext
    ) -> dict[str, Any] | None:
        call_id = f"{tool_context.session.id}/{tool_context.function_call_id}"
        if tool_context.tool_confirmation is None:  # the first call: it may ask
            declaration = tool._get_declaration()
            schema = declaration.parameters_json_schema if declaration else None
            if isinstance(schema, dict):
                self.schemas[call_id] = schema
            return None
        decided = self.decided.pop(call_id, None)
        if decided is None:  # confirmed by someone else than this adapter
            return None
        if not decided.decision.approved:
            return {"error": decided.decision.message or "Denied."}
        if decided.arguments is not None:  # ADK hands the tool these very arguments
            tool_args.clear()
            tool_args.update(decided.arguments)
        if self.ledger is not None:
            try:
                await self.ledger.executing(
                    decided.request_id,
                    tool.name,
                    dict(tool_args),
                    approved=decided.decision.digest,
                )
            except InvalidAnswer as exc:
                return {"error": str(exc)}
        return None


def _plugin(runner: Runner, ledger: Ledger | None) -> Confirmations:
    plugin = runner.plugin_manager.get_plugin(PLUGIN)
    if not isinstance(plugin, Confirmations):
        plugin = Confirmations(ledger)
        runner.plugin_manager.register_plugin(plugin)
    if ledger is not None:
        plugin.ledger = ledger
    return plugin


def confirmation_requests(
    events: Sequence[Event],
    *,
    session_id: str,
    plugin: Confirmations | None = None,
    agent: str | None = None,
    durable: bool = False,
) -> list[Request]:
    """The ``tool_call`` request of each ``adk_request_confirmation`` call in ``events`` of
    session ``session_id`` (the requests' ``run``; ``plugin`` knows the tools' schemas).
    Each request's ``data["adk"]`` keeps the confirmation call's id and the tool's
    payload."""
    requests = []
    for event in events:
        for call in event.get_function_calls():
            if call.name != CONFIRMATION or not call.args or not call.id:
                continue
            original = call.args.get("originalFunctionCall") or {}
            confirmation = call.args.get("toolConfirmation") or {}
            name, call_id = original.get("name") or "tool", original.get("id") or call.id
            payload = confirmation.get("payload")
            key = f"{session_id}/{call_id}"
            schema = plugin.schemas.get(key) if plugin is not None else None
            request = tool_call_request(
                name,
                dict(original.get("args") or {}),
                framework=FRAMEWORK,
                schema=schema,
                run=session_id,
                call_id=call_id,
                prompt=_prompt(confirmation.get("hint")),
                request_id=call_request_id(FRAMEWORK, session_id, call_id),
                agent=agent,
                durable=durable,
                editable=payload is None,
            )
            data = {**request.data, "adk": {"confirmation_id": call.id, "payload": payload}}
            if isinstance(payload, dict):
                data["schema"] = _payload_form(payload)
            requests.append(msgspec.structs.replace(request, data=data))
    return requests


ADK_OWN_HINT = "by responding with a FunctionResponse with an expected ToolConfirmation payload"
"""The end of the hint ADK itself gives a ``require_confirmation=True`` tool's
confirmation ("Please approve or reject the tool call transfer() by responding with a
FunctionResponse ..."): words for the model, not for a person."""


def _prompt(hint: Any) -> str | None:
    """The request's prompt for a confirmation's ``hint``: the tool's own words, or None
    (the request then asks about the call itself, shown with its arguments) for none or
    ADK's own (:data:`ADK_OWN_HINT`)."""
    if not isinstance(hint, str) or not hint.strip() or ADK_OWN_HINT in hint:
        return None
    return hint


def _decided(request: Request, answer: Answer) -> tuple[_Decided, dict[str, Any]]:
    """The decision on ``request``, and the ``ToolConfirmation`` response that carries it."""
    adk = request.data["adk"] if isinstance(request.data, dict) else {}
    payload = adk.get("payload")
    call = tool_call_of(request)
    decision = checked_decision(request, answer)
    if not decision.approved:
        return _Decided(request.id, decision, None), {"confirmed": False}
    if not isinstance(payload, dict):  # the form was the arguments
        response: dict[str, Any] = {"confirmed": True}
        if payload is not None:
            response["payload"] = payload
        return _Decided(request.id, decision, decision.arguments), response
    # the form was the payload: the arguments run as proposed
    if answer.data is not None:
        payload = decision.arguments
    kept = replace(decision, arguments=call.arguments, edited=False, digest=call.digest)
    return _Decided(request.id, kept, None), {"confirmed": True, "payload": payload}


async def _answer(
    plugin: Confirmations, requests: Sequence[Request], wait_for: WaitFor
) -> types.Content:
    """Ask every request at once (cancelling withdraws them); the message that resumes
    the invocation with their confirmations."""
    answers = await asyncio.gather(*(wait_for(request) for request in requests))
    parts = []
    for request, answer in zip(requests, answers, strict=True):
        decided, response = _decided(request, answer)
        if plugin.ledger is not None:
            await plugin.ledger.decided(request, decided.decision)
        call = tool_call_of(request)
        plugin.decided[f"{call.run}/{call.call_id}"] = decided
        confirmation_id = request.data["adk"]["confirmation_id"]
        reply = types.FunctionResponse(name=CONFIRMATION, id=confirmation_id, response=response)
        parts.append(types.Part(function_response=reply))
    return types.Content(role="user", parts=parts)


async def _run(
    runner: Runner, user_id: str, session_id: str, message: types.Content
) -> list[Event]:
    return [
        event
        async for event in runner.run_async(
            user_id=user_id, session_id=session_id, new_message=message
        )
    ]


async def run_with_confirmations(
    runner: Runner,
    *,
    user_id: str,
    session_id: str,
    new_message: types.Content,
    wait_for: WaitFor,
    ledger: Ledger | None = None,
) -> list[Event]:
    """Run ``new_message`` in the session, asking each tool confirmation through
    ``wait_for`` (all of one pause at once) and resuming, until none is left; every
    event of the run. With a ``ledger``, each call's proposed, approved and executed
    digests are recorded."""
    plugin = _plugin(runner, ledger)
    step = await _run(runner, user_id, session_id, new_message)
    events, agent = list(step), runner.agent.name
    while requests := confirmation_requests(
        step, session_id=session_id, plugin=plugin, agent=agent
    ):
        step = await _run(runner, user_id, session_id, await _answer(plugin, requests, wait_for))
        events += step
    return events


class _State(msgspec.Struct):
    user_id: str
    requests: list[bytes]  # each tool_call request, as JSON


def _key(runner: Runner, session_id: str) -> str:
    return f"{runner.app_name}/{session_id}"


async def _finish(
    runner: Runner,
    plugin: Confirmations,
    broker: Broker,
    user_id: str,
    session_id: str,
    events: list[Event],
) -> list[Event]:
    """Ask each pause's confirmations durably, keeping them while they wait, and resume;
    forget them once the run ends."""
    store, key, agent = broker.store(STORE), _key(runner, session_id), runner.agent.name
    while requests := confirmation_requests(
        events, session_id=session_id, plugin=plugin, agent=agent, durable=True
    ):
        protocol = broker.write_protocol
        kept = _State(user_id, [JSON.encode(request, protocol) for request in requests])
        await store.set(key, msgspec.json.encode(kept), ttl_s=STATE_TTL_S)
        message = await _answer(plugin, requests, broker.wait_for)
        events = await _run(runner, user_id, session_id, message)
    await store.delete(key)
    return events


async def run_resumable(
    runner: Runner,
    *,
    user_id: str,
    session_id: str,
    new_message: types.Content,
    broker: Broker,
) -> list[Event]:
    """Run ``new_message`` in the session, stopping the world at each pause for
    confirmations: the requests are kept under the session in
    ``broker.store("google-adk")`` and asked durably, and the invocation resumes when
    they are answered. Should this process die, :func:`resume` finishes the run (the
    runner's session service must outlive the process). The events of the last step."""
    plugin = _plugin(runner, Ledger.of(broker))
    events = await _run(runner, user_id, session_id, new_message)
    return await _finish(runner, plugin, broker, user_id, session_id, events)


async def resume(runner: Runner, *, session_id: str, broker: Broker) -> list[Event]:
    """Finish the run that :func:`run_resumable` left waiting in session ``session_id``
    (here or in a process that died): wait for its requests (attaching: they are not
    asked again) and resume the invocation with their confirmations.

    Raises:
        RunNotFound: no paused run of this session is kept.
    """
    raw = await broker.store(STORE).get(_key(runner, session_id))
    if raw is None:
        raise RunNotFound(f"no resumable google-adk run of session {session_id!r} is kept")
    kept = msgspec.json.decode(raw, type=_State)
    requests = [JSON.decode_as(encoded, Request) for encoded in kept.requests]
    plugin = _plugin(runner, Ledger.of(broker))
    message = await _answer(plugin, requests, broker.wait_for)
    events = await _run(runner, kept.user_id, session_id, message)
    return await _finish(runner, plugin, broker, kept.user_id, session_id, events)
