"""The web worker (`toolnexus worker web`) in a real browser: Debian's chromium driven by
Playwright, requests published through Redis by agents in other processes."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import re
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
from playwright.async_api import Browser, Page, async_playwright, expect

import helpers
import toolnexus
from conformance import CHROMIUM, CHROMIUM_ARGS
from conftest import FAST
from toolnexus import Answer, Broker, ConfigurationError, Quorum, Request
from toolnexus.models import Hop
from toolnexus.rendering import check_link, form_data, form_fields
from toolnexus.security import Keyring, SigningKey
from toolnexus_workers.web.access import Access, hash_password, load_users, verify_password
from toolnexus_workers.web.app import CONTENT_SECURITY_POLICY
from toolnexus_workers.web.board import FOLLOWER_BACKLOG, Board
from toolnexus_workers.web.server import WebServer
from waiting_agents import AgentFactory

TOKEN = "s3cret-token-for-the-tests"
WAIT_MS = 20_000  # for the page to show something; generous on a loaded 2-core machine
ROOT = Path(__file__).resolve().parent.parent

expect.set_options(timeout=WAIT_MS)
pytestmark = [pytest.mark.redis, pytest.mark.timeout(120)]


@pytest.fixture
async def broker(redis_url: str, namespace: str) -> AsyncIterator[Broker]:
    async with toolnexus.connect(redis_url, namespace=namespace, **FAST) as b:
        yield b


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    if shutil.which(CHROMIUM) is None:
        pytest.fail(f"{CHROMIUM} is missing: `apt-get install chromium` (.ci/run does)")
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield launched
        await launched.close()


@contextlib.asynccontextmanager
async def serving(broker: Broker, **options: Any) -> AsyncIterator[WebServer]:
    options.setdefault("access", Access(token=TOKEN))
    async with WebServer(broker, port=0, **options) as web:
        yield web


async def signed_in_page(browser: Browser, web: WebServer) -> Page:
    """A page signed in with the token, its live stream connected."""
    page = await browser.new_page()
    page.set_default_timeout(WAIT_MS)
    await page.goto(f"{web.url}?token={TOKEN}")
    await expect(page.locator("#live[data-state=live]")).to_be_visible(timeout=WAIT_MS)
    return page


def card(page: Page, request: Request) -> Any:
    return page.locator("article.request", has_text=request.prompt)


ask = functools.partial(helpers.ask, kind="input", source=helpers.AGENT_7)
"""A request from agent-7's booking tool: a form unless ``kind`` says otherwise."""


# -- the page, live ------------------------------------------------------------------


async def test_a_request_from_an_agent_process_appears_without_reload(
    broker: Broker, browser: Browser, agents: AgentFactory
) -> None:
    async with serving(broker) as web:
        page = await signed_in_page(browser, web)
        await expect(page.locator("#empty")).to_be_visible()
        first = await agents(ask("Deploy build 41 to production?", kind="approval"))
        shown = card(page, first.request)
        await expect(shown).to_be_visible(timeout=WAIT_MS)
        await expect(page.locator("#empty")).to_be_hidden()
        for who in ("server booking", "tool book_table", "agent agent-7"):
            await expect(shown.locator(".source", has_text=who)).to_be_visible()
        await expect(shown.locator(".left")).to_have_text(re.compile(r"\d+ min \d+ s left"))
        second = await agents(ask("Roll back build 40?", kind="approval"))
        await expect(card(page, second.request)).to_be_visible(timeout=WAIT_MS)
        prompts = await page.locator("article.request .prompt").all_inner_texts()
        assert prompts == ["Roll back build 40?", "Deploy build 41 to production?"]  # newest first

        await shown.get_by_role("button", name="Accept").click()
        answer = await first.answer()
        assert (answer.ok, answer.data, answer.person) == (True, None, "web:token")
        await expect(shown).to_have_count(0)
        await expect(page.locator(".note", has_text="Accepted")).to_be_visible()
        assert second.waiting


