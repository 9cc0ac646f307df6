"""Issue #28, item 5 (A2A), observation 1: with signatures required, what a remote A2A agent
is told follows only from a verified answer (threat-model S4). On a private redis-server, an
accepting answer forged into the waiter's reply stream continues nothing: the agent's task
stays paused, and the genuine signed answer afterwards continues it."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator

import pytest
from a2a.client import create_client
from a2a.helpers import get_message_text
from a2a.types import GetTaskRequest, Message, Part, Role, Task, TaskState

from conftest import Fleet
from mcp_processes import a2a_agent_http
from test_forgery import forged, shown
from toolnexus.frameworks.a2a import send_message

pytestmark = pytest.mark.redis


@pytest.fixture(scope="module")
def agent_url() -> Iterator[str]:
    with a2a_agent_http() as url:
        yield url


async def test_a_forged_answer_never_continues_the_task_and_the_signed_one_does(
    fleet: Fleet, agent_url: str
) -> None:
    question = Message(role=Role.ROLE_USER, message_id=str(uuid.uuid4()), parts=[Part(text="name")])
    async with (
        fleet.agent() as agent,
        fleet.responder() as bot,
        await create_client(agent_url) as client,
    ):
        calling = asyncio.create_task(
            send_message(client, question, wait_for=agent.wait_for, remote=agent_url)
        )
        pending = await shown(bot)
        task_id = pending.request.meta["a2a"]["task_id"]
        reply_stream = agent.keys.answers(agent.waiter_id)
        mallory = forged(agent, pending.request.id, data={"answer": "Mallory"})
        await agent.redis.xadd(reply_stream, {"id": pending.request.id, "a": mallory})
        await asyncio.sleep(0.5)
        assert not calling.done()
        paused = await client.get_task(GetTaskRequest(id=task_id))
        assert paused.status.state == TaskState.TASK_STATE_INPUT_REQUIRED  # nothing was sent
        assert "Mallory" not in json.dumps([get_message_text(m) for m in paused.history])
        await pending.accept({"answer": "Ada"}, person="web:alice")
        ended = await asyncio.wait_for(calling, 30)
    assert isinstance(ended, Task) and ended.id == task_id
    assert get_message_text(ended.status.message) == "told: Ada"
    assert agent.statistics()["refused_answers"] == 1
