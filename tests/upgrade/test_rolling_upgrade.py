"""A rolling upgrade from the last release to this tree, one process at a time, as
docs/how-to/upgrade.md says: the ACL first, then the responders, then the agents (writing
protocol 1 while any responder of the last release runs), then every process flipped to
the new protocol. Under signatures and the shipped ACL's roles, on a private Redis.

Throughout, two agents keep asking plain, durable, quorum (2 of 2) and escalating
requests, and one durable wait stays open across the whole upgrade, answered by a person
at the end. Each request must end exactly once, as its rule or person said: each agent
says what it got, each responder what it did, and the audit trail what ended."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis

import toolnexus
from fleet import (
    ROOT,
    WRITE_PROTOCOL_ENV,
    Agent,
    Asked,
    Process,
    Release,
    environment,
    redis_server,
    run,
)

pytestmark = [pytest.mark.redis, pytest.mark.slow, pytest.mark.timeout(600)]

QUEUE, ONCALL = "ops", "oncall"
AGENTS = ("agent-1", "agent-2")
BOTS = ("bot-1", "bot-2")  # one consumer group each: both vote on a quorum
USERS = {"agent-1": "a1-secret", "agent-2": "a2-secret", "responder": "r-secret", "ops": "o-secret"}
ADMIN = "admin-secret"  # the test's own user: ACL LOAD, and reading heartbeats
ASK_EVERY_S = 0.3
PLAIN_TIMEOUT_S = 90.0
HOLD_TIMEOUT_S = 500.0


def rules(bot: str) -> str:
    """A bot's rules, named after it (its answers' persons: ``auto:<bot> yes``...)."""
    return f"""
[[rule]]
name = "{bot} yes"
prompt = "^yes "
action = "accept"

[[rule]]
name = "{bot} no"
prompt = "^no "
action = "decline"

[[rule]]
name = "{bot} vote"
prompt = "^vote "
action = "accept"

