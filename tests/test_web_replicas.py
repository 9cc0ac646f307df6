"""The web page as a fleet runs it and as a person reads it, in a real browser (Debian's
chromium via Playwright): two replicas behind one browser session, one page per consumer
group, and the page's details at phone and desktop sizes (issue: nothing fails silently)."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
from playwright.async_api import Browser, Page, async_playwright, expect

import toolnexus
from conformance import CHROMIUM, CHROMIUM_ARGS
from conftest import FAST
from test_web_worker import ask
from toolnexus import Broker, ConfigurationError, Request, Source, new_id
from toolnexus.security import Keyring, SigningKey
from toolnexus_workers.web.access import Access, hash_password
from toolnexus_workers.web.server import WebServer
from waiting_agents import AgentFactory

WAIT_MS = 20_000
SECRET = "one-secret-every-replica-shares"
PHONE = {"width": 390, "height": 844}
DESKTOP = {"width": 1280, "height": 900}
SCREENSHOTS = os.environ.get("TOOLNEXUS_SCREENSHOTS")
"""Where the docs' screenshots are written when set (``docs``); else a temporary folder."""

expect.set_options(timeout=WAIT_MS)
pytestmark = [pytest.mark.redis, pytest.mark.timeout(180)]


@pytest.fixture
async def broker(redis_url: str, namespace: str) -> AsyncIterator[Broker]:
    async with toolnexus.connect(redis_url, namespace=namespace, **FAST) as b:
        yield b


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield launched
        await launched.close()


@pytest.fixture(scope="module")
def alice() -> dict[str, str]:
    return {"alice": hash_password("correct horse")}


async def sign_in(page: Page, url: str) -> None:
    await page.goto(url + "login")
    await page.get_by_label("Name").fill("alice")
    await page.get_by_label("Password").fill("correct horse")
    await page.get_by_role("button", name="Sign in").click()
    await expect(page.locator("#live[data-state=live]")).to_be_visible()


# -- replicas ------------------------------------------------------------------------


async def test_two_replicas_show_every_request_to_one_browser_session(
    broker: Broker, browser: Browser, alice: dict[str, str], agents: AgentFactory
) -> None:
    access = {"users": alice, "session_secret": SECRET}
    async with (
        WebServer(broker, port=0, group="web-0", access=Access(**access)) as first,
        WebServer(broker, port=0, group="web-1", access=Access(**access)) as second,
    ):
        context = await browser.new_context()  # one browser session: cookies are per host
        page = await context.new_page()
        await sign_in(page, first.url)
        other = await context.new_page()
        await other.goto(second.url)  # signed in on the first replica only
        await expect(other.locator("#live[data-state=live]")).to_be_visible()
        await expect(other.locator(".signout")).to_contain_text("web:alice")

        agent = await agents(ask("Book the table for four?"))
        on_first = page.locator("article.request", has_text="Book the table for four?")
        on_second = other.locator("article.request", has_text="Book the table for four?")
        await expect(on_first).to_be_visible()
        await expect(on_second).to_be_visible()  # each replica's group sees every request

        await on_second.get_by_role("button", name="Accept").click()
        answer = await agent.answer()
        assert (answer.ok, answer.person) == (True, "web:alice")
        await expect(on_first).to_have_count(0)
        await expect(page.locator(".note")).to_contain_text("Answered elsewhere by web:alice")


async def test_a_session_of_a_replica_with_another_secret_is_refused(
    broker: Broker, browser: Browser, alice: dict[str, str]
) -> None:
    async with (
        WebServer(broker, port=0, group="web-0", access=Access(users=alice)) as first,
        WebServer(broker, port=0, group="web-1", access=Access(users=alice)) as second,
    ):
        page = await browser.new_page()
        await sign_in(page, first.url)
        response = await page.goto(second.url)
        assert response is not None and response.status == 401  # sessions are its own
        await expect(page.get_by_label("Password")).to_be_visible()


