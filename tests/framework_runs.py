"""What the framework adapters' tests share: a driver script run as an agent process of
its own (killable while it waits), the first request a responder is shown, and the calls
a tool wrote down."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

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