[[rule]]
name = "{bot} durable"
prompt = "^durable "
action = "accept"
after_s = 1
"""


ONCALL_RULES = '[[rule]]\nname = "oncall esc"\nprompt = "^esc "\naction = "accept"\n'

EXPECTED_ANSWERED = {"yes": 1, "no": 1, "vote": 2, "durable": 1, "esc": 1, "hold": 0}
"""How many answers the responders' logs show as taken, by the request's kind (a vote: one
a bot)."""


@dataclass
class Fleet:
    """The processes on one Redis, and everything each did."""

    tmp: Path
    port: int
    keys: Path
    asked: dict[str, Asked] = field(default_factory=dict)
    agents: dict[str, Agent | None] = field(default_factory=dict)  # None: being replaced
    responders: dict[str, Process] = field(default_factory=dict)
    retired: list[Process] = field(default_factory=list)
    past_agents: list[Agent] = field(default_factory=list)
    counter: itertools.count[int] = field(default_factory=itertools.count)

    def url(self, user: str) -> str:
        password = ADMIN if user == "admin" else USERS[user]
        return f"redis://{user}:{password}@127.0.0.1:{self.port}/0"

    def signed(self, key: str, trusted: str, **extra: str) -> dict[str, str]:
        return environment(
            TOOLNEXUS_SIGNING_KEY=str(self.keys / f"{key}.key"),
            TOOLNEXUS_TRUSTED_KEYS=str(self.tmp / trusted),
            TOOLNEXUS_REQUIRE_SIGNATURES="1",
            **extra,
        )

    def load_acl(self, release: Release) -> None:
        """``toolnexus acl`` of ``release`` with the passwords, loaded into the running Redis."""
        written = run(
            release.toolnexus,
            "acl",
            "--agent",
            AGENTS[0],
            "--agent",
            AGENTS[1],
            "--responder",
            "responder",
            "--ops",
            "ops",
            env=environment(),
        )
        passwords = {f"REDIS_{u.upper().replace('-', '_')}_PASSWORD": p for u, p in USERS.items()}
        script = ROOT / "deploy" / "redis" / "set-passwords.sh"
        (self.tmp / "written.acl").write_text(written)
        hashed = run(script, self.tmp / "written.acl", env=environment(**passwords))
        (self.tmp / "users.acl").write_text(hashed + f"user admin on >{ADMIN} +@all ~* &*\n")
        with redis.Redis(port=self.port, username="admin", password=ADMIN) as admin:
            admin.execute_command("ACL", "LOAD")

    def start_responder(self, name: str, release: Release, *, write_protocol: int | None) -> None:
        """Responder ``name`` (bot-1, bot-2 or oncall) of ``release``, replacing the one
        running, if any (stopped first: its answers in hand end, its leases lapse)."""
        old = self.responders.pop(name, None)
        if old is not None:
            old.stop()
            self.retired.append(old)
        queue = ONCALL if name == "oncall" else QUEUE
        rules_file = self.tmp / f"{name}.toml"
        rules_file.write_text(ONCALL_RULES if name == "oncall" else rules(name))
        generation = sum(p.name.startswith(f"{name}@") for p in self.retired) + 1
        consumer = f"{name}-{generation}"
        extra = {} if write_protocol is None else {WRITE_PROTOCOL_ENV: str(write_protocol)}
        self.responders[name] = Process(
            f"{name}@{generation}",
            [
                str(release.toolnexus),
                "worker",
                "auto",
                "--rules",
                str(rules_file),
                "--url",
                self.url("responder"),
                "--queue",
                queue,
                "--group",
                name,
                "--consumer",
                consumer,
                "--lease-ms",
                "2000",
            ],
            self.signed(name, "trusted-by-responders", **extra),
            self.tmp / f"{consumer}.log",
        )

    async def beating(self, queue: str, consumer: str) -> None:
        """Until ``consumer``'s heartbeat is on ``queue`` (read by this tree)."""
        async with toolnexus.connect(self.url("admin"), queue=queue) as broker:
            for _ in range(600):
                if consumer in {beat.consumer for beat in await broker.heartbeats()}:
                    return
                await asyncio.sleep(0.1)
        raise AssertionError(f"no heartbeat of {consumer} on {queue}")

    async def replace_responder(
        self, name: str, release: Release, *, write_protocol: int | None
    ) -> None:
        await asyncio.to_thread(self.start_responder, name, release, write_protocol=write_protocol)
        started = self.responders[name]
        await self.beating(ONCALL if name == "oncall" else QUEUE, started.log.stem)

    async def replace_agent(
        self, name: str, release: Release, *, write_protocol: int | None
    ) -> None:
        """Agent ``name`` of ``release``: the running one drained (its durable waits left
        open), then the new one waits for them again."""
        old = self.agents.get(name)
        self.agents[name] = None  # asks go to the other agent meanwhile
        detached: list[str] = []
        if old is not None:
            said = await old.drain()
            self.past_agents.append(old)
            detached = [line["id"] for line in said if line.get("detached")]
        extra = {} if write_protocol is None else {WRITE_PROTOCOL_ENV: str(write_protocol)}
        env = self.signed(name, "trusted-by-agents", **extra)
        new = await Agent.start(name, release, self.url(name), QUEUE, env)
        for request_id in detached:
            new.ask(self.asked[request_id])
        self.agents[name] = new

    def running(self) -> set[str]:
        """The consumer names of the responders running now."""
        return {process.log.stem for process in self.responders.values()}

    def status(self, release: Release) -> dict[str, dict[str, Any]]:
        """The live consumers ``toolnexus status --json`` of ``release`` shows (as ops),
        by name."""
        shown = json.loads(
            run(
                release.toolnexus,
                *("status", "--json", "--url", self.url("ops")),
                *("--queue", QUEUE, "--queue", ONCALL),
                env=environment(),
            )
        )
        return {
            consumer["consumer"]: consumer
            for queue in shown["queues"]
            for group in queue["groups"]
            for consumer in group["consumers"]
            if consumer["alive"]
        }

    def ask(self, kind: str, agent: Agent) -> Asked:
        number = next(self.counter)
        request: dict[str, Any] = {
            "id": f"{kind}-{number}-{uuid.uuid4().hex[:8]}",
            "prompt": f"{kind} {number}",
            "timeout_s": HOLD_TIMEOUT_S if kind == "hold" else PLAIN_TIMEOUT_S,
        }
        if kind == "vote":
            request["quorum"] = 2
        if kind in ("durable", "hold"):
            request["durable"] = True
        if kind == "esc":
            request["escalate"] = [[1.0, ONCALL]]
        asked = Asked(request, {"kind": kind})
        self.asked[request["id"]] = asked
        agent.ask(asked)
        return asked

    async def traffic(self, stop: asyncio.Event) -> None:
        """Ask the kinds in turn, each time of the next agent that is running."""
        kinds = itertools.cycle(["yes", "no", "vote", "durable", "esc"])
        turn = itertools.cycle(AGENTS)
        while not stop.is_set():
            agent = self.agents.get(next(turn))
            if agent is not None:
                self.ask(next(kinds), agent)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), ASK_EVERY_S)

    def received(self) -> dict[str, list[dict[str, Any]]]:
        """Each request's answers and errors, as every agent process said them."""
        got: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
        for process in [*self.past_agents, *(a for a in self.agents.values() if a)]:
            for line in process.lines:
                if not line.get("detached"):
                    got[line["id"]].append(line)
        return got


