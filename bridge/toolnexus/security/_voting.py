"""The quorum rule (SPEC §14), one home for both brokers: whom a vote counts for, when the
votes counted decide, and the approvals the outcome lists.

A voter is a *person*: the person an answer names, else (a bot, or a worker that names
nobody) its responder. With signatures, both are verified material: ``person`` is a
signed field and ``responder`` the verified key name. So one person answering through two
workers' keys is one voter, and counts once.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..models import Answer, Approval, Quorum


def voter_of(answer: Answer) -> str:
    """The voter ``answer`` counts for: its person, else its responder (``""``: neither)."""
    return answer.person or answer.responder or ""


def decides(quorum: Quorum, vote: Answer, accepts: int, declines: int) -> bool:
    """Whether ``vote``, counted among ``accepts`` and ``declines`` (distinct voters, this
    vote included), decides ``quorum``: the ``need``-th accept; a decline that vetoes, or
    the ``need``-th decline with ``decline="count"``. Any ``ok=False`` is a decline."""
    if vote.ok:
        return accepts >= quorum.need
    return quorum.decline == "veto" or declines >= quorum.need


def approvals_of(accepts: Iterable[Answer]) -> list[Approval]:
    """The approvals an outcome lists: one per accepting vote counted, oldest first."""
    approvals = [Approval(vote.responder, vote.person, vote.answered_at) for vote in accepts]
    approvals.sort(key=lambda approval: approval.at)
    return approvals
