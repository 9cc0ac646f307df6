"""End to end with the real toolkit (issue #31, Deliver 3): a toolnexus toolkit agent (the
package index's, in .venv-toolkit) runs against a local fake OpenAI-compatible model that
scripts one tool call; the tool suspends with ``pending(kind="approval")``; the agent's
``wait_for`` is ten lines of HTTP to the wait gateway; the bridge's auto worker answers by
its rules on a real Redis; the toolkit re-executes the tool with the answer and the run
completes. Accepted, declined and expired."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from toolkit_env import Toolkit

import toolnexus
from toolnexus import Broker, Service
from toolnexus_workers.auto import AutoWorker, Rules
from toolnexus_workers.gateway.app import Agents, Gateway
from toolnexus_workers.gateway.server import GatewayServer
from toolnexus_workers.gateway.tokens import Tokens

TOKEN = "toolkit-agent-token-0123456789"
FAST = {"block_ms": 100, "lease_ms": 600}  # as tests/conftest.py's (a conftest here too)
RULES = """
[[rule]]
kind = "approval"
agent = "toolkit-agent"
prompt = "staging"
action = "accept"
data = { ticket = "CHG-1" }

[[rule]]
kind = "approval"
prompt = "production"
action = "decline"
"""


@pytest.fixture
async def gateway(redis_url: str, namespace: str) -> AsyncIterator[str]:
    def make(agent: str) -> Broker:
        return toolnexus.connect(redis_url, namespace=namespace, agent=agent, **FAST)

    gateway = Gateway(Agents(make), Tokens([("toolkit-agent", TOKEN)]), keepalive_s=0.5)
    async with (
        toolnexus.connect(redis_url, namespace=namespace, **FAST) as responders,
        GatewayServer(gateway, port=0) as server,
    ):
        service = Service(responders, AutoWorker(Rules.parse(RULES, "rules.toml")))
        running = asyncio.create_task(service.run())
        try:
            yield server.url
        finally:
            service.stop()
            await running


async def run_agent(
    toolkit: Toolkit, url: str, environment: str, expires_in_s: float = 30
) -> dict[str, Any]:
    spec = {"gateway": url, "token": TOKEN, "environment": environment}
    result: dict[str, Any] = await asyncio.to_thread(
        toolkit.run, "agent", {**spec, "expires_in_s": expires_in_s}
    )
    return result


async def test_an_approved_tool_runs_again_with_the_answer(toolkit: Toolkit, gateway: str) -> None:
    run = await run_agent(toolkit, gateway, "staging")
    assert run["status"] == "done"
    assert run["executions"] == [None, {"ticket": "CHG-1"}]  # suspended, then re-executed
    assert run["answers"] == [
        {"id": run["answers"][0]["id"], "ok": True, "data": {"ticket": "CHG-1"}, "reason": None}
    ]
    assert run["tools"][-1]["output"] == "deployed to staging (ticket CHG-1)"
    assert run["text"] == "done: deployed to staging (ticket CHG-1)"
    assert run["model_calls"] == 2


async def test_a_declined_tool_is_not_run_and_the_run_completes(
    toolkit: Toolkit, gateway: str
) -> None:
    run = await run_agent(toolkit, gateway, "production")
    assert run["status"] == "done"
    assert run["executions"] == [None]
    assert [(a["ok"], a["reason"]) for a in run["answers"]] == [(False, "declined")]
    assert run["text"] == "done: declined/expired: Deploy to production?"


async def test_an_unanswered_tool_expires_and_the_run_completes(
    toolkit: Toolkit, gateway: str
) -> None:
    run = await run_agent(toolkit, gateway, "the moon", expires_in_s=1.5)  # no rule: skipped
    assert run["status"] == "done"
    assert run["executions"] == [None]
    assert [(a["ok"], a["reason"]) for a in run["answers"]] == [(False, "expired")]
    assert run["text"] == "done: declined/expired: Deploy to the moon?"