@contextlib.asynccontextmanager
async def fleet_of(tmp: Path, previous: Release, current: Release) -> AsyncIterator[Fleet]:
    keys = tmp / "keys"
    for trusted in ("trusted-by-agents", "trusted-by-responders"):
        (tmp / trusted).mkdir()
    signers = [*AGENTS, *BOTS, "oncall", "desk"]
    for name in signers:
        run(current.toolnexus, "keygen", name, "--dir", keys, env=environment())
        trusted = "trusted-by-responders" if name in AGENTS else "trusted-by-agents"
        (tmp / trusted / f"{name}.pub").write_text((keys / f"{name}.pub").read_text())
    (tmp / "users.acl").write_text(f"user admin on >{ADMIN} +@all ~* &*\n")
    with redis_server(tmp, "--aclfile", str(tmp / "users.acl")) as port:
        fleet = Fleet(tmp, port, keys)
        try:
            yield fleet
        finally:
            for agent in fleet.agents.values():
                if agent is not None:
                    await agent.kill()
            for process in fleet.responders.values():
                process.kill()


async def test_a_fleet_of_the_last_release_upgrades_one_process_at_a_time_losing_nothing(
    tmp_path: Path, previous: Release, current: Release
) -> None:
    async with fleet_of(tmp_path, previous, current) as fleet:
        # the last release's fleet, under its own ACL
        fleet.load_acl(previous)
        for name in (*BOTS, "oncall"):
            await fleet.replace_responder(name, previous, write_protocol=None)
        for name in AGENTS:
            await fleet.replace_agent(name, previous, write_protocol=None)
        agent_1 = fleet.agents[AGENTS[0]]
        assert agent_1 is not None
        hold = fleet.ask("hold", agent_1)  # open across the whole upgrade
        stop = asyncio.Event()
        traffic = asyncio.create_task(fleet.traffic(stop))
        steps: list[tuple[str, Any]] = [
            ("the new ACL", lambda: asyncio.to_thread(fleet.load_acl, current)),
            *(
                (
                    f"{name} upgraded",
                    lambda n=name: fleet.replace_responder(n, current, write_protocol=1),
                )
                for name in (*BOTS, "oncall")
            ),
            *(
                (
                    f"{name} upgraded",
                    lambda n=name: fleet.replace_agent(n, current, write_protocol=1),
                )
                for name in AGENTS
            ),
            *(
                (
                    f"{name} writes protocol 2",
                    lambda n=name: fleet.replace_responder(n, current, write_protocol=None),
                )
                for name in (*BOTS, "oncall")
            ),
            *(
                (
                    f"{name} writes protocol 2",
                    lambda n=name: fleet.replace_agent(n, current, write_protocol=None),
                )
                for name in AGENTS
            ),
        ]
        await asyncio.sleep(2)
        seen = [("before", fleet.running(), await asyncio.to_thread(fleet.status, current))]
        for what, step in steps:
            await step()
            await asyncio.sleep(1.5)  # requests flow between each step
            seen.append((what, fleet.running(), await asyncio.to_thread(fleet.status, current)))
        stop.set()
        await traffic
        # a person answers the wait left open since before the upgrade
        answered = await asyncio.to_thread(
            run,
            current.toolnexus,
            "answer",
            hold.request["id"],
            "--accept",
            "--person",
            "ops:alice",
            "--url",
            fleet.url("responder"),
            "--queue",
            QUEUE,
            env=fleet.signed("desk", "trusted-by-responders"),
        )
        assert "taken by the waiter" in answered, answered
        for name in AGENTS:
            agent = fleet.agents[name]
            assert agent is not None
            await agent.drain()
        for process in fleet.responders.values():
            await asyncio.to_thread(process.stop)
        audit = json.loads(
            run(
                current.toolnexus,
                "audit",
                "--json",
                "--url",
                fleet.url("ops"),
                "--queue",
                QUEUE,
                env=environment(),
            )
        )
        check_every_request_ended_once(fleet, audit)
    # toolnexus status (this tree's, as the ops user) showed every running responder alive
    # at each step, the one just started included
    for what, running, alive in seen:
        assert running <= set(alive), (what, running, sorted(alive))


