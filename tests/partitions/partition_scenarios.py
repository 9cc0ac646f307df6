"""Partition scenarios on a Sentinel topology (issue 40): a primary, a replica and three
Sentinels, two agents and two responders, each in a namespace of its own
(partition_net.py), all through ``redis+sentinel://``; and one on a Cluster (three
masters and a replica each, through ``redis+cluster://``). Each run checks its history
(partition_history.py) and gives its figures (:class:`Figures`).

Scenarios (:data:`SCENARIOS`):

- ``isolated-primary``: the primary, one Sentinel, one agent and one responder are cut
  off from the rest (the majority fails over) until the majority's agent has been served
  by the new primary for a while, then healed.
- ``flapping-link``: the primary's link goes down and up again, second by second.
- ``quorum-failover``: as ``isolated-primary``, with requests that each need two votes
  (one from each responder, one on each side): the failover comes while votes are
  counted (``MODE`` ``quorum`` of partition_roles.py).
- ``escalation-failover``: as ``isolated-primary``, with requests that escalate after
  1.5 s from the agents' queue (nobody answers it) to the responders' ``oncall``: with a
  request published every 0.25 s (by the two agents together), hops are due throughout
  the failover (``MODE`` ``escalation``).
- ``cluster-isolated-master``: on a Cluster (:class:`ClusterRun`), the master holding
  the majority agent's waiter, with the other agent and one responder, cut off until its
  replica took over and ``hold_s`` passed, then healed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from partition_history import check, read_history
from partition_net import Net, Node, wait_until
from partition_roles import ONCALL

ROLES = Path(__file__).with_name("partition_roles.py")
MASTER = "tnxmaster"
DURABLE = {"durability": "wait", "wait_replicas": 1, "wait_timeout_ms": 100}
"""The option under test: every write waits for one replica, and is acknowledged only
if it got it."""


@dataclass
class Plan:
    """How long a run lasts."""

    warm_s: float = 3.0
    """Traffic before the fault."""
    after_s: float = 5.0
    """Traffic after the heal."""
    burst: int = 20
    """Each agent publishes this many requests at once when it starts, which the
    responders are still working through when the fault comes."""
    every_s: float = 0.5
    """Then each agent publishes a request this often."""
    think_s: float = 0.3
    """Each responder takes this long to answer (so that requests are held across a
    fault, as a person takes time)."""
    wait_s: float = 20.0
    """Each wait's deadline."""
    hold_s: float = 4.0
    """How long the partition lasts after the Sentinels switched."""
    max_cut_s: float = 12.0
    """The longest a partition lasts."""


@dataclass
class Figures:
    scenario: str
    durability: str
    requests: int
    acknowledged: int
    not_confirmed: int
    lost: int
    conflicting: int
    phantom: int
    stranded: int
    expired: int
    unavailable: int
    switch_s: float | None
    """From the fault to the majority's Sentinel naming a new master."""
    recover_s: float | None
    """From the fault to the first answer the majority's agent got after the Sentinels
    switched (from the new primary, with most faults: the old one is out of its reach).
    It includes the backlog its responder worked through first."""
    examples: list[str]
    reconnect_s: float | None = None
    """From the fault to the first thing a majority client (its agent or responder) got
    done after the Sentinels switched: an outcome, or a responder told anything."""