async def test_a_second_page_in_one_group_is_refused_naming_the_way_out(broker: Broker) -> None:
    async with WebServer(broker, port=0, group="web", access=Access(token="t" * 24)) as first:
        await _heartbeat_of(broker, first)
        with pytest.raises(ConfigurationError) as refused:
            async with WebServer(broker, port=0, group="web", access=Access(token="t" * 24)):
                pass
    message = str(refused.value)
    assert "group 'web' already has a web page" in message
    assert "--group web-2" in message and "--session-secret" in message


def test_a_short_session_secret_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="at least 16 characters"):
        Access(token="t" * 24, session_secret="short")


async def _heartbeat_of(broker: Broker, web: WebServer) -> None:
    async with asyncio.timeout(WAIT_MS / 1000):
        while not any(b.group == web.service.group for b in await broker.heartbeats()):
            await asyncio.sleep(0.05)


# -- the page's details, at phone and desktop sizes -------------------------------------

SCHEMA = {
    "type": "object",
    "properties": {
        "max_cost": {"type": "integer", "title": "Maximum cost in euros", "maximum": 500},
        "note": {"type": "string", "title": "A note for the restaurant"},
    },
    "required": ["max_cost"],
}


@pytest.mark.parametrize("size", ["phone", "desktop"])
async def test_the_page_says_what_a_person_needs_at_phone_and_desktop_sizes(
    redis_url: str,
    namespace: str,
    browser: Browser,
    agents: AgentFactory,
    size: str,
    tmp_path: Path,
) -> None:
    agent_key = SigningKey.generate("agent-7")
    signed_agent = toolnexus.connect(redis_url, namespace=namespace, signing_key=agent_key, **FAST)
    responder = toolnexus.connect(
        redis_url, namespace=namespace, trusted_keys=Keyring.of(agent_key), **FAST
    )
    async with signed_agent, responder, WebServer(responder, port=0) as web:
        page = await browser.new_page(viewport=PHONE if size == "phone" else DESKTOP)
        await page.goto(web.url)  # an open page on loopback
        await expect(page.locator("#live[data-state=live]")).to_be_visible()

        signed = ask("Spend up to how much?", data={"schema": SCHEMA})
        waiting = asyncio.create_task(signed_agent.wait_for(signed, timeout_s=120))
        link = Request(
            id=new_id(),
            kind="authorization",
            prompt="Sign in to the calendar",
            url="https://accounts.calendar-provider.example.com/oauth2/authorize"
            "?client_id=toolnexus-agent-fleet&scope=calendar.readonly&state=Zx81",
            source=Source(agent="agent-7"),
        )
        unsigned = await agents(link)
        form = page.locator("article.request", has_text="Spend up to how much?")
        auth = page.locator("article.request", has_text="Sign in to the calendar")
        await expect(form).to_be_visible()
        await expect(auth).to_be_visible()

        # signed and verified, or not
        await expect(form.locator(".badge.signed")).to_have_text("✓ signed with key agent-7")
        await expect(auth.locator(".badge.unsigned")).to_have_text("not signed")
        # Decline and Dismiss explained
        await expect(form.locator(".actions-help")).to_contain_text("Decline answers no")
        await expect(form.locator(".actions-help")).to_contain_text("Dismiss closes the request")

        # labels and "required" on one line; the URL breaks at sensible points only
        label = form.locator("label", has_text="Maximum cost in euros")
        required = label.locator(".required")
        await expect(required).to_have_text("required")
        label_box, required_box = await label.bounding_box(), await required.bounding_box()
        assert label_box is not None and required_box is not None
        assert required_box["y"] < label_box["y"] + label_box["height"] / 2 + 2
        domain = auth.locator(".url mark.domain")
        assert await domain.evaluate("e => e.getClientRects().length") == 1, "domain split"
        url = auth.locator(".url")
        assert await url.evaluate("e => e.scrollWidth <= e.clientWidth")
        assert await page.evaluate("document.documentElement.scrollWidth <= innerWidth")
        shots = Path(SCREENSHOTS) if SCREENSHOTS else tmp_path
        await page.screenshot(path=str(shots / f"web-{size}.png"), full_page=True)

        # an error names the field by its label, not its key
        async with httpx.AsyncClient() as client:
            reply = await client.post(
                web.url + "answer",
                data={"request": signed.id, "action": "accept", "csrf": web.page.open_csrf},
                headers={"x-toolnexus-fetch": "1"},
            )
        assert reply.status_code == 422
        card_html = reply.json()["card"]
        assert "“Maximum cost in euros” is required" in card_html
        assert "max_cost" not in card_html.replace('name="field.max_cost"', "")

        # a note names the request by kind, source and prompt
        await form.get_by_label("Maximum cost in euros").fill("120")
        await form.get_by_role("button", name="Accept").click()
        assert (await waiting).data == {"max_cost": 120}
        note = page.locator(".note", has_text="Spend up to how much?")
        await expect(note).to_contain_text(
            "Question from agent agent-7 (tool book_table): “Spend up to how much?”"
        )
        await unsigned_declined(auth, unsigned)