def expected(kind: str, answer: dict[str, Any]) -> bool:
    """Whether ``answer`` is the one the rule (or the person) gave a request of ``kind``."""
    by = {f"auto:{bot} {kind}" for bot in BOTS}
    if kind == "vote":
        return answer["ok"] is True and answer["approvals"] == sorted(by)
    if kind == "no":
        return (answer["ok"], answer["reason"]) == (False, "declined") and answer["person"] in by
    person = {"esc": {"auto:oncall esc"}, "hold": {"ops:alice"}}.get(kind, by)
    return answer["ok"] is True and answer["person"] in person


def check_every_request_ended_once(fleet: Fleet, audit: list[dict[str, Any]]) -> None:
    """Each request: one answer received, the one its rule or person gave; as many answers
    taken by the responders as it needed (one, or a vote from each bot), none refused for
    another reason than being over; one audit record."""
    got = fleet.received()
    by_group = collections.Counter(
        (request, process.name.partition("@")[0])
        for process in [*fleet.retired, *fleet.responders.values()]
        for request, outcome in process.decisions()
        if outcome == "answered"
    )
    twice = [taken for taken, times in by_group.items() if times > 1]
    assert not twice, f"answered twice by one group: {twice}"
    taken = collections.Counter(request for request, _group in by_group.elements())
    ended = collections.Counter(record["id"] for record in audit)
    problems = []
    for request_id, asked in fleet.asked.items():
        kind = asked.expected["kind"]
        lines = got.get(request_id, [])
        if len(lines) != 1 or "answer" not in lines[0]:
            problems.append(f"{request_id} (asked by {asked.agents}): the agents got {lines}")
        elif not expected(kind, lines[0]["answer"]):
            problems.append(f"{request_id}: not the rule's answer: {lines[0]['answer']}")
        # a vote's line may be missing: a bot's vote that did not decide is logged when its
        # accept() returns, which the request's end may cancel first (the answer's approvals
        # show both votes); never more than one a bot
        logged = taken[request_id]
        if logged > EXPECTED_ANSWERED[kind] or (
            kind != "vote" and logged < EXPECTED_ANSWERED[kind]
        ):
            problems.append(f"{request_id}: the responders answered it {logged} times")
        if ended[request_id] != 1:
            problems.append(f"{request_id}: {ended[request_id]} audit records")
    unknown = set(got) - set(fleet.asked)
    assert not unknown, f"answers to requests nobody asked: {unknown}"
    assert not problems, "\n".join(problems[:30]) + f"\n({len(problems)} problems)"
    kinds = collections.Counter(a.expected["kind"] for a in fleet.asked.values())
    assert min(kinds.values()) >= 1 and kinds["hold"] == 1 and len(fleet.asked) >= 50, kinds
    # the hold was waited for by each agent-1 process in turn: old, new at 1, new at 2
    [hold] = [a for a in fleet.asked.values() if a.expected["kind"] == "hold"]
    assert hold.agents == [AGENTS[0]] * 3, hold.agents