BOOKING = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "title": "Full name", "minLength": 2, "maxLength": 40},
        "email": {"type": "string", "title": "Email address", "format": "email"},
        "website": {"type": "string", "title": "Website", "format": "uri"},
        "day": {"type": "string", "title": "Day of the visit", "format": "date"},
        "arrival": {"type": "string", "title": "Arrival time", "format": "date-time"},
        "party": {
            "type": "integer",
            "title": "Party size",
            "minimum": 1,
            "maximum": 12,
            "default": 2,
        },
        "budget": {"type": "number", "title": "Budget per person", "minimum": 0, "maximum": 500},
        "window": {"type": "boolean", "title": "Window seat", "default": True},
        "newsletter": {"type": "boolean", "title": "Send me the newsletter"},
        "room": {"type": "string", "title": "Room", "enum": ["garden", "cellar", "terrace"]},
        "menu": {
            "type": "string",
            "title": "Menu",
            "oneOf": [
                {"const": "veg", "title": "Vegetarian"},
                {"const": "fish", "title": "Fish of the day"},
                {"const": "meat", "title": "Meat"},
            ],
            "default": "fish",
        },
        "wine": {
            "type": "string",
            "title": "Wine",
            "enum": ["r", "w"],
            "enumNames": ["Red wine", "White wine"],
        },
        "extras": {
            "type": "array",
            "title": "Extras",
            "items": {"type": "string", "enum": ["cake", "candles", "flowers"]},
        },
        "allergies": {
            "type": "array",
            "title": "Allergies",
            "items": {
                "anyOf": [
                    {"const": "nuts", "title": "Tree nuts"},
                    {"const": "gluten", "title": "Gluten"},
                    {"const": "milk", "title": "Milk"},
                ]
            },
            "maxItems": 2,
        },
        "occasion": {"type": "string", "title": "Occasion", "default": "birthday"},
    },
    "required": ["name", "email", "day", "party"],
}


async def test_every_field_kind_is_filled_by_label_and_the_agent_gets_exactly_it(
    broker: Broker, browser: Browser, agents: AgentFactory, tmp_path: Path
) -> None:
    async with serving(broker) as web:
        page = await signed_in_page(browser, web)
        await page.set_viewport_size({"width": 900, "height": 1900})
        agent = await agents(ask("Book a table at Chez Toolnexus", data={"schema": BOOKING}))
        shown = card(page, agent.request)
        await expect(shown).to_be_visible(timeout=WAIT_MS)

        # defaults are pre-filled, and the browser gets the schema's hints
        await expect(shown.get_by_label("Party size")).to_have_value("2")
        await expect(shown.get_by_label("Window seat")).to_be_checked()
        await expect(shown.get_by_label("Menu")).to_have_value("1")  # the second option
        await expect(shown.get_by_label("Occasion")).to_have_value("birthday")
        await expect(shown.get_by_label("Party size")).to_have_attribute("max", "12")
        await expect(shown.get_by_label("Email address")).to_have_attribute("type", "email")
        await expect(shown.locator(".hint", has_text="a whole number from 1 to 12")).to_be_visible()

        await shown.get_by_label("Full name").fill("Ada Lovelace")
        await shown.get_by_label("Email address").fill("ada@example.org")
        await shown.get_by_label("Website").fill("https://ada.example.org/")
        await shown.get_by_label("Day of the visit").fill("2026-05-01")
        await shown.get_by_label("Arrival time").fill("2026-05-01T19:30:00+02:00")
        await shown.get_by_label("Party size").fill("4")
        await shown.get_by_label("Budget per person").fill("62.5")
        await shown.get_by_label("Window seat").uncheck()
        await shown.get_by_label("Send me the newsletter").check()
        await shown.get_by_label("Room").select_option(label="terrace")
        await shown.get_by_label("Menu").select_option(label="Vegetarian")
        await shown.get_by_label("Wine").select_option(label="White wine")
        extras = shown.get_by_label("Extras")
        await extras.get_by_label("cake").check()
        await extras.get_by_label("flowers").check()
        allergies = shown.get_by_label("Allergies")
        await allergies.get_by_label("Gluten").check()
        await shown.screenshot(path=str(tmp_path / "web-form.png"))
        await shown.get_by_role("button", name="Accept").click()

        answer = await agent.answer()
        assert answer.ok and answer.person == "web:token"
        assert answer.data == {
            "name": "Ada Lovelace",
            "email": "ada@example.org",
            "website": "https://ada.example.org/",
            "day": "2026-05-01",
            "arrival": "2026-05-01T19:30:00+02:00",
            "party": 4,
            "budget": 62.5,
            "window": False,
            "newsletter": True,
            "room": "terrace",
            "menu": "veg",
            "wine": "w",
            "extras": ["cake", "flowers"],
            "allergies": ["gluten"],
            "occasion": "birthday",
        }
        assert type(answer.data["party"]) is int
        await expect(shown).to_have_count(0)
    assert (tmp_path / "web-form.png").stat().st_size > 10_000