async def unsigned_declined(auth: Any, unsigned: Any) -> None:
    await auth.get_by_role("button", name="Decline").click()
    assert (await unsigned.answer()).ok is False


async def test_a_withdrawn_requests_draft_stays_greyed_until_removed(
    broker: Broker, browser: Browser, agents: AgentFactory
) -> None:
    async with WebServer(broker, port=0) as web:
        page = await browser.new_page(viewport=PHONE)
        await page.goto(web.url)
        await expect(page.locator("#live[data-state=live]")).to_be_visible()
        typed = await agents(ask("Which table?", data={"schema": SCHEMA}), withdraw_after_s=8)
        untouched = await agents(ask("Which day?", data={"schema": SCHEMA}), withdraw_after_s=8)
        draft = page.locator("article.request", has_text="Which table?")
        await draft.get_by_label("A note for the restaurant").fill("by the window, please")
        gone = page.locator("article.request", has_text="Which day?")
        await expect(gone).to_be_visible()

        await expect(draft).to_have_class(contains_class("is-gone"), timeout=30_000)
        await expect(draft.locator(".gone-note")).to_contain_text("Withdrawn")
        field = draft.get_by_label("A note for the restaurant")
        await expect(field).to_have_value("by the window, please")
        await expect(field).to_be_disabled()
        await expect(draft.get_by_role("button", name="Accept")).to_have_count(0)
        await expect(gone).to_have_count(0)  # nothing typed in it: it leaves, with a note
        await expect(page.locator(".note", has_text="Which day?")).to_contain_text("Withdrawn")
        assert (await typed.answer()).reason == "withdrawn"
        assert (await untouched.answer()).reason == "withdrawn"

        await draft.get_by_role("button", name="Remove").click()
        await expect(draft).to_have_count(0)
        await expect(page.locator("#empty")).to_be_visible()


def contains_class(name: str) -> re.Pattern[str]:
    return re.compile(rf"(^|\s){re.escape(name)}(\s|$)")


def test_a_session_is_refused_when_forged_altered_or_its_login_removed(
    alice: dict[str, str],
) -> None:
    page = Access(users=alice, session_secret=SECRET)
    cookie = page.sign_in("web:alice")
    session = page.session(cookie)
    assert session is not None and session.person == "web:alice"
    body, _, mac = cookie.partition(".")
    other = base64.urlsafe_b64encode(json.dumps(["web:mallory", "x", 4102444800]).encode())
    assert page.session(f"{other.decode().rstrip('=')}.{mac}") is None  # altered
    assert page.session(f"{body}.{'A' * len(mac)}") is None  # forged
    assert page.session("garbage") is None and page.session(None) is None
    removed = Access(users={"bob": alice["alice"]}, session_secret=SECRET)
    assert removed.session(cookie) is None  # alice is no longer a login there
    assert Access(users=alice, session_secret=SECRET).session(cookie) is not None  # a replica
    page.sign_out(cookie)
    assert page.session(cookie) is None
