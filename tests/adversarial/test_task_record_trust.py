"""Issue #26 observation 1 (its review): the record a durable task-backed MCP call keeps in
Redis (task id, ``requestState``, keys answered) was unsigned, so whoever could write it
could make the agent that goes on with the call poll and answer another task, or send a
forged ``requestState``. Threat-model S3 (stored state is verified before it counts): on a
private redis-server with signatures required, the record is signed by the agent's own key
and bound to its call; a rewritten record is refused with a ``SignatureError`` and removed,
never used: no other task is polled or answered, no forged state reaches the server.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from mcp_types import CallToolResult

from conftest import Fleet
from mcp_processes import task_server_http
from toolnexus import Pending, load_mcp
from toolnexus.errors import SignatureError
from toolnexus.mcp._tasks import STORE_NAME
from toolnexus.redis_broker import RedisBroker, RedisStore

pytestmark = [pytest.mark.redis, pytest.mark.slow]


@pytest.fixture(scope="module")
def task_url() -> Iterator[str]:
    with task_server_http() as url:
        yield url


@pytest.fixture
async def agent(fleet: Fleet) -> AsyncIterator[RedisBroker]:
    async with fleet.agent() as broker:
        yield broker


async def left_behind(tools: Any, questions: Any, durable: str) -> Pending:
    """A durable call whose question was shown, then cancelled: its task is left for the next
    call with the same id."""
    call = asyncio.create_task(tools["ask_hold"].call(durable=durable))
    pending: Pending = await asyncio.wait_for(anext(questions), 30)
    call.cancel()
    await asyncio.gather(call, return_exceptions=True)
    return pending


async def records(store: RedisStore) -> dict[str, dict[str, Any]]:
    """The store's records by task id, each with its store key."""
    found = {}
    for key, raw in (await store.items()).items():
        record = json.loads(raw)
        found[record["task_id"]] = {"key": key, "raw": raw, "record": record}
    return found


def text(result: CallToolResult) -> str:
    return result.content[0].text  # type: ignore[union-attr]


async def journal(tools: Any) -> dict[str, Any]:
    return json.loads(text(await tools["journal"]()))  # type: ignore[no-any-return]


async def test_a_signed_record_is_gone_on_with(
    fleet: Fleet, agent: RedisBroker, task_url: str
) -> None:
    """S3, obs 1 (the control): a record as the agent signed it is verified and used: the
    call goes on with the same task and the person's answer is its result."""
    async with (
        fleet.responder() as bot,
        bot.responder("person") as questions,
        load_mcp(task_url, wait_for=agent.wait_for, mode="2026-07-28") as tools,
    ):
        pending = await left_behind(tools, questions, "genuine")
        store = agent.store(STORE_NAME, agent=True)
        [kept] = (await records(store)).values()
        assert kept["record"]["signature"]["key"] == "agent-7"
        again = asyncio.create_task(tools["ask_hold"].call(durable="genuine"))
        await asyncio.sleep(0.5)
        await pending.accept({"ok": True}, person="web:alice")
        assert text(await asyncio.wait_for(again, 30)) == "accept"
        assert await store.items() == {}


def redirect(record: dict[str, Any], other: dict[str, Any]) -> bytes:
    return json.dumps({**record, "task_id": other["record"]["task_id"]}).encode()


def forged_state(record: dict[str, Any], other: dict[str, Any]) -> bytes:
    return json.dumps({**record, "request_state": "forged-state"}).encode()


def answered(record: dict[str, Any], other: dict[str, Any]) -> bytes:
    return json.dumps({**record, "answered": ["hold"]}).encode()


def copied(record: dict[str, Any], other: dict[str, Any]) -> bytes:
    return other["raw"]  # type: ignore[no-any-return]


def unsigned(record: dict[str, Any], other: dict[str, Any]) -> bytes:
    return json.dumps({**other["record"], "signature": None}).encode()


@pytest.mark.parametrize(
    ("edit", "reason"),
    [
        (redirect, "bad signature"),
        (forged_state, "bad signature"),
        (answered, "bad signature"),
        (copied, "bad signature"),
        (unsigned, "missing signature"),
    ],
)
async def test_a_rewritten_record_neither_redirects_the_task_nor_changes_the_answer(
    fleet: Fleet, agent: RedisBroker, task_url: str, edit: Any, reason: str
) -> None:
    """S3, obs 1: the victim's record rewritten in Redis (pointed at another task of the same
    agent, a forged ``requestState``, a question marked answered, another call's genuine
    record copied over it, or an unsigned one) is refused and removed; nothing is sent for
    the other task or with the forged state, and both questions stay open for their
    persons."""
    async with (
        fleet.responder() as bot,
        bot.responder("person") as questions,
        load_mcp(task_url, wait_for=agent.wait_for, mode="2026-07-28") as tools,
    ):
        victim_question = await left_behind(tools, questions, "victim")
        other_question = await left_behind(tools, questions, "other")
        victim_task = victim_question.request.meta["mcp_task"]
        other_task = other_question.request.meta["mcp_task"]
        store = agent.store(STORE_NAME, agent=True)
        kept = await records(store)
        victim, other = kept[victim_task], kept[other_task]
        await agent.redis.hset(store.key, victim["key"], edit(victim["record"], other))
        before = await journal(tools)
        with pytest.raises(SignatureError, match="durable call 'victim' of tool 'ask_hold'") as e:
            await tools["ask_hold"].call(durable="victim")
        assert e.value.reason == reason
        after = await journal(tools)
        assert await store.items() == {other["key"]: other["raw"]}  # removed; the other kept
        assert after["gets"].get(other_task) == before["gets"].get(other_task)  # not polled
        assert after["updates"] == before["updates"]  # nothing answered, nothing forged
        assert after["cancels"] == before["cancels"]
        # the other call's own record still goes on with its own task and person's answer
        again = asyncio.create_task(tools["ask_hold"].call(durable="other"))
        await asyncio.sleep(0.5)
        await other_question.accept({"ok": True}, person="web:alice")
        assert text(await asyncio.wait_for(again, 30)) == "accept"
        final = await journal(tools)
    new_updates = final["updates"][len(before["updates"]) :]
    assert [(u["task"], u["state"]) for u in new_updates] == [(other_task, f"{other_task}/round-1")]
    assert victim_task not in final["cancels"]
