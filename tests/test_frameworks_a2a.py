"""A remote A2A agent's paused tasks answered through toolnexus: a local agent of the official
a2a-sdk over HTTP (examples/a2a_agent.py, no LLM), answered by a responder in another
process (tests/servers/responder.py), the bridging process killed and resumed."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import sys
import textwrap
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from a2a.client import Client, create_client
from a2a.helpers import get_message_text, new_data_part
from a2a.types import (
    GetTaskRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
    Task,
    TaskState,
    TaskStatus,
)

import toolnexus
from mcp_processes import a2a_agent_http, responder_process
from toolnexus import Broker, Request
from toolnexus.frameworks import RemoteAgentError, RunNotFound
from toolnexus.frameworks.a2a import pause_request, resume, send_message, watch

pytestmark = pytest.mark.redis

BRIDGE = Path(__file__).parent / "servers" / "a2a_bridge.py"


@pytest.fixture(scope="module")
def agent_url() -> Iterator[str]:
    with a2a_agent_http() as url:
        yield url


@pytest.fixture
async def broker(redis_url: str, namespace: str) -> AsyncIterator[Broker]:
    async with toolnexus.connect(redis_url, namespace=namespace, block_ms=100) as b:
        yield b


@pytest.fixture
async def client(agent_url: str) -> AsyncIterator[Client]:
    async with await create_client(agent_url) as c:
        yield c


def said(text: str) -> Message:
    return Message(role=Role.ROLE_USER, message_id=str(uuid.uuid4()), parts=[Part(text=text)])


Through = Callable[..., Awaitable[tuple[Task, list[Request]]]]


async def answer_by(broker: Broker, rules: dict[str, Any], seen: list[Request]) -> None:
    """Answer by prompt as tests/servers/responder.py does (``{"accept": data}``,
    ``"decline"``, ``"hold"``), in this process."""
    async with broker.responder("ops") as requests:
        async for pending in requests:
            seen.append(pending.request)
            rule = rules[pending.request.prompt]
            if rule == "decline":
                await pending.decline(person="tester")
            elif rule != "hold":
                await pending.accept(rule["accept"], person="tester")


@pytest.fixture
def through(client: Client, broker: Broker, agent_url: str) -> Through:
    """Send a text to the agent, a responder answering by ``rules``: the ended task and the
    requests the responder saw."""

    async def call(text: str, rules: dict[str, Any], **options: Any) -> tuple[Task, list[Request]]:
        seen: list[Request] = []
        answering = asyncio.create_task(answer_by(broker, rules, seen))
        try:
            ended = await send_message(
                client, said(text), wait_for=broker.wait_for, remote=agent_url, **options
            )
        finally:
            answering.cancel()
            await asyncio.gather(answering, return_exceptions=True)
        assert isinstance(ended, Task)
        return ended, seen

    return call


def state(task: Task) -> str:
    return TaskState.Name(task.status.state)


@pytest.mark.slow
async def test_a_free_text_answer_continues_the_same_task_which_completes_with_it(
    client: Client, broker: Broker, agent_url: str, redis_url: str, namespace: str
) -> None:
    rules = {"What is your name?": {"accept": {"answer": "Ada"}}}
    with responder_process(redis_url, namespace, rules) as responder:
        ended = await send_message(
            client, said("name"), wait_for=broker.wait_for, remote=agent_url, agent="agent-7"
        )
        [asked] = responder.seen
    assert isinstance(ended, Task)
    assert (state(ended), get_message_text(ended.status.message)) == (
        "TASK_STATE_COMPLETED",
        "told: Ada",
    )
    assert asked["kind"] == "input" and asked["server"] == agent_url and asked["agent"] == "agent-7"
    paused = asked["meta"]["a2a"]
    assert (paused["task_id"], paused["context_id"]) == (ended.id, ended.context_id)
    assert paused["state"] == "TASK_STATE_INPUT_REQUIRED"
    ours = [m for m in ended.history if "toolnexus" in m.metadata.fields]
    [continued] = [m for m in ours if m.metadata["toolnexus"]["request"] == asked["id"]]
    assert (continued.task_id, continued.context_id) == (ended.id, ended.context_id)
    assert get_message_text(continued) == "Ada" and continued.role == Role.ROLE_USER


async def test_a_schema_question_is_a_form_whose_fields_reach_the_agent_as_data(
    through: Through, agent_url: str
) -> None:
    ended, [asked] = await through("form", {"Your booking?": {"accept": {"seats": 4}}})
    text = get_message_text(ended.status.message)
    assert json.loads(text.removeprefix("told:  data: ")) == [{"seats": 4}]  # 4.0: protobuf
    assert asked.kind == "input"


async def test_a_tool_approval_is_a_tool_call_request_and_an_edit_reaches_the_agent(
    through: Through, agent_url: str
) -> None:
    rules = {"Run transfer?": {"accept": {"to": "ACME", "amount": 5}}}
    ended, [asked] = await through("tool", rules)
    assert (asked.kind, asked.source.tool) == ("tool_call", "transfer")
    text = get_message_text(ended.status.message)
    assert text.startswith("told: Approved. data: ")
    [data] = json.loads(text.removeprefix("told: Approved. data: "))
    call = data["tool_call"]
    assert (call["approved"], call["edited"], call["call_id"]) == (True, True, "call-1")
    assert call["arguments"] == {"to": "ACME", "amount": 5}


async def test_a_denied_tool_call_tells_the_agent_with_the_message(
    through: Through, agent_url: str
) -> None:
    ended, _ = await through("tool", {"Run transfer?": "decline"})
    text = get_message_text(ended.status.message)
    assert text.startswith("told: Denied: The call to transfer was denied by ")
    assert '"approved": false' in text and state(ended) == "TASK_STATE_COMPLETED"


async def test_a_declined_question_is_a_decline_message_on_the_task(
    through: Through, agent_url: str
) -> None:
    ended, _ = await through("name", {"What is your name?": "decline"})
    assert get_message_text(ended.status.message) == 'told: Declined. data: [{"declined": true}]'


@pytest.mark.slow
async def test_no_answer_before_the_deadline_cancels_the_task(
    through: Through, agent_url: str
) -> None:
    ended, [asked] = await through("name", {"What is your name?": "hold"}, timeout_s=1)
    assert asked.expires_at is not None and round(asked.expires_at - asked.created_at) == 1
    assert state(ended) == "TASK_STATE_CANCELED"


@pytest.mark.slow
async def test_an_unanswered_tool_approval_is_denied_with_the_deadline_message(
    through: Through, agent_url: str
) -> None:
    ended, _ = await through("tool", {"Run transfer?": "hold"}, timeout_s=1)
    text = get_message_text(ended.status.message)
    assert text.startswith("told: Denied: No approval for transfer before the deadline")


async def test_auth_required_with_a_link_is_an_authorization_request(
    through: Through, agent_url: str
) -> None:
    ended, [asked] = await through("login", {"Sign in to the calendar": {"accept": None}})
    assert (asked.kind, asked.url) == (
        "authorization",
        "https://calendar.example.com/oauth?state=1",
    )
    assert asked.meta["a2a"]["state"] == "TASK_STATE_AUTH_REQUIRED"
    assert get_message_text(ended.status.message) == 'told: Done. data: [{"authorized": true}]'


async def test_cancelling_the_call_withdraws_the_question_and_leaves_the_task_paused(
    client: Client, broker: Broker, agent_url: str
) -> None:
    calling = asyncio.create_task(
        send_message(client, said("name"), wait_for=broker.wait_for, remote=agent_url)
    )
    async with broker.responder("ops") as requests, asyncio.timeout(30):
        pending = await anext(requests)
    calling.cancel()
    await asyncio.gather(calling, return_exceptions=True)
    with pytest.raises(toolnexus.NotResolved):
        await pending.accept({"answer": "late"})
    task = await client.get_task(GetTaskRequest(id=pending.request.meta["a2a"]["task_id"]))
    assert state(task) == "TASK_STATE_INPUT_REQUIRED"


async def test_resuming_an_unknown_run_says_so(client: Client, broker: Broker) -> None:
    with pytest.raises(RunNotFound, match="no resumable A2A call 'nope' is kept"):
        await resume(client, broker=broker, run="nope")


@pytest.mark.slow
async def test_a_killed_bridge_is_resumed_in_a_new_process_on_the_same_task(
    broker: Broker, agent_url: str, redis_url: str, namespace: str
) -> None:
    command = [sys.executable, str(BRIDGE), agent_url, redis_url, namespace, "run-1"]
    first = subprocess.Popen([*command, "send", "name"], stdout=subprocess.PIPE, text=True)
    try:
        async with broker.responder("ops") as requests, asyncio.timeout(30):
            pending = await anext(requests)
        first.kill()
    finally:
        first.communicate()
    paused = pending.request.meta["a2a"]
    second = subprocess.Popen([*command, "resume"], stdout=subprocess.PIPE, text=True)
    try:
        await asyncio.sleep(0.5)  # let it attach (answering first works too: durable)
        await pending.accept({"answer": "Grace"}, person="tester")
        out, _ = await asyncio.to_thread(second.communicate, timeout=60)
    finally:
        if second.poll() is None:
            second.kill()
            second.communicate()
    assert second.returncode == 0
    ended = json.loads(out)
    assert (ended["id"], ended["context_id"]) == (paused["task_id"], paused["context_id"])
    assert (ended["state"], ended["text"]) == ("TASK_STATE_COMPLETED", "told: Grace")
    async with broker.responder("ops", until_idle=True) as requests:
        assert [p.request.id async for p in requests] == []  # nothing was asked twice


async def test_a_call_the_agent_refuses_is_a_remote_agent_error(
    client: Client, broker: Broker, agent_url: str
) -> None:
    unknown = Message(
        role=Role.ROLE_USER, message_id="m-1", task_id="no-such-task", parts=[Part(text="hi")]
    )
    with pytest.raises(RemoteAgentError, match="sending a message failed") as caught:
        await send_message(client, unknown, wait_for=broker.wait_for, remote=agent_url)
    assert f"A2A agent {agent_url!r}" in str(caught.value)


PAGE = Path(__file__).parents[1] / "docs" / "how-to" / "a2a.md"


def example(code: str, **names: Any) -> Awaitable[dict[str, Any]]:
    """A Python block of docs/how-to/a2a.md run as the body of a coroutine with ``names``;
    it returns the block's locals."""
    source = "async def example():\n" + textwrap.indent(code + "\nreturn locals()", "    ")
    exec(compile(source, str(PAGE), "exec"), names)
    coroutine: Awaitable[dict[str, Any]] = names["example"]()
    return coroutine


