"""The chat bots (`toolnexus worker slack`, `toolnexus worker telegram`): one suite that
both pass, through the fake-chat protocol of tests/chat_fakes.py (a local server speaking
the Slack Web API, with clicks POSTed to the bot's Bolt endpoint signed as Slack signs
them; a local server speaking the Telegram Bot API, long-polled for clicks and replies).
Requests go through the real Redis, agents wait in other processes where it matters; the
last tests run both bots on a Redis Cluster, over TLS and on the embedded broker."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.x509.oid import ExtendedKeyUsageOID

import helpers
import toolnexus
from chat_fakes import FORM, ChatFake, SlackChat, TelegramChat, eventually
from conformance import TOOLNEXUS, clean_env
from conftest import FAST, RedisServer
from redis_topologies import LocalCluster
from test_tls import Authority
from toolnexus import Answer, Broker, Quorum, Request, new_id
from toolnexus.models import Hop
from waiting_agents import AgentFactory

pytestmark = [pytest.mark.redis, pytest.mark.timeout(90)]

BOTS = {"slack": SlackChat, "telegram": TelegramChat}


@pytest.fixture
async def broker(redis_url: str, namespace: str) -> AsyncIterator[Broker]:
    async with toolnexus.connect(redis_url, namespace=namespace, **FAST) as b:
        yield b


@pytest.fixture(params=sorted(BOTS))
async def chat(request: pytest.FixtureRequest) -> AsyncIterator[ChatFake]:
    async with BOTS[request.param]() as fake:
        yield fake  # type: ignore[misc]


def person(chat: ChatFake) -> str:
    return f"{chat.platform}:{chat.allowed}"


ask = functools.partial(helpers.ask, source=helpers.AGENT_7)
"""A request from agent-7's booking tool: an approval unless ``kind`` says otherwise."""


async def shown(chat: ChatFake, request: Request) -> Any:
    """The message of ``request`` once it has its controls."""
    await eventually(
        lambda: bool(chat.controls(chat.message_about(request.prompt))), f"{request.id} posted"
    )
    message = chat.message_about(request.prompt)
    assert message is not None
    return message


async def closed(chat: ChatFake, request: Request, note: str) -> Any:
    """The message of ``request`` once it says ``note`` and has lost its controls."""

    def done() -> bool:
        message = chat.message_about(request.prompt)
        return note in chat.text(message) and not chat.controls(message)

    await eventually(
        done, f"{request.id} closed with {note!r}: {chat.message_about(request.prompt)}"
    )
    message = chat.message_about(request.prompt)
    assert message is not None
    return message


@contextlib.asynccontextmanager
async def waiting(broker: Broker, request: Request) -> AsyncIterator[asyncio.Task[Answer]]:
    task = asyncio.create_task(broker.wait_for(request, timeout_s=60))
    try:
        yield task
    finally:
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def test_a_request_from_an_agent_is_posted_and_an_allowed_click_answers_it(
    broker: Broker, chat: ChatFake, agents: AgentFactory
) -> None:
    request = ask("Book a table for 4 at 19:30?", expires_at=None)
    async with chat.server(broker):
        agent = await agents(request)
        message = await shown(chat, request)
        assert chat.where(message) == chat.home
        text = chat.text(message)
        assert "server booking, tool book_table, agent agent-7" in text
        assert "Time left:" in text
        assert chat.control_ids(message) == chat.approval_controls(request)
        click = await chat.click(chat.allowed, message, request, "accept")
        answer = await agent.answer()
        assert (answer.ok, answer.data, answer.person) == (True, None, person(chat))
        assert answer.responder is not None and answer.responder.startswith(f"{chat.platform}/")
        await chat.quiet(click)
        await closed(chat, request, f"Answered by {person(chat)}")


