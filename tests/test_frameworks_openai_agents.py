"""The OpenAI Agents SDK's tool approvals answered through toolnexus: inline and resumed in
another process, with a scripted model (no network). The agent runs in a process of its
own (tests/servers/openai_agents_agent.py): the SDK's module is ``agents``, which tests/agents.py
shadows here."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

import toolnexus
from toolnexus import Answer, Broker, InvalidAnswer, Pending
from toolnexus.frameworks import Ledger, audit_digests, tool_call_digest, tool_call_of

pytestmark = pytest.mark.redis

DRIVER = Path(__file__).parent / "servers" / "openai_agents_agent.py"
ARGS = {"to": "ACME", "amount": 10}


@pytest.fixture
async def broker(redis_url: str, namespace: str) -> AsyncIterator[Broker]:
    async with toolnexus.connect(redis_url, namespace=namespace, block_ms=100) as b:
        yield b


@pytest.fixture
def agent(redis_url: str, namespace: str, tmp_path: Path) -> Iterator[object]:
    here = Path(__file__).resolve().parent  # tests/agents.py would shadow the SDK
    path = [p for p in sys.path if p and Path(p).resolve() != here]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    started: list[subprocess.Popen[str]] = []

    def start(mode: str, timeout_s: float = 30) -> subprocess.Popen[str]:
        command = [sys.executable, str(DRIVER), redis_url, namespace, "run-1"]
        command += [str(tmp_path / "ran.jsonl"), mode, str(timeout_s)]
        process = subprocess.Popen(
            command,
            env=env,
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        started.append(process)
        return process

    yield start
    for process in started:
        if process.poll() is None:
            process.kill()
        process.communicate()


def ran(tmp_path: Path) -> list[dict[str, object]]:
    file = tmp_path / "ran.jsonl"
    return [json.loads(line) for line in file.read_text().splitlines()] if file.exists() else []


async def shown(broker: Broker) -> Pending:
    async with broker.responder("ops") as responder, asyncio.timeout(30):
        return await anext(responder)


async def finished(process: subprocess.Popen[str]) -> str:
    out, err = await asyncio.to_thread(process.communicate, timeout=60)
    assert process.returncode == 0, err
    return out.strip()


@pytest.mark.slow
async def test_approve_runs_the_tool_and_the_ledger_has_every_digest(
    broker: Broker, agent: object, tmp_path: Path
) -> None:
    process = agent("inline")  # type: ignore[operator]
    pending = await shown(broker)
    call = tool_call_of(pending.request)
    assert (call.name, call.arguments, call.framework) == ("transfer", ARGS, "openai-agents")
    await pending.accept()
    assert json.loads(await finished(process)) == ["sent 10 to ACME"]
    assert ran(tmp_path) == [ARGS]
    digest = tool_call_digest("transfer", ARGS)
    entry = await Ledger(broker.store("tool-calls")).get(pending.request.id)
    assert entry == {"proposed": digest, "approved": digest, "executed": digest}
    [record] = await broker.audit(request_id=pending.request.id)
    assert audit_digests(record).approved == digest


@pytest.mark.slow
async def test_deny_with_a_message_and_an_edit_is_refused_to_the_responder(
    broker: Broker, agent: object, tmp_path: Path
) -> None:
    process = agent("inline")  # type: ignore[operator]
    pending = await shown(broker)
    with pytest.raises(InvalidAnswer, match="amount"):  # the SDK cannot run edited arguments
        await pending.accept({"to": "ACME", "amount": 5})
    await pending.answer(Answer(id=pending.request.id, ok=False, data="Not this month."))
    assert json.loads(await finished(process)) == ["Not this month."]
    assert ran(tmp_path) == []


@pytest.mark.slow
async def test_a_deadline_rejects_with_a_clear_message(agent: object, tmp_path: Path) -> None:
    process = agent("inline", 0.5)  # type: ignore[operator]
    [message] = json.loads(await finished(process))
    assert message == "No approval for transfer before the deadline: the call was not run."
    assert ran(tmp_path) == []


@pytest.mark.slow
async def test_cancelling_the_run_withdraws_the_question(
    broker: Broker, agent: object, tmp_path: Path
) -> None:
    process = agent("cancel", 3)  # type: ignore[operator]
    pending = await shown(broker)
    assert await finished(process) == "cancelled"
    async with asyncio.timeout(10):
        while not (records := await broker.audit(request_id=pending.request.id)):
            await asyncio.sleep(0.05)
    assert records[0].status == "withdrawn"
    assert ran(tmp_path) == []


@pytest.mark.slow
async def test_resumed_in_another_process_after_a_kill_runs_the_tool_once(
    broker: Broker, agent: object, tmp_path: Path
) -> None:
    first = agent("start")  # type: ignore[operator]
    try:
        pending = await shown(broker)
    finally:
        first.send_signal(signal.SIGKILL)
        first.communicate()
    await pending.accept()
    assert json.loads(await finished(agent("resume"))) == ["sent 10 to ACME"]  # type: ignore[operator]
    assert ran(tmp_path) == [ARGS]
    again = agent("resume")  # type: ignore[operator]
    _, err = await asyncio.to_thread(again.communicate, timeout=60)
    assert again.returncode != 0 and "RunNotFound" in err
    assert ran(tmp_path) == [ARGS]


@pytest.mark.slow
async def test_the_docs_inline_example_runs_as_written(broker: Broker, agent: object) -> None:
    """The OpenAI Agents SDK block of docs/how-to/tool-approvals.md, run by the agent
    process as written."""
    process = agent("docs")  # type: ignore[operator]
    await (await shown(broker)).accept()
    assert json.loads(await finished(process)) == ["sent 10 to ACME"]
