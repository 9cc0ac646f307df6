"""``toolnexus worker auto --rules rules.toml``: answer requests by rules, unattended.

(Or ``--policy FILE.cedar``: a Cedar policy decides, :mod:`toolnexus_workers.policy`;
``--shadow`` decides and answers nothing, counting agreement with people.)

For CI and unattended fleets. Rules are tried in order and the first that matches
decides; a request no rule matches is skipped (left for a person)::

    [[rule]]
    name = "CI may deploy to staging"   # optional: shown in the log and as the answer's person
    kind = "approval"                   # glob patterns, or lists of them, matched against
    agent = "ci-*"                      #   kind, server, tool and agent (a missing one is "")
    prompt = "(?i)\\\\bstaging\\\\b"        # a regular expression searched in the prompt
    action = "accept"                   # accept | decline | skip (leave it for a person)
    data = { environment = "staging" }  # accept: the form's data; the schema's defaults fill in
    after_s = 0                         # act only after this long: a person may answer first

A tool approval (``kind = "tool_call"``) is matched by its call: ``tool`` is the name of
the tool it would run (the call's own, bound to its digest, not the request's source),
and ``arguments`` sets conditions on the proposed arguments, all of which must hold (an
argument that is absent, or of another type, fails its condition)::

    [[rule]]
    name = "small transfers to ACME"
    kind = "tool_call"
    tool = "transfer_*"
    arguments.amount = { max = 100 }         # a number within bounds: min, max (inclusive)
    arguments.to = "ACME*"                   # a string matching a glob (or a list of them)
    arguments.memo = { regex = "(?i)refund" }  # a string a regular expression finds
    arguments.dry_run = false                # a number or boolean: exactly it ({ equals = ... }
    action = "accept"                        #   for any JSON value); accept: as proposed

A rules file that cannot be used is refused at start with its line and the reason.
Every decision is logged as one line, its outcome last (``decision=accept
request=… rule=1 (name) kind=… server=… tool=… agent=… prompt='…' outcome=answered``);
an answer the broker refuses says so (``outcome=refused: …``) and, when the data was
invalid, the request is left for a person.
"""

from __future__ import annotations

import argparse
import asyncio
import fnmatch
import logging
import re
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from toolnexus import (
    Broker,
    ConfigurationError,
    InvalidAnswer,
    NotResolved,
    Pending,
    Request,
    Worker,
)
from toolnexus.cli import EXIT_OK, failed
from toolnexus.errors import InvalidRequest
from toolnexus.frameworks import TOOL_CALL, ToolCall, tool_call_of
from toolnexus.models import DECLINED, AnsweredEvent, EndedEvent
from toolnexus.rendering import shorten, value_text

from .options import configure_logging, run_main, serve_worker, worker_parser

if TYPE_CHECKING:  # the extra "policy" (cedarpy) is imported only for --policy
    from .policy import Decision, Policy

log = logging.getLogger("toolnexus.auto")

Action = Literal["accept", "decline", "skip"]
ACTIONS: tuple[Action, ...] = ("accept", "decline", "skip")
MATCHED = ("kind", "server", "tool", "agent")
KEYS = frozenset({*MATCHED, "prompt", "arguments", "action", "data", "after_s", "name"})
CONDITIONS = frozenset({"min", "max", "regex", "glob", "equals"})
_HEADER = re.compile(r"\s*\[\[\s*rule\s*\]\]\s*(#.*)?$")


class RulesError(ConfigurationError):
    """A rules file that cannot be used; the message names the file, line and reason."""


