"""Issue 25, observations 3 and 5: what ``status``, ``check``, ``audit`` and
``dead-letters`` exit with (Ctrl-C included, as docs/reference/cli.md says), a closed pipe
ending ``status --watch`` quietly, and stopped workers dropping out of ``status``."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import toolnexus
from toolnexus.redis_broker import RedisBroker
from toolnexus.redis_broker import _inspect as inspecting

pytestmark = pytest.mark.redis

TOOLNEXUS = str(Path(sys.executable).with_name("toolnexus"))
ROOT = Path(__file__).parents[1]


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("TOOLNEXUS_")}


async def start(*args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        TOOLNEXUS, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env=_env(), preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip


async def run(*args: str) -> tuple[int, str, str]:
    process = await start(*args)
    async with asyncio.timeout(30):
        out, err = await process.communicate()
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


class SilentServer:
    """A redis:// ``url`` whose server accepts connections and never answers: a command on
    it waits until it is interrupted (or times out); ``connected`` is set at the first
    connection (the command is past starting up)."""

    def __init__(self) -> None:
        self.url = ""
        self.connected = asyncio.Event()
        self.held: list[asyncio.StreamWriter] = []

    async def hold(self, _reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.held.append(writer)
        self.connected.set()


@pytest.fixture
async def silent_server() -> AsyncIterator[SilentServer]:
    silent = SilentServer()
    server = await asyncio.start_server(silent.hold, "127.0.0.1", 0)
    silent.url = f"redis://127.0.0.1:{server.sockets[0].getsockname()[1]}/0"
    async with server:
        yield silent
        for writer in silent.held:
            writer.close()


COMMANDS = [["status"], ["check"], ["audit"], ["dead-letters", "list"]]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
async def test_ctrl_c_exits_130_without_a_traceback(
    command: list[str], silent_server: SilentServer
) -> None:
    process = await start(*command, "--url", silent_server.url)
    async with asyncio.timeout(30):  # started, and waiting for the server's first reply
        await silent_server.connected.wait()
    assert process.returncode is None
    process.send_signal(signal.SIGINT)
    async with asyncio.timeout(20):
        _out, err = await process.communicate()
    assert process.returncode == 130
    assert "Traceback" not in err.decode()


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
@pytest.mark.slow
async def test_bad_usage_exits_2_and_unreachable_3(command: list[str]) -> None:
    code, _, err = await run(*command, "--url", "memory://")
    assert code == 2 and "this command looks inside Redis" in err, (code, err)
    code, _, err = await run(*command, "--url", "redis://127.0.0.1:1/0")
    unreachable = 1 if command == ["check"] else 3  # a probe says "not healthy", and why
    assert code == unreachable and len(err.splitlines()) == 1, (code, err)
    assert "Traceback" not in err


@pytest.mark.parametrize("flags", ["", "--json"])
@pytest.mark.slow
async def test_status_watch_ends_quietly_on_a_closed_pipe(
    flags: str, redis_url: str, namespace: str
) -> None:
    """``toolnexus status --watch | head -1``: exit 0 (pipefail: status's own), no traceback."""
    shell = await asyncio.create_subprocess_exec(
        "bash", "-o", "pipefail", "-c",
        f"{TOOLNEXUS} status --watch {flags} --interval 100ms --url {redis_url} "
        f"--namespace {namespace} | head -1",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=_env(),
    )  # fmt: skip
    async with asyncio.timeout(30):
        out, err = await shell.communicate()
    assert shell.returncode == 0 and err == b"", err
    assert namespace in out.decode()


async def test_stopped_workers_drop_out_of_status(
    redis_url: str, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A consumer without a heartbeat that holds nothing and has been idle for DROP_OUT_S is
    left out; one that holds a request stays, as does one with a heartbeat."""
    monkeypatch.setattr(inspecting, "DROP_OUT_S", 0.5)
    async with toolnexus.connect(redis_url, namespace=namespace) as broker:
        assert isinstance(broker, RedisBroker)
        redis_, stream = broker.redis, broker.keys.requests
        await redis_.xadd(stream, {"r": b"a request"})
        await redis_.xgroup_create(stream, "web", id="0")
        await redis_.xreadgroup("web", "holder", {stream: ">"}, count=1)
        await redis_.xgroup_createconsumer(stream, "web", "stopped")
        await redis_.xgroup_createconsumer(stream, "web", "beating")
        await broker.heartbeat("web", "beating", ttl_s=60)
        before = await broker.inspect()
        await asyncio.sleep(0.7)
        after = await broker.inspect()
    (web_before,) = before.groups
    assert [c.consumer for c in web_before.consumers] == ["beating", "holder", "stopped"]
    (web_after,) = after.groups
    assert [c.consumer for c in web_after.consumers] == ["beating", "holder"]


def test_drop_out_time_and_exit_statuses_are_documented() -> None:
    operating = (ROOT / "docs" / "how-to" / "operating.md").read_text()
    minutes = inspecting.DROP_OUT_S / 60
    assert f"no heartbeat for {minutes:g} minutes" in operating
    table = (ROOT / "docs" / "reference" / "cli.md").read_text()
    rows = {row.split("|")[1].strip(): row for row in table.splitlines() if row.startswith("| `")}
    for command in ("status", "check", "audit", "dead-letters"):
        assert "Ctrl-C" in rows[f"`{command}`"].split("|")[-2], command