async def test_an_invalid_value_shows_the_servers_message_and_nothing_is_sent(
    broker: Broker, browser: Browser, agents: AgentFactory
) -> None:
    async with serving(broker) as web:
        page = await signed_in_page(browser, web)
        agent = await agents(ask("Book a table for tonight", data={"schema": BOOKING}))
        shown = card(page, agent.request)
        await expect(shown).to_be_visible(timeout=WAIT_MS)
        await shown.get_by_label("Full name").fill("Ada")
        await shown.get_by_label("Email address").fill("ada@example.org")
        await shown.get_by_label("Day of the visit").fill("2026-05-01")

        # the browser's own hint stops a party of 99 before anything is sent ...
        await shown.get_by_label("Party size").fill("99")
        await shown.get_by_role("button", name="Accept").click()
        message = await shown.get_by_label("Party size").evaluate("e => e.validationMessage")
        assert message  # e.g. "Value must be less than or equal to 12."
        await shown.get_by_label("Party size").fill("3")

        # ... and what only the server checks (at most 2 allergies) comes back beside the field
        allergies = shown.get_by_label("Allergies")
        for allergy in ("Tree nuts", "Gluten", "Milk"):
            await allergies.get_by_label(allergy).check()
        await shown.get_by_role("button", name="Accept").click()
        error = shown.locator(".widget-checks.invalid .error")
        await expect(error).to_have_text(
            "['nuts', 'gluten', 'milk'] has more than the maximum of 2 items"
        )
        await expect(shown.get_by_label("Allergies")).to_have_attribute("aria-invalid", "true")
        await expect(shown.get_by_label("Full name")).to_have_value("Ada")  # kept as typed
        assert agent.waiting, "an invalid answer reached the agent"

        await shown.get_by_label("Allergies").get_by_label("Milk").uncheck()
        await shown.get_by_role("button", name="Accept").click()
        answer = await agent.answer()
        assert answer.ok and answer.data["allergies"] == ["nuts", "gluten"]
        assert answer.data["party"] == 3


@pytest.mark.parametrize("ending", ["answered", "withdrawn", "expired"])
async def test_a_request_resolved_elsewhere_vanishes_with_a_note(
    broker: Broker, browser: Browser, agents: AgentFactory, ending: str
) -> None:
    async with serving(broker) as web:
        page = await signed_in_page(browser, web)
        prompt = f"Approve the {ending} change?"
        if ending == "answered":
            agent = await agents(ask(prompt, kind="approval"))
        elif ending == "withdrawn":
            agent = await agents(ask(prompt, kind="approval"), withdraw_after_s=6)
        else:
            agent = await agents(ask(prompt, kind="approval"), timeout_s=6)
        shown = card(page, agent.request)
        await expect(shown).to_be_visible(timeout=WAIT_MS)
        if ending == "answered":
            await broker.answer(Answer(id=agent.request.id, ok=True, person="slack:U42"))
        await expect(shown).to_have_count(0, timeout=WAIT_MS)
        note = {
            "answered": "Answered elsewhere by slack:U42.",
            "withdrawn": "Withdrawn: the agent stopped waiting.",
            "expired": "Expired: nobody answered in time.",
        }[ending]
        await expect(page.locator(".note", has_text=prompt)).to_contain_text(note)
        answer = await agent.answer()
        assert answer.reason == {"answered": None}.get(ending, ending)


async def test_a_quorum_card_counts_votes_live_and_stays_for_other_persons(
    broker: Broker, browser: Browser, agents: AgentFactory
) -> None:
    async with serving(broker) as web:
        page = await signed_in_page(browser, web)
        agent = await agents(ask("Ship the release?", kind="approval", quorum=Quorum(2)))
        shown = card(page, agent.request)
        await expect(shown.locator(".approvals")).to_have_text("0 of 2 approvals")
        await shown.get_by_role("button", name="Accept").click()
        approvals = re.compile(r"^1 of 2 approvals: web:token$")  # the voter: the person
        await expect(shown.locator(".approvals")).to_have_text(approvals)
        await shown.get_by_role("button", name="Accept").click()  # the same person again
        await expect(shown.locator(".form-error")).to_contain_text("Not counted: already voted")
        await broker.answer(Answer(id=agent.request.id, ok=True, person="slack:U42"))
        await expect(shown).to_have_count(0, timeout=WAIT_MS)
        answer = await agent.answer()
        assert [a.person for a in answer.approvals or ()] == ["web:token", "slack:U42"]