@dataclass(frozen=True)
class Condition:
    """What one argument of a tool call must be (every part given must hold): a number
    from ``low`` to ``high``, a string matching one of ``globs`` or found by ``regex``, or
    exactly ``equals`` (``has_equals``: JSON-equal, so ``1`` is not ``true``)."""

    low: float | None = None
    high: float | None = None
    regex: re.Pattern[str] | None = None
    globs: tuple[str, ...] | None = None
    equals: Any = None
    has_equals: bool = False

    def holds(self, value: Any) -> bool:
        """Whether argument ``value`` meets this condition."""
        if self.has_equals and value_text(value) != value_text(self.equals):
            return False
        if self.low is not None or self.high is not None:
            if isinstance(value, bool) or not isinstance(value, int | float):
                return False
            if self.low is not None and value < self.low:
                return False
            if self.high is not None and value > self.high:
                return False
        if self.globs is not None or self.regex is not None:
            if not isinstance(value, str):
                return False
            if self.globs is not None and not any(
                fnmatch.fnmatchcase(value, g) for g in self.globs
            ):
                return False
            if self.regex is not None and self.regex.search(value) is None:
                return False
        return True


@dataclass(frozen=True)
class Rule:
    """One rule: what it matches, and what it does then."""

    index: int  # 1-based, in file order
    action: Action
    name: str | None = None
    kind: tuple[str, ...] | None = None
    server: tuple[str, ...] | None = None
    tool: tuple[str, ...] | None = None
    agent: tuple[str, ...] | None = None
    prompt: re.Pattern[str] | None = None
    arguments: tuple[tuple[str, Condition], ...] | None = None
    data: dict[str, Any] | None = None
    after_s: float = 0.0

    def matches(self, request: Request) -> bool:
        """Whether every condition of this rule holds for ``request``."""
        source = request.source
        call = _call(request)
        if call is None and (
            self.arguments is not None or (request.kind == TOOL_CALL and self.tool is not None)
        ):
            return False  # not a tool call, or one that is malformed: no tool to match
        values = {
            "kind": request.kind,
            "server": source.server or "",
            "tool": call.name if call is not None else source.tool or "",
            "agent": source.agent or "",
        }
        for key in MATCHED:
            patterns: tuple[str, ...] | None = getattr(self, key)
            if patterns is not None and not any(
                fnmatch.fnmatchcase(values[key], p) for p in patterns
            ):
                return False
        if self.prompt is not None and self.prompt.search(request.prompt) is None:
            return False
        return call is None or all(
            name in call.arguments and condition.holds(call.arguments[name])
            for name, condition in self.arguments or ()
        )

    @property
    def label(self) -> str:
        """How the log and the answer's ``person`` name this rule."""
        return self.name or f"rule {self.index}"


class Rules:
    """An ordered list of :class:`Rule`; the first match decides."""

    def __init__(self, rules: Sequence[Rule], source: str = "<rules>") -> None:
        self.rules = tuple(rules)
        self.source = source

    @classmethod
    def load(cls, path: Path) -> Rules:
        """The rules in the TOML file ``path``.

        Raises:
            RulesError: the file cannot be read, is not TOML, or a rule is wrong.
        """
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise RulesError(f"cannot read rules file {str(path)!r}: {exc}") from exc
        return cls.parse(text, str(path))

    @classmethod
    def parse(cls, text: str, source: str = "<rules>") -> Rules:
        """The rules in TOML ``text`` (``source`` names it in errors).

        Raises:
            RulesError: not TOML (the message has tomllib's line and column), or a rule
                with an unknown key or a bad value (the message names the rule, its
                line and the key).
        """
        try:
            document = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise RulesError(f"{source}: not valid TOML: {exc}") from exc
        lines = _Lines(text)
        unknown = sorted(set(document) - {"rule"})
        if unknown:
            raise RulesError(
                f"{source}, line {lines.top_level(unknown[0])}: unknown top-level key "
                f"{unknown[0]!r}: rules are [[rule]] tables"
            )
        tables = document.get("rule")
        if not isinstance(tables, list) or not tables:
            raise RulesError(f"{source}: no rules: add at least one [[rule]] table")
        rules = []
        for index, table in enumerate(tables, 1):
            where = _Where(source, index, lines)
            if not isinstance(table, dict):
                raise RulesError(f"{where.at()}: a rule must be a table")
            rules.append(_rule(index, table, where))
        return cls(rules, source)

    def match(self, request: Request) -> Rule | None:
        """The first rule that matches ``request``, or ``None``."""
        return next((rule for rule in self.rules if rule.matches(request)), None)

    def __len__(self) -> int:
        return len(self.rules)

    def __repr__(self) -> str:
        return f"<Rules {len(self.rules)} from {self.source}>"


