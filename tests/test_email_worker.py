"""``toolnexus worker email`` (issue #29): requests mailed to a local aiosmtpd server, with
the question, who asks, the time left and signed single-use links that the HTTP answering
API takes; following a link answers the request, once; links expire with the request."""

from __future__ import annotations

import asyncio
import os
import re
import shlex
import signal
import sys
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest

import answering
from answering import (
    LINK_SECRET,
    QUEUE,
    Fleet,
    form_request,
    links,
    serving,
    smtp_server,
    text,
)
from toolnexus import Source
from toolnexus.frameworks import tool_call_request
from toolnexus.rendering import FIELD_PREFIX
from toolnexus.security import SigningKey
from toolnexus_workers.auto import Rule
from toolnexus_workers.delivery import Retry
from toolnexus_workers.mail.sender import EmailWorker, Route, Smtp, read_routes

pytestmark = pytest.mark.redis

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "how-to" / "email.md"
HTML = {"Accept": "text/html"}
PROPOSAL = tool_call_request(
    "deploy", {"environment": "production"}, framework="pydantic-ai", run="run-1", call_id="c1"
)


def mailing(setup: Fleet, port: int, **options: Any) -> Any:
    """The email worker running, mailing through the SMTP server at ``port``."""
    worker = EmailWorker(
        QUEUE,
        Smtp("127.0.0.1", port, "none"),
        "toolnexus@example.com",
        setup.link_key,
        setup.server.url,
        retry=Retry(attempts=2, first_delay_s=0.05),
        **options,
    )
    return serving(setup, worker)


setup, http = answering.setup, answering.http  # the fixtures (tests/answering.py)


def tool_call() -> Any:
    return form_request(
        kind="tool_call",
        prompt="May deploy run?",
        data=PROPOSAL.data,
        source=Source(server="infra", tool="deploy", agent="ci-7"),
    )


ROUTES = [Route(("oncall@example.com",), Rule(1, "skip", kind=("tool_call",)))]


async def test_a_tool_call_is_mailed_and_its_approve_link_answers_once(
    setup: Fleet, http: httpx.AsyncClient
) -> None:
    async with smtp_server() as (inbox, port), mailing(setup, port, routes=ROUTES):
        request = tool_call()
        wait = await setup.ask(request)
        mail = await inbox.mail("oncall@example.com")
        assert mail["Subject"] == "May deploy run?"
        body = text(mail)
        assert "Tool call from server infra, tool deploy, agent ci-7\nMay deploy run?\n" in body
        assert re.search(r"\nTime left: [\w ]+ \(until [\d:]+ UTC\)\nQueue: ops\n", body)
        assert 'Tool call: deploy\n{\n  "environment": "production"\n}' in body
        found = links(mail)
        assert sorted(found) == ["Approve", "Decline"]
        page = await http.get(found["Approve"], headers=HTML)  # opening it does not answer
        assert page.status_code == 200 and "&quot;production&quot;" in page.text
        assert not wait.done()
        done = await http.post(found["Approve"], data={"action": "accept"}, headers=HTML)
        assert done.status_code == 200 and "approved" in done.text
        answer = await asyncio.wait_for(wait, 30)  # approved as proposed
        assert (answer.ok, answer.data) == (True, {"environment": "production"})
        assert (answer.person, answer.responder) == ("link:oncall@example.com", "http-worker")
        again = await http.post(found["Approve"], data={"action": "accept"}, headers=HTML)
        assert again.status_code == 410 and "used already" in again.text
        late = await http.post(found["Decline"], json={"action": "decline"})
        assert late.status_code == 410
        assert "closed, no answer is needed" in late.json()["error"]


async def test_an_input_request_gets_the_form_and_each_address_its_own_links(
    setup: Fleet, http: httpx.AsyncClient
) -> None:
    to = ["ann@example.com", "ben@example.com"]
    async with smtp_server() as (inbox, port), mailing(setup, port, to=to, routes=ROUTES):
        request = form_request()
        wait = await setup.ask(request)
        ann, ben = [links(await inbox.mail(address)) for address in to]
        assert sorted(ann) == ["Decline", "Open the form"]
        assert ann["Open the form"] != ben["Open the form"]
        assert not [a for a, _ in inbox.mails if a == "oncall@example.com"]  # no route
        form = await http.get(ben["Open the form"], headers=HTML)
        assert f'name="{FIELD_PREFIX}name"' in form.text and "Guests</label>" in form.text
        sent = await http.post(
            ben["Open the form"], json={"action": "accept", "data": {"name": "Ben", "guests": 4}}
        )
        assert sent.json() == {"outcome": "answered"}
        answer = await asyncio.wait_for(wait, 30)
        assert (answer.data, answer.person) == (
            {"name": "Ben", "guests": 4},
            "link:ben@example.com",
        )
        late = await http.post(ann["Decline"], json={"action": "decline"})
        assert late.status_code == 410


