"""Network namespaces joined by a bridge, for partition tests (issue 40).

Each node (a Redis server, a Sentinel, an agent, a responder) runs in a network namespace
of its own, with one veth link into a hub namespace that holds a bridge. Addresses are
10.213.0.N/24: they exist only inside these namespaces (the host's namespace gets no link
and no route), so nothing a run sends leaves them. A partition is iptables DROP inside the
namespaces (:meth:`Net.partition`), a flapping link a hub-side veth taken down and up
(:meth:`Net.link`). Every name carries a per-run prefix; :meth:`Net.close` kills every
process a run started (by PID) and deletes every namespace (their links go with them),
also after a failure (use it as a context manager). Needs root (CAP_NET_ADMIN).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

SUBNET = "10.213.0"


def available() -> str | None:
    """Why partition tests cannot run here (None: they can)."""
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    for tool in ("ip", "iptables", "redis-server"):
        if shutil.which(tool) is None:
            return f"needs {tool}"
    probe = f"tnxp{uuid.uuid4().hex[:6]}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True)
    if made.returncode != 0:
        return f"cannot make a network namespace: {made.stderr.decode().strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _run(*args: str) -> None:
    done = subprocess.run(args, capture_output=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {done.stderr.decode().strip()}")


@dataclass(frozen=True, slots=True)
class Node:
    name: str
    namespace: str
    ip: str
    hub_link: str


class Net:
    """The namespaces of one run (see the module's docstring)."""

    def __init__(self, directory: Path) -> None:
        self.prefix = f"tnx{uuid.uuid4().hex[:6]}"
        self.directory = directory
        self.hub = f"{self.prefix}-hub"
        self.nodes: dict[str, Node] = {}
        self.processes: list[subprocess.Popen[bytes]] = []
        self._logs: list[IO[bytes]] = []
        _run("ip", "netns", "add", self.hub)
        _run("ip", "-n", self.hub, "link", "add", "br0", "type", "bridge")
        _run("ip", "-n", self.hub, "link", "set", "br0", "up")

    def __enter__(self) -> Net:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def add(self, name: str) -> Node:
        """A node of its own namespace, linked to the hub, with the next address."""
        number = len(self.nodes) + 1
        node = Node(name, f"{self.prefix}-{name}", f"{SUBNET}.{number}", f"h{number}")
        self.nodes[name] = node  # before anything can fail: close() deletes it
        _run("ip", "netns", "add", node.namespace)
        _run(
            "ip", "link", "add", "eth0", "netns", node.namespace, "type", "veth",
            "peer", "name", node.hub_link, "netns", self.hub,
        )  # fmt: skip
        _run("ip", "-n", self.hub, "link", "set", node.hub_link, "master", "br0", "up")
        _run("ip", "-n", node.namespace, "addr", "add", f"{node.ip}/24", "dev", "eth0")
        _run("ip", "-n", node.namespace, "link", "set", "eth0", "up")
        _run("ip", "-n", node.namespace, "link", "set", "lo", "up")
        return node

    def start(self, node: Node, argv: Sequence[str], log_name: str) -> subprocess.Popen[bytes]:
        """Run ``argv`` inside ``node``'s namespace (``ip netns exec`` execs it: the PID is
        the program's), its output to ``log_name`` in the run's directory."""
        log = (self.directory / log_name).open("ab")
        self._logs.append(log)
        process = subprocess.Popen(
            ["ip", "netns", "exec", node.namespace, *argv], stdout=log, stderr=log
        )
        self.processes.append(process)
        return process

    def exec(self, node: Node, *argv: str, timeout: float = 5.0) -> str:
        """Run ``argv`` inside ``node``'s namespace; its output."""
        done = subprocess.run(
            ["ip", "netns", "exec", node.namespace, *argv],
            capture_output=True,
            timeout=timeout,
        )
        return done.stdout.decode()

    def partition(self, *sides: Sequence[Node]) -> None:
        """Drop every packet between nodes on different ``sides`` (nodes on no side keep
        every link)."""
        for i, side in enumerate(sides):
            others = [n.ip for j, other in enumerate(sides) if j != i for n in other]
            if not others:
                continue
            for node in side:
                for chain, flag in (("INPUT", "-s"), ("OUTPUT", "-d")):
                    self._iptables(node, "-A", chain, flag, ",".join(others), "-j", "DROP")

    def heal(self) -> None:
        """Remove every partition."""
        for node in self.nodes.values():
            self._iptables(node, "-F")

    def link(self, node: Node, up: bool) -> None:
        """Take ``node``'s link to the hub down, or up again."""
        _run("ip", "-n", self.hub, "link", "set", node.hub_link, "up" if up else "down")

    def _iptables(self, node: Node, *args: str) -> None:
        _run("ip", "netns", "exec", node.namespace, "iptables", "-w", *args)

    def close(self) -> None:
        """Kill every process started (by PID), delete every namespace."""
        for process in self.processes:
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
        for process in self.processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(10)
        self.processes.clear()
        for log in self._logs:
            log.close()
        self._logs.clear()
        for namespace in [n.namespace for n in self.nodes.values()] + [self.hub]:
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True)
        self.nodes.clear()


def wait_until(what: str, condition: object, timeout_s: float = 20.0) -> None:
    """Poll ``condition`` (a callable) until it is true; raise naming ``what`` if not."""
    assert callable(condition)
    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(Exception):
            if condition():
                return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout_s} s")
        time.sleep(0.1)
