"""pydantic-ai's tool approvals answered through toolnexus: inline (a capability) and
stop-the-world resumed in another process, with a scripted model (no LLM)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai import Agent
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.tools import DeferredToolRequests, RunContext

import toolnexus
from helpers import cancelling_withdraws, page_block, run_fragment, scripted
from toolnexus import Answer, Broker, InvalidAnswer, Pending
from toolnexus.frameworks import Ledger, audit_digests, tool_call_digest, tool_call_of
from toolnexus.frameworks.pydantic_ai import approvals, resume, run_resumable

ARGS = {"to": "ACME", "amount": 10}


def bank(ran: list[dict[str, Any]], **capabilities: Any) -> Agent[None, str]:
    agent = Agent(scripted(("transfer", ARGS)), output_type=str, **capabilities)

    @agent.tool_plain(requires_approval=True)
    def transfer(to: str, amount: int) -> str:
        """Send ``amount`` euros to ``to``."""
        ran.append({"to": to, "amount": amount})
        return f"sent {amount} to {to}"

    return agent


@pytest.fixture
async def memory() -> AsyncIterator[Broker]:
    async with toolnexus.connect("memory://") as broker:
        yield broker


async def shown(broker: Broker) -> Pending:
    async with broker.responder("ops") as responder, asyncio.timeout(10):
        return await anext(responder)


async def test_approve_runs_the_tool_as_proposed_and_records_its_digests(memory: Broker) -> None:
    ran: list[dict[str, Any]] = []
    ledger = Ledger(memory.store("tool-calls", agent=True))
    agent = bank(ran, capabilities=[approvals(memory.wait_for, ledger=ledger, agent="bank-bot")])
    run = asyncio.create_task(agent.run("Pay ACME"))
    pending = await shown(memory)
    request = pending.request
    call = tool_call_of(request)
    assert (request.kind, call.name, call.arguments, call.framework) == (
        "tool_call",
        "transfer",
        ARGS,
        "pydantic-ai",
    )
    assert call.digest == tool_call_digest("transfer", ARGS)
    assert request.schema is not None
    assert request.schema["properties"]["amount"]["default"] == 10  # the form opens pre-filled
    await pending.accept()
    result = await asyncio.wait_for(run, 10)
    assert ran == [ARGS]
    assert json.loads(result.output) == ["sent 10 to ACME"]
    [record] = await memory.audit(request_id=request.id)
    digests = audit_digests(record)
    assert digests.proposed == digests.approved == call.digest
    assert await ledger.get(request.id) == {
        "proposed": call.digest,
        "approved": call.digest,
        "executed": call.digest,
    }


async def test_an_inline_run_is_named_as_the_caller_says(memory: Broker) -> None:
    """Issue #43: ``approvals(..., run=...)`` names the run in its requests, so a responder
    can tie ``tool_call.run`` to it (without a name it is pydantic-ai's random run id)."""
    ran: list[dict[str, Any]] = []
    agent = bank(ran, capabilities=[approvals(memory.wait_for, run="payroll-2026-12")])
    run = asyncio.create_task(agent.run("Pay ACME"))
    pending = await shown(memory)
    assert tool_call_of(pending.request).run == "payroll-2026-12"
    await pending.accept()
    await asyncio.wait_for(run, 10)
    assert ran == [ARGS]


async def test_deny_with_a_message_tells_the_model_and_runs_nothing(memory: Broker) -> None:
    ran: list[dict[str, Any]] = []
    agent = bank(ran, capabilities=[approvals(memory.wait_for)])
    run = asyncio.create_task(agent.run("Pay ACME"))
    pending = await shown(memory)
    await pending.answer(Answer(id=pending.request.id, ok=False, data="Not this month."))
    result = await asyncio.wait_for(run, 10)
    assert ran == []
    assert json.loads(result.output) == ["Not this month."]


async def test_an_edit_runs_the_edited_arguments_and_a_bad_edit_is_refused(memory: Broker) -> None:
    ran: list[dict[str, Any]] = []
    ledger = Ledger(memory.store("tool-calls", agent=True))
    agent = bank(ran, capabilities=[approvals(memory.wait_for, ledger=ledger)])
    run = asyncio.create_task(agent.run("Pay ACME"))
    pending = await shown(memory)
    with pytest.raises(InvalidAnswer, match="amount"):
        await pending.accept({"to": "ACME", "amount": "lots"})
    assert not run.done()  # the request stays open
    await pending.accept({"to": "ACME", "amount": 5})
    result = await asyncio.wait_for(run, 10)
    assert ran == [{"to": "ACME", "amount": 5}]
    assert json.loads(result.output) == ["sent 5 to ACME"]
    [record] = await memory.audit(request_id=pending.request.id)
    digests = audit_digests(record)
    edited = tool_call_digest("transfer", {"to": "ACME", "amount": 5})
    assert (digests.proposed, digests.approved) == (tool_call_digest("transfer", ARGS), edited)
    assert (await ledger.get(pending.request.id))["executed"] == edited


async def test_a_deadline_denies_with_a_clear_message_never_approves(memory: Broker) -> None:
    ran: list[dict[str, Any]] = []
    wait_for = functools.partial(memory.wait_for, timeout_s=0.3)
    agent = bank(ran, capabilities=[approvals(wait_for)])
    result = await asyncio.wait_for(agent.run("Pay ACME"), 10)
    assert ran == []
    [message] = json.loads(result.output)
    assert message == "No approval for transfer before the deadline: the call was not run."


async def test_cancelling_the_run_withdraws_the_question(memory: Broker) -> None:
    ran: list[dict[str, Any]] = []
    agent = bank(ran, capabilities=[approvals(memory.wait_for)])
    await cancelling_withdraws(memory, agent.run("Pay ACME"))
    assert ran == []


AGENT = textwrap.dedent(
    """
    import asyncio, json, sys
    from pydantic_ai import Agent
    from pydantic_ai.messages import (
        ModelRequest, ModelResponse, TextPart, ToolCallPart, ToolReturnPart)
    from pydantic_ai.models.function import FunctionModel
    from pydantic_ai.tools import DeferredToolRequests
    import toolnexus
    from toolnexus.frameworks.pydantic_ai import resume, run_resumable

    url, namespace, run, ran_file, mode = sys.argv[1:6]

    def respond(messages, info):
        returned = [p.content for m in messages if isinstance(m, ModelRequest)
                    for p in m.parts if isinstance(p, ToolReturnPart)]
        if not returned:
            return ModelResponse(parts=[ToolCallPart("transfer", {"to": "ACME", "amount": 10})])
        return ModelResponse(parts=[TextPart(json.dumps(returned))])

    agent = Agent(FunctionModel(respond), output_type=[str, DeferredToolRequests])

    @agent.tool_plain(requires_approval=True)
    def transfer(to: str, amount: int) -> str:
        with open(ran_file, "a") as f:
            f.write(json.dumps({"to": to, "amount": amount}) + "\\n")
        return f"sent {amount} to {to}"

    async def main():
        async with toolnexus.connect(url, namespace=namespace, block_ms=100) as broker:
            if mode == "start":
                result = await run_resumable(agent, "Pay ACME", broker=broker, run=run)
            else:
                result = await resume(agent, broker=broker, run=run)
        print(result.output, flush=True)

    asyncio.run(main())
    """
)


@pytest.mark.slow
@pytest.mark.redis
async def test_resumed_in_another_process_after_a_kill_runs_the_tool_once(
    redis_url: str, namespace: str, tmp_path: Path
) -> None:
    script, ran = tmp_path / "agent.py", tmp_path / "ran.jsonl"
    script.write_text(AGENT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}

    def agent(mode: str, stdout: int = subprocess.PIPE) -> subprocess.Popen[str]:
        command = [sys.executable, str(script), redis_url, namespace, "run-7", str(ran), mode]
        return subprocess.Popen(command, env=env, stdout=stdout, stderr=subprocess.PIPE, text=True)

    first = agent("start", subprocess.DEVNULL)
    async with toolnexus.connect(redis_url, namespace=namespace, block_ms=100) as broker:
        try:
            pending = await shown(broker)
        finally:
            first.send_signal(signal.SIGKILL)
            first.communicate()
        assert tool_call_of(pending.request).run == "run-7"
        await pending.accept({"to": "ACME", "amount": 7})
        second = agent("resume")
        out, _ = await asyncio.to_thread(second.communicate, timeout=60)
        assert second.returncode == 0
        assert json.loads(out) == ["sent 7 to ACME"]
        assert [json.loads(line) for line in ran.read_text().splitlines()] == [
            {"to": "ACME", "amount": 7}
        ]
        entry = await Ledger.of(broker).get(pending.request.id)
        assert entry["executed"] == entry["approved"] != entry["proposed"]
        again = agent("resume")  # the run is over: nothing is kept to resume, nothing runs
        _, err = await asyncio.to_thread(again.communicate, timeout=60)
        assert again.returncode != 0
        assert "RunNotFound: no resumable pydantic-ai run 'run-7' is kept" in err
        assert len(ran.read_text().splitlines()) == 1


@dataclass
class AllAtOnce(AbstractCapability[Any]):
    """Holds each run at its tool until every racer is there: the runs then race on."""

    barrier: asyncio.Barrier

    @classmethod
    def get_serialization_name(cls) -> str | None:
        return None

    async def before_tool_execute(
        self, ctx: RunContext[Any], *, call: Any, tool_def: Any, args: dict[str, Any]
    ) -> dict[str, Any]:
        async with asyncio.timeout(20):
            await self.barrier.wait()
        return args


def resumable_bank(
    ran: list[dict[str, Any]], barrier: asyncio.Barrier | None = None
) -> Agent[None, str | DeferredToolRequests]:
    """A bank agent that stops the world for approvals (its output admits
    ``DeferredToolRequests``), as one process would build it; with a ``barrier``, its
    run waits at the tool for the other racers."""
    agent: Agent[None, str | DeferredToolRequests] = Agent(
        scripted(("transfer", ARGS)),
        output_type=[str, DeferredToolRequests],
        capabilities=[AllAtOnce(barrier)] if barrier else [],
    )

    @agent.tool_plain(requires_approval=True)
    def transfer(to: str, amount: int) -> str:
        ran.append({"to": to, "amount": amount})
        return f"sent {amount} to {to}"

    return agent


@pytest.mark.slow
@pytest.mark.redis
async def test_resumers_racing_for_one_answered_approval_run_the_tool_once(
    redis_url: str, namespace: str
) -> None:
    """Issue #27: four resumers (each with a broker of its own, as processes would have)
    resume the same answered run and reach its tool at the same moment; the ledger's
    atomic claim lets exactly one run the tool, the others are refused before it runs."""
    ran: list[dict[str, Any]] = []
    async with contextlib.AsyncExitStack() as stack:
        brokers = [
            await stack.enter_async_context(
                toolnexus.connect(redis_url, namespace=namespace, block_ms=100)
            )
            for _ in range(5)
        ]
        started = asyncio.create_task(
            run_resumable(resumable_bank(ran), "Pay ACME", broker=brokers[0], run="run-race")
        )
        pending = await shown(brokers[0])
        started.cancel()  # the first process is gone; its durable request stays open
        await asyncio.gather(started, return_exceptions=True)
        await pending.accept()
        barrier = asyncio.Barrier(len(brokers) - 1)
        outcomes = await asyncio.gather(
            *(resume(resumable_bank(ran, barrier), broker=b, run="run-race") for b in brokers[1:]),
            return_exceptions=True,
        )
    assert ran == [ARGS]
    finished = [o for o in outcomes if not isinstance(o, BaseException)]
    assert [json.loads(o.output) for o in finished] == [["sent 10 to ACME"]]
    refused = [str(o) for o in outcomes if isinstance(o, BaseException)]
    assert refused and all("ran already: an approval is used once" in r for r in refused), refused


async def test_the_docs_inline_example_runs_as_written(memory: Broker) -> None:
    page = "docs/how-to/tool-approvals.md"
    code = page_block(page, "from toolnexus.frameworks import Ledger\n")
    bound = {"Agent": Agent, "broker": memory, "model": scripted(("transfer", ARGS))}
    example = asyncio.create_task(run_fragment(code, page, **bound))
    await (await shown(memory)).accept({"to": "ACME", "amount": 3})
    names = await asyncio.wait_for(example, 10)
    assert json.loads(names["result"].output) == ["sent 3 to ACME"]
