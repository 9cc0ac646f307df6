"""Real servers and a responder, each in its own process, stopped by PID (no SDK imported here:
the mcp 1.x tests use it too)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

SERVERS = Path(__file__).resolve().parent / "servers"
FASTMCP = [sys.executable, str(SERVERS / "fastmcp_server.py")]
WIRE = [sys.executable, str(SERVERS / "wire_server.py")]
MCP1 = [sys.executable, str(SERVERS / "mcp1_server.py")]
TASK_SERVER = [sys.executable, str(Path(__file__).resolve().parent / "mcp_task_server.py")]
A2A_AGENT = [sys.executable, str(SERVERS.parents[1] / "examples" / "a2a_agent.py")]

BOOKING = "Your booking details?"
SEATS = "How many seats?"
COLOUR = "Which colour?"
DELETE = "Really delete?"
RULES: dict[str, Any] = {
    BOOKING: {"accept": {"name": "Ada"}},
    SEATS: {"accept": {"value": 4}},
    COLOUR: {"accept": {"value": "green"}},
    DELETE: "decline",
    "Name?": {"accept": {"name": "Grace"}},
}
"""What the responder process answers to the test servers' questions."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class ResponderProcess:
    """``tests/servers/responder.py`` running on ``queue``; ``seen`` lists the requests it
    printed, ``events`` the events of its queue (``{"event", "id", "queue"}``)."""

    def __init__(
        self, url: str, namespace: str, rules: dict[str, Any], queue: str = "default"
    ) -> None:
        command = [
            *(sys.executable, str(SERVERS / "responder.py"), url, namespace),
            *(json.dumps(rules), queue),
        ]
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
        self.seen: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self._ready = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        if not self._ready.wait(30):
            self.stop()
            raise RuntimeError("the responder process did not start")

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            item = json.loads(line)
            if item == "ready":
                self._ready.set()
            elif "event" in item:
                self.events.append(item)
            else:
                self.seen.append(item)

    def by_prompt(self, prompt: str) -> dict[str, Any]:
        return next(item for item in self.seen if item["prompt"] == prompt)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._reader.join(5)
        if self.process.stdout is not None:
            self.process.stdout.close()


@contextmanager
def responder_process(
    url: str, namespace: str, rules: dict[str, Any] | None = None, queue: str = "default"
) -> Iterator[ResponderProcess]:
    responder = ResponderProcess(url, namespace, RULES if rules is None else rules, queue)
    try:
        yield responder
    finally:
        responder.stop()


@contextmanager
def fastmcp_http(name: str = "fastmcp-elicit") -> Iterator[str]:
    """The fastmcp test server over streamable HTTP in its own process; yields its URL."""
    port = free_port()
    with _http_process([*FASTMCP, "--http", str(port), "--name", name], port) as url:
        yield url


@contextmanager
def task_server_http() -> Iterator[str]:
    """``tests/mcp_task_server.py`` (the Tasks extension) in its own process; yields its URL."""
    port = free_port()
    with _http_process([*TASK_SERVER, str(port)], port) as url:
        yield url


@contextmanager
def a2a_agent_http() -> Iterator[str]:
    """``examples/a2a_agent.py`` (an A2A agent of the a2a-sdk) in its own process;
    yields its base URL."""
    port = free_port()
    with _http_process([*A2A_AGENT, str(port)], port, path="") as url:
        yield url


@contextmanager
def _http_process(command: list[str], port: int, path: str = "/mcp") -> Iterator[str]:
    process = subprocess.Popen(command, env={**os.environ, "NO_COLOR": "1"})
    try:
        deadline = time.monotonic() + 30
        while True:
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the HTTP server {command[1]} did not start")
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}{path}"
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
