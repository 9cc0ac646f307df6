"""Every worker shows a tool approval for what it is: the tool and its arguments.

The terminal prints them and approves (y), denies with a message (n) or edits them (e),
showing the changes; the web page shows them as labelled fields from the tool's schema
(long values folded), an edit as the changes from the proposal before and after it is
sent, and refuses an edit that breaks the schema beside its field; Slack and Telegram show
a summary with Approve / Deny (a message asked for) and a link to edit on the web page;
the auto worker's rules match the tool's name and its arguments."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import re
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from playwright.async_api import Browser, async_playwright, expect

import toolnexus
from chat_fakes import (
    FakeTelegram,
    SlackChat,
    TelegramChat,
    block_actions,
    buttons,
    post_interaction,
    view_submission,
)
from chat_fakes import eventually as chat_eventually
from conformance import CHROMIUM, CHROMIUM_ARGS, TerminalAdapter
from conftest import FAST
from test_web_worker import TOKEN, WAIT_MS, signed_in_page
from toolnexus import Answer, Broker, Request, Service, Source
from toolnexus.cli._ops import audit_object, audit_text
from toolnexus.frameworks import ToolDecision, decide, tool_call_request
from toolnexus.rendering import (
    argument_changes,
    kind_label,
    page_link,
    request_anchor,
    tool_call_fields,
    tool_call_view,
)
from toolnexus.responders import Terminal
from toolnexus_workers.auto import AutoWorker, Rules, RulesError
from toolnexus_workers.web.access import Access
from toolnexus_workers.web.server import WebServer

SCHEMA = {
    "type": "object",
    "properties": {
        "to": {"type": "string", "title": "Payee", "description": "Who receives the money"},
        "amount": {"type": "integer", "title": "Amount", "maximum": 100},
        "memo": {"type": "string", "title": "Memo"},
    },
    "required": ["to", "amount"],
}
MEMO = "Invoice 42: " + "for the consulting work of the third quarter, " * 4
ARGS = {"to": "ACME", "amount": 10, "memo": MEMO}


@contextlib.asynccontextmanager
async def waiting(broker: Broker, *requests: Request) -> AsyncIterator[list[asyncio.Task[Answer]]]:
    """Waits for ``requests`` in the background; those still waiting are withdrawn at the end."""
    tasks = [asyncio.create_task(broker.wait_for(r, timeout_s=60)) for r in requests]
    try:
        yield tasks
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def transfer(**extra: Any) -> Request:
    extra.setdefault("schema", SCHEMA)
    extra.setdefault("arguments", ARGS)
    return tool_call_request(
        "transfer_funds",
        extra.pop("arguments"),
        framework="test",
        run="run-42",
        prompt=extra.pop("prompt", "Pay ACME?"),
        **extra,
    )


# -- what every worker reads: toolnexus.rendering --------------------------------------


def test_a_call_reads_the_same_for_every_worker() -> None:
    request = transfer()
    assert kind_label("tool_call") == "Tool call" and kind_label("survey") == "Survey"
    view = tool_call_view(request)
    lines = view.lines(limit=30)
    assert lines[0] == "Tool: transfer_funds (test, run run-42)"
    assert lines[1:3] == ['  Payee (to) = "ACME"', "  Amount (amount) = 10"]
    assert lines[3].startswith('  Memo (memo) = "Invoice 42: for the consulti… (')
    assert [a.long for a in view.arguments] == [False, False, True]
    changes = argument_changes(request, {**ARGS, "amount": 3.0})
    assert [str(c) for c in changes] == ["Amount: 10 → 3.0"]
    assert argument_changes(request, {**ARGS, "amount": 10.0}) == []  # the same number
    assert [str(c) for c in argument_changes(request, {"to": "ACME", "amount": 10})] == [
        f"Memo: {json.dumps(MEMO)[:39]}… ({len(json.dumps(MEMO)) - 39} more characters) → (absent)"
    ]
    assert page_link("https://desk.example/", request.id) == (
        f"https://desk.example/#{request_anchor(request.id)}"
    )


@pytest.mark.parametrize(
    ("prop", "value"),
    [
        ({"type": "array", "items": {"type": "object"}}, [{"sku": 1}]),  # a free list
        ({"type": "object"}, {"city": "Bern"}),  # nested: not a form
        ({}, 7),  # untyped: a text field would send "7"
        ({"type": ["string", "null"]}, None),  # a type list: not a form field
    ],
)
def test_a_call_a_form_cannot_hold_exactly_is_shown_not_edited(prop: Any, value: Any) -> None:
    schema = {"type": "object", "properties": {"to": {"type": "string"}, "extra": prop}}
    request = tool_call_request(
        "ship", {"to": "ACME", "extra": value}, framework="t", schema=schema
    )
    assert tool_call_fields(request) is None
    assert tool_call_fields(transfer()) is not None


# -- the terminal -----------------------------------------------------------------------


async def ask_terminal(request: Request, typed: str) -> tuple[str, ToolDecision]:
    output = io.StringIO()
    terminal = Terminal(stdin=io.StringIO(typed), output=output, color=False)
    answer = await terminal.ask(request)
    async with toolnexus.connect("memory://") as broker:  # checked as the broker checks it
        waiting = asyncio.create_task(broker.wait_for(request, timeout_s=10))
        async with broker.responder("tty") as requests, asyncio.timeout(10):
            pending = await anext(requests)
        await pending.answer(answer)
        return output.getvalue(), decide(request, await waiting)


async def test_the_terminal_prints_the_call_then_approves_it_as_proposed() -> None:
    shown, decision = await ask_terminal(transfer(), "y\n")
    assert "── tool call request from transfer_funds ──" in shown
    assert "Tool:   transfer_funds (test, run run-42)" in shown
    assert 'Payee (to) = "ACME"' in shown and "Amount (amount) = 10" in shown
    assert f"Memo (memo) = {json.dumps(MEMO)}" in shown  # printed whole
    assert "Approve this call to transfer_funds? [y/n/e]: " in shown
    assert decision.approved and not decision.edited and decision.arguments == ARGS


async def test_the_terminal_denies_with_a_message_for_the_agent() -> None:
    shown, decision = await ask_terminal(transfer(), "n\nACME is not a known payee\n")
    assert "Message for the agent (why not; optional): " in shown
    assert not decision.approved and decision.message == "ACME is not a known payee"


async def test_the_terminal_edits_shows_the_changes_then_approves() -> None:
    shown, decision = await ask_terminal(transfer(), "e\n\n500\n7\n\ny\n")
    assert "greater than the maximum of 100" in shown  # asked again
    assert "changed: Amount: 10 → 7" in shown
    assert decision.approved and decision.edited
    assert decision.arguments == {**ARGS, "amount": 7}


async def test_the_terminal_offers_no_edit_for_a_call_a_form_cannot_hold() -> None:
    schema = {"type": "object", "properties": {"items": {"type": "array"}}}
    request = tool_call_request("ship", {"items": [{"sku": 1}]}, framework="t", schema=schema)
    shown, decision = await ask_terminal(request, "e\ny\n")
    assert "Approve this call to ship? [y/n]: " in shown
    assert decision.approved and decision.arguments == {"items": [{"sku": 1}]}


@pytest.mark.redis
@pytest.mark.slow
async def test_the_terminal_worker_shows_the_call_in_a_pseudo_terminal(
    redis_url: str, namespace: str, tmp_path: Path
) -> None:
    terminal = TerminalAdapter(tmp_path)
    request = transfer()
    async with toolnexus.connect(redis_url, namespace=namespace, queue="tty", **FAST) as broker:
        try:
            await terminal.start(redis_url, namespace, "tty")
            child = terminal.child
            assert child is not None
            wait = asyncio.create_task(broker.wait_for(request, timeout_s=60))
            at = await terminal.wait_for("Tool:   transfer_funds (test, run run-42)")
            at = await terminal.wait_for('Payee (to) = "ACME"', at)
            at = await terminal.wait_for("Approve this call to transfer_funds? [y/n/e]: ", at)
            child.sendline("e")
            for asked, typed in (("Payee", ""), ("Amount", "25"), ("Memo", "")):
                at = await terminal.wait_for(asked, at)
                child.sendline(typed)
            at = await terminal.wait_for("changed: Amount: 10 → 25", at)
            at = await terminal.wait_for("Approve the call with these arguments? [y/n]: ", at)
            child.sendline("y")
            decision = decide(request, await asyncio.wait_for(wait, 20))
        finally:
            await terminal.close()
    assert decision.edited and decision.arguments == {**ARGS, "amount": 25}


# -- the auto worker --------------------------------------------------------------------

RULES = """
[[rule]]
name = "small transfers to ACME"
kind = "tool_call"
tool = "transfer_*"
arguments.amount = { min = 1, max = 100 }
arguments.to = ["ACME*", "Initech"]
arguments.memo = { regex = "(?i)^invoice \\\\d+" }
action = "accept"