async def test_links_expire_with_the_request(setup: Fleet, http: httpx.AsyncClient) -> None:
    async with smtp_server() as (inbox, port), mailing(setup, port, routes=ROUTES):
        wait = await setup.ask(tool_call(), timeout_s=1.5)
        found = links(await inbox.mail("oncall@example.com"))
        answer = await asyncio.wait_for(wait, 30)
        assert answer.reason == "expired"
        expired = await http.post(found["Approve"], json={"action": "accept"})
        assert expired.status_code == 410
        assert expired.json()["error"].startswith("this link has expired")


async def test_a_request_still_open_is_mailed_again(setup: Fleet) -> None:
    async with (
        smtp_server() as (inbox, port),
        mailing(setup, port, routes=ROUTES, remind_after_s=0.3),
    ):
        wait = await setup.ask(tool_call())
        reminder = await inbox.mail("oncall@example.com", 2)
        assert reminder["Subject"] == "Reminder: May deploy run?"
        assert "Time left: " in text(reminder)
        wait.cancel()
        await asyncio.gather(wait, return_exceptions=True)


def test_routes_are_read_and_bad_ones_refused(tmp_path: Path) -> None:
    rules = tmp_path / "routes.toml"
    rules.write_text(re.findall(r"```toml\n(.*?)```", PAGE.read_text(), re.S)[0])
    routes = read_routes(rules)
    request = tool_call()
    assert [r.to for r in routes if r.matches(request)] == [("oncall@example.com",)]
    rules.write_text('[[route]]\nkind = "input"\nto = "nobody"\n')
    with pytest.raises(Exception, match=r"route 1: 'to' must name one or more email addresses"):
        read_routes(rules)


async def test_the_documented_command_mails_and_its_link_answers(
    setup: Fleet, http: httpx.AsyncClient, tmp_path: Path
) -> None:
    """The command and the routes of docs/how-to/email.md, run as a process (its SMTP
    port and link base pointed at this test's)."""
    routes = re.findall(r"```toml\n(.*?)```", PAGE.read_text(), re.S)[0]
    (tmp_path / "email-routes.toml").write_text(routes)
    command = re.findall(r"```sh\n(.*?)```", PAGE.read_text(), re.S)[0]
    line = command.splitlines()[-3:]
    words = shlex.split(" ".join(part.rstrip("\\") for part in line))
    assert words[:3] == ["toolnexus", "worker", "email"]
    SigningKey.generate("email-worker").save(setup.keys)
    async with smtp_server() as (inbox, port):
        args = [
            str(port) if w == "2525" else setup.server.url if w == "http://127.0.0.1:8720" else w
            for w in words[3:]
        ]
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(
                [str(ROOT / "bridge"), str(ROOT / "workers"), os.environ.get("PYTHONPATH", "")]
            ),
            "TOOLNEXUS_URL": setup.redis_url,
            "TOOLNEXUS_NAMESPACE": setup.namespace,
            "TOOLNEXUS_LINK_SECRET": LINK_SECRET,
            "TOOLNEXUS_SIGNING_KEY": str(setup.keys / "email-worker.key"),
            "TOOLNEXUS_TRUSTED_KEYS": str(setup.trusted_by_worker),
            "TOOLNEXUS_REQUIRE_SIGNATURES": "1",
        }
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            "import sys; from toolnexus_workers.mail import main; sys.exit(main(sys.argv[1:]))",
            *args,
            cwd=tmp_path,
            env=env,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            wait = await setup.ask(tool_call())
            mail = await inbox.mail("oncall@example.com")
            assert mail["From"] == "toolnexus@example.com"
            sent = await http.post(links(mail)["Approve"], json={"action": "accept"})
            assert sent.json() == {"outcome": "answered"}
            answer = await asyncio.wait_for(wait, 30)
            assert answer.person == "link:oncall@example.com"
        finally:
            process.send_signal(signal.SIGTERM)
            _, err = await asyncio.wait_for(process.communicate(), 30)
        assert process.returncode == 0, err.decode()[-2000:]
