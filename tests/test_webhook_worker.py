"""``toolnexus worker webhook`` (issue #29): requests POSTed to local receivers that verify
the Standard Webhooks signatures with the ``standardwebhooks`` package; the answer link in
each message answers through the HTTP answering API; failed deliveries are retried with
the same ``webhook-id``; the end of each request is announced."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
from standardwebhooks import Webhook
from starlette.applications import Starlette

import answering
from answering import QUEUE, Fleet, Receiver, Recording, form_request, serving
from answering import WEBHOOK_SECRET as SECRET
from toolnexus_workers.delivery import Retry
from toolnexus_workers.webhook import main as webhook_main
from toolnexus_workers.webhook.sender import Endpoint, WebhookWorker

pytestmark = pytest.mark.redis

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "how-to" / "webhooks.md"


def sending(setup: Fleet, receiver: Receiver, **options: Any) -> Any:
    """The webhook worker running, POSTing to ``receiver``'s ``/hook``."""
    worker = WebhookWorker(
        QUEUE,
        [Endpoint.parse(f"ci={receiver.url}/hook")],
        SECRET,
        setup.link_key,
        setup.server.url,
        retry=options.pop("retry", Retry(attempts=4, first_delay_s=0.05)),
        **options,
    )
    return serving(setup, worker)


setup = answering.setup  # the fixture (tests/answering.py)


async def test_a_request_is_announced_signed_and_its_link_answers_it(setup: Fleet) -> None:
    recording = Recording()
    async with Receiver(recording.app()) as receiver, sending(setup, receiver):
        request = form_request()
        wait = await setup.ask(request)
        opened = await recording.message(f"{request.id}.open")
        assert opened["type"] == "request.open"
        shown = opened["data"]["request"]
        assert (shown["id"], shown["queue"], shown["signer"]) == (request.id, QUEUE, "agent-1")
        assert shown["data"]["schema"]["required"] == ["name"]
        assert 0 < opened["data"]["time_left_s"] <= 60
        link = opened["data"]["answer_link"]
        assert link.startswith(f"{setup.server.url}/v1/links/tnl1.")
        async with httpx.AsyncClient(timeout=30) as http:
            sent = await http.post(link, json={"action": "accept", "data": {"name": "Ada"}})
            assert sent.json() == {"outcome": "answered"}
            answer = await asyncio.wait_for(wait, 30)
            assert (answer.ok, answer.data) == (True, {"name": "Ada"})
            assert (answer.person, answer.responder) == ("link:webhook:ci", "http-worker")
            ended = await recording.message(f"{request.id}.ended")
            assert ended["type"] == "request.answered"
            assert ended["data"]["outcome"] == {
                "ok": True,
                "reason": None,
                "person": "link:webhook:ci",
            }
            again = await http.post(link, json={"action": "decline"})
            assert again.status_code == 410


async def test_a_failing_receiver_is_retried_with_the_same_id(setup: Fleet) -> None:
    recording = Recording(fail_first=2)
    async with Receiver(recording.app()) as receiver, sending(setup, receiver):
        request = form_request()
        wait = await setup.ask(request)
        await recording.message(f"{request.id}.open")
        ids = [attempt["webhook-id"] for attempt in recording.attempts]
        assert ids == [f"{request.id}.open"] * 3  # two refused, the third taken
        wait.cancel()  # the waiter leaves: withdrawn
        await asyncio.gather(wait, return_exceptions=True)
        ended = await recording.message(f"{request.id}.ended")
        assert ended["type"] == "request.withdrawn"
        assert ended["data"]["note"] == "Withdrawn: the agent stopped waiting."


async def test_a_request_still_open_is_announced_again(setup: Fleet) -> None:
    recording = Recording()
    async with Receiver(recording.app()) as receiver, sending(setup, receiver, remind_after_s=0.3):
        request = form_request()
        wait = await setup.ask(request)
        opened_left_s = (await recording.message(f"{request.id}.open"))["data"]["time_left_s"]
        reminded = await recording.message(f"{request.id}.reminder.1")
        assert reminded["type"] == "request.reminder"
        assert reminded["data"]["request"]["id"] == request.id
        assert 0 < reminded["data"]["time_left_s"] < opened_left_s
        wait.cancel()
        await asyncio.gather(wait, return_exceptions=True)
        await recording.message(f"{request.id}.ended")


async def test_the_documented_receiver_answers_through_the_link(setup: Fleet) -> None:
    """The receiver of docs/how-to/webhooks.md approves a read_file tool call through its
    link; the waiter gets exactly that, and a write_file call is left open."""
    blocks = re.findall(r"```python\n(.*?)```", PAGE.read_text(), re.S)
    assert len(blocks) == 1
    namespace: dict[str, Any] = {}
    exec(compile(blocks[0], str(PAGE), "exec"), namespace)
    receiver_app: Callable[[str], Starlette] = namespace["receiver"]
    app = receiver_app(SECRET)
    async with Receiver(app) as receiver:
        endpoint = Endpoint(f"{receiver.url}/hooks/toolnexus", "docs")
        worker = WebhookWorker(QUEUE, [endpoint], SECRET, setup.link_key, setup.server.url)
        async with serving(setup, worker):
            calls = {}
            for name in ("read_file", "write_file"):
                call = {"name": name, "arguments": {"path": "/etc/motd"}}
                calls[name] = await setup.ask(
                    form_request(
                        kind="tool_call", prompt=f"May {name} run?", data={"tool_call": call}
                    )
                )
            answer = await asyncio.wait_for(calls["read_file"], 30)
            assert (answer.ok, answer.data, answer.person) == (True, None, "link:webhook:docs")
            assert not calls["write_file"].done()
            calls["write_file"].cancel()
            await asyncio.gather(calls["write_file"], return_exceptions=True)


def test_the_command_makes_a_secret_and_refuses_a_bad_configuration(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert webhook_main(["--new-secret"]) == 0
    secret = capsys.readouterr().out.strip()
    assert secret.startswith("whsec_")
    Webhook(secret)  # standardwebhooks takes it
    base = ["--url", "redis://127.0.0.1:1/0", "--queue", QUEUE]
    assert webhook_main([*base, "--webhook-secret", secret]) == 2
    assert "--endpoint" in capsys.readouterr().err
    no_links = [*base, "--webhook-secret", secret, "--endpoint", "http://127.0.0.1:9/h"]
    assert webhook_main(no_links) == 2
    assert "answer link" in capsys.readouterr().err


async def test_a_tool_approval_is_announced_with_its_arguments(setup: Fleet) -> None:
    recording = Recording()
    call = {"name": "transfer", "arguments": {"to": "ACME", "amount": 10}}
    async with Receiver(recording.app()) as receiver, sending(setup, receiver):
        request = form_request(
            kind="tool_call", prompt="May transfer run?", data={"tool_call": call}
        )
        wait = await setup.ask(request)
        opened = await recording.message(f"{request.id}.open")
        shown = opened["data"]["request"]
        assert (shown["kind"], shown["data"]["tool_call"]) == ("tool_call", call)
        async with httpx.AsyncClient(timeout=30) as http:
            denied = await http.post(opened["data"]["answer_link"], json={"action": "decline"})
        assert denied.json() == {"outcome": "answered"}
        answer = await asyncio.wait_for(wait, 30)
        assert (answer.ok, answer.reason) == (False, "declined")