async def test_an_escalated_request_is_marked_and_stays_until_answered_on_the_next_queue(
    broker: Broker, browser: Browser, redis_url: str, namespace: str
) -> None:
    request = ask("Fail over the database?", kind="approval", escalate=[Hop(0.5, "oncall")])
    async with (
        serving(broker) as web,
        toolnexus.connect(redis_url, namespace=namespace, queue="oncall", **FAST) as oncall,
        oncall.responder("pager") as pager,
    ):
        page = await signed_in_page(browser, web)
        waiting = asyncio.create_task(broker.wait_for(request, timeout_s=60))
        shown = card(page, request)
        await expect(shown).to_be_visible(timeout=WAIT_MS)
        pending = await anext(pager)  # it reached oncall: still shown here, marked so
        await expect(shown.locator("p.escalated")).to_have_text(
            "Escalated to oncall: still open here too."
        )
        await expect(shown).to_have_class(re.compile("is-escalated"))
        await page.reload()  # the mark is part of the card, not only of the live change
        await expect(card(page, request).locator("p.escalated")).to_be_visible()
        await pending.accept(person="pager:ada")
        await expect(card(page, request)).to_have_count(0, timeout=WAIT_MS)
        await expect(page.locator(".note", has_text=request.prompt)).to_contain_text(
            "Answered elsewhere by pager:ada."
        )
        assert (await waiting).person == "pager:ada"


# -- authorization -------------------------------------------------------------------


async def test_an_authorization_shows_its_url_and_domain_and_is_declined(
    broker: Broker, browser: Browser, agents: AgentFactory
) -> None:
    url = "https://auth.example-pay.com/authorize?client=booking&state=7f3a&amount=20"
    async with serving(broker) as web:
        page = await signed_in_page(browser, web)
        loaded: list[str] = []
        page.on("request", lambda r: loaded.append(r.url))
        agent = await agents(ask("Authorize the 20 € deposit", kind="authorization", url=url))
        shown = card(page, agent.request)
        await expect(shown).to_be_visible(timeout=WAIT_MS)
        await expect(shown.locator(".url")).to_have_text(url)
        await expect(shown.locator(".url mark.domain")).to_have_text("example-pay.com")
        await expect(shown.locator(".domain-line")).to_have_text("Domain: example-pay.com")
        await expect(shown.locator(".warnings")).to_have_count(0)
        link = shown.get_by_role("link", name="Open the link in a new tab")
        await expect(link).to_have_attribute("href", url)
        await expect(link).to_have_attribute("rel", "noopener noreferrer nofollow")
        await expect(link).to_have_attribute("target", "_blank")

        await shown.get_by_role("button", name="Decline").click()
        answer = await agent.answer()
        assert (answer.ok, answer.reason, answer.person) == (False, "declined", "web:token")
        await expect(shown).to_have_count(0)
        assert not [u for u in loaded if "example-pay" in u], "the page loaded the URL"


async def test_a_look_alike_domain_shows_the_warning(
    broker: Broker, browser: Browser, agents: AgentFactory
) -> None:
    url = "https://gіthub.com/login/oauth/authorize?client_id=toolnexus"  # a Cyrillic і
    async with serving(broker) as web:
        page = await signed_in_page(browser, web)
        agent = await agents(ask("Sign in to GitHub", kind="authorization", url=url))
        shown = card(page, agent.request)
        await expect(shown).to_be_visible(timeout=WAIT_MS)
        warnings = shown.locator(".warnings")
        await expect(warnings).to_contain_text("The domain looks like github.com but is not it")
        await expect(warnings).to_contain_text("mixes Cyrillic and Latin letters")
        await expect(shown.locator(".other-form")).to_contain_text("xn--gthub-n2e.com")
        await shown.get_by_role("button", name="Dismiss").click()
        answer = await agent.answer()
        assert (answer.ok, answer.reason) == (False, "dismissed")


# -- access --------------------------------------------------------------------------


