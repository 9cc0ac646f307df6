"""The Telegram bot (`toolnexus worker telegram`) against a local server speaking the Bot
API: it long-polls ``getUpdates`` for the clicks and replies the tests queue; requests go
through the real Redis, agents wait in other processes where it matters."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
from collections.abc import AsyncIterator
from typing import Any

import pytest

import toolnexus
from agents import AgentFactory
from chat_fakes import FORM, TELEGRAM_TOKEN, FakeTelegram, TelegramMessage, buttons, eventually
from conformance import TOOLNEXUS, clean_env
from conftest import FAST
from toolnexus import Answer, Broker, Quorum, Request, Source, new_id
from toolnexus.models import Hop
from toolnexus_workers.telegram.server import TelegramServer

pytestmark = [pytest.mark.redis, pytest.mark.timeout(90)]

CHAT, ALLOWED, OTHER = -1001, 555, 666


@pytest.fixture
async def broker(redis_url: str, namespace: str) -> AsyncIterator[Broker]:
    async with toolnexus.connect(redis_url, namespace=namespace, **FAST) as b:
        yield b


@pytest.fixture
async def telegram() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram() as fake:
        yield fake


def bot(broker: Broker, telegram: FakeTelegram, namespace: str) -> TelegramServer:
    return TelegramServer(
        broker,
        bot_token=TELEGRAM_TOKEN,
        chat_id=CHAT,
        allowed=[str(ALLOWED)],
        api_url=telegram.url,
        polling_timeout_s=1,
        namespace=namespace,
        drain_s=2,
    )


def ask(prompt: str, kind: str = "approval", **fields: Any) -> Request:
    source = Source(server="booking", tool="book_table", agent="agent-7")
    return Request(id=new_id(), kind=kind, prompt=prompt, source=source, **fields)


async def shown(telegram: FakeTelegram, request: Request) -> TelegramMessage:
    def posted() -> bool:
        message = telegram.message_about(request.prompt)
        return message is not None and bool(buttons(message.markup))

    await eventually(posted, f"{request.id} posted")
    message = telegram.message_about(request.prompt)
    assert message is not None
    return message


async def closed(telegram: FakeTelegram, request: Request, note: str) -> TelegramMessage:
    def done() -> bool:
        message = telegram.message_about(request.prompt)
        return message is not None and note in message.text and not buttons(message.markup)

    await eventually(done, f"{request.id} closed with {note!r}")
    message = telegram.message_about(request.prompt)
    assert message is not None
    return message


async def told(telegram: FakeTelegram, query_id: str) -> dict[str, Any]:
    await eventually(lambda: telegram.answer_to(query_id) is not None, f"query {query_id} answered")
    answer = telegram.answer_to(query_id)
    assert answer is not None
    return answer


@contextlib.asynccontextmanager
async def waiting(broker: Broker, request: Request) -> AsyncIterator[asyncio.Task[Answer]]:
    task = asyncio.create_task(broker.wait_for(request, timeout_s=60))
    try:
        yield task
    finally:
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def test_a_request_from_an_agent_is_sent_and_an_allowed_click_answers_it(
    broker: Broker, telegram: FakeTelegram, namespace: str, agents: AgentFactory
) -> None:
    request = ask("Book a table for 4 at 19:30?")
    async with bot(broker, telegram, namespace):
        agent = await agents(request)
        message = await shown(telegram, request)
        assert message.chat_id == CHAT
        assert "server booking, tool book_table, agent agent-7" in message.text
        assert "Time left:" in message.text
        assert [(b["text"], b["callback_data"]) for b in buttons(message.markup)] == [
            ("Accept", "a"),
            ("Decline", "d"),
        ]
        query = telegram.click(ALLOWED, message, "a")
        answer = await agent.answer()
        assert (answer.ok, answer.data, answer.person) == (True, None, f"telegram:{ALLOWED}")
        assert answer.responder is not None and answer.responder.startswith("telegram/")
        assert (await told(telegram, query)).get("show_alert") in (None, False, "false")
        await closed(telegram, request, f"Answered by telegram:{ALLOWED}")


async def test_a_quorum_message_shows_the_count_and_a_second_vote_is_refused(
    broker: Broker, telegram: FakeTelegram, namespace: str, agents: AgentFactory
) -> None:
    request = ask("Ship release 8?", quorum=Quorum(2))
    async with bot(broker, telegram, namespace):
        agent = await agents(request)
        message = await shown(telegram, request)
        assert "0 of 2 approvals" in message.text
        query = telegram.click(ALLOWED, message, "a")
        assert "Your vote is counted: 1 of 2 approvals" in (await told(telegram, query))["text"]

        def counted() -> bool:
            shown_now = telegram.message_about(request.prompt)
            return shown_now is not None and f"approvals: telegram:{ALLOWED}" in shown_now.text

        await eventually(counted, "the count shown")
        message = await shown(telegram, request)  # its buttons stay, for others to vote
        again = telegram.click(ALLOWED, message, "a")
        assert "a second vote is not counted" in (await told(telegram, again))["text"]
        await broker.answer(Answer(id=request.id, ok=True, person="web:bob"))
        answer = await agent.answer()
        assert [a.person for a in answer.approvals or ()] == [f"telegram:{ALLOWED}", "web:bob"]
        await closed(telegram, request, "Answered elsewhere by web:bob")


async def test_a_single_choice_is_a_button_per_option(
    broker: Broker, telegram: FakeTelegram, namespace: str
) -> None:
    schema = {
        "type": "object",
        "properties": {"size": {"type": "integer", "enum": [36, 38, 40], "title": "Size"}},
        "required": ["size"],
    }
    request = ask("Which size?", kind="input", data={"schema": schema})
    async with bot(broker, telegram, namespace), waiting(broker, request) as wait:
        message = await shown(telegram, request)
        assert [b["text"] for b in buttons(message.markup)] == ["36", "38", "40", "Decline"]
        telegram.click(ALLOWED, message, "c1")
        assert (await asyncio.wait_for(wait, 30)).data == {"size": 38}


async def test_someone_not_allowed_is_refused_privately_and_nothing_changes(
    broker: Broker, telegram: FakeTelegram, namespace: str
) -> None:
    request = ask("Deploy to production?")
    async with bot(broker, telegram, namespace), waiting(broker, request) as wait:
        message = await shown(telegram, request)
        edits = len(telegram.named("editMessageText"))
        refusal = await told(telegram, telegram.click(OTHER, message, "a"))
        assert "not on the list of people who may answer" in refusal["text"]
        assert str(refusal["show_alert"]).lower() == "true"  # shown to that person only
        assert not wait.done()
        assert len(telegram.named("editMessageText")) == edits
        again = telegram.message_about(request.prompt)
        assert again is not None and buttons(again.markup)


async def test_a_multi_select_is_toggles_and_done(
    broker: Broker, telegram: FakeTelegram, namespace: str
) -> None:
    schema = {
        "type": "object",
        "properties": {
            "toppings": {
                "type": "array",
                "title": "Toppings",
                "items": {"type": "string", "enum": ["cheese", "olives", "ham"]},
                "default": ["olives"],
            }
        },
    }
    request = ask("Toppings?", kind="input", data={"schema": schema})
    async with bot(broker, telegram, namespace), waiting(broker, request) as wait:
        message = await shown(telegram, request)
        labels = [b["text"] for b in buttons(message.markup)]
        assert labels == ["☐ cheese", "☑ olives", "☐ ham", "Done", "Decline"]  # the default
        await told(telegram, telegram.click(ALLOWED, message, "t0"))
        await told(telegram, telegram.click(ALLOWED, message, "t1"))
        await told(telegram, telegram.click(ALLOWED, message, "t2"))
        ticked = telegram.message_about(request.prompt)
        assert ticked is not None
        assert [b["text"] for b in buttons(ticked.markup)][:3] == ["☑ cheese", "☐ olives", "☑ ham"]
        telegram.click(ALLOWED, message, "s")
        assert (await asyncio.wait_for(wait, 30)).data == {"toppings": ["cheese", "ham"]}


async def test_a_form_is_a_reply_sequence_that_asks_again_after_a_mistake(
    broker: Broker, telegram: FakeTelegram, namespace: str
) -> None:
    request = ask("Book a table", kind="input", data={"schema": FORM})
    async with bot(broker, telegram, namespace), waiting(broker, request) as wait:
        message = await shown(telegram, request)
        telegram.click(ALLOWED, message, "f")
        asked = 0

        async def question(containing: str) -> str:
            nonlocal asked
            await eventually(
                lambda: len(telegram.sent(CHAT)) > asked + 1, f"a question about {containing}"
            )
            asked += 1
            text = telegram.sent(CHAT)[asked]
            assert containing in text, text
            return text

        assert "1/8 Name" in await question("Name")
        telegram.say(OTHER, CHAT, "Mallory")  # someone else's message is not an answer
        telegram.say(ALLOWED, CHAT, "A")
        assert "shorter than the minimum length of 2" in await question("1/8 Name")
        telegram.say(ALLOWED, CHAT, "Ada")
        await question("2/8 Email")
        telegram.say(ALLOWED, CHAT, "not an email")
        await question("2/8 Email")
        telegram.say(ALLOWED, CHAT, "ada@example.org")
        await question("3/8 Day")
        telegram.say(ALLOWED, CHAT, "2026-05-01")
        assert "Default: 2" in await question("4/8 Guests")
        telegram.say(ALLOWED, CHAT, "-")  # the default
        await question("5/8 Budget")
        telegram.say(ALLOWED, CHAT, "99.5")
        assert "yes or no" in await question("6/8 Terrace")
        telegram.say(ALLOWED, CHAT, "maybe")
        assert "neither yes nor no" in await question("6/8 Terrace")
        telegram.say(ALLOWED, CHAT, "yes")
        menu = await question("7/8 Menu")
        assert "2. fish" in menu
        telegram.say(ALLOWED, CHAT, "4")
        await question("7/8 Menu")  # no option 4: asked again
        telegram.say(ALLOWED, CHAT, "2")
        await question("8/8 Extras")
        telegram.say(ALLOWED, CHAT, "1, wine")
        answer = await asyncio.wait_for(wait, 30)
        assert answer.data == {
            "name": "Ada",
            "email": "ada@example.org",
            "day": "2026-05-01",
            "guests": 2,
            "budget": 99.5,
            "terrace": True,
            "menu": "fish",
            "extras": ["cake", "wine"],
        }
        assert answer.person == f"telegram:{ALLOWED}"
        await closed(telegram, request, f"Answered by telegram:{ALLOWED}")


@pytest.mark.parametrize(
    ("url", "warning"),
    [
        ("https://auth.example-pay.com/authorize?client=booking", None),
        ("https://paypal.com.secure-login.example/authorize", "starts with paypal.com"),
        ("http://pay.example.com/authorize", "not https"),
    ],
)
async def test_an_authorization_shows_its_url_domain_and_warnings_then_is_done(
    broker: Broker, telegram: FakeTelegram, namespace: str, url: str, warning: str | None
) -> None:
    request = ask("Let booking charge your card", kind="authorization", url=url)
    async with bot(broker, telegram, namespace), waiting(broker, request) as wait:
        message = await shown(telegram, request)
        assert f"Address: {url}" in message.text and "Domain: " in message.text
        if warning is None:
            assert "site example-pay.com" in message.text and "⚠️" not in message.text
        else:
            assert warning in message.text
        controls = buttons(message.markup)
        assert controls[0] == {"text": "Open link", "url": url}
        assert [b.get("callback_data") for b in controls[1:]] == ["k", "d"]
        telegram.click(ALLOWED, message, "k")
        assert (await asyncio.wait_for(wait, 30)).ok is True


async def test_answered_elsewhere_edits_the_message_and_a_late_click_is_told_so(
    broker: Broker, telegram: FakeTelegram, namespace: str
) -> None:
    request = ask("Rotate the keys?")
    async with bot(broker, telegram, namespace), waiting(broker, request) as wait:
        message = await shown(telegram, request)
        await broker.answer(Answer(id=request.id, ok=False, reason="declined", person="web:bob"))
        assert (await wait).reason == "declined"
        await closed(telegram, request, "Answered elsewhere by web:bob")
        late = await told(telegram, telegram.click(ALLOWED, message, "a"))
        assert late["text"].startswith("Too late")
        assert len(await broker.audit(request_id=request.id)) == 1  # answered once


async def test_a_restarted_bot_finds_its_messages_and_keeps_them_in_step(
    broker: Broker, telegram: FakeTelegram, namespace: str
) -> None:
    kept, resolved = ask("Still open after the restart?"), ask("Answered while the bot was away?")
    async with waiting(broker, kept) as wait_kept, waiting(broker, resolved) as wait_resolved:
        async with bot(broker, telegram, namespace):
            await shown(telegram, kept)
            await shown(telegram, resolved)
        posted = len(telegram.named("sendMessage"))
        await broker.answer(Answer(id=resolved.id, ok=True, person="web:carol"))
        assert (await wait_resolved).person == "web:carol"
        async with bot(broker, telegram, namespace):
            await closed(telegram, resolved, "Answered elsewhere by web:carol")
            message = await shown(telegram, kept)
            await eventually(lambda: bool(edits(telegram, message)), "its message edited again")
            assert len(telegram.named("sendMessage")) == posted  # nothing sent twice
            telegram.click(ALLOWED, message, "a")
            assert (await asyncio.wait_for(wait_kept, 30)).person == f"telegram:{ALLOWED}"
            await closed(telegram, kept, "Answered by")


def edits(telegram: FakeTelegram, message: TelegramMessage) -> list[Any]:
    return [
        c
        for c in telegram.named("editMessageText")
        if int(c.params["message_id"]) == message.message_id
    ]


def test_the_command_names_what_is_missing(namespace: str) -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        command = [TOOLNEXUS, "worker", "telegram", "--namespace", namespace]
        env = {k: v for k, v in clean_env().items() if not k.startswith("TELEGRAM_")}
        return subprocess.run(
            [*command, *args], capture_output=True, text=True, env=env, timeout=60
        )

    assert "no Telegram bot token" in run().stderr
    assert "no Telegram chat" in run("--bot-token", TELEGRAM_TOKEN).stderr
    assert "is a number" in run("--bot-token", TELEGRAM_TOKEN, "--chat", "ops").stderr
    done = run("--bot-token", TELEGRAM_TOKEN, "--chat", "-100")
    assert done.returncode == 2 and "--allow-user" in done.stderr


async def test_an_escalated_request_says_so_and_stays_answerable(
    broker: Broker, telegram: FakeTelegram, namespace: str
) -> None:
    request = ask("Restart the replica?", escalate=[Hop(0.3, "oncall")])
    async with bot(broker, telegram, namespace), waiting(broker, request) as wait:
        await shown(telegram, request)
        note = "Escalated to oncall: still open here too."

        def marked() -> bool:
            message = telegram.message_about(request.prompt)
            return message is not None and note in message.text and bool(buttons(message.markup))

        await eventually(marked, "the message marked escalated, its buttons kept")
        message = telegram.message_about(request.prompt)
        assert message is not None
        telegram.click(ALLOWED, message, "a")
        assert (await wait).ok