[[rule]]
name = "dry runs"
kind = "tool_call"
arguments.dry_run = true
action = "accept"

[[rule]]
name = "every other tool call is for a person"
kind = "tool_call"
action = "skip"

[[rule]]
name = "approvals"
kind = "approval"
action = "decline"
"""


def call(name: str = "transfer_funds", source: Source | None = None, **arguments: Any) -> Request:
    request = tool_call_request(name, {**ARGS, **arguments}, framework="test", schema=SCHEMA)
    return request if source is None else msgspec.structs.replace(request, source=source)


@pytest.mark.parametrize(
    ("request_", "rule"),
    [
        (call(), "small transfers to ACME"),
        (call(to="ACME Corp", amount=100), "small transfers to ACME"),
        (call(name="transfer_eur", to="Initech", amount=1), "small transfers to ACME"),
        # must not match the first rule:
        (call(amount=500), "every other tool call is for a person"),  # above the bound
        (call(amount=0), "every other tool call is for a person"),  # below it
        (call(amount="10"), "every other tool call is for a person"),  # a string, not a number
        (call(amount=True), "every other tool call is for a person"),  # a boolean, not 1
        (call(to="EVIL ACME"), "every other tool call is for a person"),  # glob anchored
        (call(memo="refund 42"), "every other tool call is for a person"),  # regex fails
        (call(name="delete_account"), "every other tool call is for a person"),  # tool name
        # the request's source says transfer_funds, the call it approves is delete_account:
        (
            call(name="delete_account", source=Source(tool="transfer_funds")),
            "every other tool call is for a person",
        ),
        (call(name="delete_account", dry_run=True), "dry runs"),
        (call(name="delete_account", dry_run=1), "every other tool call is for a person"),
        (Request(id="x", kind="approval", source=Source(tool="transfer_funds")), "approvals"),
    ],
)
def test_auto_rules_match_a_calls_tool_and_arguments(request_: Request, rule: str) -> None:
    matched = Rules.parse(RULES).match(request_)
    assert matched is not None and matched.label == rule


def test_the_documented_tool_rules_match_as_the_page_says() -> None:
    """The rules of docs/how-to/workers.md, run against calls that must match and calls
    that must not."""
    page = (Path(__file__).parent.parent / "docs" / "how-to" / "workers.md").read_text()
    blocks = re.findall(r"^ *```toml\n(.*?)^ *```", page, re.S | re.M)
    text = next(b for b in blocks if "small transfers to known payees" in b)
    rules = Rules.parse(textwrap.dedent(text), "workers.md")
    small = "small transfers to known payees"
    for request, label in [
        (call(dry_run=False), small),
        (call(to="Initech", amount=100, dry_run=False), small),
        (call(), "every other tool call waits for a person"),  # no dry_run argument
        (call(amount=500, dry_run=False), "every other tool call waits for a person"),
        (call(amount="10", dry_run=False), "every other tool call waits for a person"),
        (call(to="EVIL ACME", dry_run=False), "every other tool call waits for a person"),
        (call(dry_run=0), "every other tool call waits for a person"),
        (
            call(name="delete_account", source=Source(tool="transfer_funds"), dry_run=False),
            "every other tool call waits for a person",
        ),
    ]:
        matched = rules.match(request)
        assert matched is not None and matched.label == label, request.data


def test_argument_conditions_only_match_tool_calls() -> None:
    rules = Rules.parse('[[rule]]\narguments.amount = { max = 100 }\naction = "accept"\n')
    assert rules.match(Request(id="x", kind="approval", data={"amount": 1})) is None
    assert rules.match(call()) is not None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            '[[rule]]\naction = "accept"\narguments.amount = { below = 3 }\n',
            r"rule 1 \(line 3\): 'arguments.amount' has unknown condition 'below' \(known: equals",
        ),
        (
            '[[rule]]\naction = "accept"\narguments.amount = { max = "100" }\n',
            r"rule 1 \(line 3\): 'arguments.amount' max must be a number, not '100'",
        ),
        (
            '[[rule]]\naction = "accept"\narguments.memo = { regex = "(" }\n',
            r"rule 1 \(line 3\): 'arguments.memo' is not a valid regular expression",
        ),
        (
            '[[rule]]\naction = "accept"\narguments = "amount <= 100"\n',
            r"rule 1 \(line 3\): 'arguments' must be a table of conditions by argument name",
        ),
    ],
)
def test_a_bad_argument_condition_is_refused_with_its_line(text: str, message: str) -> None:
    with pytest.raises(RulesError, match=message):
        Rules.parse(text, "rules.toml")


async def test_the_auto_worker_approves_a_matching_call_as_proposed_and_skips_the_rest() -> None:
    small, large = call(), call(amount=500)
    async with toolnexus.connect("memory://") as broker:
        service = Service(broker, AutoWorker(Rules.parse(RULES)))
        run = asyncio.create_task(service.run())
        try:
            waiting = asyncio.create_task(broker.wait_for(small, timeout_s=10))
            left = asyncio.create_task(broker.wait_for(large, timeout_s=10))
            decision = decide(small, await asyncio.wait_for(waiting, 10))
            async with asyncio.timeout(10):
                while service.statistics()["skipped"] < 1:
                    await asyncio.sleep(0.02)
            assert not left.done()  # left for a person
            left.cancel()
            records = await broker.audit(request_id=small.id)
        finally:
            service.stop()
            await run
    assert "tool transfer_funds approved as proposed" in audit_text(records[-1])
    assert decision.approved and not decision.edited and decision.arguments == ARGS
    assert decision.answered_by is not None
    assert decision.answered_by.endswith("auto:small transfers to ACME")


# -- the web page -----------------------------------------------------------------------


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield launched
        await launched.close()


@pytest.fixture
async def redis_broker(redis_url: str, namespace: str) -> AsyncIterator[Broker]:
    async with toolnexus.connect(redis_url, namespace=namespace, **FAST) as broker:
        yield broker


@pytest.mark.redis
@pytest.mark.slow
async def test_the_web_page_shows_the_arguments_and_an_edit_as_a_diff(
    redis_broker: Broker, browser: Browser
) -> None:
    request = transfer()
    async with (
        WebServer(redis_broker, port=0, access=Access(token=TOKEN)) as web,
        waiting(redis_broker, request) as (answered,),
    ):
        page = await signed_in_page(browser, web)
        card = page.locator(f"article#{request_anchor(request.id)}")
        await expect(card).to_be_visible(timeout=WAIT_MS)
        await expect(card.locator(".kind")).to_have_text("Tool call")
        await expect(card.locator(".tool-name")).to_have_text(
            "Tool transfer_funds (test, run run-42)"
        )
        # labelled fields from the tool's schema, each holding its proposed value
        await expect(card.get_by_label("Payee")).to_have_value("ACME")
        description = card.locator(".description", has_text="Who receives the money")
        await expect(description).to_be_visible()
        await expect(card.get_by_label("Amount")).to_have_value("10")
        # the long memo folded: its beginning in the summary, the whole in a text area
        folded = card.locator("details.long-value")
        await expect(folded).not_to_have_attribute("open", "")
        await expect(folded.locator("summary")).to_contain_text("Invoice 42: for the consulting")
        await expect(card.get_by_label("Memo")).to_be_hidden()
        await folded.locator("summary").click()
        await expect(card.get_by_label("Memo")).to_have_value(MEMO)

        edits = card.locator(".edits")
        await expect(edits).to_be_hidden()
        await card.get_by_label("Amount").fill("500")
        await expect(edits).to_be_visible()
        await expect(edits.locator("li")).to_have_text(["Amount: 10 → 500"])
        # the browser's hint stops 500; without it, the server refuses it beside the field
        await card.get_by_label("Amount").evaluate("e => e.removeAttribute('max')")
        await card.get_by_role("button", name="Approve").click()
        await expect(card.locator(".field.invalid .error")).to_have_text(
            "500 is greater than the maximum of 100"
        )
        await expect(card.get_by_label("Amount")).to_have_attribute("aria-invalid", "true")
        await expect(card.locator(".edits li")).to_have_text(["Amount: 10 → 500"])  # still shown
        assert not answered.done(), "a refused edit reached the agent"

        await card.get_by_label("Amount").fill("3")
        await card.get_by_label("Payee").fill("ACME Ltd")
        await expect(card.locator(".edits li")).to_have_text(
            ["Payee: ACME → ACME Ltd", "Amount: 10 → 3"]
        )
        await card.get_by_role("button", name="Approve").click()
        decision = decide(request, await asyncio.wait_for(answered, 20))
        await expect(page.locator("#notes .note")).to_contain_text(
            'Approved with changes (Payee: "ACME" → "ACME Ltd"; Amount: 10 → 3)'
        )
        # and what is recorded says so: the audit trail, as `toolnexus audit` reads it
        records = await redis_broker.audit(request_id=request.id)
    assert decision.approved and decision.edited
    assert decision.arguments == {**ARGS, "to": "ACME Ltd", "amount": 3}
    assert len(records) == 1
    assert (
        'tool transfer_funds approved with changes (Payee: "ACME" → "ACME Ltd"; Amount: 10 → 3)'
        in audit_text(records[0])
    )
    assert audit_object(records[0])["tool_call"]["changes"] == [
        {"argument": "to", "before": '"ACME"', "after": '"ACME Ltd"'},
        {"argument": "amount", "before": "10", "after": "3"},
    ]


@pytest.mark.redis
@pytest.mark.slow
async def test_the_web_page_denies_with_a_message_and_shows_a_rich_call_as_it_is(
    redis_broker: Broker, browser: Browser
) -> None:
    rich_schema = {"type": "object", "properties": {"items": {"type": "array"}}}
    rich = tool_call_request(
        "ship", {"items": [{"sku": 1}]}, framework="t", schema=rich_schema, prompt="Ship?"
    )
    request = transfer()
    async with (
        WebServer(redis_broker, port=0, access=Access(token=TOKEN)) as web,
        waiting(redis_broker, request, rich) as (denied, approved),
    ):
        page = await signed_in_page(browser, web)
        card = page.locator(f"article#{request_anchor(request.id)}")
        await card.get_by_label("Message for the agent, if you deny").fill("Not this quarter")
        await card.get_by_role("button", name="Deny").click()
        decision = decide(request, await asyncio.wait_for(denied, 20))
        await expect(page.locator("#notes .note")).to_contain_text("Denied (“Not this quarter”)")

        shown = page.locator(f"article#{request_anchor(rich.id)}")
        await expect(shown.locator(".arguments dt")).to_have_text(["items"])
        await expect(shown.locator(".arguments dd code")).to_have_text('[{"sku": 1}]')
        await expect(shown.locator("input:not([type=hidden])")).to_have_count(0)
        await shown.get_by_role("button", name="Approve").click()
        rich_decision = decide(rich, await asyncio.wait_for(approved, 20))
    assert not decision.approved and decision.message == "Not this quarter"
    assert rich_decision.approved and not rich_decision.edited


# -- Slack and Telegram -----------------------------------------------------------------

WEB_URL = "https://desk.example/"


@pytest.mark.redis
@pytest.mark.slow
async def test_slack_shows_a_summary_approves_and_denies_with_a_message(
    redis_broker: Broker,
) -> None:
    approve, deny = transfer(prompt="Pay ACME now?"), transfer(prompt="Pay ACME later?")
    async with (
        SlackChat() as chat,
        chat.server(redis_broker, web_url=WEB_URL),
        waiting(redis_broker, approve, deny) as (approving, denying),
    ):
        await chat_eventually(lambda: bool(chat.controls(chat.message_about("now?"))), "posted")
        message = chat.message_about("now?")
        text = chat.text(message)
        assert "Tool call from tool transfer_funds" in text
        assert "Tool: transfer_funds (test, run run-42)" in text
        assert '  Payee (to) = "ACME"' in text and "  Amount (amount) = 10" in text
        assert "more characters)" in text and MEMO not in text  # the memo shortened
        controls = chat.controls(message)
        assert [(c["text"]["text"], c["action_id"]) for c in controls] == [
            ("Approve", "tnx.accept"),
            ("Deny…", "tnx.deny"),
            ("Edit on the web page", "tnx.link"),
        ]
        assert controls[2]["url"] == page_link(WEB_URL, approve.id)
        await post_interaction(
            chat.running.url, block_actions(chat.allowed, message, "tnx.accept", approve.id)
        )
        approved = decide(approve, await asyncio.wait_for(approving, 20))
        closed = f"Approved by slack:{chat.allowed}"
        await chat_eventually(lambda: closed in chat.text(chat.message_about("now?")), closed)
        assert not chat.controls(chat.message_about("now?"))

        await chat_eventually(lambda: bool(chat.controls(chat.message_about("later?"))), "posted")
        later = chat.message_about("later?")
        await post_interaction(
            chat.running.url, block_actions(chat.allowed, later, "tnx.deny", deny.id)
        )
        await chat_eventually(lambda: bool(chat.named("views.open")), "the modal opened")
        modal = chat.named("views.open")[0].params["view"]
        assert modal["callback_id"] == "tnx.deny" and modal["submit"]["text"] == "Deny"
        values = {"message": {"v": {"type": "plain_text_input", "value": "Over budget"}}}
        await post_interaction(chat.running.url, view_submission(chat.allowed, modal, values))
        denied = decide(deny, await asyncio.wait_for(denying, 20))
    assert approved.approved and approved.arguments == ARGS and not approved.edited
    assert str(approved.answered_by).endswith(f"slack:{chat.allowed}")
    assert not denied.approved and denied.message == "Over budget"


@pytest.mark.redis
@pytest.mark.slow
async def test_telegram_shows_a_summary_approves_and_denies_with_a_message(
    redis_broker: Broker,
) -> None:
    approve, deny = transfer(prompt="Pay ACME now?"), transfer(prompt="Pay ACME later?")
    async with (
        TelegramChat() as chat,
        chat.server(redis_broker, web_url=WEB_URL),
        waiting(redis_broker, approve, deny) as (approving, denying),
    ):
        await chat_eventually(lambda: bool(chat.controls(chat.message_about("now?"))), "posted")
        message = chat.message_about("now?")
        assert message is not None
        assert "Tool: transfer_funds (test, run run-42)" in message.text
        assert "  Amount (amount) = 10" in message.text and MEMO not in message.text
        assert buttons(message.markup) == [
            {"text": "Approve", "callback_data": "a"},
            {"text": "Deny", "callback_data": "d"},
            {"text": "Deny with a message…", "callback_data": "m"},
            {"text": "Edit on the web page", "url": page_link(WEB_URL, approve.id)},
        ]
        FakeTelegram.click(chat, int(chat.allowed), message, "a")
        approved = decide(approve, await asyncio.wait_for(approving, 20))

        await chat_eventually(lambda: bool(chat.controls(chat.message_about("later?"))), "posted")
        later = chat.message_about("later?")
        assert later is not None
        FakeTelegram.click(chat, int(chat.allowed), later, "m")
        await chat_eventually(
            lambda: any("message for the agent" in t for t in chat.sent(chat.home)), "asked"
        )
        chat.say(int(chat.other), chat.home, "Fine by me")  # not theirs to answer
        chat.say(int(chat.allowed), chat.home, "Over budget")
        denied = decide(deny, await asyncio.wait_for(denying, 20))
        closed = f"Denied by telegram:{chat.allowed}"
        await chat_eventually(lambda: closed in chat.text(chat.message_about("later?")), closed)
    assert approved.approved and approved.arguments == ARGS
    assert not denied.approved and denied.message == "Over budget"
