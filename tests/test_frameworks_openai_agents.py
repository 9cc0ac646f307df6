"""The OpenAI Agents SDK's tool approvals answered through toolnexus: inline and resumed in
another process, with a scripted model (no network). The agent runs in a process of its
own (tests/servers/openai_agents_agent.py), which these tests kill and start again."""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path

import pytest

import framework_runs
from framework_runs import finished, ran, shown
from toolnexus import Answer, Broker, InvalidAnswer
from toolnexus.frameworks import Ledger, audit_digests, tool_call_digest, tool_call_of

pytestmark = pytest.mark.redis

DRIVER = Path(__file__).parent / "servers" / "openai_agents_agent.py"
ARGS = {"to": "ACME", "amount": 10}


broker = framework_runs.broker  # the fixture (tests/framework_runs.py)
agent = framework_runs.agent_fixture(DRIVER)


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
    entry = await Ledger.of(broker).get(pending.request.id)
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
