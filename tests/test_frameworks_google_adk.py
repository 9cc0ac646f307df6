"""Google ADK's tool confirmations answered through toolnexus: the real ADK with a scripted
model (a ``BaseLlm`` yielding function calls; no network), inline and resumed in another
process after a kill, its sessions in SQLite. Runs in .venv-frameworks (``./run
test-frameworks``): google-adk's pins conflict with .venv's."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from google.adk.runners import Runner
from google.genai import types

import toolnexus
from helpers import cancelling_withdraws
from servers.adk_agent import APP, ARGS, USER, final_text, runner
from toolnexus import Answer, Broker, InvalidAnswer, Pending
from toolnexus.frameworks import Ledger, audit_digests, tool_call_digest, tool_call_of
from toolnexus.frameworks.google_adk import run_with_confirmations

DRIVER = Path(__file__).parent / "servers" / "adk_agent.py"


@pytest.fixture
async def memory() -> AsyncIterator[Broker]:
    async with toolnexus.connect("memory://") as broker:
        yield broker


def ran(home: Path) -> list[dict[str, Any]]:
    file = home / "ran.jsonl"
    return [json.loads(line) for line in file.read_text().splitlines()] if file.exists() else []


async def shown(broker: Broker) -> Pending:
    async with broker.responder("ops") as responder, asyncio.timeout(30):
        return await anext(responder)


async def run(bank: Runner, wait_for: Any, **kw: Any) -> Any:
    """Run "Pay ACME" in a new session, confirmations through ``wait_for``; the final
    JSON the model answered."""
    session = await bank.session_service.create_session(app_name=APP, user_id=USER)
    message = types.Content(role="user", parts=[types.Part(text="Pay ACME")])
    events = await run_with_confirmations(
        bank, user_id=USER, session_id=session.id, new_message=message, wait_for=wait_for, **kw
    )
    return final_text(events)


async def test_approve_runs_the_tool_and_records_every_digest(
    memory: Broker, tmp_path: Path
) -> None:
    ledger = Ledger(memory.store("tool-calls", agent=True))
    session = asyncio.create_task(run(runner(tmp_path), memory.wait_for, ledger=ledger))
    pending = await shown(memory)
    call = tool_call_of(pending.request)
    assert (call.name, call.arguments, call.framework, call.call_id) == (
        "transfer",
        ARGS,
        "google-adk",
        "fc-1",
    )
    # a plain require_confirmation=True: the person is asked about the call, not shown
    # ADK's hint for the model ("... by responding with a FunctionResponse ...", issue #43)
    assert pending.request.prompt == "Run the tool transfer?"
    assert pending.request.schema is not None  # the tool's declared schema, pre-filled
    assert pending.request.schema["properties"]["amount"] == {
        "title": "Amount",
        "type": "integer",
        "default": 10,
    }
    await pending.accept()
    assert await asyncio.wait_for(session, 30) == [{"result": "sent 10 to ACME"}]
    assert ran(tmp_path) == [ARGS]
    digest = tool_call_digest("transfer", ARGS)
    entry = await ledger.get(pending.request.id)
    assert entry == {"proposed": digest, "approved": digest, "executed": digest}
    [record] = await memory.audit(request_id=pending.request.id)
    assert audit_digests(record).approved == digest


async def test_deny_tells_the_model_the_persons_message(memory: Broker, tmp_path: Path) -> None:
    session = asyncio.create_task(run(runner(tmp_path), memory.wait_for))
    pending = await shown(memory)
    await pending.answer(Answer(id=pending.request.id, ok=False, data="Not this month."))
    assert await asyncio.wait_for(session, 30) == [{"error": "Not this month."}]
    assert ran(tmp_path) == []


async def test_an_edit_runs_the_edited_arguments_and_a_bad_one_is_refused(
    memory: Broker, tmp_path: Path
) -> None:
    session = asyncio.create_task(run(runner(tmp_path), memory.wait_for))
    pending = await shown(memory)
    with pytest.raises(InvalidAnswer, match="amount"):
        await pending.accept({"to": "ACME", "amount": "lots"})
    assert not session.done()  # the request stays open
    await pending.accept({"to": "ACME", "amount": 5})
    assert await asyncio.wait_for(session, 30) == [{"result": "sent 5 to ACME"}]
    assert ran(tmp_path) == [{"to": "ACME", "amount": 5}]


async def test_a_payload_confirmation_answers_with_the_payload(
    memory: Broker, tmp_path: Path
) -> None:
    session = asyncio.create_task(run(runner(tmp_path, tool="book_leave"), memory.wait_for))
    pending = await shown(memory)
    call = tool_call_of(pending.request)
    assert (call.name, call.arguments, pending.request.prompt) == (
        "book_leave",
        {"days": 5},
        "Approve 5 days of leave?",
    )
    assert pending.request.schema is not None  # the form is the payload
    assert pending.request.schema["properties"]["approved_days"]["default"] == 5
    await pending.accept({"approved_days": 3})
    *_, last = await asyncio.wait_for(session, 30)
    assert last == {"status": "booked", "days": 3}
    assert ran(tmp_path) == [{"days": 3}]


async def test_a_deadline_denies_with_a_clear_message(memory: Broker, tmp_path: Path) -> None:
    wait_for = functools.partial(memory.wait_for, timeout_s=0.3)
    [response] = await asyncio.wait_for(run(runner(tmp_path), wait_for), 30)
    message = "No approval for transfer before the deadline: the call was not run."
    assert response == {"error": message}
    assert ran(tmp_path) == []


async def test_cancelling_the_run_withdraws_the_question(memory: Broker, tmp_path: Path) -> None:
    await cancelling_withdraws(memory, run(runner(tmp_path), memory.wait_for))
    assert ran(tmp_path) == []


@pytest.mark.slow
@pytest.mark.redis
async def test_resumed_in_another_process_after_a_kill_runs_the_tool_once(
    redis_url: str, namespace: str, tmp_path: Path
) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}

    def agent(*args: str) -> subprocess.Popen[str]:
        command = [sys.executable, str(DRIVER), redis_url, namespace, str(tmp_path), *args]
        return subprocess.Popen(
            command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )

    first = agent("start")
    async with toolnexus.connect(redis_url, namespace=namespace, block_ms=100) as broker:
        try:
            pending = await shown(broker)
        finally:
            first.send_signal(signal.SIGKILL)
            out, _ = first.communicate()
        session_id = out.split()[0]
        assert tool_call_of(pending.request).run == session_id
        assert pending.request.durable
        await pending.accept({"to": "ACME", "amount": 7})
        second = agent("resume", session_id)
        out, err = await asyncio.to_thread(second.communicate, timeout=60)
        assert second.returncode == 0, err
        assert json.loads(out) == [{"result": "sent 7 to ACME"}]
        assert ran(tmp_path) == [{"to": "ACME", "amount": 7}]
        entry = await Ledger.of(broker).get(pending.request.id)
        assert entry["executed"] == entry["approved"] != entry["proposed"]
        again = agent("resume", session_id)  # the run is over: nothing is kept, nothing runs
        _, err = await asyncio.to_thread(again.communicate, timeout=60)
        assert again.returncode != 0
        assert f"RunNotFound: no resumable google-adk run of session {session_id!r}" in err
        assert ran(tmp_path) == [{"to": "ACME", "amount": 7}]


PAGE = Path(__file__).parents[1] / "docs" / "how-to" / "google-adk.md"


async def test_the_docs_example_runs_as_written(memory: Broker, tmp_path: Path) -> None:
    """The inline block of docs/how-to/google-adk.md, run as written with the page's names
    bound (a runner of the scripted agent, a session)."""
    [code] = [
        m.group(1)
        for m in re.finditer(r"^```python\n(.*?)^```", PAGE.read_text(), re.S | re.M)
        if "run_with_confirmations(" in m.group(1)
    ]
    source = "async def example():\n" + textwrap.indent(code + "\nreturn locals()", "    ")
    bank = runner(tmp_path)
    session = await bank.session_service.create_session(app_name=APP, user_id=USER)
    scope: dict[str, Any] = {"broker": memory, "runner": bank, "session": session}
    exec(compile(source, str(PAGE), "exec"), scope)
    example = asyncio.create_task(scope["example"]())
    pending = await shown(memory)
    left_s = (pending.request.expires_at or 0) - time.time()
    assert 250 < left_s <= 300, left_s  # the page's deadline, not the 600 s default
    await pending.accept({"to": "ACME", "amount": 3})
    names = await asyncio.wait_for(example, 30)
    assert final_text(names["events"]) == [{"result": "sent 3 to ACME"}]
