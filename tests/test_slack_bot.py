"""The Slack bot (`toolnexus worker slack`) against a local server speaking the Slack Web
API, with interactions POSTed to its Bolt endpoint signed as Slack signs them; requests
go through the real Redis, agents wait in other processes where it matters."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
from collections.abc import AsyncIterator
from typing import Any

import pytest

import toolnexus
from agents import AgentFactory
from chat_fakes import (
    BOT_TOKEN,
    FORM,
    SIGNING_SECRET,
    FakeSlack,
    actions,
    block_actions,
    eventually,
    post_interaction,
    view_submission,
)
from conformance import TOOLNEXUS, clean_env
from conftest import FAST
from toolnexus import Answer, Broker, Quorum, Request, Source, new_id
from toolnexus.models import Hop
from toolnexus_workers.slack.server import SlackServer

pytestmark = [pytest.mark.redis, pytest.mark.timeout(90)]

ALLOWED, OTHER = "UALLOW", "UOTHER"


@pytest.fixture
async def broker(redis_url: str, namespace: str) -> AsyncIterator[Broker]:
    async with toolnexus.connect(redis_url, namespace=namespace, **FAST) as b:
        yield b


@pytest.fixture
async def slack() -> AsyncIterator[FakeSlack]:
    async with FakeSlack() as fake:
        yield fake


def bot(broker: Broker, slack: FakeSlack, namespace: str) -> SlackServer:
    return SlackServer(
        broker,
        bot_token=BOT_TOKEN,
        signing_secret=SIGNING_SECRET,
        channel="C1",
        allowed=[ALLOWED],
        port=0,
        api_url=slack.url,
        namespace=namespace,
        drain_s=2,
    )


def ask(prompt: str, kind: str = "approval", **fields: Any) -> Request:
    source = Source(server="booking", tool="book_table", agent="agent-7")
    return Request(id=new_id(), kind=kind, prompt=prompt, source=source, **fields)


async def shown(slack: FakeSlack, request: Request) -> dict[str, Any]:
    """The message of ``request`` once it has its controls."""
    await eventually(
        lambda: bool(actions(slack.message_about(request.prompt))), f"{request.id} posted"
    )
    message = slack.message_about(request.prompt)
    assert message is not None
    return message


async def closed(slack: FakeSlack, request: Request, note: str) -> dict[str, Any]:
    """The message of ``request`` once it says ``note`` and has lost its controls."""

    def done() -> bool:
        message = slack.message_about(request.prompt) or {}
        return note in message.get("text", "") and not actions(message)

    await eventually(
        done, f"{request.id} closed with {note!r}: {slack.message_about(request.prompt)}"
    )
    message = slack.message_about(request.prompt)
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
    broker: Broker, slack: FakeSlack, namespace: str, agents: AgentFactory
) -> None:
    request = ask("Book a table for 4 at 19:30?", expires_at=None)
    async with bot(broker, slack, namespace) as server:
        agent = await agents(request)
        message = await shown(slack, request)
        assert message["channel"] == "C1"
        text = message["text"]
        assert "server booking, tool book_table, agent agent-7" in text
        assert "Time left:" in text
        assert [(e["action_id"], e["value"]) for e in actions(message)] == [
            ("tnx.accept", request.id),
            ("tnx.decline", request.id),
        ]
        reply = await post_interaction(
            server.url, block_actions(ALLOWED, message, "tnx.accept", request.id)
        )
        assert reply.status_code == 200
        answer = await agent.answer()
        assert (answer.ok, answer.data, answer.person) == (True, None, f"slack:{ALLOWED}")
        assert answer.responder is not None and answer.responder.startswith("slack/")
        await closed(slack, request, f"Answered by slack:{ALLOWED}")


async def test_a_quorum_message_shows_the_count_and_keeps_its_buttons(
    broker: Broker, slack: FakeSlack, namespace: str, agents: AgentFactory
) -> None:
    request = ask("Ship release 7?", quorum=Quorum(2))
    async with bot(broker, slack, namespace) as server:
        agent = await agents(request)
        message = await shown(slack, request)
        assert "0 of 2 approvals" in message["text"]
        await post_interaction(
            server.url, block_actions(ALLOWED, message, "tnx.accept", request.id)
        )

        def counted() -> bool:
            text = (slack.message_about(request.prompt) or {}).get("text", "")
            return f"1 of 2 approvals: slack:{ALLOWED}" in text  # the voter: the person

        await eventually(counted, "the count shown")
        assert actions(slack.message_about(request.prompt))  # others can still vote
        await broker.answer(Answer(id=request.id, ok=True, person="web:bob"))
        answer = await agent.answer()
        assert [a.person for a in answer.approvals or ()] == [f"slack:{ALLOWED}", "web:bob"]
        await closed(slack, request, "Answered elsewhere by web:bob")


async def test_a_single_choice_is_one_button_per_option(
    broker: Broker, slack: FakeSlack, namespace: str
) -> None:
    schema = {
        "type": "object",
        "properties": {"size": {"type": "string", "enum": ["S", "M", "L"], "title": "Size"}},
        "required": ["size"],
    }
    request = ask("Which size?", kind="input", data={"schema": schema})
    async with bot(broker, slack, namespace) as server, waiting(broker, request) as wait:
        message = await shown(slack, request)
        labels = [e["text"]["text"] for e in actions(message)]
        assert labels == ["S", "M", "L", "Decline"]
        await post_interaction(
            server.url, block_actions(ALLOWED, message, "tnx.choice.2", request.id)
        )
        answer = await asyncio.wait_for(wait, 30)
        assert (answer.ok, answer.data) == (True, {"size": "L"})


async def test_someone_not_allowed_is_refused_privately_and_nothing_changes(
    broker: Broker, slack: FakeSlack, namespace: str
) -> None:
    request = ask("Deploy to production?")
    async with bot(broker, slack, namespace) as server, waiting(broker, request) as wait:
        message = await shown(slack, request)
        updates = len(slack.named("chat.update"))
        await post_interaction(server.url, block_actions(OTHER, message, "tnx.accept", request.id))
        await eventually(lambda: bool(slack.ephemerals(OTHER)), "a refusal sent")
        assert "not on the list of people who may answer" in slack.ephemerals(OTHER)[0]
        assert not wait.done()
        assert len(slack.named("chat.update")) == updates
        assert actions(slack.message_about(request.prompt))  # its controls are still there
        # a forged click (the wrong signing secret) is refused by Bolt before anything
        forged = block_actions(ALLOWED, message, "tnx.accept", request.id)
        reply = await post_interaction(server.url, forged, secret="not-the-secret")
        assert reply.status_code == 401
        await asyncio.sleep(0.5)
        assert not wait.done()


async def test_a_multi_select_sends_the_chosen_options(
    broker: Broker, slack: FakeSlack, namespace: str
) -> None:
    schema = {
        "type": "object",
        "properties": {
            "toppings": {
                "type": "array",
                "title": "Toppings",
                "items": {"type": "string", "enum": ["cheese", "olives", "ham"]},
                "minItems": 1,
            }
        },
    }
    request = ask("Toppings?", kind="input", data={"schema": schema})
    async with bot(broker, slack, namespace) as server, waiting(broker, request) as wait:
        message = await shown(slack, request)
        menu = actions(message)[0]
        assert menu["type"] == "multi_static_select"
        assert [o["text"]["text"] for o in menu["options"]] == ["cheese", "olives", "ham"]
        picked = {
            "tnx.controls": {
                "tnx.pick": {
                    "type": "multi_static_select",
                    "selected_options": [{"value": "0"}, {"value": "2"}],
                }
            }
        }
        click = block_actions(ALLOWED, message, "tnx.send", request.id, state=picked)
        await post_interaction(server.url, click)
        answer = await asyncio.wait_for(wait, 30)
        assert answer.data == {"toppings": ["cheese", "ham"]}


async def test_a_form_is_a_modal_whose_mistakes_are_shown_and_whose_submission_answers(
    broker: Broker, slack: FakeSlack, namespace: str
) -> None:
    request = ask("Book a table", kind="input", data={"schema": FORM})
    async with bot(broker, slack, namespace) as server, waiting(broker, request) as wait:
        message = await shown(slack, request)
        await post_interaction(server.url, block_actions(ALLOWED, message, "tnx.form", request.id))
        await eventually(lambda: bool(slack.named("views.open")), "the modal opened")
        opened = slack.named("views.open")[0].params
        view = opened["view"]
        inputs = {b["label"]["text"]: b for b in view["blocks"] if b["type"] == "input"}
        assert list(inputs) == [
            "Name",
            "Email",
            "Day",
            "Guests",
            "Budget",
            "Terrace",
            "Menu",
            "Extras",
        ]
        kinds = {label: b["element"]["type"] for label, b in inputs.items()}
        assert kinds == {
            "Name": "plain_text_input",
            "Email": "email_text_input",
            "Day": "datepicker",
            "Guests": "number_input",
            "Budget": "number_input",
            "Terrace": "checkboxes",
            "Menu": "static_select",
            "Extras": "multi_static_select",
        }
        assert inputs["Guests"]["element"]["initial_value"] == "2"  # the default, offered
        assert inputs["Name"]["optional"] is False and inputs["Budget"]["optional"] is True

        def values(name: str, guests: str) -> dict[str, Any]:
            return {
                "f0": {"v": {"type": "plain_text_input", "value": name}},
                "f1": {"v": {"type": "email_text_input", "value": "ada@example.org"}},
                "f2": {"v": {"type": "datepicker", "selected_date": "2026-05-01"}},
                "f3": {"v": {"type": "number_input", "value": guests}},
                "f4": {"v": {"type": "number_input", "value": "99.5"}},
                "f5": {"v": {"type": "checkboxes", "selected_options": [{"value": "0"}]}},
                "f6": {"v": {"type": "static_select", "selected_option": {"value": "1"}}},
                "f7": {
                    "v": {
                        "type": "multi_static_select",
                        "selected_options": [{"value": "0"}, {"value": "1"}],
                    }
                },
            }

        wrong = await post_interaction(
            server.url, view_submission(ALLOWED, view, values("A", "40"))
        )
        errors = wrong.json()
        assert errors["response_action"] == "errors"
        assert "shorter than the minimum length of 2" in errors["errors"]["f0"]
        assert "12" in errors["errors"]["f3"]
        assert not wait.done()
        right = await post_interaction(
            server.url, view_submission(ALLOWED, view, values("Ada", "4"))
        )
        assert right.status_code == 200 and not right.content.strip(b" {}")
        answer = await asyncio.wait_for(wait, 30)
        assert answer.data == {
            "name": "Ada",
            "email": "ada@example.org",
            "day": "2026-05-01",
            "guests": 4,
            "budget": 99.5,
            "terrace": True,
            "menu": "fish",
            "extras": ["cake", "wine"],
        }
        assert answer.person == f"slack:{ALLOWED}"


@pytest.mark.parametrize(
    ("url", "warning"),
    [
        ("https://auth.example-pay.com/authorize?client=booking", None),
        ("https://gіthub.com/login/oauth/authorize", "looks like github.com"),  # a Cyrillic і
        ("http://pay.example.com/authorize", "not https"),
    ],
)
async def test_an_authorization_shows_its_url_domain_and_warnings_then_is_done(
    broker: Broker, slack: FakeSlack, namespace: str, url: str, warning: str | None
) -> None:
    request = ask("Let booking charge your card", kind="authorization", url=url)
    async with bot(broker, slack, namespace) as server, waiting(broker, request) as wait:
        message = await shown(slack, request)
        assert f"Address: {url}" in message["text"]
        assert "Domain: " in message["text"]
        if warning is None:
            assert "site example-pay.com" in message["text"] and "⚠️" not in message["text"]
        else:
            assert warning in message["text"]
        controls = actions(message)
        assert controls[0]["url"] == url
        assert [c["action_id"] for c in controls] == ["tnx.link", "tnx.done", "tnx.decline"]
        await post_interaction(server.url, block_actions(ALLOWED, message, "tnx.done", request.id))
        assert (await asyncio.wait_for(wait, 30)).ok is True


async def test_answered_elsewhere_edits_the_message_and_a_late_click_is_told_so(
    broker: Broker, slack: FakeSlack, namespace: str
) -> None:
    request = ask("Rotate the keys?")
    async with bot(broker, slack, namespace) as server, waiting(broker, request) as wait:
        message = await shown(slack, request)
        await broker.answer(Answer(id=request.id, ok=False, reason="declined", person="web:bob"))
        assert (await wait).reason == "declined"
        await closed(slack, request, "Answered elsewhere by web:bob")
        await post_interaction(
            server.url, block_actions(ALLOWED, message, "tnx.accept", request.id)
        )
        await eventually(lambda: bool(slack.ephemerals(ALLOWED)), "the late click answered")
        assert slack.ephemerals(ALLOWED)[0].startswith("Too late")
        assert len(await broker.audit(request_id=request.id)) == 1  # answered once


async def test_a_restarted_bot_finds_its_messages_and_keeps_them_in_step(
    broker: Broker, slack: FakeSlack, namespace: str
) -> None:
    kept, resolved = ask("Still open after the restart?"), ask("Answered while the bot was away?")
    async with waiting(broker, kept) as wait_kept, waiting(broker, resolved) as wait_resolved:
        async with bot(broker, slack, namespace):
            await shown(slack, kept)
            await shown(slack, resolved)
        posted = len(slack.named("chat.postMessage"))
        await broker.answer(Answer(id=resolved.id, ok=True, person="web:carol"))
        assert (await wait_resolved).person == "web:carol"
        async with bot(broker, slack, namespace) as again:
            await closed(slack, resolved, "Answered elsewhere by web:carol")
            kept_ts = slack.message_about(kept.prompt)["ts"]  # type: ignore[index]
            edits = lambda: [c for c in slack.named("chat.update") if c.params["ts"] == kept_ts]  # noqa: E731
            await eventually(lambda: bool(edits()), "the kept request's message edited again")
            assert len(slack.named("chat.postMessage")) == posted  # nothing posted twice
            message = await shown(slack, kept)
            await post_interaction(
                again.url, block_actions(ALLOWED, message, "tnx.accept", kept.id)
            )
            assert (await asyncio.wait_for(wait_kept, 30)).person == f"slack:{ALLOWED}"
            await closed(slack, kept, "Answered by")


def test_the_command_names_what_is_missing(namespace: str) -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        command = [TOOLNEXUS, "worker", "slack", "--namespace", namespace]
        env = {k: v for k, v in clean_env().items() if not k.startswith("SLACK_")}
        return subprocess.run(
            [*command, *args], capture_output=True, text=True, env=env, timeout=60
        )

    assert "no Slack bot token" in run().stderr
    assert "--signing-secret" in run("--bot-token", "xoxb-1").stderr
    assert "no Slack channel" in run("--bot-token", "x", "--signing-secret", "s").stderr
    done = run("--bot-token", "x", "--signing-secret", "s", "--channel", "C1")
    assert done.returncode == 2 and "--allow-user" in done.stderr


async def test_an_escalated_request_says_so_and_stays_answerable(
    broker: Broker, slack: FakeSlack, namespace: str
) -> None:
    request = ask("Restart the primary?", escalate=[Hop(0.3, "oncall")])
    async with bot(broker, slack, namespace) as server, waiting(broker, request) as wait:
        await shown(slack, request)
        note = "Escalated to oncall: still open here too."
        await eventually(
            lambda: note in (slack.message_about(request.prompt) or {}).get("text", ""),
            "the message marked escalated",
        )
        message = slack.message_about(request.prompt)
        assert message is not None and actions(message)  # still open here
        await post_interaction(
            server.url, block_actions(ALLOWED, message, "tnx.accept", request.id)
        )
        assert (await wait).ok
