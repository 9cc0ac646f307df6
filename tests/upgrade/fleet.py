"""Processes of two releases on one Redis: each release's own ``toolnexus`` commands and an
agent script of public API calls run by its own Python, nothing of one in the other's process.

What each process does is kept: an :class:`Agent` records what it asked and what it got, a
:class:`Process` keeps its stderr (the auto worker logs one ``decision=... outcome=...`` line
a request), so a test can check that every request ended once, as its rule or person said."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
WRITE_PROTOCOL_ENV = "TOOLNEXUS_WRITE_PROTOCOL"
"""Which protocol a process writes (1: what the previous release reads)."""

AGENT = r"""
import asyncio, json, sys
import toolnexus
from toolnexus import Hop, Quorum, Request

def say(line):
    sys.stdout.write(json.dumps(line) + "\n")
    sys.stdout.flush()

def request_of(asked):
    schema = asked.get("schema")
    return Request(
        id=asked["id"],
        kind="input" if schema else "approval",
        prompt=asked["prompt"],
        data={"schema": schema} if schema else None,
        quorum=Quorum(asked["quorum"]) if asked.get("quorum") else None,
        escalate=[Hop(after_s=s, queue=q) for s, q in asked.get("escalate", [])] or None,
    )

async def wait(broker, asked):
    try:
        answer = await broker.wait_for(
            request_of(asked), timeout_s=asked["timeout_s"], durable=asked.get("durable", False)
        )
    except asyncio.CancelledError:
        say({"id": asked["id"], "detached": True})
        raise
    except toolnexus.ToolnexusError as exc:
        say({"id": asked["id"], "error": f"{type(exc).__name__}: {exc}"})
    else:
        say({"id": asked["id"], "answer": {
            "ok": answer.ok, "reason": answer.reason, "data": answer.data,
            "person": answer.person, "responder": answer.responder,
            "approvals": sorted(a.person or a.responder for a in answer.approvals or ()),
        }})

async def main():
    url, queue = sys.argv[1:3]
    loop = asyncio.get_running_loop()
    commands = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(commands), sys.stdin)
    waits = {}
    async with toolnexus.connect(url, queue=queue, block_ms=100, lease_ms=2000) as broker:
        say({"ready": True})
        while line := await commands.readline():
            asked = json.loads(line)
            if asked.get("drain"):
                break
            waits[asked["id"]] = (loop.create_task(wait(broker, asked)), asked.get("durable"))
        # stopping: a durable wait is left for the next process (cancelled, not withdrawn);
        # the others are waited for
        for task, durable in waits.values():
            if durable:
                task.cancel()
        await asyncio.gather(*(task for task, _ in waits.values()), return_exceptions=True)
    say({"drained": True})

