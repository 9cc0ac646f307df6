"""Answering requests at a terminal (SPEC §12): the demo's responder, and ``worker terminal``'s.

A form is asked field by field (defaults offered, choices numbered, each value
checked as it is typed); an authorization shows its URL with the domain singled
out, and is never opened or fetched; a tool approval shows the tool and its arguments,
then approves them (y), denies with a message (n) or edits them field by field (e),
showing the changes before approving; y/n confirms. End of input (Ctrl-D) dismisses,
and so does :meth:`Terminal.interrupt` (what ``worker terminal`` calls on Ctrl-C).

Input is read by one thread per terminal, line by line, so a question abandoned
half way (its request was answered elsewhere) never swallows the next answer.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
from typing import Any, TextIO

from .._broker import Pending
from .._schema import FORMAT_SHAPES, options, validate_form
from ..errors import AlreadyVoted, InvalidAnswer, InvalidRequest, NotResolved
from ..models import DECLINED, DISMISSED, Answer, Request
from ..rendering import (
    ToolCallView,
    argument_changes,
    check_link,
    tool_call_fields,
    tool_call_view,
)
from ._serve import approvals_line

_BOLD, _DIM, _URL_HOST, _RESET = "\x1b[1m", "\x1b[2m", "\x1b[1;4;33m", "\x1b[0m"
_YES, _NO = frozenset({"y", "yes"}), frozenset({"n", "no"})
_SKIP = object()


class Terminal:
    """A person at a terminal, answering one request at a time.

    ``color`` defaults to on when ``output`` is a terminal and ``NO_COLOR`` is unset.
    """

    def __init__(
        self,
        *,
        stdin: TextIO | None = None,
        output: TextIO | None = None,
        color: bool | None = None,
    ) -> None:
        self.stdin = stdin or sys.stdin
        self.output = output or sys.stdout
        if color is None:
            color = self.output.isatty() and "NO_COLOR" not in os.environ
        self.color = color
        self._lines: _Lines | None = None
        self._interrupted = asyncio.Event()

    async def handle(self, pending: Pending) -> Answer | None:
        """Ask about ``pending`` until the broker takes the answer (returned) or another
        answer wins (``None``, after saying so)."""
        while True:
            answer = await self.ask(pending.request)
            try:
                progress = await pending.answer(answer)
            except InvalidAnswer as exc:
                self._say(f"  ✗ {exc}: please answer again.")
                continue
            except AlreadyVoted as exc:  # a quorum's (SPEC §14): it stays open for others
                self._say(f"  ✗ not counted: {exc.reason}")
                return None
            except NotResolved as exc:
                self._say(f"  (this request is no longer open: {exc.reason})")
                return None
            if progress is not None:
                self._say(f"  ✓ vote counted: {approvals_line(progress)}")
            else:
                self._say("  ✓ answer sent" if answer.ok else f"  ✓ {answer.reason}")
            return answer

    def interrupt(self) -> None:
        """Dismiss the question being asked (or the next one, if none is): Ctrl-C."""
        self._interrupted.set()

    def discard_typed_ahead(self) -> None:
        """Forget lines typed but not read yet (meant for a question that went away)."""
        if self._lines is not None:
            self._lines.discard()

    async def end_of_input(self) -> None:
        """Return once the person ends the input (Ctrl-D), reading from now on."""
        await self._reader().ended.wait()

    def say(self, text: str, *, dim: bool = False) -> None:
        """Print a line of text for the person, dimmed if asked."""
        self._say(self._style(text, _DIM) if dim else text)

    async def ask(self, request: Request) -> Answer:
        """The person's answer to ``request``; end of input or :meth:`interrupt` gives
        ``reason="dismissed"``."""
        try:
            tool = self._header(request)
            schema = request.schema
            if request.kind == "authorization" and request.url:
                return await self._ask_url(request, request.url)
            if tool is not None:
                return await self._ask_tool_call(request, tool)
            if schema is not None:
                return await self._ask_form(request, schema)
            accept = await self._yes_no("  Accept?")
            return _yes_or_declined(request, accept)
        except EOFError:
            self._say("")
            return Answer(id=request.id, ok=False, reason=DISMISSED)
        except _Interrupted:
            self._say("")
            return Answer(id=request.id, ok=False, reason=DISMISSED)

    # -- kinds -------------------------------------------------------------------

    async def _ask_url(self, request: Request, url: str) -> Answer:
        link = check_link(url)  # as the web page shows it: the same domain highlighted
        shown = link.before + link.host_prefix + self._style(link.domain, _URL_HOST) + link.after
        self._say(f"  URL:    {shown if link.domain else url}")
        if link.domain:
            other = f" (also written {link.other_form})" if link.other_form else ""
            self._say(f"  Domain: {self._style(link.domain, _BOLD)}{other}")
        for warning in link.warnings:
            self._say(f"  ⚠ {warning}")
        self._say(
            self._style(
                "  Open it yourself if you trust this domain; nothing is opened for you.", _DIM
            )
        )
        accept = await self._yes_no("  Continue with this authorization?")
        return _yes_or_declined(request, accept)

    async def _ask_tool_call(self, request: Request, tool: ToolCallView) -> Answer:
        schema = request.schema
        editable = tool_call_fields(request) is not None  # else: approve or deny as proposed
        keys = "y/n/e" if editable else "y/n"
        while True:
            text = (
                await self._read(f"  Approve this call to {tool.call.name}? [{keys}]: ")
            ).lower()
            if text in _YES:
                return Answer(id=request.id, ok=True)
            if text in _NO:
                message = await self._read("  Message for the agent (why not; optional): ")
                return Answer(id=request.id, ok=False, reason=DECLINED, data=message or None)
            if not editable or schema is None or text not in ("e", "edit"):
                choices = "y (yes), n (no) or e (edit the arguments)" if editable else "y or n"
                self._say(f"  ✗ {text!r} is not an answer: type {choices}")
                continue
            self._say(self._style("  Enter keeps an argument as proposed.", _DIM))
            data = await self._fields(schema)
            changes = argument_changes(request, validate_form(schema, data))
            for change in changes:
                self._say(f"  changed: {change}")
            if not changes:
                self._say("  (no changes: the arguments as proposed)")
            if await self._yes_no("  Approve the call with these arguments?"):
                return Answer(id=request.id, ok=True, data=data)

    async def _fields(self, schema: dict[str, Any]) -> dict[str, Any]:
        """Each field of ``schema`` asked in turn: the values given (a skipped one left out)."""
        required = set(schema.get("required", []))
        data: dict[str, Any] = {}
        for name, field in schema.get("properties", {}).items():
            value = await self._ask_field(
                name, field if isinstance(field, dict) else {}, name in required
            )
            if value is not _SKIP:
                data[name] = value
        return data

    async def _ask_form(self, request: Request, schema: dict[str, Any]) -> Answer:
        data = await self._fields(schema)
        self._say("  Your answer:")
        for line in _summary(schema, data):
            self._say(f"    {line}")
        accept = await self._yes_no("  Send this answer?")
        if not accept:
            return Answer(id=request.id, ok=False, reason=DECLINED)
        return Answer(id=request.id, ok=True, data=data)

    # -- one field ---------------------------------------------------------------

    async def _ask_field(self, name: str, field: dict[str, Any], required: bool) -> Any:
        """Ask one field until its value passes the field's own rules."""
        label = field.get("title") or name
        if field.get("description"):
            self._say(self._style(f"  {field['description']}", _DIM))
        choices = options(field)
        multiple = field.get("type") == "array"
        if choices:
            for number, (_, title) in enumerate(choices, 1):
                self._say(f"    {number}) {title}")
        while True:
            hint = _hint(field, choices, multiple, required)
            text = await self._read(f"  {label}{hint}: ")
            try:
                value = _parse(text, field, choices, multiple, required)
                if value is not _SKIP:
                    validate_form({"type": "object", "properties": {name: field}}, {name: value})
            except (ValueError, InvalidAnswer) as exc:
                self._say(f"  ✗ {exc}")
                continue
            return value

    # -- input and output --------------------------------------------------------

    async def _read(self, prompt: str) -> str:
        """The next line the person types, stripped.

        Raises:
            EOFError: end of input.
            _Interrupted: :meth:`interrupt` was called.
        """
        if self._interrupted.is_set():
            self._interrupted.clear()
            raise _Interrupted
        self.output.write(prompt)
        self.output.flush()
        line = asyncio.ensure_future(self._reader().get())
        interrupted = asyncio.ensure_future(self._interrupted.wait())
        try:
            await asyncio.wait({line, interrupted}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            line.cancel()
            interrupted.cancel()
        if not line.cancelled() and line.done():
            text = line.result()
            if text is None:
                raise EOFError
            return text.strip()
        self._interrupted.clear()
        raise _Interrupted

    async def _yes_no(self, question: str) -> bool:
        while True:
            text = (await self._read(f"{question} [y/n]: ")).lower()
            if text in _YES or text in _NO:
                return text in _YES
            self._say(f"  ✗ {text!r} is not an answer: type y (yes) or n (no)")

    def _reader(self) -> _Lines:
        if self._lines is None:
            self._lines = _Lines(self.stdin)
        return self._lines

    def _header(self, request: Request) -> ToolCallView | None:
        """Say what ``request`` is, who asks and its prompt; a tool approval's call (then
        returned), its tool and each argument."""
        source = request.source
        who = " · ".join(
            part
            for part in (
                source.server,
                source.tool,
                f"agent {source.agent}" if source.agent else None,
            )
            if part
        )
        title = f"{request.kind.replace('_', ' ')} request" + (f" from {who}" if who else "")
        self._say("")
        self._say(self._style(f"── {title} ──", _BOLD))
        if request.prompt:
            self._say(request.prompt)
        if request.kind != "tool_call":
            return None
        try:
            tool = tool_call_view(request)
        except InvalidRequest as exc:  # asked as the form it also is
            self._say(f"  ✗ This tool call cannot be shown: {exc}")
            return None
        self._say(f"  Tool:   {self._style(tool.call.name, _BOLD)} ({tool.origin})")
        if not tool.arguments:
            self._say("  (no arguments)")
        for argument in tool.arguments:
            self._say(f"    {argument.label} = {argument.text}")
        return tool

    def _style(self, text: str, style: str) -> str:
        return f"{style}{text}{_RESET}" if self.color else text

    def _say(self, text: str) -> None:
        print(text, file=self.output, flush=True)


class _Interrupted(Exception):
    """The person pressed Ctrl-C: the question is dismissed."""


class _Lines:
    """The lines of ``stdin``, read by one daemon thread into a queue; ``None`` at the end."""

    def __init__(self, stdin: TextIO) -> None:
        self._queue: asyncio.Queue[str | None] = asyncio.Queue()
        self._loop = asyncio.get_running_loop()
        self._ended = False  # get() returned the end
        self.ended = asyncio.Event()  # the thread read the end
        thread = threading.Thread(target=self._pump, args=(stdin,), daemon=True)
        thread.start()

    def _pump(self, stdin: TextIO) -> None:
        while True:
            line = stdin.readline()
            try:
                self._loop.call_soon_threadsafe(self._queue.put_nowait, line or None)
                if not line:
                    self._loop.call_soon_threadsafe(self.ended.set)
            except RuntimeError:  # the event loop is gone: nobody is listening
                return
            if not line:
                return

    async def get(self) -> str | None:
        if self._ended:
            return None
        line = await self._queue.get()
        self._ended = line is None
        return line

    def discard(self) -> None:
        while not self._queue.empty():
            if self._queue.get_nowait() is None:
                self._ended = True


def _summary(schema: dict[str, Any], data: dict[str, Any]) -> list[str]:
    """Each field of ``schema`` as answered in ``data``: its label and value, a choice by
    its title, a field left out as such."""
    lines = []
    for name, field in schema.get("properties", {}).items():
        field = field if isinstance(field, dict) else {}
        label = field.get("title") or name
        if name not in data:
            lines.append(f"{label}: (left out)")
            continue
        value = data[name]
        titles = dict(options(field))
        if isinstance(value, list):
            shown = ", ".join(str(titles.get(item, item)) for item in value) or "none"
        elif isinstance(value, bool):
            shown = "yes" if value else "no"
        else:
            shown = str(titles.get(value, value))
        lines.append(f"{label}: {shown}")
    return lines


def _yes_or_declined(request: Request, accept: bool) -> Answer:
    if accept:
        return Answer(id=request.id, ok=True)
    return Answer(id=request.id, ok=False, reason=DECLINED)


def _hint(
    field: dict[str, Any], choices: list[tuple[Any, str]], multiple: bool, required: bool
) -> str:
    """What to type, and the default, e.g. `` (integer 1–12) [2]``."""
    kind = field.get("type")
    if choices:
        what = f"numbers 1-{len(choices)}, comma-separated" if multiple else f"1-{len(choices)}"
    elif kind == "boolean":
        what = "y/n"
    elif kind in ("integer", "number"):
        low, high = field.get("minimum"), field.get("maximum")
        if low is not None and high is not None:
            what = f"{kind} {low}–{high}"
        elif low is not None or high is not None:
            what = f"{kind} ≥ {low}" if low is not None else f"{kind} ≤ {high}"
        else:
            what = str(kind)
    else:
        shape = FORMAT_SHAPES.get(field.get("format", ""))
        limits = [field["format"]] if "format" in field else []
        if shape is not None:
            limits.append(shape)
        if "maxLength" in field:
            limits.append(f"{field.get('minLength', 0)}–{field['maxLength']} characters")
        elif "minLength" in field:
            limits.append(f"at least {field['minLength']} characters")
        what = ", ".join(limits)
    parts = [what] if what else []
    if not required and "default" not in field:
        parts.append("optional")
    hint = f" ({'; '.join(parts)})" if parts else ""
    if "default" in field:
        hint += f" [{_show_default(field['default'], field, choices)}]"
    return hint


def _show_default(default: Any, field: dict[str, Any], choices: list[tuple[Any, str]]) -> str:
    if field.get("type") == "boolean":
        return "y" if default else "n"
    numbers = {value: str(number) for number, (value, _) in enumerate(choices, 1)}
    if isinstance(default, list):
        return ",".join(numbers.get(value, str(value)) for value in default) or "none"
    return numbers.get(default, str(default))


def _parse(
    text: str,
    field: dict[str, Any],
    choices: list[tuple[Any, str]],
    multiple: bool,
    required: bool,
) -> Any:
    """The value ``text`` stands for; ``_SKIP`` to leave an optional field out.

    Raises:
        ValueError: text that is not a value of the field's kind, or empty for a required field.
    """
    if not text:
        if "default" in field:
            return field["default"]
        if multiple:
            return []
        if not required:
            return _SKIP
        raise ValueError("an answer is required")
    if choices:
        picked = [_pick(part.strip(), choices) for part in text.split(",")] if multiple else None
        return picked if picked is not None else _pick(text, choices)
    kind = field.get("type")
    if kind == "boolean":
        if text.lower() in _YES | {"true", "1"}:
            return True
        if text.lower() in _NO | {"false", "0"}:
            return False
        raise ValueError("answer y or n")
    if kind == "integer":
        try:
            return int(text)
        except ValueError:
            raise ValueError(f"{text!r} is not a whole number") from None
    if kind == "number":
        try:
            number = float(text)
        except ValueError:
            raise ValueError(f"{text!r} is not a number") from None
        return int(number) if number.is_integer() and "." not in text else number
    return text


def _pick(text: str, choices: list[tuple[Any, str]]) -> Any:
    """The choice numbered or named ``text``.

    Raises:
        ValueError: no such choice.
    """
    if text.isdigit() and 1 <= int(text) <= len(choices):
        return choices[int(text) - 1][0]
    for value, label in choices:
        if text in (str(value), label):
            return value
    raise ValueError(f"{text!r} is not one of the choices 1-{len(choices)}")