async def test_a_quorum_message_shows_the_count_and_a_second_vote_is_refused(
    broker: Broker, chat: ChatFake, agents: AgentFactory
) -> None:
    request = ask("Ship release 7?", quorum=Quorum(2))
    async with chat.server(broker):
        agent = await agents(request)
        message = await shown(chat, request)
        assert "0 of 2 approvals" in chat.text(message)
        click = await chat.click(chat.allowed, message, request, "accept")
        assert "Your vote is counted: 1 of 2 approvals" in await chat.told(click)

        def counted() -> bool:
            text = chat.text(chat.message_about(request.prompt))
            return f"1 of 2 approvals: {person(chat)}" in text  # the voter: the person

        await eventually(counted, "the count shown")
        message = await shown(chat, request)  # its controls stay, for others to vote
        again = await chat.click(chat.allowed, message, request, "accept")
        assert "a second vote is not counted" in await chat.told(again)
        await broker.answer(Answer(id=request.id, ok=True, person="web:bob"))
        answer = await agent.answer()
        assert [a.person for a in answer.approvals or ()] == [person(chat), "web:bob"]
        await closed(chat, request, "Answered elsewhere by web:bob")


@pytest.mark.parametrize(
    ("options", "position", "labels", "chosen"),
    [
        ({"type": "string", "enum": ["S", "M", "L"]}, 2, ["S", "M", "L"], "L"),
        ({"type": "integer", "enum": [36, 38, 40]}, 1, ["36", "38", "40"], 38),
    ],
)
async def test_a_single_choice_is_one_button_per_option(
    broker: Broker,
    chat: ChatFake,
    options: dict[str, Any],
    position: int,
    labels: list[str],
    chosen: Any,
) -> None:
    schema = {
        "type": "object",
        "properties": {"size": {**options, "title": "Size"}},
        "required": ["size"],
    }
    request = ask("Which size?", kind="input", data={"schema": schema})
    async with chat.server(broker), waiting(broker, request) as wait:
        message = await shown(chat, request)
        assert chat.labels(message) == [*labels, "Decline"]
        await chat.click(chat.allowed, message, request, f"choice:{position}")
        answer = await asyncio.wait_for(wait, 30)
        assert (answer.ok, answer.data) == (True, {"size": chosen})


async def test_someone_not_allowed_is_refused_privately_and_nothing_changes(
    broker: Broker, chat: ChatFake
) -> None:
    request = ask("Deploy to production?")
    async with chat.server(broker), waiting(broker, request) as wait:
        message = await shown(chat, request)
        edits = len(chat.named(chat.edited_method))
        refusal = await chat.told_privately(
            await chat.click(chat.other, message, request, "accept")
        )
        assert "not on the list of people who may answer" in refusal
        assert not wait.done()
        assert len(chat.named(chat.edited_method)) == edits
        assert chat.controls(chat.message_about(request.prompt))  # its controls are still there
        await chat.forge(message, request)
        await asyncio.sleep(0.5)
        assert not wait.done()


async def test_a_multi_select_sends_the_chosen_options(broker: Broker, chat: ChatFake) -> None:
    schema = {
        "type": "object",
        "properties": {
            "toppings": {
                "type": "array",
                "title": "Toppings",
                "items": {"type": "string", "enum": ["cheese", "olives", "ham"]},
                "minItems": 1,
                "default": ["olives"],
            }
        },
    }
    request = ask("Toppings?", kind="input", data={"schema": schema})
    async with chat.server(broker), waiting(broker, request) as wait:
        message = await shown(chat, request)
        assert chat.choices(message) == [("cheese", False), ("olives", True), ("ham", False)]
        await chat.pick(chat.allowed, message, request, {0, 2})
        answer = await asyncio.wait_for(wait, 30)
        assert answer.data == {"toppings": ["cheese", "ham"]}


async def test_a_form_asks_every_field_shows_mistakes_and_answers(
    broker: Broker, chat: ChatFake
) -> None:
    request = ask("Book a table", kind="input", data={"schema": FORM})
    async with chat.server(broker), waiting(broker, request) as wait:
        message = await shown(chat, request)
        sent = await chat.fill_form(message, request, wait.done)
        answer = await asyncio.wait_for(wait, 30)
        assert answer.data == sent
        assert answer.person == person(chat)
        await closed(chat, request, f"Answered by {person(chat)}")