async def test_without_the_token_the_page_is_refused(
    broker: Broker, browser: Browser, agents: AgentFactory
) -> None:
    async with serving(broker) as web:
        agent = await agents(ask("Delete the staging database?", kind="approval"))
        signed_in = await signed_in_page(browser, web)
        await expect(card(signed_in, agent.request)).to_be_visible(timeout=WAIT_MS)

        stranger = await browser.new_page()
        response = await stranger.goto(web.url)
        assert response is not None and response.status == 401
        await expect(stranger.get_by_label("Access token")).to_be_visible()
        await expect(stranger.get_by_text("Delete the staging database?")).to_have_count(0)
        response = await stranger.goto(f"{web.url}?token=wrong-token-guessed-here")
        assert response is not None and response.status == 401

        form = {"request": agent.request.id, "action": "accept", "csrf": ""}
        async with httpx.AsyncClient(base_url=web.url) as client:
            assert (await client.get("/events")).status_code == 401
            assert (await client.post("/answer", data=form)).status_code == 401
            bad = {"authorization": "Bearer wrong-token-guessed-here"}
            assert (await client.post("/answer", data=form, headers=bad)).status_code == 401
            # signed in, but a form without the session's CSRF token, or from another site
            cookies = {c["name"]: c["value"] for c in await signed_in.context.cookies()}
            client.cookies.update(cookies)
            assert (await client.post("/answer", data=form)).status_code == 403
            csrf = await signed_in.locator("input[name=csrf]").first.input_value()
            evil = {"origin": "https://evil.example"}
            response = await client.post("/answer", data={**form, "csrf": csrf}, headers=evil)
            assert response.status_code == 403
        assert agent.waiting, "a refused answer reached the agent"

        # the token typed into the sign-in form works like the link
        await stranger.get_by_label("Access token").fill(TOKEN)
        await stranger.get_by_role("button", name="Sign in with the token").click()
        await expect(card(stranger, agent.request)).to_be_visible(timeout=WAIT_MS)
        await card(stranger, agent.request).get_by_role("button", name="Decline").click()
        assert (await agent.answer()).reason == "declined"


PHONE = {"width": 390, "height": 844}
"""A phone's viewport: no hover, so nothing may be said in a tooltip only."""


