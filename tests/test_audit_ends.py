"""Issue 25, observation 5: ``audit`` is complete and readable. Every end of a wait has its
record, withdrawals included (Ctrl-C of ``toolnexus ask``, a cancelled ``wait_for``); each
line says kind, prompt, source, outcome, who, verification and times; ``--json`` prints
plain objects, the signed bytes only with ``--raw``."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import signal
import sys
from pathlib import Path

import pytest

import toolnexus
from toolnexus import Answer, Request, new_id
from toolnexus.models import Source
from toolnexus.redis_broker import RedisBroker
from toolnexus.security import AuditRecord

pytestmark = pytest.mark.redis

TOOLNEXUS = str(Path(sys.executable).with_name("toolnexus"))
FAST = {"block_ms": 100, "lease_ms": 600}


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("TOOLNEXUS_")}


async def run(*args: str) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        TOOLNEXUS, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env=_env(),
    )  # fmt: skip
    async with asyncio.timeout(30):
        out, err = await process.communicate()
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def records_of(broker: RedisBroker, request_id: str) -> list[AuditRecord]:
    """The audit records of ``request_id``, once there is one (they are written lazily)."""
    async with asyncio.timeout(10):
        while not (found := await broker.audit(request_id=request_id)):
            await asyncio.sleep(0.05)
    return found


async def first_request(broker: RedisBroker) -> Request:
    async with asyncio.timeout(20):
        while not (entries := await broker.redis.xrange(broker.keys.requests, count=1)):
            await asyncio.sleep(0.05)
    return broker.codec.decode_as(entries[0][1][b"r"], Request)


@pytest.mark.slow
async def test_ctrl_c_of_ask_is_recorded_as_withdrawn(redis_url: str, namespace: str) -> None:
    args = ["--url", redis_url, "--namespace", namespace]
    process = await asyncio.create_subprocess_exec(
        TOOLNEXUS, "ask", "Ship the release?", "--server", "ci", "--tool", "deploy", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=_env(),
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    async with toolnexus.connect(redis_url, namespace=namespace, **FAST) as broker:
        assert isinstance(broker, RedisBroker)
        request = await first_request(broker)
        process.send_signal(signal.SIGINT)
        assert await asyncio.wait_for(process.wait(), 20) == 130
        (record,) = await records_of(broker, request.id)
    assert record.status == "withdrawn" and record.reason == "withdrawn"
    code, out, _ = await run("audit", "--id", request.id, *args)
    assert code == 0
    (line,) = out.splitlines()
    assert f" {request.id} approval withdrawn by - asked by toolnexus ask via ci/deploy " in line
    assert line.endswith(": 'Ship the release?'")


async def test_a_cancelled_wait_for_is_recorded_as_withdrawn(
    redis_url: str, namespace: str
) -> None:
    request = Request(id=new_id(), kind="input", prompt="Your name?", source=Source(agent="a1"))
    async with toolnexus.connect(redis_url, namespace=namespace, **FAST) as broker:
        assert isinstance(broker, RedisBroker)
        waiting = asyncio.create_task(broker.wait_for(request, timeout_s=60))
        await first_request(broker)
        waiting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await waiting
        (record,) = await records_of(broker, request.id)
    assert (record.status, record.ok, record.reason) == ("withdrawn", False, "withdrawn")


@pytest.mark.slow
async def test_audit_json_is_plain_and_raw_only_when_asked(redis_url: str, namespace: str) -> None:
    args = ["--url", redis_url, "--namespace", namespace]
    request = Request(id=new_id(), kind="approval", prompt="Deploy?", source=Source(agent="a1"))
    async with toolnexus.connect(redis_url, namespace=namespace, **FAST) as broker:
        assert isinstance(broker, RedisBroker)
        waiting = asyncio.create_task(broker.wait_for(request, timeout_s=60))
        async with broker.responder("web") as web:
            pending = await asyncio.wait_for(anext(web), 20)
            await pending.accept(person="web:alice")
        await asyncio.wait_for(waiting, 20)
        (stored,) = await records_of(broker, request.id)
    code, out, _ = await run("audit", "--json", "--id", request.id, *args)
    assert code == 0
    (plain,) = json.loads(out)
    assert plain["id"] == request.id and plain["status"] == "answered"
    assert plain["prompt"] == "Deploy?" and plain["outcome"] == "accepted"
    assert plain["kind"] == "approval" and plain["source"] == {"agent": "a1"}
    assert plain["person"] == "web:alice" and plain["verified"] is None
    assert plain["resolved_at"] >= plain["created_at"]
    assert plain["digest"] == (stored.digest or b"").hex() and plain["votes"] == []
    assert not {"request", "answer", "raw"} & set(plain)
    code, out, _ = await run("audit", "--json", "--raw", "--id", request.id, *args)
    (raw,) = json.loads(out)
    assert base64.b64decode(raw["raw"]["request"]) == stored.request
    assert base64.b64decode(raw["raw"]["answer"]) == stored.answer
    assert codec_answer(base64.b64decode(raw["raw"]["answer"])).person == "web:alice"


def codec_answer(raw: bytes) -> Answer:
    return toolnexus.codec.MSGPACK.decode_as(raw, Answer)