@pytest.mark.parametrize(
    ("url", "warning"),
    [
        ("https://auth.example-pay.com/authorize?client=booking", None),
        ("https://gіthub.com/login/oauth/authorize", "looks like github.com"),  # a Cyrillic і
        ("https://paypal.com.secure-login.example/authorize", "starts with paypal.com"),
        ("http://pay.example.com/authorize", "not https"),
    ],
)
async def test_an_authorization_shows_its_url_domain_and_warnings_then_is_done(
    broker: Broker, chat: ChatFake, url: str, warning: str | None
) -> None:
    request = ask("Let booking charge your card", kind="authorization", url=url)
    async with chat.server(broker), waiting(broker, request) as wait:
        message = await shown(chat, request)
        text = chat.text(message)
        assert f"Address: {url}" in text and "Domain: " in text
        if warning is None:
            assert "site example-pay.com" in text and "⚠️" not in text
        else:
            assert warning in text
        chat.check_link_controls(message, url)
        await chat.click(chat.allowed, message, request, "done")
        assert (await asyncio.wait_for(wait, 30)).ok is True


async def test_answered_elsewhere_edits_the_message_and_a_late_click_is_told_so(
    broker: Broker, chat: ChatFake
) -> None:
    request = ask("Rotate the keys?")
    async with chat.server(broker), waiting(broker, request) as wait:
        message = await shown(chat, request)
        await broker.answer(Answer(id=request.id, ok=False, reason="declined", person="web:bob"))
        assert (await wait).reason == "declined"
        await closed(chat, request, "Answered elsewhere by web:bob")
        late = await chat.told(await chat.click(chat.allowed, message, request, "accept"))
        assert late.startswith("Too late")
        assert len(await broker.audit(request_id=request.id)) == 1  # answered once


async def restarted_bot_keeps_its_messages_in_step(broker: Broker, chat: ChatFake) -> None:
    """A bot that restarts closes the message of a request resolved while it was away,
    edits (never posts again) the message of one still open, which is answered there."""
    kept, resolved = ask("Still open after the restart?"), ask("Answered while the bot was away?")
    async with waiting(broker, kept) as wait_kept, waiting(broker, resolved) as wait_resolved:
        async with chat.server(broker):
            await shown(chat, kept)
            await shown(chat, resolved)
        posted = len(chat.named(chat.posted_method))
        await broker.answer(Answer(id=resolved.id, ok=True, person="web:carol"))
        assert (await wait_resolved).person == "web:carol"
        async with chat.server(broker):
            await closed(chat, resolved, "Answered elsewhere by web:carol")
            message = await shown(chat, kept)
            await eventually(lambda: bool(chat.edits_of(message)), "its message edited again")
            assert len(chat.named(chat.posted_method)) == posted  # nothing posted twice
            await chat.click(chat.allowed, message, kept, "accept")
            assert (await asyncio.wait_for(wait_kept, 30)).person == person(chat)
            await closed(chat, kept, "Answered by")


@pytest.mark.slow
async def test_a_restarted_bot_finds_its_messages_and_keeps_them_in_step(
    broker: Broker, chat: ChatFake
) -> None:
    await restarted_bot_keeps_its_messages_in_step(broker, chat)


@pytest.mark.slow
def test_the_command_names_what_is_missing(chat: ChatFake, namespace: str) -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        command = [TOOLNEXUS, "worker", chat.platform, "--namespace", namespace]
        env = {k: v for k, v in clean_env().items() if not k.startswith(chat.platform.upper())}
        return subprocess.run(
            [*command, *args], capture_output=True, text=True, env=env, timeout=60
        )

    for args, needle in chat.missing:
        done = run(*args)
        assert needle in done.stderr, (args, done.stderr)
    assert done.returncode == 2