async def test_the_docs_examples_run_as_written(
    client: Client, broker: Broker, agent_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    blocks = re.findall(r"^```python\n(.*?)^```", PAGE.read_text(), re.S | re.M)
    inline, _executor_fragment, resumable, resumed, watching = blocks
    running = asyncio.create_task(example(inline, broker=broker, url=agent_url))
    async with broker.responder("ops") as requests, asyncio.timeout(30):
        pending = await anext(requests)
    await pending.accept({"answer": "Ada"})
    await asyncio.wait_for(running, 30)
    assert capsys.readouterr().out == "told: Ada\n"

    names = {"broker": broker, "url": agent_url, "create_client": create_client}
    first = asyncio.create_task(example(resumable, hello=said("name"), **names))
    async with broker.responder("ops") as requests, asyncio.timeout(30):
        pending = await anext(requests)
    first.cancel()  # as if its process died: a durable question is not withdrawn
    await asyncio.gather(first, return_exceptions=True)
    second = asyncio.create_task(example(resumed, **names))
    await pending.accept({"answer": "Grace"})
    task = (await asyncio.wait_for(second, 30))["task"]
    assert task.id == pending.request.meta["a2a"]["task_id"]
    assert get_message_text(task.status.message) == "told: Grace"

    paused = await paused_elsewhere(client, "ctx-7")
    watcher = asyncio.create_task(example(watching, **names))
    try:
        async with broker.responder("ops") as requests, asyncio.timeout(30):
            pending = await anext(requests)
        await pending.accept({"answer": "Alan"})
        ended = await ended_task(client, paused.id)
    finally:
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
    assert get_message_text(ended.status.message) == "told: Alan"


async def paused_elsewhere(client: Client, context_id: str) -> Task:
    """A task another caller started in ``context_id`` and left paused (it asks a name)."""
    message = said("name")
    message.context_id = context_id
    async for event in client.send_message(SendMessageRequest(message=message)):
        if event.HasField("task"):
            task_id = event.task.id
    task = await client.get_task(GetTaskRequest(id=task_id))
    assert state(task) == "TASK_STATE_INPUT_REQUIRED"
    return task


async def ended_task(client: Client, task_id: str) -> Task:
    async with asyncio.timeout(30):
        while state(task := await client.get_task(GetTaskRequest(id=task_id))) in PAUSED_STATES:
            await asyncio.sleep(0.05)
    return task


PAUSED_STATES = ("TASK_STATE_INPUT_REQUIRED", "TASK_STATE_AUTH_REQUIRED")


async def test_a_watcher_continues_a_task_another_caller_left_paused(
    client: Client, broker: Broker, agent_url: str
) -> None:
    context_id = f"ctx-{uuid.uuid4()}"
    paused = await paused_elsewhere(client, context_id)
    other = await paused_elsewhere(client, f"ctx-{uuid.uuid4()}")  # not watched
    watching = asyncio.create_task(
        watch(client, broker=broker, remote=agent_url, poll_s=0.05, context_id=context_id)
    )
    try:
        async with broker.responder("ops") as requests, asyncio.timeout(30):
            pending = await anext(requests)
        assert pending.request.meta["a2a"]["task_id"] == paused.id
        await pending.accept({"answer": "Ada"})
        ended = await ended_task(client, paused.id)
    finally:
        watching.cancel()
        await asyncio.gather(watching, return_exceptions=True)
    assert get_message_text(ended.status.message) == "told: Ada"
    assert state(await client.get_task(GetTaskRequest(id=other.id))) == "TASK_STATE_INPUT_REQUIRED"
    async with broker.responder("ops", until_idle=True) as requests:
        assert [p.request.id async for p in requests] == []  # the other task was not asked


async def test_a_watcher_refuses_a_poll_that_is_no_time(client: Client, broker: Broker) -> None:
    with pytest.raises(toolnexus.InvalidRequest, match="poll_s must be a positive number"):
        await watch(client, broker=broker, remote="x", poll_s=0)


@pytest.mark.slow
async def test_the_worker_killed_while_a_task_waits_is_restarted_and_continues_it(
    client: Client, broker: Broker, agent_url: str, redis_url: str, namespace: str
) -> None:
    """``toolnexus worker a2a``: killed, started again, and stopped by SIGTERM."""
    context_id = f"ctx-{uuid.uuid4()}"
    paused = await paused_elsewhere(client, context_id)
    argv = ["--url", redis_url, "--namespace", namespace, "--agent", agent_url]
    argv += ["--context", context_id, "--poll-s", "0.1", "--name", "bridge-1"]
    code = f"import sys\nfrom toolnexus_workers.a2a import main\nsys.exit(main({argv!r}))"
    first = subprocess.Popen([sys.executable, "-c", code])
    try:
        async with broker.responder("ops") as requests, asyncio.timeout(30):
            pending = await anext(requests)
    finally:
        first.kill()
        first.wait()
    assert pending.request.source.agent == "bridge-1"
    second = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True)
    try:
        await pending.accept({"answer": "Grace"}, person="tester")
        ended = await ended_task(client, paused.id)
    finally:
        second.send_signal(signal.SIGTERM)
        _, err = await asyncio.to_thread(second.communicate, timeout=30)
    assert second.returncode == 0, err
    assert get_message_text(ended.status.message) == "told: Grace"
    async with broker.responder("ops", until_idle=True) as requests:
        assert [p.request.id async for p in requests] == []  # nothing was asked twice


