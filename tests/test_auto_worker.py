"""The auto-policy worker: its rules file, refused at start when wrong, and a fleet of
1,000 requests answered by its rules."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

import toolnexus
from toolnexus import Answer, Broker, Request, Service, Source, new_id
from toolnexus.errors import UnknownRequest
from toolnexus.security import Keyring, SigningKey
from toolnexus_workers.auto import AutoWorker, Rules, RulesError

TOOLNEXUS = str(Path(sys.executable).with_name("toolnexus"))

BOOKING = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 2},
        "guests": {"type": "integer", "minimum": 1, "maximum": 12, "default": 2},
        "seating": {"type": "string", "enum": ["indoor", "terrace"], "default": "indoor"},
    },
    "required": ["name"],
}

FLEET_RULES = """\
# Payments are never authorized unattended.
[[rule]]
name = "no payments"
kind = "authorization"
server = "pay-*"
action = "decline"

[[rule]]
name = "CI bookings"
kind = "input"
tool = ["book_table", "book_room"]
agent = "ci-*"
action = "accept"
data = { name = "Fleet Bot" }

[[rule]]
name = "staging"
kind = "approval"
prompt = "(?i)\\\\bstaging\\\\b"
action = "accept"

[[rule]]
name = "production is for people"
prompt = "(?i)production"
action = "skip"

