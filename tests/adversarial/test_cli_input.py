"""The command line given bad input, and ``status`` / ``audit`` given odd keys and entries:
one line naming the problem, exit 2 for bad usage (never 1, which ``ask`` means as
"declined"), no traceback; nothing in Redis makes ``status`` or ``audit`` die.

Threat-model line S10; issue #24 observation 10.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
import redis

from toolnexus import Hop, Quorum, Request, new_id
from toolnexus.cli import main
from toolnexus.codec import MSGPACK
from toolnexus.keys import Keys
from toolnexus.models import Heartbeat
from toolnexus.security import AuditRecord
from toolnexus.security._audit import encode_record

pytestmark = pytest.mark.redis

TOOLNEXUS = str(Path(sys.executable).with_name("toolnexus"))
DEEP = "[" * 200_000


def usage_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """Run ``toolnexus argv`` in this process; it must end with exit status 2 and one line
    on stderr (argparse's convention), no exception escaping: that line."""
    try:
        status = main(list(argv))
    except SystemExit as exit_:  # argparse refusing an argument
        status = exit_.code  # type: ignore[assignment]
    err = capsys.readouterr().err
    assert status == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 or lines[-1].startswith("toolnexus"), err
    return lines[-1]


@pytest.fixture
def client(redis_url: str, namespace: str) -> Iterator[redis.Redis]:
    with redis.Redis.from_url(redis_url) as r:
        yield r


def test_a_schema_nested_200000_deep_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """S10, observation 10: ``ask --schema`` of a 200,000-deep JSON file printed a
    RecursionError traceback and exited 1 ("declined")."""
    schema = tmp_path / "deep.json"
    schema.write_text(DEEP)
    line = usage_error(capsys, "ask", "Deploy?", "--schema", str(schema), "--url", "memory://")
    assert "--schema" in line and "nested too deep" in line


def test_an_accept_nested_too_deep_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    """S10, observation 10: ``answer --accept '[[[[…'`` printed a traceback and exited 1."""
    line = usage_error(capsys, "answer", "req-1", "--accept", DEEP, "--url", "memory://")
    assert "--accept" in line and "nested too deep" in line


@pytest.mark.parametrize(
    "argv",
    [
        ["ask", "Deploy?", "--timeout", "9" * 400],  # a duration of 1e399 s: infinity
        ["status", "--watch", "--interval", "9" * 400],
        ["audit", "--since", "9" * 400],
    ],
    ids=["ask-timeout", "status-interval", "audit-since"],
)
def test_an_endless_duration_is_a_usage_error(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """S10, observation 10: a duration too long to be one is refused where it is read."""
    line = usage_error(capsys, *argv, "--url", "redis://127.0.0.1:1/0")
    assert "DURATION" in line or "duration" in line


@pytest.mark.parametrize(
    "url", ["redis://agent:s3cret@[::1/0", "redis://agent:s3cret@127.0.0.1:6379/zero"]
)
def test_a_malformed_url_is_a_usage_error(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    """S9/S10, observation 9/10: an unclosed IPv6 bracket raised ValueError with a
    traceback; a database path that is not a number was quietly database 0 (the ask
    waited there). One line, the password hidden."""
    line = usage_error(capsys, "audit", "--url", url)
    assert "s3cret" not in line and ("IPv6" in line or "database" in line)


def test_a_prompt_that_is_not_text_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    """S10, observation 10: a prompt holding a byte that is not UTF-8 (in argv, a lone
    surrogate) raised UnicodeEncodeError with a traceback; now one line names the field."""
    line = usage_error(capsys, "ask", "Deploy \udcff?", "--url", "memory://", "--timeout", "1")
    assert "prompt" in line
    line = usage_error(capsys, "answer", "req-1", "--decline", "--person", "ops:\udcff")
    assert "person" in line  # not exit 1, "refused", for bad usage


async def test_the_process_prints_one_line_and_no_traceback(tmp_path: Path) -> None:
    """S10, observation 10: the same as a process, as a script sees it."""
    schema = tmp_path / "deep.json"
    schema.write_text(DEEP)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLNEXUS_")}
    process = await asyncio.create_subprocess_exec(
        TOOLNEXUS, "ask", "Deploy?", "--schema", str(schema), "--url", "memory://",
        stderr=asyncio.subprocess.PIPE, env=env,
    )  # fmt: skip
    _, err = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode == 2
    assert len(err.decode().splitlines()) == 1 and b"Traceback" not in err


def test_status_survives_a_key_name_that_is_not_utf8(
    redis_url: str, namespace: str, client: redis.Redis, capsys: pytest.CaptureFixture[str]
) -> None:
    """S10, observation 10: ``toolnexus status`` died with a traceback on a key of the
    namespace whose name is not UTF-8; now it shows the queues it can read (and passes
    over a queue's key that is not a stream)."""
    client.xadd(Keys(namespace, "real").requests, {"r": b"garbage"})
    client.xadd(f"{{{namespace}:q:".encode() + b"\xff\xfe}:requests", {"r": b"x"})
    client.set(b"{" + namespace.encode() + b":w:\xff}:alive", 1)
    client.set(Keys(namespace, "string").requests, "not a stream")
    assert main(["status", "--url", redis_url, "--namespace", namespace]) == 0
    out = capsys.readouterr().out
    assert "queue real: 1 open" in out and "queue string" not in out


def test_status_and_audit_survive_odd_entries(
    redis_url: str, namespace: str, client: redis.Redis, capsys: pytest.CaptureFixture[str]
) -> None:
    """S10, observation 10: a heartbeat and audit records whose times are not times (NaN,
    beyond any calendar) and entries that are not records: ``status`` and ``audit`` (text
    and JSON) print what they can and exit 0."""
    keys = Keys(namespace, "default")
    client.xadd(keys.requests, {"r": b"garbage"})
    beat = Heartbeat("web", "w1", at=float("nan"), expires_at=1e300)
    client.hset(keys.heartbeats(), "web/w1", msgspec.msgpack.encode((1, beat)))
    odd = [
        AuditRecord(id="req-nan", status="answered", resolved_at=float("nan"), created_at=0.0),
        AuditRecord(id="req-far", status="answered", resolved_at=1e300, created_at=-1e300),
        AuditRecord(id="req-inf", status="expired", resolved_at=float("inf")),
    ]
    for record in odd:
        client.xadd(keys.audit, {"r": encode_record(record)})
    client.xadd(keys.audit, {"r": b"\xc1 not a record"})
    client.xadd(keys.audit, {"x": b"no r field"})
    url = ["--url", redis_url, "--namespace", namespace]
    assert main(["status", *url]) == 0
    assert "web" in capsys.readouterr().out
    assert main(["audit", *url]) == 0
    out = capsys.readouterr().out
    assert all(record.id in out for record in odd)
    assert main(["audit", "--json", *url]) == 0
    assert "req-far" in capsys.readouterr().out


def test_status_survives_states_of_another_type(
    redis_url: str, namespace: str, client: redis.Redis, capsys: pytest.CaptureFixture[str]
) -> None:
    """S10, observation 10: a quorum's or an escalating request's state key that is not a
    hash (one SET by anyone with write rights) ended ``status`` as "unreachable" (exit 3);
    now that request is passed over."""
    keys = Keys(namespace, "default")
    waiter = "a" * 16
    for request in (
        Request(id=new_id(), kind="approval", quorum=Quorum(need=2), reply_to=waiter),
        Request(id=new_id(), kind="approval", escalate=[Hop(60, "oncall")], reply_to=waiter),
    ):
        client.xadd(keys.requests, {"r": MSGPACK.encode(request)})
        client.set(keys.state(waiter, request.id), "not a hash")
    client.set(keys.durable_states_pattern().replace("*", "req-x"), "not a hash")
    assert main(["status", "--url", redis_url, "--namespace", namespace]) == 0
    assert "queue default: 2 open" in capsys.readouterr().out