def test_the_worker_refuses_a_poll_that_is_no_time(capsys: pytest.CaptureFixture[str]) -> None:
    from toolnexus_workers.a2a import main

    assert main(["--agent", "http://127.0.0.1:1", "--poll-s", "0"]) == 2
    assert "--poll-s must be a positive number of seconds, not 0.0" in capsys.readouterr().err


def paused_task(state: TaskState, *parts: Part) -> Task:
    message = Message(message_id="s-1", role=Role.ROLE_AGENT, parts=list(parts))
    return Task(id="t-1", context_id="c-1", status=TaskStatus(state=state, message=message))


def test_a_task_that_is_not_paused_is_no_request() -> None:
    done = paused_task(TaskState.TASK_STATE_COMPLETED, Part(text="done"))
    with pytest.raises(toolnexus.InvalidRequest, match="'t-1' is not waiting for input"):
        pause_request(done, remote="a")


def test_a_schema_that_is_no_flat_form_is_refused_by_name() -> None:
    nested = {"type": "object", "properties": {"address": {"type": "object"}}}
    task = paused_task(
        TaskState.TASK_STATE_INPUT_REQUIRED, Part(text="Where?"), new_data_part({"schema": nested})
    )
    with pytest.raises(toolnexus.InvalidRequest, match="address"):
        pause_request(task, remote="a")


def test_the_same_pause_is_the_same_request_and_another_pause_another() -> None:
    first = paused_task(TaskState.TASK_STATE_INPUT_REQUIRED, Part(text="Name?"))
    again = pause_request(first, remote="a").id
    assert again == pause_request(first, remote="a").id != pause_request(first, remote="b").id
    later = paused_task(TaskState.TASK_STATE_INPUT_REQUIRED, Part(text="Name?"))
    later.status.message.message_id = "s-2"
    assert pause_request(later, remote="a").id != again