class _Lines:
    """Where things are in the rules text, for error messages."""

    def __init__(self, text: str) -> None:
        self.lines = text.splitlines()
        self.headers = [n for n, line in enumerate(self.lines, 1) if _HEADER.match(line)]

    def rule(self, index: int) -> int | None:
        return self.headers[index - 1] if index <= len(self.headers) else None

    def key(self, index: int, key: str) -> int | None:
        start = self.rule(index)
        if start is None:
            return None
        end = self.headers[index] if index < len(self.headers) else len(self.lines) + 1
        pattern = re.compile(rf"\s*{re.escape(key)}\s*=")
        return next((n for n in range(start + 1, end) if pattern.match(self.lines[n - 1])), start)

    def top_level(self, key: str) -> int | str:
        pattern = re.compile(rf"\s*\[*\s*{re.escape(key)}\s*[=\]]")
        return next((n for n, line in enumerate(self.lines, 1) if pattern.match(line)), "?")


@dataclass(frozen=True)
class _Where:
    source: str
    index: int
    lines: _Lines

    def at(self, key: str | None = None) -> str:
        line = self.lines.rule(self.index) if key is None else self.lines.key(self.index, key)
        return f"{self.source}, rule {self.index}" + (f" (line {line})" if line else "")

    def error(self, key: str, problem: str) -> RulesError:
        return RulesError(f"{self.at(key)}: {key!r} {problem}")


def _rule(index: int, table: dict[str, Any], where: _Where) -> Rule:
    unknown = sorted(set(table) - KEYS)
    if unknown:
        raise RulesError(
            f"{where.at(unknown[0])}: unknown key {unknown[0]!r} "
            f"(known keys: {', '.join(sorted(KEYS))})"
        )
    if "action" not in table:
        raise RulesError(f"{where.at()}: 'action' is required: one of {', '.join(ACTIONS)}")
    action = table["action"]
    if action not in ACTIONS:
        raise where.error("action", f"must be one of {', '.join(ACTIONS)}, not {action!r}")
    fields: dict[str, Any] = {
        key: _patterns(table[key], key, where) for key in MATCHED if key in table
    }
    if "prompt" in table:
        fields["prompt"] = _regex(table["prompt"], where, "prompt")
    if "arguments" in table:
        conditions = table["arguments"]
        if not isinstance(conditions, dict) or not conditions:
            raise where.error(
                "arguments", f"must be a table of conditions by argument name, not {conditions!r}"
            )
        fields["arguments"] = tuple(
            (name, _condition(value, f"arguments.{name}", where))
            for name, value in conditions.items()
        )
    if "name" in table:
        if not isinstance(table["name"], str) or not table["name"]:
            raise where.error("name", f"must be a non-empty string, not {table['name']!r}")
        fields["name"] = table["name"]
    if "data" in table:
        if action != "accept":
            raise where.error("data", f'is only for action = "accept", not {action!r}')
        if not isinstance(table["data"], dict):
            raise where.error("data", f"must be a table of field values, not {table['data']!r}")
        fields["data"] = table["data"]
    if "after_s" in table:
        after_s = table["after_s"]
        if isinstance(after_s, bool) or not isinstance(after_s, int | float) or after_s < 0:
            raise where.error("after_s", f"must be a number of seconds ≥ 0, not {after_s!r}")
        if action == "skip" and after_s:
            raise where.error("after_s", 'means nothing for action = "skip"')
        fields["after_s"] = float(after_s)
    return Rule(index=index, action=action, **fields)


