"""CrewAI flows' ``@human_feedback`` reviews answered through toolnexus: inline, and a
persisted flow resumed in another process after a kill, with a scripted collapse LLM (no
network; tests/servers/crewai_flow.py). Runs in .venv-crewmaf (./run test-crewmaf): CrewAI
pins mcp<2 and pydantic<2.13."""

from __future__ import annotations

import ast
import asyncio
import functools
import re
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("crewai", reason="in .venv-crewmaf only (./run test-crewmaf)")

from crewai.flow.persistence import SQLiteFlowPersistence

import framework_runs
from framework_runs import calls_in, driver, finished, shown
from servers.crewai_flow import COLLAPSE, PaymentReview
from toolnexus import Answer, Broker, ConfigurationError, InvalidAnswer
from toolnexus.frameworks import (
    RunNotFound,
    audit_digests,
    tool_call_digest,
    tool_call_of,
)
from toolnexus.frameworks.crewai import Feedback, kickoff, resume

pytestmark = [pytest.mark.redis, pytest.mark.timeout(180)]

DRIVER = Path(__file__).parent / "servers" / "crewai_flow.py"
PROPOSAL = {"to": "ACME", "amount": 10}


broker = framework_runs.broker  # the fixture (tests/framework_runs.py)


@pytest.fixture
def ran_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    file = tmp_path / "ran.jsonl"
    monkeypatch.setenv("TOOLNEXUS_TEST_RAN_FILE", str(file))
    return file


async def test_approve_routes_to_the_approved_step(broker: Broker, ran_file: Path) -> None:
    flow = asyncio.create_task(kickoff(PaymentReview(), wait_for=broker.wait_for))
    pending = await shown(broker)
    call = tool_call_of(pending.request)
    assert (call.name, call.arguments, call.framework) == (
        "propose",
        {"output": PROPOSAL},
        "crewai",
    )
    assert pending.request.prompt == "Send 10 euros to ACME?"
    await pending.accept()
    assert await flow == "sent 10 to ACME"
    assert calls_in(ran_file) == [PROPOSAL]
    [record] = await broker.audit(request_id=pending.request.id)
    assert audit_digests(record).approved == tool_call_digest("propose", {"output": PROPOSAL})


async def test_deny_with_a_message_and_an_edit_is_refused(broker: Broker, ran_file: Path) -> None:
    flow = asyncio.create_task(kickoff(PaymentReview(), wait_for=broker.wait_for))
    pending = await shown(broker)
    with pytest.raises(InvalidAnswer, match="output"):  # the output under review is as it is
        await pending.accept({"output": {"to": "ACME", "amount": 5}})
    await pending.answer(Answer(id=pending.request.id, ok=False, data="Not this month."))
    assert await flow == "not paid: rejected: Not this month."
    assert calls_in(ran_file) == []


async def test_a_deadline_takes_the_rejected_path_with_a_clear_message(
    broker: Broker, ran_file: Path
) -> None:
    wait_for = functools.partial(broker.wait_for, timeout_s=0.5)
    result = await kickoff(PaymentReview(), wait_for=wait_for)
    assert result == (
        "not paid: rejected: No approval for propose before the deadline: the call was not run."
    )
    assert calls_in(ran_file) == []


async def test_cancelling_the_flow_withdraws_the_question(broker: Broker, ran_file: Path) -> None:
    flow = asyncio.create_task(kickoff(PaymentReview(), wait_for=broker.wait_for))
    pending = await shown(broker)
    flow.cancel()
    with pytest.raises(asyncio.CancelledError):
        await flow
    async with asyncio.timeout(10):
        while not (records := await broker.audit(request_id=pending.request.id)):
            await asyncio.sleep(0.05)
    assert records[0].status == "withdrawn"
    assert calls_in(ran_file) == []


async def test_an_emit_without_the_outcomes_is_a_clear_error(broker: Broker) -> None:
    from crewai.flow import Flow, human_feedback, start

    class Unrouted(Flow[dict[str, Any]]):
        @start()
        @human_feedback(message="Fine?", llm=COLLAPSE, provider=Feedback())
        def draft(self) -> str:
            return "a draft"

    with pytest.raises(ConfigurationError, match="emit must list the outcomes 'approved'"):
        await kickoff(Unrouted(), wait_for=broker.wait_for)


@pytest.fixture
def flow_process(redis_url: str, namespace: str, ran_file: Path) -> Iterator[Any]:
    with driver(DRIVER, redis_url, namespace, str(ran_file), cwd=ran_file.parent) as start:
        yield start


@pytest.mark.slow
async def test_resumed_in_another_process_after_a_kill_runs_the_step_once(
    broker: Broker, flow_process: Any, ran_file: Path
) -> None:
    first = flow_process("start")
    try:
        pending = await shown(broker)
    finally:
        first.send_signal(signal.SIGKILL)
        first.communicate()
    flow_id = tool_call_of(pending.request).run
    assert flow_id is not None
    await pending.accept()
    out = await finished(flow_process("resume", flow_id))
    assert out.splitlines()[-1] == "RESULT sent 10 to ACME"
    assert calls_in(ran_file) == [PROPOSAL]
    persistence = SQLiteFlowPersistence(str(ran_file.parent / "flows.db"))
    with pytest.raises(RunNotFound):  # a second resumer (here, in this process)
        await resume(PaymentReview, broker=broker, flow_id=flow_id, persistence=persistence)
    assert calls_in(ran_file) == [PROPOSAL]


PAGE = Path(__file__).parents[1] / "docs" / "how-to" / "tool-approvals.md"


async def test_the_docs_example_runs_as_written(broker: Broker, ran_file: Path) -> None:
    """The CrewAI block of docs/how-to/tool-approvals.md, run as written: approved."""
    from crewai.flow import Flow, human_feedback, listen, start

    [code] = [
        m.group(1)
        for m in re.finditer(r"^```python\n(.*?)^```", PAGE.read_text(), re.S | re.M)
        if m.group(1).startswith("class Payment(Flow")
    ]
    names = {"Flow": Flow, "human_feedback": human_feedback, "listen": listen, "start": start}
    scope: dict[str, Any] = {
        **names,
        "Any": Any,
        "Feedback": Feedback,
        "kickoff": kickoff,
        "broker": broker,
        "collapse_llm": COLLAPSE,
        "__name__": __name__,
    }
    # at the top level, as a module runs it (with its top-level await)
    running = eval(compile(code, str(PAGE), "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT), scope)
    example = asyncio.create_task(running)
    await (await shown(broker)).accept()
    await example
    assert scope["result"] == "sent 10 to ACME"
