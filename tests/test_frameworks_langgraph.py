"""LangGraph's and LangChain's interrupts answered through toolnexus: the
``HumanInTheLoopMiddleware`` (batched and per call), langgraph's ``HumanInterrupt`` and a
plain ``interrupt()`` question, inline and resumed (in this process with the in-memory
checkpointer, in another process with the SQLite one), with a scripted model (no network)."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, StateGraph
from langgraph.types import interrupt
from typing_extensions import TypedDict

import toolnexus
from conftest import Fleet
from helpers import page_block
from servers.langgraph_agent import ARGS, Scripted, bank, calls, tool_results, transfer_tool
from test_forgery import decline_genuinely
from test_forgery import shown as shown_to
from toolnexus import Answer, Broker, InvalidAnswer, Pending
from toolnexus.frameworks import (
    Ledger,
    RunNotFound,
    audit_digests,
    tool_call_digest,
    tool_call_of,
)
from toolnexus.frameworks.langgraph import resume, run_resumable, run_with_approvals

DRIVER = Path(__file__).parent / "servers" / "langgraph_agent.py"
PAY = {"messages": [("user", "Pay ACME")]}


def thread(name: str) -> Any:
    return {"configurable": {"thread_id": name}}


def ran(tmp_path: Path) -> list[dict[str, Any]]:
    file = tmp_path / "ran.jsonl"
    return [json.loads(line) for line in file.read_text().splitlines()] if file.exists() else []


@pytest.fixture
async def memory() -> AsyncIterator[Broker]:
    async with toolnexus.connect("memory://") as broker:
        yield broker


async def shown(broker: Broker, count: int = 1) -> list[Pending]:
    seen: list[Pending] = []
    async with broker.responder("ops") as responder, asyncio.timeout(30):
        async for pending in responder:
            seen.append(pending)
            if len(seen) == count:
                return seen
    raise AssertionError("the responder stopped")


async def test_approve_runs_the_tool_and_the_ledger_has_every_digest(
    memory: Broker, tmp_path: Path
) -> None:
    ledger = Ledger(memory.store("tool-calls", agent=True))
    agent = bank(tmp_path / "ran.jsonl", InMemorySaver(), [*calls(ARGS), "done"], ledger=ledger)
    run = asyncio.create_task(
        run_with_approvals(
            agent, PAY, config=thread("t-1"), wait_for=memory.wait_for, ledger=ledger
        )
    )
    [pending] = await shown(memory)
    request = pending.request
    call = tool_call_of(request)
    assert (request.kind, call.name, call.arguments, call.framework, call.run, call.call_id) == (
        "tool_call",
        "transfer",
        ARGS,
        "langgraph",
        "t-1",
        "call_1",  # the model's tool call id, matched to the batched action request
    )
    assert request.schema is not None
    assert request.schema["properties"]["amount"]["default"] == 10  # the tool's schema
    await pending.accept()
    values = await asyncio.wait_for(run, 30)
    assert tool_results(values) == ["sent 10 to ACME"]
    assert values["messages"][-1].content == "done"
    assert ran(tmp_path) == [ARGS]
    digest = tool_call_digest("transfer", ARGS)
    assert await ledger.get(request.id) == {
        "proposed": digest,
        "approved": digest,
        "executed": digest,
    }
    [record] = await memory.audit(request_id=request.id)
    assert (audit_digests(record).proposed, audit_digests(record).approved) == (digest, digest)


async def test_two_calls_of_one_turn_one_denied_with_a_message(
    memory: Broker, tmp_path: Path
) -> None:
    other = {"to": "EVIL", "amount": 99}
    agent = bank(tmp_path / "ran.jsonl", InMemorySaver(), [*calls(ARGS, other), "done"])
    run = asyncio.create_task(
        run_with_approvals(agent, PAY, config=thread("t-2"), wait_for=memory.wait_for)
    )
    first, second = sorted(await shown(memory, 2), key=lambda p: tool_call_of(p.request).call_id)
    assert tool_call_of(second.request).arguments == other
    await second.answer(Answer(id=second.request.id, ok=False, data="Not this one."))
    await first.accept()
    values = await asyncio.wait_for(run, 30)
    assert sorted(tool_results(values)) == [  # the rejection comes first
        "User rejected the tool call for `transfer` with reason: Not this one.",
        "sent 10 to ACME",
    ]
    assert ran(tmp_path) == [ARGS]


async def test_an_edit_runs_the_edited_arguments_and_a_bad_edit_is_refused(
    memory: Broker, tmp_path: Path
) -> None:
    ledger = Ledger(memory.store("tool-calls", agent=True))
    agent = bank(
        tmp_path / "ran.jsonl",
        InMemorySaver(),
        [*calls(ARGS), "done"],
        ledger=ledger,
        mode="per_call",
    )
    run = asyncio.create_task(
        run_with_approvals(
            agent, PAY, config=thread("t-3"), wait_for=memory.wait_for, ledger=ledger
        )
    )
    [pending] = await shown(memory)
    with pytest.raises(InvalidAnswer, match="amount"):
        await pending.accept({"to": "ACME", "amount": "lots"})  # breaks the tool's schema
    assert not run.done()  # the request stays open
    edited = {"to": "ACME", "amount": 5}
    await pending.accept(edited)
    values = await asyncio.wait_for(run, 30)
    assert ran(tmp_path) == [edited]
    [result] = tool_results(values)
    assert result.endswith("sent 5 to ACME")  # after the middleware's note of the edit
    [record] = await memory.audit(request_id=pending.request.id)
    digests = audit_digests(record)
    assert (digests.proposed, digests.approved) == (
        tool_call_digest("transfer", ARGS),
        tool_call_digest("transfer", edited),
    )
    assert (await ledger.get(pending.request.id))["executed"] == digests.approved


async def test_where_edit_is_not_allowed_an_edit_is_refused_to_the_responder(
    memory: Broker, tmp_path: Path
) -> None:
    agent = bank(
        tmp_path / "ran.jsonl",
        InMemorySaver(),
        [*calls(ARGS), "done"],
        allowed=("approve", "reject"),
        mode="per_call",
    )
    run = asyncio.create_task(
        run_with_approvals(agent, PAY, config=thread("t-4"), wait_for=memory.wait_for)
    )
    [pending] = await shown(memory)
    with pytest.raises(InvalidAnswer, match="amount"):
        await pending.accept({"to": "ACME", "amount": 5})
    await pending.answer(Answer(id=pending.request.id, ok=False, data="Not this month."))
    values = await asyncio.wait_for(run, 30)
    assert tool_results(values) == [
        "User rejected the tool call for `transfer` with reason: Not this month."
    ]
    assert ran(tmp_path) == []


@pytest.mark.parametrize("mode", ["batched", "per_call"])
async def test_a_deadline_rejects_with_a_clear_message(
    memory: Broker, tmp_path: Path, mode: str
) -> None:
    agent = bank(tmp_path / "ran.jsonl", InMemorySaver(), [*calls(ARGS), "done"], mode=mode)
    wait_for = functools.partial(memory.wait_for, timeout_s=0.3)
    values = await asyncio.wait_for(
        run_with_approvals(agent, PAY, config=thread("t-5"), wait_for=wait_for), 30
    )
    assert tool_results(values) == [
        "User rejected the tool call for `transfer` with reason: "
        "No approval for transfer before the deadline: the call was not run."
    ]
    assert ran(tmp_path) == []


async def test_cancelling_the_run_withdraws_the_question(memory: Broker, tmp_path: Path) -> None:
    agent = bank(tmp_path / "ran.jsonl", InMemorySaver(), [*calls(ARGS), "done"])
    async with memory.events() as events:
        run = asyncio.create_task(
            run_with_approvals(agent, PAY, config=thread("t-6"), wait_for=memory.wait_for)
        )
        [pending] = await shown(memory)
        run.cancel()
        async with asyncio.timeout(10):
            async for event in events:
                if event.id == pending.request.id and event.event == "withdrawn":
                    break
    [record] = await memory.audit(request_id=pending.request.id)
    assert record.status == "withdrawn"
    assert ran(tmp_path) == []


async def test_a_tool_that_cannot_be_refused_is_not_asked(memory: Broker, tmp_path: Path) -> None:
    agent = bank(tmp_path / "ran.jsonl", InMemorySaver(), calls(ARGS), allowed=("approve",))
    with pytest.raises(toolnexus.ConfigurationError, match="one to refuse it"):
        await run_with_approvals(agent, PAY, config=thread("t-7"), wait_for=memory.wait_for)
    assert ran(tmp_path) == []


class Errand(TypedDict, total=False):
    region: Any
    review: Any


def errand() -> Any:
    """A graph of plain ``interrupt()`` calls: a question, then a ``HumanInterrupt``."""

    def ask(state: Errand) -> Errand:
        return {"region": interrupt({"question": "Which region?", "options": ["eu", "us"]})}

    def review(state: Errand) -> Errand:
        action = {"action": "deploy", "args": {"region": "eu"}}
        flags = {"allow_accept": True, "allow_edit": True, "allow_respond": True}
        return {
            "review": interrupt(
                [
                    {
                        "action_request": action,
                        "config": flags | {"allow_ignore": True},
                        "description": "Deploy?",
                    }
                ]
            )
        }

    graph = StateGraph(Errand)
    graph.add_node("ask", ask)
    graph.add_node("review", review)
    graph.add_edge(START, "ask")
    graph.add_edge("ask", "review")
    return graph.compile(checkpointer=InMemorySaver())


async def test_a_plain_question_and_a_human_interrupt(memory: Broker) -> None:
    run = asyncio.create_task(
        run_with_approvals(errand(), {}, config=thread("t-8"), wait_for=memory.wait_for)
    )
    [asked] = await shown(memory)
    assert (asked.request.kind, asked.request.prompt) == ("input", "Which region?")
    await asked.accept({"answer": "eu"})
    [review] = await shown(memory)
    call = tool_call_of(review.request)
    assert (call.name, call.arguments, review.request.prompt) == (
        "deploy",
        {"region": "eu"},
        "Deploy?",
    )
    await review.accept({"region": "us"})
    values = await asyncio.wait_for(run, 30)
    assert values["region"] == {"ok": True, "answer": "eu"}
    assert values["review"] == [
        {"type": "edit", "args": {"action": "deploy", "args": {"region": "us"}}}
    ]


async def test_plain_interrupts_resumed_after_the_asking_run_is_gone(memory: Broker) -> None:
    graph = errand()
    asking = asyncio.create_task(run_resumable(graph, {}, broker=memory, config=thread("t-13")))
    [asked] = await shown(memory)
    asking.cancel()  # the asking run is gone; its durable question stays
    await asyncio.gather(asking, return_exceptions=True)
    await asked.accept({"answer": "us"})
    resumed = asyncio.create_task(resume(graph, broker=memory, config=thread("t-13")))
    [review] = await shown(memory)  # the graph went on to its next interrupt
    await review.answer(Answer(id=review.request.id, ok=False, data="Not today."))
    values = await asyncio.wait_for(resumed, 30)
    assert values["region"] == {"ok": True, "answer": "us"}
    assert values["review"] == [{"type": "response", "args": "Not today."}]


async def test_an_interrupt_that_is_no_question_is_refused(memory: Broker) -> None:
    def odd(state: Errand) -> Errand:
        return {"region": interrupt(42)}

    graph = StateGraph(Errand)
    graph.add_node("odd", odd)
    graph.add_edge(START, "odd")
    compiled = graph.compile(checkpointer=InMemorySaver())
    with pytest.raises(toolnexus.InvalidRequest, match="toolnexus asks a string or"):
        await run_with_approvals(compiled, {}, config=thread("t-12"), wait_for=memory.wait_for)


async def test_resumed_with_the_in_memory_checkpointer_runs_the_tool_once(
    memory: Broker, tmp_path: Path
) -> None:
    checkpointer = InMemorySaver()
    ledger = Ledger(memory.store("tool-calls", agent=True))
    first = bank(tmp_path / "ran.jsonl", checkpointer, calls(ARGS), ledger=ledger)
    asking = asyncio.create_task(run_resumable(first, PAY, broker=memory, config=thread("t-9")))
    [pending] = await shown(memory)
    asking.cancel()  # the asking run is gone; its durable request stays
    await asyncio.gather(asking, return_exceptions=True)
    await pending.accept()
    second = bank(tmp_path / "ran.jsonl", checkpointer, ["done"], ledger=ledger)
    values = await asyncio.wait_for(resume(second, broker=memory, config=thread("t-9")), 30)
    assert tool_results(values) == ["sent 10 to ACME"]
    assert ran(tmp_path) == [ARGS]
    assert set(await ledger.get(pending.request.id)) == {"proposed", "approved", "executed"}
    with pytest.raises(RunNotFound, match="t-9"):
        await resume(second, broker=memory, config=thread("t-9"))
    assert ran(tmp_path) == [ARGS]


@pytest.mark.slow
@pytest.mark.redis
async def test_resumed_in_another_process_after_a_kill_runs_the_tool_once(
    redis_url: str, namespace: str, tmp_path: Path
) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    db = str(tmp_path / "checkpoints.sqlite")

    def agent(mode: str) -> subprocess.Popen[str]:
        command = [sys.executable, str(DRIVER), redis_url, namespace, "t-10"]
        command += [str(tmp_path / "ran.jsonl"), db, mode]
        return subprocess.Popen(
            command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )

    first = agent("start")
    async with toolnexus.connect(redis_url, namespace=namespace, block_ms=100) as broker:
        try:
            [pending] = await shown(broker)
        finally:
            first.send_signal(signal.SIGKILL)
            first.communicate()
        assert first.returncode == -signal.SIGKILL
        assert tool_call_of(pending.request).run == "t-10"
        await pending.accept({"to": "ACME", "amount": 7})
        second = agent("resume")
        out, err = await asyncio.to_thread(second.communicate, timeout=60)
        assert second.returncode == 0, err
        [result] = json.loads(out)
        assert result.endswith("sent 7 to ACME")
        assert ran(tmp_path) == [{"to": "ACME", "amount": 7}]
        entry = await Ledger.of(broker).get(pending.request.id)
        assert entry["executed"] == entry["approved"] != entry["proposed"]
        again = agent("resume")  # the run is over: nothing is kept, nothing runs
        _, err = await asyncio.to_thread(again.communicate, timeout=60)
        assert again.returncode != 0
        assert "RunNotFound: no resumable langgraph run of thread 't-10' is kept" in err
        assert ran(tmp_path) == [{"to": "ACME", "amount": 7}]


@pytest.mark.redis
async def test_a_signed_approval_replayed_for_the_next_identical_call_is_refused(
    fleet: Fleet, tmp_path: Path
) -> None:
    """The model calls ``transfer`` with the same arguments twice; the signed answer that
    approved the first call, replayed for the second, approves nothing."""
    script = [*calls(ARGS), *calls(ARGS, first=2), "done"]
    graph = bank(tmp_path / "ran.jsonl", InMemorySaver(), script)
    async with fleet.agent() as agent, fleet.responder() as bot:
        wait_for = functools.partial(agent.wait_for, timeout_s=30)
        run = asyncio.create_task(
            run_with_approvals(graph, PAY, config=thread("t-11"), wait_for=wait_for)
        )
        first = await shown_to(bot)
        await first.accept(person="web:alice")
        second = await shown_to(bot)  # the run went on: the model called again
        assert tool_call_of(second.request).digest == tool_call_of(first.request).digest
        reply_stream = agent.keys.answers(agent.waiter_id)
        [(_, entry)] = await agent.redis.xrange(reply_stream, count=1)
        genuine = agent.codec.decode_as(entry[b"a"], Answer)
        assert genuine.id == first.request.id and genuine.signature is not None
        replayed = msgspec.structs.replace(genuine, id=second.request.id)
        await agent.redis.xadd(
            reply_stream, {"id": second.request.id, "a": agent.codec.encode(replayed)}
        )
        await asyncio.sleep(0.5)
        assert not run.done()  # the replay approved nothing
        await decline_genuinely(bot, second.request.id)
        values = await asyncio.wait_for(run, 30)
        [record] = await agent.audit(request_id=second.request.id)
    assert "bad signature" in [refusal.reason for refusal in record.refused]
    assert ran(tmp_path) == [ARGS]  # once
    assert tool_results(values)[-1].startswith("User rejected the tool call for `transfer`")


async def test_the_docs_inline_example_runs_as_written(memory: Broker, tmp_path: Path) -> None:
    """The LangGraph block of docs/how-to/tool-approvals.md, run as written."""
    code = page_block("docs/how-to/tool-approvals.md", "from langchain.agents import create_agent")
    source = "async def example():\n" + textwrap.indent(code + "\nreturn locals()", "    ")
    scope: dict[str, Any] = {
        "broker": memory,
        "model": Scripted(messages=iter([*calls(ARGS), "done"])),
        "transfer": transfer_tool(tmp_path / "ran.jsonl"),
    }
    exec(compile(source, "tool-approvals.md", "exec"), scope)
    example = asyncio.create_task(scope["example"]())
    [pending] = await shown(memory)
    await pending.accept({"to": "ACME", "amount": 3})
    names = await asyncio.wait_for(example, 30)
    [result] = tool_results(names["state"])
    assert result.endswith("sent 3 to ACME")
    assert (await names["ledger"].get(pending.request.id)).keys() == {
        "proposed",
        "approved",
        "executed",
    }