class SentinelRun:
    """One run: the topology up, the traffic, the fault, the figures."""

    def __init__(self, net: Net, durability: str, plan: Plan, mode: str = "plain") -> None:
        self.net, self.plan, self.durability, self.mode = net, plan, durability, mode
        self.dir = net.directory
        self.r1, self.r2 = net.add("r1"), net.add("r2")
        self.sentinels = [net.add(f"s{i}") for i in (1, 2, 3)]
        self.a1, self.p1 = net.add("a1"), net.add("p1")
        self.a2, self.p2 = net.add("a2"), net.add("p2")
        addresses = ",".join(f"{s.ip}:26379" for s in self.sentinels)
        self.url = f"redis+sentinel://{addresses}/{MASTER}"
        self.options: dict[str, Any] = {"block_ms": 100, "lease_ms": 1000}
        if durability == "wait":
            self.options.update(DURABLE)
        self.histories: list[Path] = []

    def start_servers(self) -> None:
        for node, extra in ((self.r1, []), (self.r2, ["--replicaof", self.r1.ip, "6379"])):
            directory = self.dir / node.name
            directory.mkdir()
            argv = ["redis-server", "--port", "6379", "--bind", node.ip, "--protected-mode"]
            argv += ["no", "--save", "", "--dir", str(directory), *extra]
            self.net.start(node, argv, f"{node.name}.log")
        wait_until("the replica is in sync", lambda: "master_link_status:up" in self.info(self.r2))
        for sentinel in self.sentinels:
            config = self.dir / f"{sentinel.name}.conf"
            config.write_text(
                f"port 26379\nbind {sentinel.ip}\nprotected-mode no\ndir {self.dir}\n"
                f"sentinel monitor {MASTER} {self.r1.ip} 6379 2\n"
                f"sentinel down-after-milliseconds {MASTER} 1000\n"
                f"sentinel failover-timeout {MASTER} 5000\n"
            )
            self.net.start(
                sentinel, ["redis-server", str(config), "--sentinel"], f"{sentinel.name}.log"
            )

        def sentinels_ready() -> bool:
            for s in self.sentinels:
                out = self.cli(s, 26379, "SENTINEL", "MASTER", MASTER)
                fields = dict(zip(out[::2], out[1::2], strict=False))
                if fields.get("num-slaves") != "1" or fields.get("num-other-sentinels") != "2":
                    return False
            return True

        wait_until("the Sentinels see the replica and each other", sentinels_ready, 30)

    def cli(self, node: Node, port: int, *args: str) -> list[str]:
        out = self.net.exec(node, "redis-cli", "-h", node.ip, "-p", str(port), *args, timeout=3)
        return out.split()

    def info(self, node: Node) -> str:
        return self.net.exec(node, "redis-cli", "-h", node.ip, "-p", "6379", "INFO", "replication")

    def master_seen_by(self, sentinel: Node) -> str | None:
        out = self.cli(sentinel, 26379, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER)
        return out[0] if out else None

    def start_traffic(self, run_s: float) -> None:
        plan = self.plan
        oncall = {"queue": ONCALL} if self.mode == "escalation" else {}
        for node, role, numbers in (
            (self.p1, "responder", (run_s + plan.wait_s, plan.think_s)),
            (self.p2, "responder", (run_s + plan.wait_s, plan.think_s)),
            (self.a1, "agent", (run_s, plan.every_s, plan.wait_s, plan.burst)),
            (self.a2, "agent", (run_s, plan.every_s, plan.wait_s, plan.burst)),
        ):
            history = self.dir / f"{node.name}.jsonl"
            self.histories.append(history)
            options = json.dumps({**self.options, **(oncall if role == "responder" else {})})
            argv = [
                sys.executable, str(ROLES), role, self.url, "partitions", node.name,
                str(history), options, self.mode, *(str(n) for n in numbers),
            ]  # fmt: skip
            self.net.start(node, argv, f"{node.name}.log")

    def run(self, scenario: str, fault: Callable[[SentinelRun], float | None]) -> Figures:
        """Start everything, let traffic flow, run ``fault`` (which returns when the
        Sentinels switched, if they did), wait for the agents, check the history."""
        self.start_servers()
        plan = self.plan
        run_s = plan.warm_s + plan.max_cut_s + plan.after_s
        self.start_traffic(run_s)
        agents = self.net.processes[-2:]

        def ready() -> bool:
            return all('"op": "ready"' in path.read_text() for path in self.histories)

        wait_until("every agent and responder connected", ready, 90)
        time.sleep(plan.warm_s)
        self.cut_at = time.time()
        switched = fault(self)
        stuck = []
        for agent in agents:  # they publish until run_s, then wait for the rest
            try:
                agent.wait(run_s + plan.wait_s + 30)
            except subprocess.TimeoutExpired:  # its open waits count as stranded
                agent.kill()
                stuck.append(f"agent pid {agent.pid} did not exit: killed")
        figures = self.figures(scenario, switched)
        figures.examples += stuck
        return figures

    def figures(self, scenario: str, switched: float | None) -> Figures:
        events = [e for e in read_history(self.histories) if e["op"] != "ready"]
        verdict = check(events)
        outcomes = [e for e in events if e["op"] == "outcome"]
        majority = [
            e["t"]
            for e in outcomes
            if e["by"] == self.a2.name
            and e.get("reason") is None
            and e["t"] > (switched or self.cut_at)
        ]
        after_switch = [
            e["t"]
            for e in events
            if e["by"] in (self.a2.name, self.p2.name)
            and e["op"] in ("outcome", "respond")
            and e["t"] > (switched or self.cut_at)
        ]
        return Figures(
            reconnect_s=round(min(after_switch) - self.cut_at, 2) if after_switch else None,
            scenario=scenario,
            durability=self.durability,
            requests=verdict.requests,
            acknowledged=verdict.acknowledged,
            not_confirmed=verdict.not_confirmed,
            lost=verdict.count("lost"),
            conflicting=verdict.count("conflicting"),
            phantom=verdict.count("phantom"),
            stranded=verdict.count("stranded"),
            expired=sum(1 for e in outcomes if e.get("reason") == "expired"),
            unavailable=sum(1 for e in outcomes if e.get("reason") == "unavailable"),
            switch_s=None if switched is None else round(switched - self.cut_at, 2),
            recover_s=round(min(majority) - self.cut_at, 2) if majority else None,
            examples=[f"{v.kind} {v.request}: {v.detail}" for v in verdict.violations[:5]],
        )

    def wait_for_switch(self, sentinel: Node, timeout_s: float) -> float | None:
        """When ``sentinel`` names another master than r1 (None: not within
        ``timeout_s``)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if self.master_seen_by(sentinel) not in (None, self.r1.ip):
                    return time.time()
            except Exception:
                pass
            time.sleep(0.1)
        return None


def isolated_primary(run: SentinelRun) -> float | None:
    """The primary with one Sentinel, one agent and one responder, cut off from the rest
    until the Sentinels switched and ``hold_s`` passed; then healed."""
    minority = [run.r1, run.sentinels[0], run.a1, run.p1]
    majority = [run.r2, *run.sentinels[1:], run.a2, run.p2]
    run.net.partition(minority, majority)
    switched = run.wait_for_switch(run.sentinels[1], run.plan.max_cut_s)
    time.sleep(run.plan.hold_s)
    run.net.heal()
    return switched


def flapping_link(run: SentinelRun) -> float | None:
    """The primary's link down for a second and up for a second, for ``max_cut_s``."""
    switched = None
    end = time.monotonic() + run.plan.max_cut_s
    while time.monotonic() < end:
        run.net.link(run.r1, False)
        time.sleep(1.0)
        run.net.link(run.r1, True)
        if switched is None:
            switched = run.wait_for_switch(run.sentinels[1], 1.0)
        else:
            time.sleep(1.0)
    return switched