def _patterns(value: Any, key: str, where: _Where) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise where.error(key, f"must be a glob pattern or a non-empty list of them, not {value!r}")


def _regex(value: Any, where: _Where, key: str) -> re.Pattern[str]:
    if not isinstance(value, str):
        raise where.error(key, f"must be a regular expression string, not {value!r}")
    try:
        return re.compile(value)
    except re.error as exc:
        raise where.error(key, f"is not a valid regular expression: {exc}") from exc


def _condition(value: Any, key: str, where: _Where) -> Condition:
    """An argument's condition: a glob (or list of them), a number or boolean to equal, or
    a table of ``min``, ``max``, ``regex``, ``glob``, ``equals``."""
    if isinstance(value, str | list):
        return Condition(globs=_patterns(value, key, where))
    if isinstance(value, bool | int | float):
        return Condition(equals=value, has_equals=True)
    if not isinstance(value, dict) or not value:
        raise where.error(key, f"must be a glob, a number, a boolean or a table, not {value!r}")
    unknown = sorted(set(value) - CONDITIONS)
    if unknown:
        raise where.error(
            key, f"has unknown condition {unknown[0]!r} (known: {', '.join(sorted(CONDITIONS))})"
        )
    bounds: dict[str, float] = {}
    for bound in ("min", "max"):
        if bound in value:
            number = value[bound]
            if isinstance(number, bool) or not isinstance(number, int | float):
                raise where.error(key, f"{bound} must be a number, not {number!r}")
            bounds[bound] = number
    return Condition(
        low=bounds.get("min"),
        high=bounds.get("max"),
        regex=_regex(value["regex"], where, key) if "regex" in value else None,
        globs=_patterns(value["glob"], key, where) if "glob" in value else None,
        equals=value.get("equals"),
        has_equals="equals" in value,
    )


def _call(request: Request) -> ToolCall | None:
    """The call a tool approval proposes; None for any other request, or a malformed one."""
    if request.kind != TOOL_CALL:
        return None
    try:
        return tool_call_of(request)
    except InvalidRequest:
        return None