[[rule]]
name = "everything else"
action = "decline"
"""


def fleet_request(n: int) -> Request:
    """Five kinds of request, in turn; what the rules do with each is in :func:`expected`."""
    source = Source(server=f"srv-{n % 3}", tool="book_table", agent=f"ci-{n % 7}")
    match n % 5:
        case 0:
            payment = Source(server="pay-eu", tool="charge", agent=f"ci-{n}")
            return Request(
                id=new_id(), kind="authorization", url="https://pay.example/", source=payment
            )
        case 1:
            return Request(id=new_id(), kind="input", data={"schema": BOOKING}, source=source)
        case 2:
            return Request(id=new_id(), kind="approval", prompt=f"Deploy build {n} to Staging?")
        case 3:
            return Request(id=new_id(), kind="approval", prompt=f"Deploy build {n} to production?")
        case _:
            return Request(id=new_id(), kind="approval", prompt=f"Drop table {n}?")


def expected(n: int) -> tuple[bool, str | None, object]:
    """(ok, reason, data) the waiter of request ``n`` receives."""
    match n % 5:
        case 0:
            return False, "declined", None
        case 1:
            return True, None, {"name": "Fleet Bot", "guests": 2, "seating": "indoor"}
        case 2:
            return True, None, None
        case 3:
            return False, "dismissed", None  # left by the rules; a person dismissed it
        case _:
            return False, "declined", None


def test_the_first_matching_rule_decides() -> None:
    rules = Rules.parse(FLEET_RULES, "fleet.toml")
    assert len(rules) == 5
    decided = [rules.match(fleet_request(n)) for n in range(5)]
    assert [rule.label if rule else None for rule in decided] == [
        "no payments",
        "CI bookings",
        "staging",
        "production is for people",
        "everything else",
    ]
    # A booking from an agent the rule does not name falls through to the catch-all.
    other = Request(id="r", kind="input", source=Source(tool="book_table", agent="laptop"))
    assert (rule := rules.match(other)) is not None and rule.label == "everything else"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            '[[rule]]\naction = "accept"\nkind = "input\n',
            r"fleet.toml: not valid TOML: .*\(at line 3",
        ),
        ("", r"fleet.toml: no rules: add at least one \[\[rule\]\] table"),
        ('mode = "fast"\n', r"fleet.toml, line 1: unknown top-level key 'mode'"),
        (
            '[[rule]]\naction = "accept"\n\n[[rule]]\nknd = "input"\naction = "decline"\n',
            r"fleet.toml, rule 2 \(line 5\): unknown key 'knd' \(known keys: action, after_s",
        ),
        ('[[rule]]\nkind = "input"\n', r"fleet.toml, rule 1 \(line 1\): 'action' is required"),
        (
            '# comment\n[[rule]]\naction = "maybe"\n',
            r"rule 1 \(line 3\): 'action' must be one of accept, decline, skip, not 'maybe'",
        ),
        (
            '[[rule]]\naction = "accept"\nprompt = "(unclosed"\n',
            r"rule 1 \(line 3\): 'prompt' is not a valid regular expression: missing \)",
        ),
        (
            '[[rule]]\naction = "decline"\ndata = { name = "x" }\n',
            r"rule 1 \(line 3\): 'data' is only for action = \"accept\", not 'decline'",
        ),
        (
            '[[rule]]\naction = "accept"\nafter_s = -1\n',
            r"rule 1 \(line 3\): 'after_s' must be a number of seconds ≥ 0, not -1",
        ),
        (
            '[[rule]]\naction = "accept"\nagent = []\n',
            r"rule 1 \(line 3\): 'agent' must be a glob pattern or a non-empty list of them",
        ),
    ],
)
def test_a_bad_rules_file_is_refused_with_the_line_and_the_reason(text: str, message: str) -> None:
    with pytest.raises(RulesError, match=message):
        Rules.parse(text, "fleet.toml")


@pytest.mark.slow
def test_the_command_refuses_a_bad_rules_file_at_start(tmp_path: Path) -> None:
    bad = tmp_path / "rules.toml"
    bad.write_text('[[rule]]\nkind = "input"\naction = "approve"\n')
    done = subprocess.run(
        [TOOLNEXUS, "worker", "auto", "--rules", str(bad), "--url", "redis://127.0.0.1:1/0"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr.strip() == (
        f"toolnexus worker auto: {bad}, rule 1 (line 3): 'action' must be one of "
        "accept, decline, skip, not 'approve'"
    )
    missing = subprocess.run(
        [TOOLNEXUS, "worker", "auto", "--rules", str(tmp_path / "none.toml"), "--check"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert missing.returncode == 2
    assert "cannot read rules file" in missing.stderr and "none.toml" in missing.stderr


def test_check_says_a_good_rules_file_is_valid(tmp_path: Path) -> None:
    good = tmp_path / "rules.toml"
    good.write_text(FLEET_RULES)
    done = subprocess.run(
        [TOOLNEXUS, "worker", "auto", "--rules", str(good), "--check"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert (done.returncode, done.stdout) == (0, f"{good}: 5 rules, all valid\n")


async def test_a_fleet_of_1000_requests_is_answered_by_the_rules(
    broker: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="toolnexus.auto")
    requests = [fleet_request(n) for n in range(1000)]
    service = Service(broker, AutoWorker(Rules.parse(FLEET_RULES)))
    run = asyncio.create_task(service.run())
    waits = [asyncio.create_task(broker.wait_for(r, timeout_s=60)) for r in requests]
    # What the rules left (production) is answered by a person, in another group.
    left = {r.id for n, r in enumerate(requests) if n % 5 == 3}
    async with asyncio.timeout(60):
        while service.statistics()["skipped"] < len(left):
            await asyncio.sleep(0.05)
    async with broker.responder("people") as people:
        dismissed = 0
        async with asyncio.timeout(60):
            async for pending in people:
                if pending.request.id in left:
                    await pending.dismiss(person="ops:grace")
                    dismissed += 1
                    if dismissed == len(left):
                        break
    answers = await asyncio.wait_for(asyncio.gather(*waits), 60)
    service.stop()
    await run
    for n, answer in enumerate(answers):
        assert (answer.ok, answer.reason, answer.data) == expected(n), n
        if n % 5 != 3:
            assert answer.responder is not None and answer.responder.startswith("auto/")
    assert answers[1].person == "auto:CI bookings"
    stats = service.statistics()
    assert (stats["answered"], stats["skipped"], stats["errors"]) == (800, 200, 0)
    decisions = [r.getMessage() for r in caplog.records if r.name == "toolnexus.auto"]
    assert len(decisions) == 1000
    assert sum("outcome=skipped: left for a person" in line for line in decisions) == 200


async def test_after_s_leaves_a_person_time_to_answer_first(broker: Broker) -> None:
    rules = Rules.parse('[[rule]]\nkind = "approval"\naction = "accept"\nafter_s = 0.5\n')
    worker = AutoWorker(rules)
    service = Service(broker, worker)
    run = asyncio.create_task(service.run())
    try:
        first = Request(id=new_id(), kind="approval", prompt="wait for me")
        waiting = asyncio.create_task(broker.wait_for(first, timeout_s=20))
        await asyncio.sleep(0.1)
        await asyncio.wait_for(_answered_by_a_person(broker, first.id), 10)
        assert (await waiting).person == "ops:grace"
        # Nobody answers the second: the rule does, once after_s has passed.
        second = await broker.wait_for(Request(id=new_id(), kind="approval"), timeout_s=20)
        assert (second.ok, second.person) == (True, "auto:rule 1")
    finally:
        service.stop()
        await run
        await worker.aclose()
    assert service.statistics()["refused"] == 0


async def _answered_by_a_person(broker: Broker, request_id: str) -> None:
    while True:
        try:
            await broker.answer(Answer(id=request_id, ok=True, person="ops:grace"))
            return
        except UnknownRequest:  # not published yet
            await asyncio.sleep(0.02)


@pytest.mark.redis
@pytest.mark.slow
async def test_a_worker_with_a_key_signs_its_answers(
    redis_url: str, namespace: str, tmp_path: Path
) -> None:
    """Every worker answers through the broker, which signs with the configured key: a
    waiter that requires signatures takes the auto worker's answer as its key's."""
    agent, bot = SigningKey.generate("agent-1"), SigningKey.generate("auto-bot")
    for key in (agent, bot):
        key.save(tmp_path)
    rules = tmp_path / "rules.toml"
    rules.write_text('[[rule]]\nkind = "approval"\naction = "accept"\n')
    env = {
        **os.environ,
        "TOOLNEXUS_SIGNING_KEY": str(tmp_path / "auto-bot.key"),
        "TOOLNEXUS_TRUSTED_KEYS": str(tmp_path / "agent-1.pub"),
        "TOOLNEXUS_REQUIRE_SIGNATURES": "1",
    }
    worker = subprocess.Popen(
        [TOOLNEXUS, "worker", "auto", "--url", redis_url, "--namespace", namespace,
         "--rules", str(rules)],
        env=env,
    )  # fmt: skip
    try:
        async with toolnexus.connect(
            redis_url,
            namespace=namespace,
            signing_key=agent,
            trusted_keys=Keyring.of(bot),
            require_signatures=True,
        ) as broker:
            answer = await broker.wait_for(
                Request(id=new_id(), kind="approval", prompt="Deploy to staging?"), timeout_s=60
            )
    finally:
        worker.terminate()
        worker.wait(20)
    assert (answer.ok, answer.responder) == (True, "auto-bot")
    assert answer.signature is not None and answer.signature.key == "auto-bot"
