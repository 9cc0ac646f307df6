"""A process that calls a remote A2A agent and sees its task through with durable questions.

    python a2a_bridge.py AGENT_URL REDIS_URL NAMESPACE RUN send TEXT
    python a2a_bridge.py AGENT_URL REDIS_URL NAMESPACE RUN resume

``send`` sends TEXT (``send_resumable``), ``resume`` continues the kept call (``resume``).
Prints the ended task as one JSON line: its id, context id, state and status text.
"""

from __future__ import annotations

import asyncio
import json
import sys
import uuid

from a2a.client import create_client
from a2a.helpers import get_message_text
from a2a.types import Message, Part, Role, Task, TaskState

import toolnexus
from toolnexus.frameworks.a2a import resume, send_resumable


async def main(agent_url: str, redis_url: str, namespace: str, run: str, mode: str) -> None:
    async with (
        toolnexus.connect(redis_url, namespace=namespace, block_ms=100, lease_ms=600) as broker,
        await create_client(agent_url) as client,
    ):
        if mode == "send":
            message = Message(
                role=Role.ROLE_USER, message_id=str(uuid.uuid4()), parts=[Part(text=sys.argv[6])]
            )
            ended = await send_resumable(
                client, message, broker=broker, run=run, remote=agent_url, timeout_s=60
            )
        else:
            ended = await resume(client, broker=broker, run=run)
        assert isinstance(ended, Task)
        state = TaskState.Name(ended.status.state)
        text = get_message_text(ended.status.message)
        print(
            json.dumps(
                {"id": ended.id, "context_id": ended.context_id, "state": state, "text": text}
            )
        )


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:6]))
