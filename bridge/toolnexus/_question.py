"""The ``question`` builtin (SPEC §10): the tool an agent offers its model to ask the person.

It speaks the same contract as an MCP elicitation: one ``kind="input"`` request with
a form schema, through the same ``wait_for``. Free text and choices are one-field
forms (field ``answer``); a schema is asked as it is.

    result = await question("Which region?", options=["eu", "us"], wait_for=broker.wait_for)
    if result.ok:
        region = result.answer          # "eu"
    else:
        print("no answer:", result.reason)  # "declined", "expired", ...

:data:`QUESTION_TOOL` describes it for agent frameworks (name, description,
``inputSchema``); :func:`question_tool` gives the matching callable.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

from ._hops import HopSpec, hops
from ._numeric import check_number
from ._schema import check_answer, check_schema
from .errors import InvalidRequest
from .models import OnExpiry, Request, Source, WaitFor, new_id

QUESTION_TOOL: dict[str, Any] = {
    "name": "question",
    "description": (
        "Ask the person you are working for a question and wait for their answer. Use it "
        "when you need information, a decision or a confirmation that only they can give. "
        "Give `options` to offer a choice (with `multiple` to allow several), or `schema` "
        "for a small form; otherwise the answer is free text. The result has `ok`; with "
        "`ok` true, `answer` is the text, the chosen option (a list with `multiple`) or the "
        "form's fields; with `ok` false, `reason` says why there is no answer "
        "(`declined`, `dismissed`, `expired`, ...)."
    ),
    "inputSchema": {
        "type": "object",
        "properties": {
            "prompt": {
                "type": "string",
                "description": "The question, as the person will read it.",
            },
            "options": {
                "type": "array",
                "items": {"type": "string"},
                "minItems": 1,
                "description": "Choices the person picks from.",
            },
            "multiple": {
                "type": "boolean",
                "default": False,
                "description": "With `options`: allow picking several.",
            },
            "schema": {
                "type": "object",
                "description": (
                    "A flat JSON Schema object whose properties are the form's fields "
                    "(string, number, integer, boolean, enum, array of enum)."
                ),
            },
        },
        "required": ["prompt"],
        "additionalProperties": False,
    },
}
"""The ``question`` tool for agent frameworks: ``name``, ``description``, ``inputSchema``."""


@dataclass(frozen=True, slots=True)
class QuestionResult:
    """What came back: ``ok`` with the ``answer``, or not ``ok`` with the ``reason`` why not."""

    ok: bool
    answer: Any = None
    reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The result as the JSON a model reads: ``{"ok", "answer"}`` or ``{"ok", "reason"}``."""
        if self.ok:
            return {"ok": True, "answer": self.answer}
        return {"ok": False, "reason": self.reason}


QuestionTool: TypeAlias = Callable[..., Awaitable[dict[str, Any]]]
"""``async (prompt, options=None, multiple=False, schema=None) -> dict``: the tool's JSON result."""


