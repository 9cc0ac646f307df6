"""SPEC §14's features together: a quorum that nobody completes gets its default on expiry;
a quorum's votes come from the queue it escalated to as well as from its own."""

from __future__ import annotations

import asyncio

import pytest

import toolnexus
from conftest import FAST
from toolnexus import Broker, Hop, OnExpiry, Quorum, Request, new_id


def approval(**fields: object) -> Request:
    return Request(id=new_id(), kind="approval", prompt="Deploy to prod?", **fields)  # type: ignore[arg-type]


@pytest.mark.slow
@pytest.mark.parametrize("broker", ["memory", "redis"], indirect=True)
async def test_a_quorum_short_of_votes_at_its_deadline_gets_its_default(broker: Broker) -> None:
    request = approval(quorum=Quorum(2), on_expiry=OnExpiry(ok=False))
    waiting = asyncio.create_task(broker.wait_for(request, timeout_s=1.5))
    async with broker.responder("ops") as shown:
        pending = await asyncio.wait_for(anext(shown), 10)
        progress = await pending.accept(person="ops:alice")
        assert progress is not None and (progress.count, progress.need) == (1, 2)
        answer = await asyncio.wait_for(waiting, 10)
    # one approval of two is no approval: the default (decline) applies, marked as such
    assert (answer.ok, answer.reason, answer.defaulted) == (False, "expired", True)
    assert answer.person is None and not answer.approvals


async def test_a_quorum_counts_votes_from_the_queue_it_escalated_to(
    redis_url: str, namespace: str
) -> None:
    async with (
        toolnexus.connect(redis_url, namespace=namespace, queue="desk", **FAST) as desk,
        toolnexus.connect(redis_url, namespace=namespace, queue="oncall", **FAST) as oncall,
        desk.responder("web") as on_desk,
        oncall.responder("pager") as on_call,
    ):
        request = approval(quorum=Quorum(2), escalate=[Hop(0.3, "oncall")])
        waiting = asyncio.create_task(desk.wait_for(request, timeout_s=20))
        first = await asyncio.wait_for(anext(on_desk), 10)
        assert await first.accept(person="desk:alice") is not None  # 1 of 2
        second = await asyncio.wait_for(anext(on_call), 10)  # after the hop
        assert second.request.id == request.id
        assert await second.accept(person="pager:bob") is None  # it decided
        answer = await asyncio.wait_for(waiting, 10)
    assert answer.ok and answer.approvals is not None
    assert sorted(a.person or "" for a in answer.approvals) == ["desk:alice", "pager:bob"]
