"""``toolnexus worker auto --policy FILE.cedar`` (issue 45): a Cedar policy decides, with
the asking agent's verified signer as its principal; errors fail closed; a broken policy
file is refused at start; ``--shadow`` answers nothing and counts agreement with people."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import toolnexus
from toolnexus import Broker, Request, Service, new_id
from toolnexus.frameworks import decide, tool_call_request
from toolnexus.security import Keyring, SigningKey
from toolnexus_workers.auto import AutoWorker
from toolnexus_workers.policy import Policy, PolicyError

TOOLNEXUS = str(Path(sys.executable).with_name("toolnexus"))

POLICY = """\
@id("ci may transfer small amounts")
permit (principal == Agent::"ci-agent", action == Action::"tool:transfer", resource)
when { resource.arguments.amount <= 100 };

@id("no transfers to mallory")
forbid (principal, action == Action::"tool:transfer", resource)
when { resource.arguments.to == "mallory" };

@id("lookups are fine")
permit (principal, action == Action::"tool:lookup", resource);

@id("no large lookups")
forbid (principal, action == Action::"tool:lookup", resource)
when { resource.arguments.limit > 10 };
"""


def call(name: str, **arguments: Any) -> Request:
    return tool_call_request(name, arguments, framework="test", agent="ci-agent")


def test_each_decision_of_the_policy() -> None:
    policy = Policy.parse(POLICY, "fleet.cedar")
    assert len(policy) == 4

    def decided(request: Request, signer: str | None = "ci-agent") -> tuple[str, tuple[str, ...]]:
        decision = policy.decide(request, signer, "default")
        return decision.verdict, decision.policies

    assert decided(call("transfer", amount=50, to="acme")) == (
        "accept",
        ("ci may transfer small amounts",),
    )
    # forbid wins over permit, and names the policy that forbade
    assert decided(call("transfer", amount=50, to="mallory")) == (
        "decline",
        ("no transfers to mallory",),
    )
    assert decided(call("transfer", amount=500, to="acme")) == ("skip", ())  # no decision
    # the request claims ci-agent, but nobody trusted signed it: the permit cannot apply
    assert decided(call("transfer", amount=50, to="acme"), signer=None) == ("skip", ())
    assert decided(call("transfer", amount=50, to="acme"), signer="other") == ("skip", ())
    # another kind of request is another action: nothing here decides it
    assert decided(Request(id=new_id(), kind="approval", prompt="Deploy?")) == ("skip", ())
    # a request of another kind cannot pose as a tool's action, which a permit allows
    lookups = Policy.parse('permit (principal, action == Action::"tool:lookup", resource);')
    posing = Request(id=new_id(), kind="tool:lookup", prompt="Look up?")
    assert lookups.decide(posing, "ci-agent", "default").verdict == "decline"
    assert lookups.decide(call("lookup"), "ci-agent", "default").verdict == "accept"


def test_an_evaluation_error_declines_even_when_a_permit_applies() -> None:
    """The forbid fails on a string limit; Cedar alone would allow (the permit applies)."""
    policy = Policy.parse(POLICY)
    decision = policy.decide(call("lookup", limit="lots"), "ci-agent", "default")
    assert decision.verdict == "decline"
    assert decision.why.startswith("error: ") and "policy3" in decision.why
    assert policy.decide(call("lookup", limit=5), "ci-agent", "default").verdict == "accept"
    # configured so, an error leaves the request for people instead: never accepts
    to_people = Policy.parse(POLICY, on_error="skip")
    assert to_people.decide(call("lookup", limit="lots"), "ci-agent", "default").verdict == "skip"
    # an argument Cedar cannot hold (a fraction finer than 4 places) is left out: the
    # policy that reads it fails, and so the request is declined
    finer = policy.decide(call("transfer", amount=0.123456, to="acme"), "ci-agent", "default")
    assert finer.verdict == "decline" and "amount" in finer.why
    # a fraction Cedar can hold is a decimal: comparing it with a Long is an error too
    assert policy.decide(
        call("transfer", amount=1.5, to="acme"), "ci-agent", "default"
    ).verdict == ("decline")


def test_arguments_cannot_forge_entities() -> None:
    """An argument shaped like Cedar's entity escape is left out, not read as an entity."""
    policy = Policy.parse(
        'permit (principal, action, resource) when { resource.arguments.who == Agent::"ci" };'
    )
    forged = call("transfer", who={"__entity": {"type": "Agent", "id": "ci"}})
    decision = policy.decide(forged, None, "default")
    assert decision.verdict == "decline" and "who" in decision.why


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("permit (principal, action, resource) when { x ", "not a valid Cedar policy set: "),
        ("permit (principal, acton, resource);", "not a valid Cedar policy set: "),
        ("// nothing here\n", "no policies: add at least one permit or forbid"),
        (
            "permit (principal == ?principal, action, resource);",
            "templates (?principal, ?resource) decide nothing here",
        ),
    ],
)
def test_a_bad_policy_is_refused(text: str, problem: str) -> None:
    with pytest.raises(PolicyError, match=f"^fleet.cedar: {re.escape(problem)}"):
        Policy.parse(text, "fleet.cedar")