class ClusterRun(SentinelRun):
    """As :class:`SentinelRun`, on a Redis Cluster of three masters (r1..r3) and a
    replica each (r4..r6), through ``redis+cluster://``; no Sentinels (the masters vote
    a replica in)."""

    def __init__(self, net: Net, durability: str, plan: Plan, mode: str = "plain") -> None:
        self.net, self.plan, self.durability, self.mode = net, plan, durability, mode
        self.dir = net.directory
        self.servers = [net.add(f"r{i}") for i in range(1, 7)]
        self.r1 = self.servers[0]
        self.sentinels = []
        self.a1, self.p1 = net.add("a1"), net.add("p1")
        self.a2, self.p2 = net.add("a2"), net.add("p2")
        self.url = "redis+cluster://" + ",".join(f"{n.ip}:6379" for n in self.servers)
        self.options = {"block_ms": 100, "lease_ms": 1000}
        if durability == "wait":
            self.options.update(DURABLE)
        self.histories = []

    def start_servers(self) -> None:
        for node in self.servers:
            directory = self.dir / node.name
            directory.mkdir()
            argv = ["redis-server", "--port", "6379", "--bind", node.ip, "--protected-mode"]
            argv += ["no", "--save", "", "--appendonly", "no", "--dir", str(directory)]
            argv += ["--cluster-enabled", "yes", "--cluster-node-timeout", "1000"]
            argv += ["--repl-diskless-sync-delay", "0"]
            self.net.start(node, argv, f"{node.name}.log")
        for node in self.servers:
            wait_until(f"{node.name} is up", lambda n=node: self.cli(n, 6379, "PING") == ["PONG"])
        # masters first: r1..r3 get the slots, r4..r6 replicate them
        created = self.net.exec(
            self.r1, "redis-cli", "--cluster", "create",
            *(f"{n.ip}:6379" for n in self.servers), "--cluster-replicas", "1", "--cluster-yes",
            timeout=60,
        )  # fmt: skip
        if "All 16384 slots covered" not in created:
            raise RuntimeError(f"the cluster was not created: {created[-500:]}")

        def healthy() -> bool:
            for node in self.servers:
                if "cluster_state:ok" not in self.net.exec(
                    node, "redis-cli", "-h", node.ip, "CLUSTER", "INFO"
                ):
                    return False
                info = self.info(node)
                if "role:slave" in info and "master_link_status:up" not in info:
                    return False
            return True

        wait_until("the cluster is formed, every replica in sync", healthy, 60)

    def master_of_waiter(self, agent: Node) -> Node:
        """The master holding the slot of ``agent``'s waiter (named in its ``ready``)."""
        history = self.dir / f"{agent.name}.jsonl"
        ready = next(e for e in read_history([history]) if e["op"] == "ready")
        key = f"{{partitions:w:{ready['waiter']}}}:answers"
        slot = int(self.cli(self.r1, 6379, "CLUSTER", "KEYSLOT", key)[0])
        nodes = self.net.exec(self.r1, "redis-cli", "-h", self.r1.ip, "CLUSTER", "NODES")
        for fields in (line.split() for line in nodes.splitlines()):
            if "master" not in fields[2]:
                continue
            for span in fields[8:]:
                first, _, last = span.partition("-")
                if first.isdigit() and int(first) <= slot <= int(last or first):
                    ip = fields[1].split(":")[0]
                    return next(n for n in self.servers if n.ip == ip)
        raise RuntimeError(f"no master holds slot {slot}")

    def wait_for_switch(self, sentinel: Node, timeout_s: float) -> float | None:
        """When ``sentinel`` (a majority node here) sees r1 (the isolated master) failed
        and a replica serving its slots (None: not within ``timeout_s``)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            nodes = self.net.exec(sentinel, "redis-cli", "-h", sentinel.ip, "CLUSTER", "NODES")
            lines = [line.split() for line in nodes.splitlines()]
            if any(
                f[1].startswith(f"{self.r1.ip}:") and "fail" in f[2].split(",") for f in lines
            ) and any("master" in f[2] and len(f) > 8 for f in lines if self.r1.ip not in f[1]):
                masters = [f for f in lines if "master" in f[2] and "fail" not in f[2]]
                if sum(1 for f in masters if len(f) > 8) == 3:
                    return time.time()
            time.sleep(0.1)
        return None


def cluster_isolated_master(run: SentinelRun) -> float | None:
    """The Cluster master holding the majority agent's waiter (its reply stream and
    request states: where answers to it are written), with the other agent and one
    responder, cut off from the rest until its replica was voted in and ``hold_s``
    passed; then healed."""
    assert isinstance(run, ClusterRun)
    run.r1 = run.master_of_waiter(run.a2)
    minority = [run.r1, run.a1, run.p1]
    majority = [n for n in run.net.nodes.values() if n not in minority]
    run.net.partition(minority, majority)
    watcher = next(n for n in run.servers if n not in minority)
    switched = run.wait_for_switch(watcher, run.plan.max_cut_s)
    time.sleep(run.plan.hold_s)
    run.net.heal()
    return switched


@dataclass(frozen=True)
class Scenario:
    fault: Callable[[SentinelRun], float | None]
    mode: str = "plain"
    """The requests' shape (partition_roles.py's ``MODE``)."""
    topology: type[SentinelRun] = SentinelRun


SCENARIOS: dict[str, Scenario] = {
    "isolated-primary": Scenario(isolated_primary),
    "flapping-link": Scenario(flapping_link),
    "quorum-failover": Scenario(isolated_primary, "quorum"),
    "escalation-failover": Scenario(isolated_primary, "escalation"),
    "cluster-isolated-master": Scenario(cluster_isolated_master, topology=ClusterRun),
}


def run_scenario(directory: Path, scenario: str, durability: str, plan: Plan) -> Figures:
    """One run of ``scenario`` in namespaces of its own, all of them removed after."""
    directory.mkdir(parents=True, exist_ok=True)
    chosen = SCENARIOS[scenario]
    with Net(directory) as net:
        run = chosen.topology(net, durability, plan, chosen.mode)
        return run.run(scenario, chosen.fault)


def as_json(figures: Figures) -> str:
    return json.dumps(asdict(figures))
