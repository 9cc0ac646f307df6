"""The Microsoft Agent Framework's tool approvals answered through toolnexus: inline, and a
workflow resumed from its file checkpoint in another process, with a scripted chat client
(no network). The agent runs in a process of its own (tests/servers/agent_framework_agent.py),
so that it can be killed while it waits. Runs in .venv-crewmaf (./run test-crewmaf): the
framework pins msgspec<0.23."""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path

import pytest

pytest.importorskip("agent_framework", reason="in .venv-crewmaf only (./run test-crewmaf)")

from agent_framework import (
    Executor,
    FileCheckpointStorage,
    WorkflowBuilder,
    WorkflowContext,
    handler,
)

import framework_runs
from framework_runs import finished, ran, shown
from toolnexus import Answer, Broker, InvalidAnswer, InvalidRequest
from toolnexus.frameworks import audit_digests, tool_call_digest, tool_call_of
from toolnexus.frameworks.agent_framework import run_workflow

pytestmark = pytest.mark.redis

DRIVER = Path(__file__).parent / "servers" / "agent_framework_agent.py"
ARGS = {"to": "ACME", "amount": 10}
REJECTED = "Error: Tool call invocation was rejected by user."  # the framework's own text


broker = framework_runs.broker  # the fixture (tests/framework_runs.py)
agent = framework_runs.agent_fixture(DRIVER)


@pytest.mark.slow
async def test_approve_runs_the_tool_and_the_audit_proves_the_digest(
    broker: Broker, agent: object, tmp_path: Path
) -> None:
    process = agent("inline")  # type: ignore[operator]
    pending = await shown(broker)
    call = tool_call_of(pending.request)
    assert (call.name, call.arguments, call.framework) == ("transfer", ARGS, "agent-framework")
    await pending.accept()
    assert json.loads(await finished(process)) == ["sent 10 to ACME"]
    assert ran(tmp_path) == [ARGS]
    digest = tool_call_digest("transfer", ARGS)
    [record] = await broker.audit(request_id=pending.request.id)
    assert audit_digests(record).approved == digest


@pytest.mark.slow
async def test_deny_with_a_message_and_an_edit_is_refused_to_the_responder(
    broker: Broker, agent: object, tmp_path: Path
) -> None:
    process = agent("inline")  # type: ignore[operator]
    pending = await shown(broker)
    with pytest.raises(InvalidAnswer, match="amount"):  # changed arguments are refused
        await pending.accept({"to": "ACME", "amount": 5})
    await pending.answer(Answer(id=pending.request.id, ok=False, data="Not this month."))
    assert json.loads(await finished(process)) == [REJECTED, "Not this month."]
    assert ran(tmp_path) == []


@pytest.mark.slow
async def test_a_deadline_rejects_with_a_clear_message(agent: object, tmp_path: Path) -> None:
    process = agent("inline", 0.5)  # type: ignore[operator]
    [rejected, message] = json.loads(await finished(process))
    assert rejected == REJECTED
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
@pytest.mark.parametrize(
    ("start", "resume"), [("start", "resume"), ("agent-start", "agent-resume")]
)
async def test_resumed_in_another_process_after_a_kill_runs_the_tool_once(
    broker: Broker, agent: object, tmp_path: Path, start: str, resume: str
) -> None:
    """A workflow from its file checkpoint, and an agent from its kept session."""
    first = agent(start)  # type: ignore[operator]
    try:
        pending = await shown(broker)
    finally:
        first.send_signal(signal.SIGKILL)
        first.communicate()
    await pending.accept()
    assert json.loads(await finished(agent(resume))) == ["sent 10 to ACME"]  # type: ignore[operator]
    assert ran(tmp_path) == [ARGS]
    again = agent(resume)  # type: ignore[operator]
    _, err = await asyncio.to_thread(again.communicate, timeout=60)
    assert again.returncode != 0 and "RunNotFound" in err
    assert ran(tmp_path) == [ARGS]


@pytest.mark.slow
async def test_the_docs_inline_example_runs_as_written(broker: Broker, agent: object) -> None:
    """The Agent Framework block of docs/how-to/tool-approvals.md, run by the agent process
    as written."""
    process = agent("docs")  # type: ignore[operator]
    await (await shown(broker)).accept()
    assert json.loads(await finished(process)) == ["sent 10 to ACME"]


class Budget(Executor):
    """Asks how much, a ``request_info`` of a text wanting a number: no approval."""

    @handler
    async def start(self, text: str, ctx: WorkflowContext) -> None:
        await ctx.request_info("How much?", int)


async def test_a_request_info_that_is_no_approval_is_refused_by_name(
    broker: Broker, tmp_path: Path
) -> None:
    storage = FileCheckpointStorage(str(tmp_path))
    workflow = WorkflowBuilder(start_executor=Budget(id="budget"), name="budget").build()
    with pytest.raises(InvalidRequest, match="not a 'str'"):
        await run_workflow(workflow, "go", broker=broker, run="run-1", checkpoint_storage=storage)