async def test_an_escalated_request_says_so_and_stays_answerable(
    broker: Broker, chat: ChatFake
) -> None:
    request = ask("Restart the primary?", escalate=[Hop(0.3, "oncall")])
    async with chat.server(broker), waiting(broker, request) as wait:
        await shown(chat, request)
        note = "Escalated to oncall: still open here too."

        def marked() -> bool:
            message = chat.message_about(request.prompt)
            return note in chat.text(message) and bool(chat.controls(message))

        await eventually(marked, "the message marked escalated, its controls kept")
        message = chat.message_about(request.prompt)
        await chat.click(chat.allowed, message, request, "accept")
        assert (await wait).ok


# -- other brokers: the bots keep their messages through the broker's store --------------


async def answered_and_restarted(url: str, chat: ChatFake, **options: Any) -> None:
    """A request answered by a click, then the restart test, on a broker at ``url``."""
    async with toolnexus.connect(url, namespace=f"chat{new_id()[:8]}", **options) as b:
        request = ask("Over another topology?")
        async with chat.server(b), waiting(b, request) as wait:
            message = await shown(chat, request)
            await chat.click(chat.allowed, message, request, "accept")
            assert (await asyncio.wait_for(wait, 30)).person == person(chat)
            await closed(chat, request, f"Answered by {person(chat)}")
        await restarted_bot_keeps_its_messages_in_step(b, chat)
        assert await b.store(chat.platform).items() == {}  # every message closed, forgotten


async def test_both_bots_run_on_a_redis_cluster(
    redis_cluster: LocalCluster, chat: ChatFake
) -> None:
    assert redis_cluster.url.startswith("redis+cluster://")
    await answered_and_restarted(redis_cluster.url, chat, **FAST)


async def test_both_bots_run_on_the_embedded_broker(chat: ChatFake) -> None:
    await answered_and_restarted("memory://", chat)


@pytest.fixture
def tls(tmp_path: Path) -> Iterator[tuple[RedisServer, dict[str, Any]]]:
    """A redis-server speaking only TLS, with client certificates; the client's options."""
    ca = Authority(tmp_path, "toolnexus-chat-ca")
    cert, key = ca.issue("bot", ExtendedKeyUsageOID.CLIENT_AUTH)
    client = {"ssl_ca_certs": ca.cert_file, "ssl_certfile": cert, "ssl_keyfile": key}
    server_cert, server_key = ca.issue("redis", ExtendedKeyUsageOID.SERVER_AUTH)
    server = RedisServer(
        tmp_path,
        "--tls-cert-file",
        server_cert,
        "--tls-key-file",
        server_key,
        "--tls-ca-cert-file",
        ca.cert_file,
        "--tls-auth-clients",
        "yes",
        tls=True,
        **client,
    )
    server.start()
    try:
        yield server, client
    finally:
        server.kill()


@pytest.mark.slow
async def test_both_bots_run_over_tls(
    tls: tuple[RedisServer, dict[str, Any]], chat: ChatFake
) -> None:
    server, client = tls
    assert server.url.startswith("rediss://")
    await answered_and_restarted(server.url, chat, **FAST, **client)


async def test_a_request_still_open_gets_a_reminder_in_reply_with_the_time_left(
    broker: Broker, chat: ChatFake
) -> None:
    request = ask("Restart the cache?")
    async with chat.server(broker, remind_after_s=0.3), waiting(broker, request):
        message = await shown(chat, request)

        def reminders() -> list[Any]:
            return [
                call
                for call in chat.named(chat.posted_method)
                if str(call.params.get("text", "")).startswith("⏰ Reminder: still open.")
            ]

        await eventually(lambda: len(reminders()) >= 2, "two reminders")
        first = reminders()[0].params
        assert "Time left: " in first["text"]
        # a reply to the request's message, which keeps its controls
        assert (first.get("thread_ts") or first.get("reply_parameters")) is not None
        assert chat.controls(chat.message_about(request.prompt)) == chat.controls(message)