class AutoWorker(Worker):
    """Answers each request as the first matching rule says, or as a Cedar policy decides;
    the rest are skipped. ``shadow`` (a policy only): decide, log and count, answer none;
    when people have answered, count whether the policy agreed (:meth:`agreement`)."""

    group = "auto"

    def __init__(
        self, rules: Rules | Policy, *, queue: str = "default", shadow: bool = False
    ) -> None:
        if shadow and isinstance(rules, Rules):
            raise ConfigurationError("shadow mode is for a policy (--policy), not rules")
        self.rules = rules
        self.queue = queue
        self.shadow = shadow
        self._later: dict[str, asyncio.Task[None]] = {}
        self._shadowed: dict[str, Decision] = {}
        self._agreement = {"agreed": 0, "disagreed": 0, "undecided": 0, "unresolved": 0}

    async def show(self, pending: Pending) -> None:
        if not isinstance(self.rules, Rules):
            await self._decide(pending, self.rules)
            return
        rule = self.rules.match(pending.request)
        if rule is None or rule.action == "skip":
            await pending.skip()
            _log(pending.request, rule, "skipped: left for a person")
        elif rule.after_s > 0:
            self._later[pending.request.id] = asyncio.get_running_loop().create_task(
                self._act_later(pending, rule)
            )
            _log(pending.request, rule, f"waiting {rule.after_s:g} s")
        else:
            await self._act(pending, rule)

    async def gone(self, pending: Pending, event: EndedEvent) -> None:
        waiting = self._later.pop(pending.request.id, None)
        if waiting is not None:
            waiting.cancel()
        decision = self._shadowed.pop(pending.request.id, None)
        if decision is not None:
            self._compare(pending.request, decision, event)
        log.info("gone request=%s why=%s", pending.request.id, event.event)

    def agreement(self) -> dict[str, int]:
        """Shadow mode's counts of the requests people resolved: ``agreed`` (people
        accepted what the policy would accept, or declined what it would decline),
        ``disagreed``, ``undecided`` (the policy had no decision) and ``unresolved``
        (dismissed, expired or withdrawn: no accept or decline to compare with);
        ``pending``: decided by the policy, not yet resolved."""
        return {**self._agreement, "pending": len(self._shadowed)}

    def counters(self) -> dict[str, int]:
        """In shadow mode, :meth:`agreement` for the heartbeat (``shadow_agreed``, ...)."""
        return {f"shadow_{k}": v for k, v in self.agreement().items()} if self.shadow else {}

    async def aclose(self) -> None:
        """Cancel the answers still waiting for their ``after_s``."""
        waiting = list(self._later.values())
        for task in waiting:
            task.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)
        self._later.clear()

    async def _decide(self, pending: Pending, policy: Policy) -> None:
        request = pending.request
        decision = policy.decide(request, pending.signer, self.queue)

        def say(outcome: str, level: int = logging.INFO) -> None:
            _log_policy(request, pending.signer, decision, outcome, level=level)

        if self.shadow:
            self._shadowed[request.id] = decision
            say("shadow: not answered")
        elif decision.verdict == "skip":
            await pending.skip()
            say("skipped: left for people")
        else:
            message = None if decision.verdict == "accept" else _denial(decision)
            person = f"auto:policy {decision.label}"
            await self._answer(pending, decision.verdict, None, message, person, say)

    def _compare(self, request: Request, decision: Decision, event: EndedEvent) -> None:
        answer = event.answer if isinstance(event, AnsweredEvent) else None
        people: str | None = None
        if answer is not None:
            people = "accept" if answer.ok else "decline" if answer.reason == DECLINED else None
        if people is None:
            counted = "unresolved"
        elif decision.verdict == "skip":
            counted = "undecided"
        else:
            counted = "agreed" if people == decision.verdict else "disagreed"
        self._agreement[counted] += 1
        counts = " ".join(f"{k}={v}" for k, v in self.agreement().items())
        log.info(
            "shadow request=%s policy=%s policies=%s people=%s %s (%s)",
            request.id,
            decision.verdict,
            decision.label,
            people or (answer.reason if answer is not None else None) or event.event,
            counted,
            counts,
        )

    async def _act_later(self, pending: Pending, rule: Rule) -> None:
        try:
            await asyncio.sleep(rule.after_s)
            await self._act(pending, rule)
        finally:
            self._later.pop(pending.request.id, None)

    async def _act(self, pending: Pending, rule: Rule) -> None:
        def say(outcome: str, level: int = logging.INFO) -> None:
            _log(pending.request, rule, outcome, level=level)

        action: Literal["accept", "decline"] = "accept" if rule.action == "accept" else "decline"
        await self._answer(pending, action, rule.data, None, f"auto:{rule.label}", say)

    async def _answer(
        self,
        pending: Pending,
        action: Literal["accept", "decline"],
        data: dict[str, Any] | None,
        message: str | None,
        person: str,
        say: Callable[..., None],
    ) -> None:
        """Answer ``pending`` as decided (accept with ``data``, or the schema's defaults;
        or decline with ``message``), and ``say`` how it went."""
        request = pending.request
        try:
            if action == "accept":
                default: dict[str, Any] | None = {} if request.schema is not None else None
                await pending.accept(data if data is not None else default, person=person)
            else:
                await pending.decline(message, person=person)
        except InvalidAnswer as exc:
            await pending.skip()
            say(f"refused: left for a person: {exc}", logging.WARNING)
        except NotResolved as exc:
            say(f"refused: {exc.reason}")
        else:
            say("answered")


def _denial(decision: Decision) -> str:
    """Why the policy declined, as the answer's message (a tool approval's model reads it)."""
    if decision.why == "forbid":
        return f"forbidden by policy {decision.label}"
    return f"declined: the policy failed closed ({shorten(decision.why, 200)})"


