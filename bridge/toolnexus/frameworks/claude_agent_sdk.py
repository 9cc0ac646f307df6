"""The Claude Agent SDK's tool permissions through toolnexus (extra ``claude-agent-sdk``).

The SDK drives the Claude Code CLI, which asks before a tool runs. Two ways to answer
through ``wait_for``, each call a ``kind="tool_call"`` request:

*Inline*: :func:`can_use_tool` is the ``can_use_tool`` callback of
``ClaudeAgentOptions``: it asks, and returns ``PermissionResultAllow`` (with
``updated_input`` for an edit, checked against the tool's schema where ``schemas`` names
it) or ``PermissionResultDeny`` with the person's message. The CLI waits on the callback
while it runs; cancelling the query withdraws the question.

*Resumable*: :func:`run_resumable` installs a ``PreToolUse`` hook that defers each tool
call (``permissionDecision: "defer"``): the CLI stops with the call in
``ResultMessage.deferred_tool_use``. The session id and the request are kept in
``broker.store("claude-agent-sdk")``, the request asked durably; once answered, the
session is resumed (``resume=session_id``) and the hook allows the call (with the
approved arguments as ``updatedInput``) or denies it with the message. Should the process
die while it waits, :func:`resume` in any process (the same ``cwd`` and Claude config
directory: the CLI keeps the session's transcript there) attaches to the same request and
finishes the session; the :class:`~toolnexus.frameworks.Ledger` refuses to run a call
twice.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from typing import Any, Final

import msgspec

from .._broker import Broker
from ..codec import JSON
from ..errors import ConfigurationError, InvalidAnswer
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
    from claude_agent_sdk import (
        ClaudeAgentOptions,
        ClaudeSDKClient,
        HookContext,
        HookInput,
        HookJSONOutput,
        HookMatcher,
        PermissionResultAllow,
        PermissionResultDeny,
        ResultMessage,
        ToolPermissionContext,
    )
except ImportError as exc:  # pragma: no cover - the extra is installed in the tests
    raise missing_extra(__name__, "the Claude Agent SDK", "claude-agent-sdk") from exc

FRAMEWORK: Final = "claude-agent-sdk"
STORE: Final = "claude-agent-sdk"
"""The broker store that keeps resumable sessions (:func:`run_resumable`)."""

CanUseTool = Callable[
    [str, dict[str, Any], ToolPermissionContext],
    Awaitable[PermissionResultAllow | PermissionResultDeny],
]


def _request(
    name: str,
    arguments: dict[str, Any],
    call_id: str,
    run: str,
    schemas: Mapping[str, dict[str, Any]] | None,
    *,
    prompt: str | None = None,
    agent: str | None = None,
    durable: bool = False,
) -> Request:
    return tool_call_request(
        name,
        arguments,
        framework=FRAMEWORK,
        schema=(schemas or {}).get(name),
        run=run,
        call_id=call_id,
        prompt=prompt,
        request_id=call_request_id(FRAMEWORK, run, call_id),
        agent=agent,
        durable=durable,
    )


def can_use_tool(
    wait_for: WaitFor,
    *,
    run: str,
    schemas: Mapping[str, dict[str, Any]] | None = None,
    ledger: Ledger | None = None,
    agent: str | None = None,
) -> CanUseTool:
    """A ``can_use_tool`` callback asking each tool call through ``wait_for``.

    ``run`` names the session in the requests (unique to it); ``schemas`` maps a tool's
    name as Claude calls it (``"mcp__bank__transfer"``) to its JSON input schema, which
    an edit must satisfy (a tool not named: any object). With a ``ledger``, each call's
    proposed and approved digests are recorded.
    """

    async def can_use(
        name: str, arguments: dict[str, Any], context: ToolPermissionContext
    ) -> PermissionResultAllow | PermissionResultDeny:
        call_id = context.tool_use_id or name
        request = _request(
            name, arguments, call_id, run, schemas, prompt=context.title, agent=agent
        )
        [decision] = await ask(wait_for, [request], ledger=ledger)
        if decision.approved:
            return PermissionResultAllow(updated_input=decision.arguments)
        return PermissionResultDeny(message=decision.message or "Denied.")

    return can_use


class _Deferring:
    """The ``PreToolUse`` hook of a resumable session: a call with a decision is allowed
    (recorded as executing in the ledger) or denied; any other call is deferred."""

    def __init__(self, run: str, ledger: Ledger) -> None:
        self.run = run
        self.ledger = ledger
        self.decided: dict[str, ToolDecision] = {}

    async def __call__(
        self, hook: HookInput, tool_use_id: str | None, context: HookContext
    ) -> HookJSONOutput:
        if hook["hook_event_name"] != "PreToolUse":
            return {}
        decision = self.decided.pop(hook["tool_use_id"], None)
        if decision is None:
            return {"hookSpecificOutput": {"hookEventName": "PreToolUse",
                                           "permissionDecision": "defer"}}  # fmt: skip
        arguments = decision.arguments
        if decision.approved and arguments is not None:
            request_id = call_request_id(FRAMEWORK, self.run, hook["tool_use_id"])
            try:
                await self.ledger.executing(
                    request_id, hook["tool_name"], arguments, approved=decision.digest
                )
            except InvalidAnswer as exc:
                decision = replace(decision, approved=False, message=str(exc))
            else:
                return {
                    "hookSpecificOutput": {
                        "hookEventName": "PreToolUse",
                        "permissionDecision": "allow",
                        "updatedInput": arguments,
                    }
                }
        return {
            "hookSpecificOutput": {
                "hookEventName": "PreToolUse",
                "permissionDecision": "deny",
                "permissionDecisionReason": decision.message or "Denied.",
            }
        }


class _State(msgspec.Struct):
    session_id: str
    request: bytes  # the tool_call request, as JSON


async def _turn(options: ClaudeAgentOptions, prompt: str | None) -> ResultMessage:
    """Run one turn of a session (``prompt`` None: resume it as it stopped); its result."""
    async with ClaudeSDKClient(options) as client:
        if prompt is not None:
            await client.query(prompt)
        async for message in client.receive_response():
            if isinstance(message, ResultMessage):
                return message
    raise ConfigurationError(
        "the Claude Code CLI ended the session without a result (its stderr says why)"
    )


async def _finish(
    options: ClaudeAgentOptions,
    broker: Broker,
    run: str,
    hook: _Deferring,
    result: ResultMessage,
    schemas: Mapping[str, dict[str, Any]] | None,
) -> ResultMessage:
    """Ask each deferred call durably, keeping the session while it waits, and resume the
    session with the decision; forget the session once it ends."""
    while result.deferred_tool_use is not None:
        deferred = result.deferred_tool_use
        request = _request(deferred.name, deferred.input, deferred.id, run, schemas, durable=True)
        kept = _State(result.session_id, JSON.encode(request, broker.write_protocol))
        await broker.store(STORE).set(run, msgspec.json.encode(kept), ttl_s=STATE_TTL_S)
        result = await _step(options, broker, hook, result.session_id, request)
    await broker.store(STORE).delete(run)
    return result


async def _step(
    options: ClaudeAgentOptions,
    broker: Broker,
    hook: _Deferring,
    session_id: str,
    request: Request,
) -> ResultMessage:
    """Wait for ``request`` (durably) and resume session ``session_id`` with its decision."""
    [decision] = await ask(broker.wait_for, [request], ledger=hook.ledger)
    hook.decided[tool_call_of(request).call_id or ""] = decision
    return await _turn(replace(options, resume=session_id), None)


def _with_hook(options: ClaudeAgentOptions, hook: _Deferring, matcher: str | None) -> Any:
    hooks = dict(options.hooks or {})
    hooks["PreToolUse"] = [*hooks.get("PreToolUse", []), HookMatcher(matcher, [hook])]
    return replace(options, hooks=hooks)


async def run_resumable(
    prompt: str,
    *,
    options: ClaudeAgentOptions,
    broker: Broker,
    run: str,
    schemas: Mapping[str, dict[str, Any]] | None = None,
    matcher: str | None = None,
) -> ResultMessage:
    """Run ``prompt`` in a new session, stopping the world at each tool call that
    ``matcher`` matches (a ``PreToolUse`` matcher; None: every tool): the call is
    deferred, the session id and the request kept under ``run`` (unique to this session)
    in ``broker.store("claude-agent-sdk")``, the request asked durably, and the session
    resumed when it is answered. Should this process die, :func:`resume` finishes it.
    The session's final ``ResultMessage``.
    """
    hook = _Deferring(run, Ledger.of(broker))
    options = _with_hook(options, hook, matcher)
    result = await _turn(options, prompt)
    return await _finish(options, broker, run, hook, result, schemas)


async def resume(
    *,
    options: ClaudeAgentOptions,
    broker: Broker,
    run: str,
    schemas: Mapping[str, dict[str, Any]] | None = None,
    matcher: str | None = None,
) -> ResultMessage:
    """Finish the session ``run`` that :func:`run_resumable` left waiting (here or in a
    process that died): wait for its request (attaching: it is not asked again) and
    resume the session with the decision. ``options`` must give the CLI the same ``cwd``
    and config directory (``CLAUDE_CONFIG_DIR``) as the first process.

    Raises:
        RunNotFound: no session of this name is kept.
    """
    raw = await broker.store(STORE).get(run)
    if raw is None:
        raise RunNotFound(f"no resumable claude-agent-sdk session {run!r} is kept")
    kept = msgspec.json.decode(raw, type=_State)
    request = JSON.decode_as(kept.request, Request)
    hook = _Deferring(run, Ledger.of(broker))
    options = _with_hook(options, hook, matcher)
    result = await _step(options, broker, hook, kept.session_id, request)
    return await _finish(options, broker, run, hook, result, schemas)
