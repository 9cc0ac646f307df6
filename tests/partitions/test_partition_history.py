"""The history checker flags each kind of violation in a fabricated history, and passes a
clean one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from partition_history import (
    ACCEPTED,
    ALREADY_RESOLVED,
    COUNTED,
    FAILED,
    NOT_CONFIRMED,
    check,
    read_history,
)


def publish(req: str) -> dict[str, Any]:
    return {"op": "publish", "req": req, "by": "agent"}


def respond(req: str, answer: Any, told: str) -> dict[str, Any]:
    return {"op": "respond", "req": req, "answer": answer, "told": told, "by": "responder"}


def outcome(req: str, answer: Any = None, reason: str | None = None) -> dict[str, Any]:
    return {"op": "outcome", "req": req, "answer": answer, "reason": reason, "by": "agent"}


CLEAN = [
    publish("a"),
    respond("a", 1, ACCEPTED),
    respond("a", 2, ALREADY_RESOLVED),
    outcome("a", 1),
    publish("b"),  # answered, but not confirmed: whatever the waiter got is fine
    respond("b", 3, NOT_CONFIRMED),
    outcome("b", 3),
    publish("c"),  # not confirmed and then lost: no violation (never acknowledged)
    respond("c", 4, NOT_CONFIRMED),
    respond("c", 5, FAILED),
    outcome("c", reason="expired"),
    publish("d"),
    outcome("d", reason="unavailable"),
]


def test_a_clean_history_passes() -> None:
    verdict = check(CLEAN)
    assert verdict.ok, verdict.violations
    assert (verdict.requests, verdict.acknowledged, verdict.not_confirmed) == (4, 1, 2)


def test_an_acknowledged_answer_the_waiter_never_got_is_lost() -> None:
    verdict = check([publish("a"), respond("a", 1, ACCEPTED), outcome("a", reason="expired")])
    assert [(v.kind, v.request) for v in verdict.violations] == [("lost", "a")]
    # acknowledged, and the waiter returned another answer: lost too
    verdict = check(
        [publish("a"), respond("a", 1, ACCEPTED), respond("a", 2, FAILED), outcome("a", 2)]
    )
    assert [v.kind for v in verdict.violations] == ["lost"]


def test_a_counted_vote_missing_from_the_approvals_is_lost() -> None:
    def vote(req: str, answer: Any, voter: str) -> dict[str, Any]:
        return {**respond(req, answer, COUNTED), "voter": voter}

    def decided(req: str, answer: Any, voters: list[str]) -> dict[str, Any]:
        return {**outcome(req, answer), "voters": voters}

    kept = [
        publish("a"),
        vote("a", 1, "p1"),
        respond("a", 2, ACCEPTED),
        decided("a", 2, ["p1", "p2"]),
    ]
    verdict = check(kept)
    assert verdict.ok, verdict.violations
    assert verdict.acknowledged == 1  # a counted vote is no answer
    dropped = [
        publish("a"),
        vote("a", 1, "p1"),
        respond("a", 2, ACCEPTED),
        decided("a", 2, ["p2", "p3"]),
    ]
    verdict = check(dropped)
    assert [(v.kind, v.request) for v in verdict.violations] == [("lost", "a")]
    assert "p1" in verdict.violations[0].detail
    # the quorum not reached: a counted vote has no approvals to be missing from
    assert check([publish("a"), vote("a", 1, "p1"), outcome("a", reason="expired")]).ok


def test_two_different_acknowledged_answers_conflict() -> None:
    history = [publish("a"), respond("a", 1, ACCEPTED), respond("a", 2, ACCEPTED), outcome("a", 1)]
    verdict = check(history)
    kinds = sorted(v.kind for v in verdict.violations)
    assert kinds == ["conflicting", "lost"]  # answer 2 never reached the waiter either
    assert verdict.count("conflicting") == 1
    # the same answer acknowledged twice (a retry) is no conflict
    same = [publish("a"), respond("a", 1, ACCEPTED), respond("a", 1, ACCEPTED), outcome("a", 1)]
    assert check(same).ok


def test_an_outcome_nobody_gave_is_a_phantom() -> None:
    verdict = check([publish("a"), respond("a", 1, NOT_CONFIRMED), outcome("a", 9)])
    assert [v.kind for v in verdict.violations] == ["phantom"]
    verdict = check([publish("a"), outcome("a", reason="made up")])
    assert [v.kind for v in verdict.violations] == ["phantom"]


def test_a_wait_with_no_outcome_is_stranded() -> None:
    verdict = check([publish("a"), respond("a", 1, NOT_CONFIRMED)])
    assert [(v.kind, v.request) for v in verdict.violations] == [("stranded", "a")]


def test_an_unknown_told_is_refused() -> None:
    try:
        check([respond("a", 1, "maybe")])
    except ValueError as exc:
        assert "maybe" in str(exc)
    else:
        raise AssertionError("an unknown 'told' was taken")


def test_histories_are_read_from_several_files_skipping_a_torn_line(tmp_path: Path) -> None:
    agent, responder = tmp_path / "agent.jsonl", tmp_path / "responder.jsonl"
    agent.write_text(json.dumps(publish("a")) + "\n" + json.dumps(outcome("a", 1)) + "\n")
    responder.write_text(json.dumps(respond("a", 1, ACCEPTED)) + '\n{"op": "resp')
    events = read_history([agent, responder, tmp_path / "absent.jsonl"])
    assert len(events) == 3
    assert check(events).ok
