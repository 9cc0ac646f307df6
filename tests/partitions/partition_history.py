"""One history of a partition run, and the check of it (issue 40's four violations).

Every process of a run appends JSON lines to its own file; :func:`read_history` joins
them. An event is one of:

- ``{"op": "publish", "req": ID, "by": WHO}``: an agent published a request and waits;
- ``{"op": "respond", "req": ID, "answer": VALUE, "told": TOLD, "by": WHO}``: what a
  responder was told of its answer ``VALUE``: :data:`ACCEPTED`, :data:`ALREADY_RESOLVED`,
  :data:`NOT_CONFIRMED` or :data:`FAILED` (Redis unreachable, any other error), or, for a
  quorum's vote that did not decide, :data:`COUNTED` (with ``"voter": PERSON``);
- ``{"op": "outcome", "req": ID, "answer": VALUE | None, "reason": REASON, "by": WHO}``:
  what the waiter's wait returned: a person's answer (``reason`` None, ``answer`` the data
  a responder gave; for a quorum the deciding vote's, with ``"voters"``: the persons its
  approvals name) or a rule's outcome (``reason`` :data:`RULE_REASONS`: expired,
  unavailable, withdrawn; ``answer`` None).

:func:`check` finds, per request:

- **lost**: an answer acknowledged (``accepted``) to a responder that is not the waiter's
  outcome (the waiter returned something else, or nothing); or a vote acknowledged as
  ``counted`` whose voter is missing from the approvals of the answer the waiter returned;
- **conflicting**: two different answers acknowledged for one request;
- **phantom**: an outcome that no responder gave (its answer was never sent) and no rule;
- **stranded**: a published request whose waiter neither returned an outcome nor was told
  ``unavailable``.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ACCEPTED = "accepted"
ALREADY_RESOLVED = "already resolved"
NOT_CONFIRMED = "not confirmed"
FAILED = "failed"
COUNTED = "counted"
TOLD = frozenset({ACCEPTED, ALREADY_RESOLVED, NOT_CONFIRMED, FAILED, COUNTED})

RULE_REASONS = frozenset({"expired", "unavailable", "withdrawn"})
"""The outcomes a rule gives (no responder's answer)."""

KINDS = ("lost", "conflicting", "phantom", "stranded")


@dataclass(frozen=True, slots=True)
class Violation:
    kind: str
    """One of :data:`KINDS`."""
    request: str
    detail: str


@dataclass(slots=True)
class Verdict:
    """The check of one history: the counts beside the violations."""

    requests: int = 0
    acknowledged: int = 0
    not_confirmed: int = 0
    outcomes: int = 0
    violations: list[Violation] = field(default_factory=list)

    def count(self, kind: str) -> int:
        return sum(1 for v in self.violations if v.kind == kind)

    @property
    def ok(self) -> bool:
        return not self.violations


def read_history(paths: Iterable[Path]) -> list[dict[str, Any]]:
    """The events of every file in ``paths`` (JSON lines; a torn last line, written by a
    process killed mid-write, is skipped)."""
    events: list[dict[str, Any]] = []
    for path in paths:
        if not path.exists():
            continue
        for line in path.read_text().splitlines():
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(event, dict) and "op" in event and "req" in event:
                events.append(event)
    return events


def check(events: Iterable[dict[str, Any]]) -> Verdict:
    """The violations of ``events`` (see the module's docstring)."""
    published: set[str] = set()
    responses: dict[str, list[dict[str, Any]]] = defaultdict(list)
    outcomes: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for event in events:
        op, req = event["op"], str(event["req"])
        if op == "publish":
            published.add(req)
        elif op == "respond":
            if event.get("told") not in TOLD:
                raise ValueError(f"request {req}: a responder told {event.get('told')!r}")
            responses[req].append(event)
        elif op == "outcome":
            outcomes[req].append(event)
        else:
            raise ValueError(f"request {req}: unknown op {op!r}")
    verdict = Verdict(requests=len(published))
    for req in sorted(published | set(responses) | set(outcomes)):
        told = responses.get(req, [])
        acked = [r["answer"] for r in told if r["told"] == ACCEPTED]
        verdict.acknowledged += len(acked)
        verdict.not_confirmed += sum(1 for r in told if r["told"] == NOT_CONFIRMED)
        ends = outcomes.get(req, [])
        verdict.outcomes += len(ends)
        given = [e["answer"] for e in ends if e.get("reason") is None]
        distinct_acked = _distinct(acked)
        if len(distinct_acked) > 1:
            verdict.violations.append(
                Violation("conflicting", req, f"acknowledged answers {distinct_acked}")
            )
        for answer in distinct_acked:
            if answer not in given:
                got = [e.get("answer") if e.get("reason") is None else e["reason"] for e in ends]
                verdict.violations.append(
                    Violation("lost", req, f"acknowledged {answer!r}, the waiter got {got}")
                )
        for vote in told:
            if vote["told"] != COUNTED:
                continue
            for end in ends:
                voters = end.get("voters")
                if end.get("reason") is None and voters is not None and vote["voter"] not in voters:
                    verdict.violations.append(
                        Violation(
                            "lost", req, f"vote of {vote['voter']!r} counted, approvals {voters}"
                        )
                    )
        sent = [r["answer"] for r in told]
        for end in ends:
            reason = end.get("reason")
            if reason is None and end.get("answer") not in sent:
                verdict.violations.append(
                    Violation(
                        "phantom", req, f"outcome {end.get('answer')!r}: no responder gave it"
                    )
                )
            elif reason is not None and reason not in RULE_REASONS:
                verdict.violations.append(
                    Violation("phantom", req, f"outcome reason {reason!r}: no rule gives it")
                )
        if req in published and not ends:
            verdict.violations.append(Violation("stranded", req, "no outcome, not unavailable"))
    return verdict


def _distinct(values: list[Any]) -> list[Any]:
    distinct: list[Any] = []
    for value in values:
        if value not in distinct:
            distinct.append(value)
    return distinct
