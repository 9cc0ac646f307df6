"""A request's notes as people read them, on the web page and in chat alike: what
happens if nobody answers, why it left, where it escalated."""

from __future__ import annotations

from collections.abc import Sequence

from ..models import AnsweredEvent, EndedEvent, ExpiredEvent, Request, WithdrawnEvent


def standing_notes(request: Request) -> list[str]:
    """What to know of a request beyond its question (SPEC §14): what happens if nobody
    answers in time, and whether it outlives the agent's restarts."""
    notes = []
    if request.on_expiry is not None:
        outcome = "accepted" if request.on_expiry.ok else "declined"
        notes.append(f"If nobody answers in time, it is {outcome} by default.")
    if request.durable:
        notes.append("Durable: it stays open while the agent restarts.")
    return notes


def gone_note(event: EndedEvent) -> str:
    """Why a request left the page, in a few words."""
    match event:
        case AnsweredEvent(answer=answer):
            who = answer and (answer.person or answer.responder)
            return f"Answered elsewhere{f' by {who}' if who else ''}."
        case ExpiredEvent(answer=answer) if answer is not None and answer.defaulted:
            outcome = "accepted" if answer.ok else "declined"  # SPEC §14: no person's answer
            return f"Expired: nobody answered in time; {outcome} by default."
        case ExpiredEvent():
            return "Expired: nobody answered in time."
        case WithdrawnEvent():
            return "Withdrawn: the agent stopped waiting."


def escalated_note(queues: Sequence[str]) -> str:
    """What a request still open here says once it escalated to ``queues`` (SPEC §14)."""
    return f"Escalated to {', '.join(queues)}: still open here too."
