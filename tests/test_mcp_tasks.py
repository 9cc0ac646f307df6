"""Several input requests at once and the Tasks extension under load_mcp (issue 26, parts 3-5).

Part 3 against the SDK's ``MCPServer`` (tests/mcp_helpers.py) over streamable HTTP; parts 4
and 5 against our own Tasks server (tests/mcp_task_server.py) in another process, with
responders in other processes through Redis; a durable call survives a ``kill -9`` of its
agent."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp_types import CallToolResult

import toolnexus
from mcp_helpers import FAST, answering, http_server, make_server
from mcp_processes import SERVERS, responder_process, task_server_http
from toolnexus import Broker, ConfigurationError, InvalidRequest, Pending, load_mcp
from toolnexus.mcp import McpError, TaskCancelled
from toolnexus.mcp._tasks import STORE_NAME

pytestmark = pytest.mark.redis

NAME = "Name for the booking?"
SEATS = "How many seats?"
RULES: dict[str, Any] = {NAME: {"accept": {"name": "Ada"}}, SEATS: {"accept": {"value": 3}}}


def text(result: CallToolResult) -> str:
    return result.content[0].text  # type: ignore[union-attr]


async def journal(tools: Any) -> dict[str, Any]:
    return json.loads(text(await tools["journal"]()))  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def task_url() -> Iterator[str]:
    with task_server_http() as url:
        yield url


@pytest.fixture
async def rbroker(redis_url: str, namespace: str) -> AsyncIterator[Broker]:
    async with toolnexus.connect(redis_url, namespace=namespace, **FAST) as broker:
        yield broker


# -- several input requests of one InputRequiredResult (part 3) ----------------------------


@pytest.fixture(scope="module")
def sdk_url() -> Iterator[str]:
    with http_server(make_server().server) as url:
        yield url


async def test_the_requests_of_one_result_are_published_together_and_answered_in_any_order(
    sdk_url: str, rbroker: Broker
) -> None:
    held: list[Pending] = []

    async def handle(pending: Pending) -> None:
        held.append(pending)
        if len(held) == 3:  # all three are out before any has an answer
            for each in reversed(held):
                await each.accept({"x": each.request.prompt})

    async with (
        answering(rbroker, handle) as seen,
        load_mcp(sdk_url, wait_for=rbroker.wait_for, mode="2026-07-28") as tools,
    ):
        result = json.loads(text(await asyncio.wait_for(tools["ask_three"](label="p"), 30)))
    assert result["state_echoed"] is True  # retried once, with the request state as given
    assert {key: result[key]["content"]["x"] for key in "abc"} == {k: f"p:{k}" for k in "abc"}
    assert sorted(r.meta["input_key"] for r in seen) == ["a", "b", "c"]
    assert len({r.meta["input_group"] for r in seen}) == 1


@pytest.mark.slow
async def test_a_decline_or_an_expiry_of_one_request_is_sent_for_its_key(
    sdk_url: str, rbroker: Broker
) -> None:
    async def handle(pending: Pending) -> None:
        prompt = pending.request.prompt
        if prompt.endswith(":a"):
            await pending.accept({"x": "yes"})
        elif prompt.endswith(":b"):
            await pending.decline()
        # ":c" is left to expire

    async with (
        answering(rbroker, handle),
        load_mcp(sdk_url, wait_for=rbroker.wait_for, mode="2026-07-28", timeout_s=1.5) as tools,
    ):
        result = json.loads(text(await asyncio.wait_for(tools["ask_three"](label="m"), 30)))
    assert result["state_echoed"] is True
    assert {key: result[key]["action"] for key in "abc"} == {
        "a": "accept",
        "b": "decline",
        "c": "cancel",
    }


async def test_concurrent_calls_get_their_own_answers(sdk_url: str, rbroker: Broker) -> None:
    async def handle(pending: Pending) -> None:
        await pending.accept({"x": pending.request.prompt})

    async with (
        answering(rbroker, handle) as seen,
        load_mcp(sdk_url, wait_for=rbroker.wait_for, mode="2026-07-28") as tools,
    ):
        results = await asyncio.wait_for(
            asyncio.gather(*(tools["ask_three"](label=label) for label in "pqr")), 30
        )
    for label, result in zip("pqr", results, strict=True):
        got = json.loads(text(result))
        assert got["state_echoed"] is True
        assert {key: got[key]["content"]["x"] for key in "abc"} == {
            key: f"{label}:{key}" for key in "abc"
        }
    groups = {r.prompt[0]: r.meta["input_group"] for r in seen}
    assert len(set(groups.values())) == 3  # each call's requests form a group of their own


# -- the Tasks extension (part 4) ------------------------------------------------------------


async def test_a_task_backed_call_returns_the_tools_result(
    task_url: str, rbroker: Broker, redis_url: str, namespace: str
) -> None:
    with responder_process(redis_url, namespace, RULES) as responder:
        async with load_mcp(
            task_url, wait_for=rbroker.wait_for, mode="2026-07-28", agent="a-1", timeout_s=100
        ) as tools:
            result = await asyncio.wait_for(tools["book"](), 30)
            seen = await journal(tools)
    assert text(result) == "booked 3 seats for Ada"
    # both questions of the task were put to responders, each naming the task and its key
    asked = {item["prompt"]: item for item in responder.seen}
    assert set(asked) == {NAME, SEATS}
    task_id = asked[NAME]["meta"]["mcp_task"]
    assert {item["meta"]["input_key"] for item in asked.values()} == {"name", "seats"}
    assert {item["tool"] for item in asked.values()} == {"book"}
    assert {item["agent"] for item in asked.values()} == {"a-1"}
    # each answer went back alone (answered keys are not sent again), echoing the newest state
    updates = [u for u in seen["updates"] if u["task"] == task_id]
    assert sorted(key for update in updates for key in update["keys"]) == ["name", "seats"]
    assert all(len(update["keys"]) == 1 for update in updates)
    assert {update["state"] for update in updates} == {f"{task_id}/round-1"}
    # the extension was declared on the call; tasks/* were routed by their task id
    assert {"tool": "book", "declared": True} in seen["declared"]
    assert seen["gets"][task_id] >= 1
    assert seen["misrouted"] == []


async def test_a_decline_goes_back_as_a_decline_for_its_key(
    task_url: str, rbroker: Broker, redis_url: str, namespace: str
) -> None:
    rules = {NAME: "decline", SEATS: {"accept": {"value": 2}}}
    with responder_process(redis_url, namespace, rules):
        async with load_mcp(task_url, wait_for=rbroker.wait_for, mode="2026-07-28") as tools:
            result = await asyncio.wait_for(tools["book"](), 30)
    assert json.loads(text(result)) == {"name": "decline", "seats": "accept"}


async def test_the_tasks_ttl_bounds_the_questions_deadline(
    task_url: str, rbroker: Broker, redis_url: str, namespace: str
) -> None:
    with responder_process(redis_url, namespace, {"Quick?": "decline"}) as responder:
        async with load_mcp(
            task_url, wait_for=rbroker.wait_for, mode="2026-07-28", timeout_s=600
        ) as tools:
            assert text(await asyncio.wait_for(tools["short_ttl"](), 30)) == "decline"
    assert 0 <= responder.by_prompt("Quick?")["timeout_s"] <= 4


async def test_failed_and_cancelled_tasks_raise_toolnexus_errors(task_url: str) -> None:
    async with load_mcp(task_url, mode="2026-07-28") as tools:
        with pytest.raises(McpError, match="the kitchen is closed") as failed:
            await asyncio.wait_for(tools["fail_task"](), 30)
        assert failed.value.code == -32000
        with pytest.raises(TaskCancelled, match="was cancelled"):
            await asyncio.wait_for(tools["self_cancel"](), 30)


@pytest.mark.slow
async def test_polls_follow_the_servers_interval_and_the_read_timeout_bounds_each_poll(
    task_url: str,
) -> None:
    async with load_mcp(task_url, mode="2026-07-28", read_timeout_s=0.4) as tools:
        before = set((await journal(tools))["gets"])
        assert text(await asyncio.wait_for(tools["brew"](seconds=1.2), 30)) == "brewed"
        gets = {k: n for k, n in (await journal(tools))["gets"].items() if k not in before}
    # 1.2 s of work polled every 100 ms (pollIntervalMs): about 12 polls, not a busy loop
    # and not the 1 s default
    assert len(gets) == 1 and 5 <= next(iter(gets.values())) <= 14, gets


async def test_cancelling_the_call_cancels_the_task_and_withdraws_its_question(
    task_url: str, rbroker: Broker, redis_url: str, namespace: str
) -> None:
    with responder_process(redis_url, namespace, {"Hold on?": "hold"}) as responder:
        async with load_mcp(task_url, wait_for=rbroker.wait_for, mode="2026-07-28") as tools:
            call = asyncio.create_task(tools["ask_hold"]())
            for _ in range(200):
                if responder.seen:
                    break
                await asyncio.sleep(0.05)
            task_id = responder.by_prompt("Hold on?")["meta"]["mcp_task"]
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
            assert task_id in (await journal(tools))["cancels"]
            request_id = responder.by_prompt("Hold on?")["id"]
            for _ in range(100):
                if any(
                    e["id"] == request_id and e["event"] == "withdrawn" for e in responder.events
                ):
                    break
                await asyncio.sleep(0.05)
            else:
                pytest.fail(f"no withdrawn event for {request_id}: {responder.events}")


async def test_a_withdrawn_question_cancels_the_task(task_url: str) -> None:
    async def wait_for(request: toolnexus.Request) -> toolnexus.Answer:
        return toolnexus.Answer(id=request.id, ok=False, reason="withdrawn")

    async with load_mcp(task_url, wait_for=wait_for, mode="2026-07-28") as tools:
        with pytest.raises(TaskCancelled, match=r"'hold' of task .* was withdrawn") as ended:
            await asyncio.wait_for(tools["ask_hold"](), 30)
        assert ended.value.task_id in (await journal(tools))["cancels"]


async def test_a_cancelled_task_leaves_the_whole_load_mcp_block_as_itself(task_url: str) -> None:
    """Issue #43: ``except TaskCancelled`` around ``async with load_mcp(...)`` (one server
    or a config's) catches it: the session's task groups no longer wrap it in
    ``ExceptionGroup`` → ``ExceptionGroup`` → ``TaskCancelled``."""

    async def wait_for(request: toolnexus.Request) -> toolnexus.Answer:
        return toolnexus.Answer(id=request.id, ok=False, reason="withdrawn")

    config = {"mcpServers": {"tasks": {"url": task_url}}}
    for server, tool in ((task_url, "ask_hold"), (config, "tasks.ask_hold")):
        caught: list[TaskCancelled] = []
        try:
            async with load_mcp(server, wait_for=wait_for, mode="2026-07-28") as tools:
                await asyncio.wait_for(tools[tool](), 30)
        except TaskCancelled as exc:
            caught.append(exc)
        assert [type(exc) for exc in caught] == [TaskCancelled], server
        assert "was withdrawn" in str(caught[0])
    caught_too: list[TaskCancelled] = []
    try:
        async with load_mcp(task_url, mode="2026-07-28") as tools:
            await asyncio.wait_for(tools["self_cancel"](), 30)
    except TaskCancelled as exc:  # cancelled by the server
        caught_too.append(exc)
    assert len(caught_too) == 1 and "was cancelled" in str(caught_too[0])


async def test_durable_needs_a_brokers_wait_for(task_url: str) -> None:
    async def wait_for(request: toolnexus.Request) -> toolnexus.Answer:
        return toolnexus.Answer(id=request.id, ok=False, reason="declined")

    async with load_mcp(task_url, wait_for=wait_for, mode="2026-07-28") as tools:
        with pytest.raises(ConfigurationError, match="broker's wait_for"):
            await tools["book"].call(durable="x")
        with pytest.raises(ConfigurationError, match="non-empty string"):
            await tools["book"].call(durable="")


@pytest.mark.slow
async def test_a_durable_call_left_behind_goes_on_and_a_lost_task_is_forgotten(
    task_url: str, rbroker: Broker
) -> None:
    store = rbroker.store(STORE_NAME, agent=True)
    async with (
        rbroker.responder("person") as questions,
        load_mcp(task_url, wait_for=rbroker.wait_for, mode="2026-07-28") as tools,
    ):
        call = asyncio.create_task(tools["ask_hold"].call(durable="left"))
        pending = await asyncio.wait_for(anext(questions), 30)
        call.cancel()  # a durable call's task is left for the next call, not cancelled
        with pytest.raises(asyncio.CancelledError):
            await call
        task_id = pending.request.meta["mcp_task"]
        assert task_id not in (await journal(tools))["cancels"]
        assert len(await store.items()) == 1
        again = asyncio.create_task(tools["ask_hold"].call(durable="left"))
        await asyncio.sleep(0.5)
        await pending.accept({"ok": True}, person="tester")  # the same question, still open
        assert text(await asyncio.wait_for(again, 30)) == "accept"
        assert await store.items() == {}
        call = asyncio.create_task(tools["ask_hold"].call(durable="lost"))
        await asyncio.wait_for(anext(questions), 30)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
    with task_server_http() as fresh:  # a server that never had that task ("task-server" too)
        async with load_mcp(fresh, wait_for=rbroker.wait_for, mode="2026-07-28") as tools:
            with pytest.raises(McpError, match="Task not found") as lost:
                await tools["ask_hold"].call(durable="lost")
    assert lost.value.code == -32602
    assert await store.items() == {}  # forgotten: the next call starts a new task


@pytest.mark.slow
async def test_a_durable_id_names_one_call(task_url: str, rbroker: Broker) -> None:
    store = rbroker.store(STORE_NAME, agent=True)
    async with (
        rbroker.responder("person") as questions,
        load_mcp(task_url, wait_for=rbroker.wait_for, mode="2026-07-28") as tools,
    ):
        call = asyncio.create_task(tools["ask_hold"].call({"table": 1}, durable="one"))
        await asyncio.wait_for(anext(questions), 30)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        kept = await store.items()
        with pytest.raises(InvalidRequest, match="durable call 'one' of tool 'ask_hold' exists"):
            await tools["ask_hold"].call({"table": 2}, durable="one")
    assert await store.items() == kept  # the record of the first call is left alone


class Agent:
    """tests/servers/task_agent.py in its own process; ``lines`` what it printed."""

    def __init__(self, *args: str) -> None:
        command = [sys.executable, str(SERVERS / "task_agent.py"), *args]
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
        self.lines: list[Any] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(json.loads(line))

    async def printed(self, predicate: Any, timeout_s: float = 30) -> Any:
        for _ in range(int(timeout_s / 0.05)):
            for line in self.lines:
                if predicate(line):
                    return line
            await asyncio.sleep(0.05)
        raise AssertionError(f"the agent printed {self.lines}, exit {self.process.poll()}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(10)
        self._reader.join(5)
        if self.process.stdout is not None:
            self.process.stdout.close()


# -- a durable task-backed call survives its agent (part 5) ----------------------------------


@pytest.mark.slow
async def test_a_durable_task_survives_a_killed_agent(
    task_url: str, rbroker: Broker, redis_url: str, namespace: str
) -> None:
    args = (task_url, redis_url, namespace, "booking-42")
    first = Agent(*args)
    try:
        async with rbroker.responder("person") as requests:
            seen = []
            async for pending in requests:  # the first agent asks both questions; nobody answers
                seen.append(pending)
                if len(seen) == 2:
                    break
            task_id = seen[0].request.meta["mcp_task"]
            assert all(p.request.durable for p in seen)
            record = await rbroker.store(STORE_NAME, agent=True).items()
            assert [json.loads(value)["task_id"] for value in record.values()] == [task_id]
            os.kill(first.process.pid, signal.SIGKILL)  # kill -9, mid-task
            assert first.process.wait(10) == -signal.SIGKILL
            # the person answers one question while no agent runs
            by_prompt = {p.request.prompt: p for p in seen}
            await by_prompt[NAME].accept({"name": "Grace"}, person="tester")
            second = Agent(*args)  # the same agent, started again
            try:
                await second.printed(lambda line: line == "calling")
                await asyncio.sleep(0.5)
                await by_prompt[SEATS].accept({"value": 5}, person="tester")
                done = await second.printed(lambda line: isinstance(line, dict))
            finally:
                second.stop()
    finally:
        first.stop()
    assert done == {"text": "booked 5 seats for Grace"}
    # the same task, not a new one: the server made no second task for this call
    async with load_mcp(task_url, mode="2026-07-28") as tools:
        seen_updates = [u for u in (await journal(tools))["updates"] if u["task"] == task_id]
    assert sorted(key for u in seen_updates for key in u["keys"]) == ["name", "seats"]
    # the record is gone once the task ended
    assert await rbroker.store(STORE_NAME, agent=True).items() == {}


@pytest.mark.slow
def test_the_tasks_example_runs(task_url: str) -> None:
    page = (Path(__file__).parents[1] / "docs" / "how-to" / "mcp-servers.md").read_text()
    found = re.search(r"## Tasks: .*?```python\n(.*?)```", page, flags=re.S)
    assert found is not None
    done = subprocess.run(
        [sys.executable, "-c", found.group(1), task_url],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["booked 2 seats for Ada"]