asyncio.run(main())
"""


@dataclass(frozen=True)
class Release:
    """One release's environment: its Python and the ``toolnexus`` command beside it."""

    python: Path

    @property
    def toolnexus(self) -> Path:
        return self.python.parent / "toolnexus"

    def installed(self) -> dict[str, str]:
        """The version of ``toolnexus-bridge`` it has, and the file it imports as toolnexus."""
        script = (
            "import importlib.metadata as m, json, toolnexus; print(json.dumps("
            "{'version': m.version('toolnexus-bridge'), 'file': toolnexus.__file__}))"
        )
        done = subprocess.run(
            [str(self.python), "-I", "-c", script], capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        found: dict[str, str] = json.loads(done.stdout)
        return found


def environment(**extra: str) -> dict[str, str]:
    """A process's environment: none of this tree's paths or ``TOOLNEXUS_*`` settings,
    then ``extra``."""
    clean = {
        k: v for k, v in os.environ.items() if not k.startswith("TOOLNEXUS_") and k != "PYTHONPATH"
    }
    return {**clean, **extra}


def run(*command: str | Path, env: dict[str, str], timeout_s: float = 60) -> str:
    """A command's output; its failure fails the test with what it said."""
    done = subprocess.run(
        [str(c) for c in command], capture_output=True, text=True, timeout=timeout_s, env=env
    )
    assert done.returncode == 0, f"{command}: {done.returncode}\n{done.stderr}"
    return done.stdout


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.contextmanager
def redis_server(directory: Path, *args: str) -> Iterator[int]:
    """A private redis-server on a free port (no persistence); its port."""
    binary = shutil.which("redis-server")
    assert binary is not None, "redis-server is not installed (./run installs it)"
    for _ in range(5):
        port = free_port()
        command = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
        process = subprocess.Popen(
            [*command, "--appendonly", "no", "--dir", str(directory), *args],
            stdout=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while process.poll() is None and time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.02)
        if process.poll() is None:
            break
    else:
        raise RuntimeError("redis-server did not start on five free ports")
    try:
        yield port
    finally:
        process.kill()
        process.wait(10)


class Process:
    """A long-running command (a worker) of one release; its stderr kept in ``log``."""

    def __init__(self, name: str, command: list[str], env: dict[str, str], log: Path) -> None:
        self.name, self.log = name, log
        self._err = log.open("w")
        self.process = subprocess.Popen(
            command, env=env, stdin=subprocess.DEVNULL, stdout=self._err, stderr=self._err
        )

    def stop(self, timeout_s: float = 30) -> None:
        """SIGTERM; it must end with status 0 (what it said is in the failure)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
        self._err.close()
        assert self.process.returncode == 0, f"{self.name}: {self.process.returncode}\n{self.said}"

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        self._err.close()

    @property
    def said(self) -> str:
        return self.log.read_text()

    def decisions(self) -> list[tuple[str, str]]:
        """The auto worker's decisions: (request id, outcome), in order."""
        line = re.compile(r"decision=\S+ request=(\S+) .* outcome=(.*)$")
        return [(m[1], m[2]) for m in map(line.search, self.said.splitlines()) if m]


@dataclass
class Asked:
    """One request an agent asked, what it should end with, and what it got."""

    request: dict[str, Any]
    expected: dict[str, Any]
    agents: list[str] = field(default_factory=list)  # each process that waited for it
    got: list[dict[str, Any]] = field(default_factory=list)  # each answer or error received


class Agent:
    """An agent process of one release (the :data:`AGENT` script): it asks what it is told,
    each wait a task of its own, and says each answer as one JSON line."""

    def __init__(self, name: str, process: asyncio.subprocess.Process) -> None:
        self.name, self.process = name, process
        self.lines: list[dict[str, Any]] = []
        self.drained = asyncio.Event()
        self._reader: asyncio.Task[None] | None = None

    @classmethod
    async def start(
        cls, name: str, release: Release, url: str, queue: str, env: dict[str, str]
    ) -> Agent:
        process = await asyncio.create_subprocess_exec(
            str(release.python),
            "-I",
            "-c",
            AGENT,
            url,
            queue,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        agent = cls(name, process)
        assert process.stdout is not None
        ready = await asyncio.wait_for(process.stdout.readline(), 60)
        assert json.loads(ready or b"{}").get("ready"), f"agent {name} did not start"
        agent._reader = asyncio.get_running_loop().create_task(agent._read())
        return agent

    async def _read(self) -> None:
        assert self.process.stdout is not None
        while line := await self.process.stdout.readline():
            said = json.loads(line)
            if said.get("drained"):
                self.drained.set()
            else:
                self.lines.append(said)

    def ask(self, asked: Asked) -> None:
        assert self.process.stdin is not None
        asked.agents.append(self.name)
        self.process.stdin.write((json.dumps(asked.request) + "\n").encode())

    def said_about(self, request_id: str) -> list[dict[str, Any]]:
        return [line for line in self.lines if line["id"] == request_id]

    async def drain(self, timeout_s: float = 90) -> list[dict[str, Any]]:
        """Stop: its plain waits end first, its durable ones are left (detached); all it said."""
        assert self.process.stdin is not None
        self.process.stdin.write(b'{"drain": true}\n')
        await asyncio.wait_for(self.drained.wait(), timeout_s)
        assert await asyncio.wait_for(self.process.wait(), 30) == 0, f"agent {self.name}"
        if self._reader is not None:
            await self._reader
        return self.lines

    async def kill(self) -> None:
        if self.process.returncode is None:
            self.process.kill()
            await self.process.wait()
