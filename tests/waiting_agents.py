"""Agents in other processes, each waiting through Redis for one request's answer."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from typing import Any

import msgspec
import pytest

from toolnexus import Answer, Request

AGENT = r"""
import asyncio, sys
import msgspec, toolnexus

async def main():
    url, namespace, request_json, timeout_s, withdraw_after_s, options = sys.argv[1:7]
    request = msgspec.json.decode(request_json, type=toolnexus.Request)
    options = {"block_ms": 100, **msgspec.json.decode(options)}
    async with toolnexus.connect(url, namespace=namespace, **options) as broker:
        waiting = broker.wait_for(request, timeout_s=float(timeout_s))
        if float(withdraw_after_s) > 0:
            try:
                answer = await asyncio.wait_for(waiting, float(withdraw_after_s))
            except TimeoutError:
                answer = toolnexus.Answer(id=request.id, ok=False, reason="withdrawn")
        else:
            answer = await waiting
    sys.stdout.write(msgspec.json.encode(answer).decode() + "\n")

asyncio.run(main())
"""


class Agent:
    """An agent in another process waiting for one request's answer through Redis."""

    def __init__(self, process: asyncio.subprocess.Process, request: Request) -> None:
        self.process = process
        self.request = request

    async def answer(self, timeout_s: float = 60) -> Answer:
        assert self.process.stdout is not None
        line = await asyncio.wait_for(self.process.stdout.readline(), timeout_s)
        assert line, "the agent process ended without an answer"
        return msgspec.json.decode(line, type=Answer)

    @property
    def waiting(self) -> bool:
        return self.process.returncode is None


AgentFactory = Callable[..., Any]


@pytest.fixture
async def agents(redis_url: str, namespace: str) -> AsyncIterator[AgentFactory]:
    """Start agents: ``await agents(request, timeout_s=120, withdraw_after_s=0)``; other
    keywords are broker options (``liveness_ms=1000``)."""
    started: list[Agent] = []

    async def start(
        request: Request, timeout_s: float = 120, withdraw_after_s: float = 0, **options: Any
    ) -> Agent:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            AGENT,
            redis_url,
            namespace,
            msgspec.json.encode(request).decode(),
            str(timeout_s),
            str(withdraw_after_s),
            msgspec.json.encode(options).decode(),
            stdout=subprocess.PIPE,
        )
        agent = Agent(process, request)
        started.append(agent)
        return agent

    yield start
    for agent in started:
        if agent.waiting:
            agent.process.kill()
        await agent.process.wait()