def question_schema(
    *,
    options: Sequence[str] | None = None,
    multiple: bool = False,
    schema: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The form a question asks: ``schema`` itself, or a one-field form named ``answer``.

    Raises:
        InvalidRequest: both ``options`` and ``schema``, empty ``options``, ``multiple``
            without options, or a schema that is not a flat MCP form schema.
    """
    if schema is not None:
        if options is not None or multiple:
            raise InvalidRequest("a question takes either options or a schema, not both")
        check_schema(schema)
        return schema
    if options is None:
        if multiple:
            raise InvalidRequest("multiple=True needs options to pick from")
        field: dict[str, Any] = {"type": "string", "title": "Answer"}
    else:
        choices = list(options)
        if not choices or not all(isinstance(choice, str) for choice in choices):
            raise InvalidRequest("options must be a non-empty list of strings")
        enum = {"type": "string", "enum": choices}
        field = {"type": "array", "title": "Answers", "items": enum} if multiple else enum
    return {"type": "object", "properties": {"answer": field}, "required": ["answer"]}


async def question(
    prompt: str,
    *,
    wait_for: WaitFor,
    options: Sequence[str] | None = None,
    multiple: bool = False,
    schema: dict[str, Any] | None = None,
    timeout_s: float | None = None,
    agent: str | None = None,
    allow: Sequence[str] | None = None,
    on_expiry: OnExpiry | None = None,
    durable: bool = False,
    request_id: str | None = None,
    escalate: Sequence[HopSpec] | None = None,
) -> QuestionResult:
    """Ask the person ``prompt`` through ``wait_for`` and return what they answered.

    The answer is a string for free text, one of ``options`` (a list of them with
    ``multiple``), or for a ``schema`` the form's fields with defaults filled in. A
    decline, a dismissal or no answer before ``timeout_s`` is a result with
    ``ok=False`` and its ``reason``, never an exception. ``allow`` lists who may answer
    (responder key names and persons, ``slack:*`` patterns). ``escalate`` moves an
    unanswered question on to further queues (SPEC §14): ``[("15m", "oncall"), ("1h",
    "managers")]``, each hop's time counted from when it was asked; without
    ``timeout_s`` the wait lasts until the last hop plus the broker's default timeout.

    SPEC §14: ``on_expiry`` is what the result is when nobody answers in time (its
    ``reason`` is then ``"expired"``). ``durable`` asks with ``request_id`` (a fresh id if
    None) a question that outlives this process (``wait_for`` a broker's, which waits
    durably for a request marked durable); asking again with the same id after a restart
    attaches to it (the answer given meanwhile comes back at once).

    Raises:
        InvalidRequest: an empty prompt, a ``timeout_s`` that is not a positive finite
            number, options and schema that do not make a question
            (see :func:`question_schema`), or an escalation that cannot be followed (see
            :func:`~toolnexus._hops.check_hops`).
        InvalidAnswer: ``wait_for`` accepted data that breaks the form (a broker never does).
    """
    if not prompt or not prompt.strip():
        raise InvalidRequest("a question needs a prompt")
    if timeout_s is not None:
        check_number("timeout_s", timeout_s, error=InvalidRequest)
    form = question_schema(options=options, multiple=multiple, schema=schema)
    created_at = time.time()
    request = Request(
        id=request_id or new_id("qst"),
        kind="input",
        prompt=prompt,
        data={"schema": form},
        source=Source(tool="question", agent=agent),
        created_at=created_at,
        expires_at=None if timeout_s is None else created_at + timeout_s,
        allow=None if allow is None else list(allow),
        on_expiry=on_expiry,
        durable=durable,
        escalate=hops(escalate) if escalate else None,
    )
    answer = await wait_for(request)  # a broker waits durably for a durable request
    if not answer.ok:
        return QuestionResult(ok=False, reason=answer.reason)
    data = check_answer(request, answer, None).data
    return QuestionResult(ok=True, answer=data if schema is not None else data["answer"])


def question_tool(
    wait_for: WaitFor,
    *,
    timeout_s: float | None = None,
    agent: str | None = None,
    escalate: Sequence[HopSpec] | None = None,
) -> QuestionTool:
    """The ``question`` tool as an async callable taking :data:`QUESTION_TOOL`'s arguments;
    each question it asks escalates as ``escalate`` says (see :func:`question`).

    Raises:
        InvalidRequest: ``escalate`` holds a hop that is not ``(after, queue)``.

    It returns :meth:`QuestionResult.to_dict`; arguments that do not make a question
    give ``{"ok": False, "error": ...}`` so the model can correct itself.
    """

    planned = hops(escalate) if escalate else None

    async def run(
        prompt: str,
        options: list[str] | None = None,
        multiple: bool = False,
        schema: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        try:
            result = await question(
                prompt,
                wait_for=wait_for,
                options=options,
                multiple=multiple,
                schema=schema,
                timeout_s=timeout_s,
                agent=agent,
                escalate=planned,
            )
        except InvalidRequest as exc:
            return {"ok": False, "error": str(exc)}
        return result.to_dict()

    run.__name__ = run.__qualname__ = QUESTION_TOOL["name"]
    run.__doc__ = QUESTION_TOOL["description"]
    return run