async def test_first_use_at_phone_size_says_everything_on_the_page(
    redis_url: str, namespace: str, browser: Browser, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue #43: the log says how to sign in (the ``?token=`` form, not the token); the
    sign-in page says where a token comes from; a token sign-in is said plainly (no
    ``web:token``); what signed and not signed mean is on the card, not in a tooltip;
    ``/favicon.ico`` is served."""
    caplog.set_level(logging.INFO, logger="toolnexus")
    agent_key, web_key = SigningKey.generate("agent-7"), SigningKey.generate("web-1")
    options = {"namespace": namespace, **FAST}
    async with (
        toolnexus.connect(
            redis_url, signing_key=agent_key, trusted_keys=Keyring.of(web_key), **options
        ) as agent,
        toolnexus.connect(redis_url, **options) as unsigned_agent,
        toolnexus.connect(
            redis_url, signing_key=web_key, trusted_keys=Keyring.of(agent_key), **options
        ) as broker,
        serving(broker) as web,
    ):
        said = "\n".join(record.getMessage() for record in caplog.records)
        assert f"sign in by opening {web.url.rstrip('/')}/?token=<the --token value>" in said
        assert TOKEN not in said
        page = await browser.new_page(viewport=PHONE)
        page.set_default_timeout(WAIT_MS)
        response = await page.goto(web.url)
        assert response is not None and response.status == 401
        where = page.get_by_text("the one this page's worker was started with")
        await expect(where).to_be_visible()
        await expect(page.get_by_text("toolnexus worker web --token …")).to_be_visible()
        await page.goto(f"{web.url}?token={TOKEN}")
        await expect(page.locator("#live[data-state=live]")).to_be_visible()
        await expect(page.get_by_text("Signed in with the page's access token")).to_be_visible()
        signed = Request(id=toolnexus.new_id(), kind="approval", prompt="Deploy build 7?")
        unsigned = Request(id=toolnexus.new_id(), kind="approval", prompt="Roll back build 6?")
        waits = [
            asyncio.create_task(agent.wait_for(signed, timeout_s=60)),
            asyncio.create_task(unsigned_agent.wait_for(unsigned, timeout_s=60)),
        ]
        try:
            shown = card(page, signed)
            await expect(shown.locator(".badge.signed")).to_have_text("✓ signed with key agent-7")
            await expect(shown.locator(".signature-note")).to_be_visible()
            await expect(shown.locator(".signature-note")).to_contain_text(
                "checks out against the trusted key agent-7"
            )
            bare = card(page, unsigned)
            await expect(bare.locator(".badge.unsigned")).to_have_text("not signed")
            await expect(bare.locator(".signature-note.unsigned")).to_be_visible()
            await expect(bare.locator(".signature-note.unsigned")).to_contain_text(
                "anyone who can write to the broker could have sent this request"
            )
            assert "web:token" not in await page.locator("body").inner_text()
            icon = await page.request.get(f"{web.url.rstrip('/')}/favicon.ico")
            assert icon.status == 200 and icon.headers["content-type"] == "image/svg+xml"
        finally:
            for wait in waits:
                wait.cancel()
            await asyncio.gather(*waits, return_exceptions=True)


async def test_a_login_from_the_users_file_becomes_the_answers_person(
    broker: Broker, browser: Browser, agents: AgentFactory, tmp_path: Path
) -> None:
    users = tmp_path / "users.toml"
    users.write_text(f'[users]\nalice = "{hash_password("correct horse")}"\n')
    async with serving(broker, access=Access(users=load_users(users))) as web:
        agent = await agents(ask("Ship the release?", kind="approval"))
        page = await browser.new_page()
        page.set_default_timeout(WAIT_MS)
        await page.goto(web.url)
        await page.get_by_label("Name").fill("alice")
        await page.get_by_label("Password").fill("wrong horse")
        await page.get_by_role("button", name="Sign in").click()
        await expect(page.get_by_role("alert")).to_have_text("Wrong token, name or password.")
        await page.get_by_label("Password").fill("correct horse")
        await page.get_by_role("button", name="Sign in").click()
        await expect(page.get_by_text("Signed in as web:alice")).to_be_visible()
        shown = card(page, agent.request)
        await expect(shown).to_be_visible(timeout=WAIT_MS)
        await shown.get_by_role("button", name="Accept").click()
        answer = await agent.answer()
        assert (answer.ok, answer.person) == (True, "web:alice")


async def test_an_open_page_serves_loopback_names_only(broker: Broker) -> None:
    with pytest.raises(ConfigurationError, match=re.escape("refusing to listen on '0.0.0.0'")):
        WebServer(broker, host="0.0.0.0", port=0)
    async with WebServer(broker, port=0) as web, httpx.AsyncClient(base_url=web.url) as client:
        page = await client.get("/")
        assert page.status_code == 200
        assert page.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
        assert page.headers["referrer-policy"] == "no-referrer"
        # a DNS name rebound to 127.0.0.1 is not this page
        rebound = await client.get("/", headers={"host": f"attacker.example:{web.port}"})
        assert rebound.status_code == 401
        assert "answers at 127.0.0.1 or localhost only" in rebound.text


@pytest.mark.slow
def test_the_command_refuses_a_public_address_without_access(namespace: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TOOLNEXUS_WEB_TOKEN"}
    command = shutil.which("toolnexus", path=str(Path(sys.executable).parent))
    assert command is not None
    done = subprocess.run(
        [command, "worker", "web", "--host", "0.0.0.0", "--namespace", namespace],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert done.returncode == 2
    assert "refusing to listen on '0.0.0.0' without access control" in done.stderr


async def test_every_asset_ships_in_the_package(broker: Broker) -> None:
    async with WebServer(broker, port=0) as web, httpx.AsyncClient(base_url=web.url) as client:
        page = (await client.get("/")).text
        for asset in ("/static/app.js", "/static/style.css"):
            assert f'"{asset}"' in page
            assert (await client.get(asset)).status_code == 200
        assert "http://" not in page and "https://" not in page


# -- the parts, without a browser ----------------------------------------------------


@pytest.mark.parametrize(
    ("url", "warning"),
    [
        ("https://github.com/login/oauth", None),
        ("https://accounts.google.com/o/oauth2", None),
        ("http://github.com/login", "This link is not https"),
        ("https://g1thub.com/login", "The domain looks like github.com but is not it"),
        ("https://xn--80ak6aa92e.com/", "The domain is written in punycode (xn--80ak6aa92e.com)"),
        ("https://раураl.com/", "The domain mixes Cyrillic and Latin letters"),
        ("https://github.com.evil.example/", "starts with github.com, but the site is evil"),
        ("https://github.com@evil.example/", "The part before “@” (github.com) is not the site"),
        ("https://10.1.2.3/authorize", "a bare IP address"),
        ("javascript:alert(1)", "This is not a web address (javascript)"),
    ],
)
def test_links_are_taken_apart_with_their_warnings(url: str, warning: str | None) -> None:
    link = check_link(url)
    assert link.before + link.host + link.after == url
    assert link.host.endswith(link.domain)
    if warning is None:
        assert link.warnings == ()
    else:
        assert any(warning in w for w in link.warnings), link.warnings
    assert link.openable == url.startswith("http")


def test_a_submitted_form_becomes_typed_data() -> None:
    fields = form_fields(BOOKING)
    submitted = {
        "field.name": ["Ada"],
        "field.party": ["3.0"],
        "field.budget": ["abc"],
        "field.room": ["7"],
        "field.extras": ["2", "0"],
        "field.email": [""],
    }
    assert form_data(fields, submitted) == {
        "name": "Ada",
        "party": 3,  # an integer field typed as 3.0 is the integer 3
        "budget": "abc",  # kept for the schema check to name
        "window": False,
        "newsletter": False,
        "room": "7",  # no such option: kept for the schema check to refuse
        "extras": ["flowers", "cake"],
        "allergies": [],
    }


def test_passwords_are_hashed_and_bad_users_files_refused(tmp_path: Path) -> None:
    stored = hash_password("pw")
    assert verify_password("pw", stored) and not verify_password("pW", stored)
    bad = tmp_path / "users.toml"
    bad.write_text('[users]\nalice = "plain-text"\n')
    with pytest.raises(ConfigurationError, match="user 'alice': the value is not a password hash"):
        load_users(bad)
    bad.write_text("alice = 1\n")
    with pytest.raises(ConfigurationError, match=r"needs a \[users\] table"):
        load_users(bad)
    with pytest.raises(ConfigurationError, match="at least 16 characters"):
        Access(token="short")


async def test_time_left_counts_down_in_the_page(
    broker: Broker, browser: Browser, agents: AgentFactory
) -> None:
    async with serving(broker) as web:
        page = await signed_in_page(browser, web)
        agent = await agents(ask("Quick: approve?", kind="approval"), timeout_s=50)
        left = card(page, agent.request).locator(".left")
        await expect(left).to_have_text(re.compile(r"^\d+ s left$"), timeout=WAIT_MS)
        first = await left.inner_text()
        await expect(left).not_to_have_text(first, timeout=WAIT_MS)
        assert int((await left.inner_text()).split()[0]) < int(first.split()[0])


async def test_without_javascript_a_posted_form_still_answers(
    broker: Broker, agents: AgentFactory
) -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer", "title": "Guests"}}}
    async with WebServer(broker, port=0) as web, httpx.AsyncClient(base_url=web.url) as client:
        agent = await agents(ask("How many guests?", data={"schema": schema}))
        async with asyncio.timeout(WAIT_MS / 1000):
            while "How many guests?" not in (page := (await client.get("/")).text):
                await asyncio.sleep(0.05)
        csrf = re.search(r'name="csrf" value="([^"]+)"', page)
        assert csrf is not None
        form = {"request": agent.request.id, "csrf": csrf[1], "action": "accept"}
        refused = await client.post("/answer", data={**form, "field.n": "many"})
        assert refused.status_code == 422
        assert "&#39;many&#39; is not of type &#39;integer&#39;" in refused.text
        sent = await client.post("/answer", data={**form, "field.n": "5"})
        assert (sent.status_code, sent.headers["location"]) == (303, "/")
        assert (await agent.answer()).data == {"n": 5}


async def test_a_page_that_falls_too_far_behind_is_ended() -> None:
    async with toolnexus.connect("memory://") as memory:
        waiting = asyncio.create_task(memory.wait_for(ask("Anything?", kind="approval")))
        async with memory.responder("web") as requests:
            pending = await anext(requests)
            board = Board()
            with board.follow() as follower:
                for _ in range(FOLLOWER_BACKLOG + 1):
                    board.show(pending)  # a page that reads nothing
                assert [change async for change in follower] == []
            await pending.dismiss()
        assert (await waiting).reason == "dismissed"
