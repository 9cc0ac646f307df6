"""What the framework adapters' tests share: a driver script run as an agent process of
its own (killable while it waits), the first request a responder is shown, the calls a
tool wrote down, and the fixtures ``broker`` and ``agent`` (made by :func:`agent_fixture`),
which a test module takes as its own by assigning them to those names (as the fixtures
of tests/answering.py)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

import toolnexus
from toolnexus import Broker, Pending

Start = Callable[..., "subprocess.Popen[str]"]


@contextmanager
def driver(script: Path, *args: str, cwd: Path, drop: Path | None = None) -> Iterator[Start]:
    """``start(*more)`` runs ``python script *args *more`` in ``cwd`` (this process's
    ``sys.path`` as its PYTHONPATH, less ``drop``); every process still running at the
    end is killed."""
    path = [p for p in sys.path if p and (drop is None or Path(p).resolve() != drop)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    started: list[subprocess.Popen[str]] = []

    def start(*more: str) -> subprocess.Popen[str]:
        process = subprocess.Popen(
            [sys.executable, str(script), *args, *more],
            env=env,
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        started.append(process)
        return process

    try:
        yield start
    finally:
        for process in started:
            if process.poll() is None:
                process.kill()
            process.communicate()


async def shown(broker: Broker, timeout_s: float = 60) -> Pending:
    """The first request a responder of queue ``ops`` is shown."""
    async with broker.responder("ops") as responder, asyncio.timeout(timeout_s):
        return await anext(responder)


async def finished(process: subprocess.Popen[str], timeout_s: float = 150) -> str:
    """What ``process`` printed, once it exited with status 0."""
    out, err = await asyncio.to_thread(process.communicate, timeout=timeout_s)
    assert process.returncode == 0, err
    return out.strip()


def calls_in(file: Path) -> list[dict[str, object]]:
    """The calls a tool wrote to ``file``, one JSON object a line (none: no file)."""
    return [json.loads(line) for line in file.read_text().splitlines()] if file.exists() else []


def ran(tmp_path: Path) -> list[dict[str, object]]:
    """The calls the tool of an :func:`agent_fixture` agent ran, in the test's directory."""
    return calls_in(tmp_path / "ran.jsonl")


@pytest.fixture
async def broker(redis_url: str, namespace: str) -> AsyncIterator[Broker]:
    """A broker on the test's namespace, reading in short blocks."""
    async with toolnexus.connect(redis_url, namespace=namespace, block_ms=100) as b:
        yield b


def agent_fixture(script: Path) -> Any:
    """An ``agent`` fixture: ``agent(mode, timeout_s=30)`` starts ``script`` as an agent
    process on the test's namespace (run ``run-1``), which writes what its tool ran where
    :func:`ran` reads it; it is killed at the end of the test if it still runs."""

    @pytest.fixture
    def agent(redis_url: str, namespace: str, tmp_path: Path) -> Iterator[Start]:
        ran_file = str(tmp_path / "ran.jsonl")
        with driver(script, redis_url, namespace, "run-1", ran_file, cwd=tmp_path) as start:
            yield lambda mode, timeout_s=30: start(mode, str(timeout_s))

    return agent