def _log_policy(
    request: Request, signer: str | None, decision: Decision, outcome: str, *, level: int
) -> None:
    """The one line that records a policy's decision, like :func:`_log`'s for a rule."""
    log.log(
        level,
        "decision=%s request=%s policy=%s (%s) principal=%s %s outcome=%s",
        decision.verdict,
        request.id,
        decision.label,
        shorten(decision.why, 300),
        f"Agent::{signer!r}" if signer is not None else "unverified",
        _describe(request),
        outcome,
    )


def _log(request: Request, rule: Rule | None, outcome: str, *, level: int = logging.INFO) -> None:
    """The one line that records a decision: what, by which rule, on what, and how it went."""
    log.log(
        level,
        "decision=%s request=%s rule=%s %s outcome=%s",
        rule.action if rule is not None else "skip",
        request.id,
        f"{rule.index} ({rule.label})" if rule is not None else "none",
        _describe(request),
        outcome,
    )


def _describe(request: Request) -> str:
    source = request.source
    call = _call(request)
    described = (
        f"kind={request.kind} server={source.server or '-'} tool={source.tool or '-'} "
        f"agent={source.agent or '-'} prompt={request.prompt[:120]!r}"
    )
    if call is not None:
        described += f" arguments={shorten(value_text(call.arguments), 120)}"
    return described


def parser() -> argparse.ArgumentParser:
    """The command line of ``toolnexus worker auto``."""
    p = worker_parser(
        "auto",
        "Answer requests unattended by rules (TOML) or a Cedar policy. Rules: first match "
        "wins; accept with data or the schema's defaults, decline, or skip to leave the "
        "request for a person. A policy: permit accepts, forbid declines, no decision leaves "
        "it for people, an error declines.",
        group="auto",
    )
    given = p.add_mutually_exclusive_group(required=True)
    given.add_argument("--rules", type=Path, help="the rules file (TOML)")
    given.add_argument(
        "--policy", type=Path, help="a Cedar policy file (needs the extra 'policy': cedarpy)"
    )
    p.add_argument(
        "--on-error",
        choices=("decline", "people"),
        default="decline",
        help="with --policy: what a policy that fails to evaluate decides: decline (the "
        "default), or leave the request for people; never accept",
    )
    p.add_argument(
        "--shadow",
        action="store_true",
        help="with --policy: decide and log, answer nothing, and count how often the "
        "policy agrees with what people answer",
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="check the rules or policy file, print a summary, exit",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """``toolnexus worker auto``: answer requests by the rules in a TOML file, or by a
    Cedar policy."""
    args = parser().parse_args(argv)
    configure_logging(args)
    try:
        rules = _load(args)
    except ConfigurationError as exc:
        return failed(args.prog, exc)
    if args.check:
        kind = "rules" if isinstance(rules, Rules) else "policies"
        print(f"{rules.source}: {len(rules)} {kind}, all valid")
        return EXIT_OK

    async def work(broker: Broker) -> int:
        worker = AutoWorker(rules, queue=args.queue, shadow=args.shadow)
        how = "in shadow mode (answering nothing) " if args.shadow else ""
        log.info("answering queue %r %sby %r", args.queue, how, rules)
        return await serve_worker(broker, args, worker, worker.aclose)

    return run_main(args, work)


def _load(args: argparse.Namespace) -> Rules | Policy:
    """The rules or the policy the command line names.

    Raises:
        ConfigurationError: the file cannot be used, cedarpy is missing, or ``--shadow``
            or ``--on-error`` without ``--policy``.
    """
    if args.rules is not None:
        if args.shadow or args.on_error != "decline":
            option = "--shadow" if args.shadow else "--on-error"
            raise ConfigurationError(f"{option} is for a policy (--policy), not rules")
        return Rules.load(args.rules)
    from .policy import Policy  # the optional extra, only when asked for

    return Policy.load(args.policy, "skip" if args.on_error == "people" else "decline")


__all__ = ["AutoWorker", "Condition", "Rule", "Rules", "RulesError", "main", "parser"]
