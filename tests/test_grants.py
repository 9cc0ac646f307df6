"""Time-limited grants (issue 45): a person's signed grant lets the auto worker accept the
same agent's calls of the same tool (and arguments) until it expires or is revoked; anything
else (another agent, tool or arguments, an expired, over-long, forged or unsigned grant)
falls through to the rules, and so to people."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2 as httpx
import msgspec
import pytest
from playwright.async_api import Browser, async_playwright, expect

import toolnexus
from conformance import CHROMIUM, CHROMIUM_ARGS
from conftest import FAST
from toolnexus import Request, Service
from toolnexus.errors import SignatureError
from toolnexus.frameworks import decide, tool_call_of, tool_call_request
from toolnexus.grants import GRANTS_STORE, Grants, covers, make_grant, why_not_valid
from toolnexus.models import Grant
from toolnexus.rendering import request_anchor
from toolnexus.security import Keyring, SigningKey, sign_grant, verify_grant
from toolnexus_workers.auto import AutoWorker, GrantCheck, Rules
from toolnexus_workers.web.access import Access
from toolnexus_workers.web.server import WebServer

TOOLNEXUS = str(Path(sys.executable).with_name("toolnexus"))
HOUR = 3600.0


def test_a_grant_is_signed_over_every_field() -> None:
    web, mallory = SigningKey.generate("web-1"), SigningKey.generate("mallory")
    trusted = Keyring.of(web)
    grant = make_grant(
        web, agent="ci-agent", tool="transfer", minutes=10, arguments={"to": "acme"}, person="ann"
    )
    assert verify_grant(grant, trusted) == "web-1"
    assert grant.expires_at - grant.granted_at == 600
    for change in (
        {"agent": "other"},
        {"tool": "lookup"},
        {"arguments": None},
        {"arguments": {"to": "acme", "amount": 1}},
        {"expires_at": grant.expires_at + 1},
        {"granted_at": grant.granted_at + 1},
        {"person": "bob"},
        {"id": "grant-2"},
    ):
        widened = msgspec.structs.replace(grant, **change)
        with pytest.raises(SignatureError, match="bad signature"):
            verify_grant(widened, trusted)
    with pytest.raises(SignatureError, match="missing signature"):
        verify_grant(msgspec.structs.replace(grant, signature=None), trusted)
    forged = sign_grant(msgspec.structs.replace(grant, signature=None), mallory)
    with pytest.raises(SignatureError, match="unknown key 'mallory'"):
        verify_grant(forged, trusted)
    # a signature by a trusted key under another name is not that key's
    posing = msgspec.structs.replace(
        forged, signature=msgspec.structs.replace(forged.signature, key="web-1")
    )
    with pytest.raises(SignatureError, match="bad signature"):
        verify_grant(posing, trusted)


def test_a_grant_covers_exactly_its_agent_tool_and_arguments() -> None:
    web = SigningKey.generate("web-1")
    any_arguments = make_grant(web, agent="ci-agent", tool="transfer", minutes=5)
    assert covers(any_arguments, "ci-agent", "transfer", {"amount": 9})
    assert not covers(any_arguments, None, "transfer", {})  # unverified: never
    assert not covers(any_arguments, "ci-agent-2", "transfer", {})
    assert not covers(any_arguments, "ci-agent", "transfer_all", {})
    named = make_grant(
        web, agent="ci-agent", tool="transfer", minutes=5, arguments={"amount": 1, "to": "acme"}
    )
    assert covers(named, "ci-agent", "transfer", {"amount": 1, "to": "acme"})
    assert covers(named, "ci-agent", "transfer", {"amount": 1, "to": "acme", "memo": "x"})
    assert not covers(named, "ci-agent", "transfer", {"amount": 1})  # one missing
    assert not covers(named, "ci-agent", "transfer", {"amount": 2, "to": "acme"})
    assert not covers(named, "ci-agent", "transfer", {"amount": True, "to": "acme"})
    assert not covers(named, "ci-agent", "transfer", {"amount": 1.0, "to": "acme"})
    assert not covers(named, "ci-agent", "transfer", {"amount": 1, "to": ["acme"]})


def test_only_a_trusted_current_grant_within_the_maximum_counts() -> None:
    web = SigningKey.generate("web-1")
    trusted = Keyring.of(web)
    now = time.time()
    grant = make_grant(web, agent="a", tool="t", minutes=30, now=now)
    assert why_not_valid(grant, trusted, HOUR, now) is None
    assert why_not_valid(grant, trusted, HOUR, now + 1800) == "expired"
    assert why_not_valid(grant, trusted, 600, now) == "longer than the maximum of 10 minutes"
    # dated ahead, it still cannot outlast the maximum from now
    ahead = make_grant(web, agent="a", tool="t", minutes=10, now=now + 3 * HOUR)
    assert why_not_valid(ahead, trusted, HOUR, now) == "longer than the maximum of 60 minutes"
    assert why_not_valid(grant, Keyring(), HOUR, now) == (
        f"grant {grant.id!r} refused: unknown key 'web-1'"
    )
    with pytest.raises(toolnexus.ConfigurationError, match="positive number of minutes"):
        make_grant(web, agent="a", tool="t", minutes=0)


def call(name: str, agent: str = "ci-agent", **arguments: Any) -> Request:
    return tool_call_request(name, arguments, framework="test", agent=agent)


def _logged(log: Path, needle: str) -> bool:
    return needle in log.read_text(encoding="utf-8", errors="replace")


async def _until(condition: Any, what: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


def _raw(grant: Grant) -> bytes:
    return msgspec.msgpack.encode(grant)


@pytest.mark.redis
@pytest.mark.slow
async def test_the_auto_worker_honours_a_grant_and_nothing_wider(
    redis_url: str, namespace: str, tmp_path: Path
) -> None:
    ci, other, web = (SigningKey.generate(n) for n in ("ci-agent", "other-agent", "web-1"))
    mallory = SigningKey.generate("mallory")
    for key in (ci, other, web):
        key.save(tmp_path / "keys")
    agents = tmp_path / "agents.pub"
    agents.write_text(ci.public_line() + "\n" + other.public_line() + "\n")
    rules = tmp_path / "rules.toml"
    rules.write_text('[[rule]]\nkind = "*"\naction = "skip"\n')
    log = tmp_path / "auto.log"
    env = {**os.environ, "TOOLNEXUS_TRUSTED_KEYS": str(agents)}
    with log.open("w") as stderr:
        worker = subprocess.Popen(
            [TOOLNEXUS, "worker", "auto", "--url", redis_url, "--namespace", namespace,
             "--rules", str(rules), "--grant-keys", str(tmp_path / "keys" / "web-1.pub"),
             "--max-grant-minutes", "30"],
            env=env,
            stderr=stderr,
        )  # fmt: skip
    try:
        async with (
            toolnexus.connect(redis_url, namespace=namespace, signing_key=ci) as as_ci,
            toolnexus.connect(redis_url, namespace=namespace, signing_key=other) as as_other,
            toolnexus.connect(redis_url, namespace=namespace) as unsigned,
        ):
            grants = Grants(unsigned)
            store = unsigned.store(GRANTS_STORE)
            granted = make_grant(
                web, agent="ci-agent", tool="transfer", minutes=10,
                arguments={"to": "acme", "amount": 50}, person="web:ann",
            )  # fmt: skip
            await grants.keep(granted)
            brief = make_grant(web, agent="ci-agent", tool="brief", minutes=0.05)
            await grants.keep(brief)
            # every grant below fails closed: its tool is left for people
            unsigned_grant = msgspec.structs.replace(
                make_grant(web, agent="ci-agent", tool="unsigned_tool", minutes=10),
                signature=None,
            )
            forged = make_grant(mallory, agent="ci-agent", tool="forged_tool", minutes=10)
            too_long = make_grant(web, agent="ci-agent", tool="long_tool", minutes=31)
            expired = make_grant(
                web, agent="ci-agent", tool="expired_tool", minutes=5, now=time.time() - 600
            )
            for grant in (unsigned_grant, forged, too_long, expired):
                await store.set(grant.id, _raw(grant), ttl_s=600)
            await store.set("garbage", b"\x92not a grant", ttl_s=600)

            proposed = call("transfer", to="acme", amount=50)
            for request in (proposed, _again(proposed)):  # honoured until it ends
                answer = await as_ci.wait_for(request, timeout_s=60)
                assert (answer.ok, answer.person) == (True, f"auto:grant {granted.id} from web:ann")
                assert decide(request, answer).approved
            more = call("transfer", to="acme", amount=50, memo="x")
            extra = await as_ci.wait_for(more, timeout_s=60)
            assert extra.ok  # the arguments named hold; others are free
            assert (await as_ci.wait_for(call("brief"), timeout_s=60)).ok

            left: list[tuple[Any, Request]] = [
                (as_other, call("transfer", agent="other-agent", to="acme", amount=50)),
                (unsigned, call("transfer", to="acme", amount=50)),  # claims ci-agent
                (as_ci, call("lookup", to="acme", amount=50)),
                (as_ci, call("transfer", to="acme", amount=51)),
                (as_ci, call("transfer", to="acme")),
                (as_ci, call("unsigned_tool")),
                (as_ci, call("forged_tool")),
                (as_ci, call("long_tool")),
                (as_ci, call("expired_tool")),
            ]
            await asyncio.sleep(brief.expires_at - time.time() + 0.2)
            left.append((as_ci, call("brief")))  # its grant has just expired
            waits = [asyncio.create_task(b.wait_for(r, timeout_s=60)) for b, r in left]
            for _, request in left:
                await _until(
                    lambda r=request: _logged(log, f"decision=skip request={r.id}"),  # type: ignore[misc]
                    f"the worker to leave {request.id} for people",
                )

            listed = subprocess.run(
                [TOOLNEXUS, "grants", "list", "--url", redis_url, "--namespace", namespace],
                capture_output=True, text=True, timeout=30, check=True,
            )  # fmt: skip
            assert (
                f"{granted.id} agent=ci-agent tool=transfer "
                '{"to": "acme", "amount": 50} until ' in listed.stdout
            )
            assert f"{unsigned_grant.id} agent=ci-agent tool=unsigned_tool" in listed.stdout
            assert "(key UNSIGNED)" in listed.stdout and "(key mallory)" in listed.stdout
            revoked = subprocess.run(
                [TOOLNEXUS, "grants", "revoke", granted.id, "--url", redis_url,
                 "--namespace", namespace],
                capture_output=True, text=True, timeout=30, check=False,
            )  # fmt: skip
            assert (revoked.returncode, revoked.stdout) == (0, f"revoked {granted.id}\n")
            again = subprocess.run(
                [TOOLNEXUS, "grants", "revoke", granted.id, "--url", redis_url,
                 "--namespace", namespace],
                capture_output=True, text=True, timeout=30, check=False,
            )  # fmt: skip
            assert again.returncode == 1
            assert again.stderr == f"toolnexus grants: no grant {granted.id} on queue 'default'\n"
            after = _again(proposed)
            left.append((as_ci, after))
            waits.append(asyncio.create_task(as_ci.wait_for(after, timeout_s=60)))
            await _until(
                lambda: _logged(log, f"decision=skip request={after.id}"), "the revocation"
            )

            ids = {request.id for _, request in left}
            async with unsigned.responder("people") as people:
                async with asyncio.timeout(30):
                    async for pending in people:
                        if pending.request.id in ids:
                            await pending.decline(person="ops:grace")
                            ids.discard(pending.request.id)
                            if not ids:
                                break
            for answer in await asyncio.gather(*waits):
                assert (answer.ok, answer.person) == (False, "ops:grace")
    finally:
        worker.terminate()
        worker.wait(20)
    text = log.read_text()
    assert f"decision=accept request={proposed.id} grant={granted.id} (from web:ann" in text
    assert "principal=Agent::'ci-agent'" in text
    assert f"{forged.id} for ci-agent/forged_tool does not count: grant " in text
    assert "unknown key 'mallory'" in text
    assert f"{too_long.id} for ci-agent/long_tool does not count: longer than" in text
    assert f"{expired.id} for ci-agent/expired_tool does not count: expired" in text
    assert "entry 'garbage' is not a grant" in text


def _again(request: Request) -> Request:
    """The same call as ``request``, asked anew (a fresh request id)."""
    proposed = tool_call_of(request)
    return call(proposed.name, request.source.agent or "", **proposed.arguments)


# -- granting on the web page, in Chromium ---------------------------------------------

TOKEN = "grants-test-token"
WAIT_MS = 20_000


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield launched
        await launched.close()


@pytest.mark.redis
@pytest.mark.slow
async def test_a_person_grants_a_tool_on_the_web_page_and_the_auto_worker_honours_it(
    redis_url: str, namespace: str, browser: Browser
) -> None:
    ci, web = SigningKey.generate("ci-agent"), SigningKey.generate("web-1")
    agents = Keyring.of(ci)
    async with (
        toolnexus.connect(redis_url, namespace=namespace, signing_key=ci) as asking,
        toolnexus.connect(
            redis_url, namespace=namespace, signing_key=web, trusted_keys=agents, **FAST
        ) as page_broker,
        toolnexus.connect(redis_url, namespace=namespace, trusted_keys=agents) as auto,
        WebServer(page_broker, port=0, access=Access(token=TOKEN)) as server,
    ):
        skip_all = Rules.parse('[[rule]]\nkind = "*"\naction = "skip"\n')
        check = GrantCheck(Grants(auto), Keyring.of(web), max_s=HOUR)
        service = Service(auto, AutoWorker(skip_all, grants=check))
        run = asyncio.create_task(service.run())
        try:
            page = await browser.new_page()
            await page.goto(f"{server.url}?token={TOKEN}")
            await expect(page.locator("#live[data-state=live]")).to_be_visible(timeout=WAIT_MS)

            first = call("transfer", to="acme", amount=50)
            answered = asyncio.create_task(asking.wait_for(first, timeout_s=60))
            card = page.locator(f"article#{request_anchor(first.id)}")
            await expect(card).to_be_visible(timeout=WAIT_MS)
            grant_choice = card.get_by_label("If you approve, also let this agent call transfer")
            await grant_choice.select_option(label="for 10 minutes")
            await expect(card.get_by_label("only with these arguments")).to_be_checked()
            await card.get_by_role("button", name="Approve").click()
            answer = await asyncio.wait_for(answered, 30)
            assert (answer.ok, answer.person) == (True, "web:token")
            await expect(page.locator("#notes .note")).to_contain_text(
                "may call transfer with these arguments for 10 minutes", timeout=WAIT_MS
            )
            (grant,) = await Grants(auto).all()
            assert (grant.agent, grant.tool, grant.arguments, grant.person) == (
                "ci-agent",
                "transfer",
                {"to": "acme", "amount": 50},
                "web:token",
            )
            assert grant.expires_at - grant.granted_at == 600
            assert verify_grant(grant, Keyring.of(web)) == "web-1"

            again = await asyncio.wait_for(asking.wait_for(_again(first), timeout_s=60), 30)
            assert (again.ok, again.person) == (True, f"auto:grant {grant.id} from web:token")
            # the page lists the grant in force; revoking it there ends it
            await page.reload()
            listed = page.locator("section.grants li.grant")
            await expect(listed).to_contain_text(
                'ci-agent may call transfer with {"to": "acme", "amount": 50}'
            )
            await expect(listed).to_contain_text("(granted by web:token)")
            revoke = page.get_by_role("button", name="Revoke the grant of transfer to ci-agent")
            await revoke.click()
            await expect(page.locator("section.grants")).to_have_count(0)
            assert await Grants(auto).all() == []
            revoked = _again(first)
            left = asyncio.create_task(asking.wait_for(revoked, timeout_s=60))
            revoked_card = page.locator(f"article#{request_anchor(revoked.id)}")
            await expect(revoked_card).to_be_visible(timeout=WAIT_MS)  # for people again
            await revoked_card.get_by_role("button", name="Deny").click()
            assert not (await asyncio.wait_for(left, 30)).ok

            other = call("transfer", to="acme", amount=5000)
            waiting = asyncio.create_task(asking.wait_for(other, timeout_s=60))
            other_card = page.locator(f"article#{request_anchor(other.id)}")
            await expect(other_card).to_be_visible(timeout=WAIT_MS)  # left for people
            await other_card.get_by_role("button", name="Deny").click()
            assert not (await asyncio.wait_for(waiting, 30)).ok
        finally:
            service.stop()
            await run


async def test_the_page_offers_no_grant_for_an_unverified_agent(
    redis_url: str, namespace: str, browser: Browser
) -> None:
    web = SigningKey.generate("web-1")
    async with (
        toolnexus.connect(redis_url, namespace=namespace) as asking,
        toolnexus.connect(redis_url, namespace=namespace, signing_key=web, **FAST) as on_page,
        WebServer(on_page, port=0, access=Access(token=TOKEN)) as server,
    ):
        page = await browser.new_page()
        await page.goto(f"{server.url}?token={TOKEN}")
        request = call("transfer", to="acme", amount=50)  # claims ci-agent, unsigned
        waiting = asyncio.create_task(asking.wait_for(request, timeout_s=60))
        card = page.locator(f"article#{request_anchor(request.id)}")
        await expect(card).to_be_visible(timeout=WAIT_MS)
        await expect(card.locator(".field.grant")).to_have_count(0)
        # a forged form asking for a grant anyway is refused, and nothing is answered
        async with httpx.AsyncClient(base_url=server.url) as client:
            refused = await client.post(
                "/answer",
                data={"request": request.id, "action": "accept", "grant_minutes": "10"},
                headers={"Authorization": f"Bearer {TOKEN}"},
            )
        assert refused.status_code == 422
        assert "agent is not verified (its request is unsigned)" in refused.text
        assert not waiting.done()
        await card.get_by_role("button", name="Deny").click()
        assert not (await asyncio.wait_for(waiting, 30)).ok
        assert await Grants(on_page).all() == []


def test_the_auto_worker_refuses_grant_options_it_cannot_use(tmp_path: Path) -> None:
    rules = tmp_path / "rules.toml"
    rules.write_text('[[rule]]\nkind = "*"\naction = "skip"\n')
    missing = tmp_path / "nobody.pub"

    def auto(*options: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [TOOLNEXUS, "worker", "auto", "--rules", str(rules), "--url", "redis://127.0.0.1:1/0",
             *options],
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip

    unreadable = auto("--grant-keys", str(missing))
    assert unreadable.returncode == 2
    assert unreadable.stderr == (
        f"toolnexus worker auto: cannot read trusted keys {missing}: No such file or directory\n"
    )
    for minutes in ("0", "-5", "nan"):
        bad = auto("--grant-keys", str(missing), "--max-grant-minutes", minutes)
        assert bad.returncode == 2
        assert "--max-grant-minutes must be a positive number of minutes" in bad.stderr