def test_the_command_refuses_a_broken_policy_file_in_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "fleet.cedar"
    bad.write_text("permit (principal, action, resource) when { resource.to == };\n")
    done = subprocess.run(
        [TOOLNEXUS, "worker", "auto", "--policy", str(bad), "--url", "redis://127.0.0.1:1/0"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr == (
        f"toolnexus worker auto: {bad}: not a valid Cedar policy set: unexpected token `}}`\n"
    )
    good = tmp_path / "good.cedar"
    good.write_text(POLICY)
    checked = subprocess.run(
        [TOOLNEXUS, "worker", "auto", "--policy", str(good), "--check"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert (checked.returncode, checked.stdout) == (0, f"{good}: 4 policies, all valid\n")
    shadowed_rules = subprocess.run(
        [TOOLNEXUS, "worker", "auto", "--rules", str(good), "--shadow"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert shadowed_rules.returncode == 2
    assert shadowed_rules.stderr.strip().endswith("--shadow is for a policy (--policy), not rules")


def _logged(log: Path, needle: str) -> bool:
    return needle in log.read_text(encoding="utf-8", errors="replace")


async def _until(condition: Any, what: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


@pytest.mark.redis
@pytest.mark.slow
async def test_the_policy_worker_decides_as_a_process(
    redis_url: str, namespace: str, tmp_path: Path
) -> None:
    agent = SigningKey.generate("ci-agent")
    agent.save(tmp_path)
    policy = tmp_path / "fleet.cedar"
    policy.write_text(POLICY)
    log = tmp_path / "auto.log"
    env = {**os.environ, "TOOLNEXUS_TRUSTED_KEYS": str(tmp_path / "ci-agent.pub")}
    with log.open("w") as stderr:
        worker = subprocess.Popen(
            [TOOLNEXUS, "worker", "auto", "--url", redis_url, "--namespace", namespace,
             "--policy", str(policy)],
            env=env,
            stderr=stderr,
        )  # fmt: skip
    try:
        async with (
            toolnexus.connect(redis_url, namespace=namespace, signing_key=agent) as signed,
            toolnexus.connect(redis_url, namespace=namespace) as unsigned,
        ):
            proposed = call("transfer", amount=50, to="acme")
            small = await signed.wait_for(proposed, timeout_s=60)
            assert (small.ok, small.person) == (True, "auto:policy ci may transfer small amounts")
            decided = decide(proposed, small)  # the call as proposed
            assert (decided.approved, decided.arguments) == (True, {"amount": 50, "to": "acme"})

            mallory = await signed.wait_for(call("transfer", amount=50, to="mallory"), timeout_s=60)
            assert (mallory.ok, mallory.reason) == (False, "declined")
            assert mallory.data == "forbidden by policy no transfers to mallory"

            failed = await signed.wait_for(call("lookup", limit="lots"), timeout_s=60)
            assert (failed.ok, failed.reason) == (False, "declined")
            assert isinstance(failed.data, str) and "the policy failed closed" in failed.data

            # No decision: left for people (another group), who answer it.
            large = call("transfer", amount=500, to="acme")
            forged = call("transfer", amount=50, to="acme")  # claims ci-agent, unsigned
            waits = [
                asyncio.create_task(signed.wait_for(large, timeout_s=60)),
                asyncio.create_task(unsigned.wait_for(forged, timeout_s=60)),
            ]
            for request in (large, forged):
                await _until(
                    lambda r=request: _logged(log, f"decision=skip request={r.id}"),  # type: ignore[misc]
                    f"the worker to leave {request.id}",
                )
            assert _logged(
                log, f"request={forged.id} policy=none (no decision) principal=unverified"
            )
            async with unsigned.responder("people") as people:
                left = {large.id, forged.id}
                async with asyncio.timeout(30):
                    async for pending in people:
                        if pending.request.id in left:
                            await pending.decline(person="ops:grace")
                            left.discard(pending.request.id)
                            if not left:
                                break
            for answer in await asyncio.gather(*waits):
                assert (answer.ok, answer.person) == (False, "ops:grace")
    finally:
        worker.terminate()
        worker.wait(20)
    text = log.read_text()
    assert f"decision=accept request={small.id} policy=ci may transfer small amounts" in text
    assert "principal=Agent::'ci-agent'" in text
    assert "decision=decline" in text and "policy=no transfers to mallory (forbid)" in text


SCRIPT: list[tuple[dict[str, Any], str, str]] = [
    # (the call's arguments, what people answer, how the shadow policy counts it)
    ({"amount": 10, "to": "acme"}, "accept", "agreed"),
    ({"amount": 20, "to": "acme"}, "accept", "agreed"),
    ({"amount": 30, "to": "acme"}, "decline", "disagreed"),
    ({"amount": 10, "to": "mallory"}, "decline", "agreed"),
    ({"amount": 20, "to": "mallory"}, "accept", "disagreed"),
    ({"amount": 500, "to": "acme"}, "accept", "undecided"),
    ({"amount": 40, "to": "acme"}, "dismiss", "unresolved"),
]

SHADOW_RESOLVED = ("agreed", "disagreed", "undecided", "unresolved")


@pytest.mark.redis
async def test_shadow_mode_answers_nothing_and_counts_agreement(
    redis_url: str, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="toolnexus.auto")
    agent = SigningKey.generate("ci-agent")
    async with (
        toolnexus.connect(redis_url, namespace=namespace, signing_key=agent) as asking,
        toolnexus.connect(redis_url, namespace=namespace, trusted_keys=Keyring.of(agent)) as auto,
        toolnexus.connect(redis_url, namespace=namespace) as answering,
    ):
        worker = AutoWorker(Policy.parse(POLICY), shadow=True)
        service = Service(auto, worker, heartbeat_ttl_s=0.6)
        run = asyncio.create_task(service.run())
        try:
            requests = [call("transfer", **arguments) for arguments, _, _ in SCRIPT]
            waits = [asyncio.create_task(asking.wait_for(r, timeout_s=60)) for r in requests]
            await _until(lambda: service.statistics()["shown"] == len(SCRIPT), "the shadow")
            assert worker.agreement()["pending"] == len(SCRIPT)
            await _people_answer(
                answering, {r.id: s[1] for r, s in zip(requests, SCRIPT, strict=True)}
            )
            answers = await asyncio.wait_for(asyncio.gather(*waits), 30)
            await _until(lambda: worker.agreement()["pending"] == 0, "the resolutions")
            counts = worker.agreement()
            beats = await _shadow_beat(auto)
        finally:
            service.stop()
            await run
    assert all(answer.person == "ops:grace" for answer in answers)  # none by the shadow
    assert service.statistics()["answered"] == 0
    expected = {"agreed": 3, "disagreed": 2, "undecided": 1, "unresolved": 1, "pending": 0}
    assert counts == expected
    assert {k.removeprefix("shadow_"): v for k, v in beats.items()} == expected
    lines = [r.getMessage() for r in caplog.records if r.name == "toolnexus.auto"]
    assert sum("outcome=shadow: not answered" in line for line in lines) == len(SCRIPT)
    assert any(
        f"shadow request={requests[2].id} policy=accept policies=ci may transfer small amounts "
        "people=decline disagreed" in line
        for line in lines
    )


async def _people_answer(broker: Broker, script: dict[str, str]) -> None:
    """Answer each request as ``script`` says, as a person in the group ``people``."""
    left = dict(script)
    async with broker.responder("people") as people:
        async with asyncio.timeout(30):
            async for pending in people:
                action = left.pop(pending.request.id, None)
                if action == "accept":
                    await pending.accept(person="ops:grace")
                elif action == "decline":
                    await pending.decline(person="ops:grace")
                elif action == "dismiss":
                    await pending.dismiss(person="ops:grace")
                if not left:
                    return


async def _shadow_beat(broker: Broker) -> dict[str, Any]:
    """The shadow counters in the auto worker's heartbeat, once it tells the final ones."""
    deadline = time.monotonic() + 10
    while True:
        beats = [b for b in await broker.heartbeats() if b.group == "auto"]
        told = {k: v for b in beats for k, v in b.info.items() if k.startswith("shadow_")}
        resolved = sum(told.get(f"shadow_{k}", 0) for k in SHADOW_RESOLVED)
        if resolved == len(SCRIPT) or time.monotonic() > deadline:
            return told
        await asyncio.sleep(0.1)
