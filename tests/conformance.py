"""The responder conformance suite (SPEC §12): what every worker in this repository does.

A worker is driven through a :class:`WorkerUnderTest` adapter: start it on a Redis
queue, make it answer a request with :data:`DATA`, ask whether a request is shown,
send it SIGTERM. ``tests/test_conformance.py`` runs every check in :data:`CHECKS`
against every adapter; to add a worker, write an adapter and list it there.

Requests carry their purpose in the prompt (``conformance hold|answer|invalid <id>``)
so that a worker answering by rules (auto) can be told what to do by its rules file.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import re
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Literal, Protocol

import httpx2 as httpx
import pexpect
from playwright.async_api import Browser, Locator, Playwright, async_playwright

import toolnexus
from answering import WEBHOOK_SECRET, Receiver, Recording, links, smtp_server
from chat_fakes import (
    BOT_TOKEN,
    SIGNING_SECRET,
    TELEGRAM_TOKEN,
    FakeSlack,
    FakeTelegram,
    block_actions,
    post_interaction,
    view_submission,
)
from chat_fakes import actions as chat_actions
from chat_fakes import buttons as chat_buttons
from conftest import RedisServer
from helpers import eventually
from toolnexus import (
    Answer,
    Broker,
    Event,
    InvalidAnswer,
    Pending,
    Request,
    Service,
    Source,
    Worker,
    new_id,
)
from toolnexus_workers.http.server import HttpServer
from toolnexus_workers.http.tokens import Tokens, add_token
from toolnexus_workers.links import LinkKey

FORM = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "title": "Name", "minLength": 2},
        "guests": {"type": "integer", "title": "Guests", "minimum": 1, "maximum": 12, "default": 2},
    },
    "required": ["name"],
}
DATA = {"name": "Ada Lovelace"}
"""What a worker is made to answer; the waiter receives :data:`EXPECTED`."""
EXPECTED = {"name": "Ada Lovelace", "guests": 2}
INVALID = {"name": "A"}
"""What a worker is made to send when it must be refused."""
REFUSAL = "shorter than the minimum length of 2"
LEASE_MS = 1000
"""The lease workers under test take, so that what a stopped worker held is reclaimed soon."""

Purpose = Literal["hold", "answer", "invalid"]

TOOLNEXUS = str(Path(sys.executable).with_name("toolnexus"))
CHROMIUM = "/usr/bin/chromium"
"""Debian's chromium (.ci/run installs it), driven by Playwright: no browser download."""
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def conformance_request(purpose: Purpose) -> Request:
    """A form request; ``purpose`` says what the check will make the worker do with it."""
    request_id = new_id("cnf")
    return Request(
        id=request_id,
        kind="input",
        prompt=f"conformance {purpose} {request_id}",
        data={"schema": FORM},
        source=Source(server="conformance", tool="check", agent="suite"),
    )


class WorkerUnderTest(Protocol):
    """How the suite drives one worker."""

    env: Mapping[str, str]
    """Variables the worker runs with besides the suite's (its signing key, ...); set it
    before :meth:`start`."""

    group: str
    """The worker's consumer group; its answers come from responders named ``GROUP/...``,
    or ``answers_as`` if the adapter says (the webhook and email workers are answered
    through the HTTP answering API's links)."""

    async def start(self, url: str, namespace: str, queue: str) -> None:
        """Start the worker on ``url`` (Redis), answering ``queue`` of ``namespace``."""

    async def shows(self, request: Request) -> bool:
        """Whether ``request`` is on display now (held, not yet gone or answered)."""

    async def answer(self, request: Request) -> None:
        """Make the worker accept the shown ``request`` with :data:`DATA`."""

    async def answer_invalidly(self, request: Request) -> str:
        """Make the worker answer ``request`` with :data:`INVALID`; return how the refusal
        was reported (a log line, the text on screen, the exception's message)."""

    async def terminate(self) -> int:
        """Send SIGTERM; return the exit status once the worker has stopped."""

    async def close(self) -> None:
        """Stop whatever is still running (after a failure too)."""


STARTUP_S = 40.0
"""How long a worker process may take to start serving: on a loaded 2-core machine, loading
its framework (aiogram, slack-bolt, starlette) alone has taken over 15 s."""


@contextlib.asynccontextmanager
async def waiting(broker: Broker, request: Request) -> AsyncIterator[asyncio.Task[Answer]]:
    task = asyncio.create_task(broker.wait_for(request, timeout_s=60))
    try:
        yield task
    finally:
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


# -- the checks -------------------------------------------------------------------


async def shows_new_requests(worker: WorkerUnderTest, broker: Broker) -> None:
    request = conformance_request("hold")
    async with waiting(broker, request):
        await eventually(lambda: worker.shows(request), f"{request.id} shown")


async def removes_resolved_requests(worker: WorkerUnderTest, broker: Broker) -> None:
    answered = conformance_request("hold")
    async with waiting(broker, answered) as wait:
        await eventually(lambda: worker.shows(answered), f"{answered.id} shown")
        await broker.answer(Answer(id=answered.id, ok=False, reason="declined"))
        await eventually(lambda: _not(worker.shows(answered)), f"{answered.id} removed")
        assert (await wait).reason == "declined"
    withdrawn = conformance_request("hold")
    async with waiting(broker, withdrawn) as wait:
        await eventually(lambda: worker.shows(withdrawn), f"{withdrawn.id} shown")
        wait.cancel()  # the asker stops waiting
    await eventually(lambda: _not(worker.shows(withdrawn)), f"{withdrawn.id} removed")


async def answers_exactly_once(worker: WorkerUnderTest, broker: Broker) -> None:
    request = conformance_request("answer")
    async with following(broker) as seen:
        async with waiting(broker, request) as wait:
            await worker.answer(request)
            answer = await asyncio.wait_for(wait, 30)
        assert (answer.ok, answer.data) == (True, EXPECTED)
        answers_as = getattr(worker, "answers_as", worker.group)
        assert answer.responder is not None and answer.responder.startswith(f"{answers_as}/")
        await asyncio.sleep(1.0)  # room for a second answer, were there one
        assert not await worker.shows(request)
    assert [e.event for e in seen if e.id == request.id] == ["answered"]


async def refuses_nothing_silently(worker: WorkerUnderTest, broker: Broker) -> None:
    request = conformance_request("invalid")
    async with waiting(broker, request) as wait:
        reported = await worker.answer_invalidly(request)
        assert REFUSAL in reported
        assert not wait.done()  # refused: the request is still open
        await broker.answer(Answer(id=request.id, ok=False, reason="dismissed"))
        assert (await wait).reason == "dismissed"
        await eventually(lambda: _not(worker.shows(request)), f"{request.id} removed")


async def drains_on_sigterm(worker: WorkerUnderTest, broker: Broker) -> None:
    request = conformance_request("hold")
    async with waiting(broker, request) as wait:
        await eventually(lambda: worker.shows(request), f"{request.id} shown")
        status = await asyncio.wait_for(worker.terminate(), 20)
        assert status == 0
        assert not wait.done()  # stopping answered nothing
        # What it held goes back to its group: another consumer gets it.
        async with broker.responder(worker.group) as group:
            async with asyncio.timeout(20):
                pending = await anext(group)
            assert pending.request.id == request.id
            await pending.accept(DATA)
        assert (await wait).data == EXPECTED


async def survives_a_reconnect(
    worker: WorkerUnderTest, broker: Broker, server: RedisServer
) -> None:
    before = conformance_request("answer")
    async with waiting(broker, before) as wait:
        await worker.answer(before)
        assert (await asyncio.wait_for(wait, 30)).data == EXPECTED
    server.stop()
    await asyncio.sleep(0.5)
    server.start()
    after = conformance_request("answer")
    async with waiting(broker, after) as wait:
        await worker.answer(after)
        assert (await asyncio.wait_for(wait, 40)).data == EXPECTED


CHECKS: dict[str, Callable[[WorkerUnderTest, Broker], Awaitable[None]]] = {
    "shows new requests": shows_new_requests,
    "removes resolved requests": removes_resolved_requests,
    "answers exactly once": answers_exactly_once,
    "refuses nothing silently": refuses_nothing_silently,
    "drains on SIGTERM": drains_on_sigterm,
}
"""The checks run on the shared Redis; :func:`survives_a_reconnect` needs a private one."""


async def _not(check: Awaitable[bool]) -> bool:
    return not await check


@contextlib.asynccontextmanager
async def following(broker: Broker) -> AsyncIterator[list[Event]]:
    """The events of ``broker`` while in the block, collected in a list."""
    seen: list[Event] = []

    async def follow(events: toolnexus.EventStream) -> None:
        async for event in events:
            seen.append(event)

    async with broker.events() as events:
        task = asyncio.create_task(follow(events))
        try:
            yield seen
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


def worker_command(name: str, url: str, namespace: str, queue: str, *extra: str) -> list[str]:
    """``toolnexus worker NAME`` with the options the suite gives every worker."""
    return [
        TOOLNEXUS,
        "worker",
        name,
        "--url",
        url,
        "--namespace",
        namespace,
        "--queue",
        queue,
        "--lease-ms",
        str(LEASE_MS),
        *extra,
    ]


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLNEXUS_")}
    return {**env, **extra}


NO_ENV: Mapping[str, str] = MappingProxyType({})


def signing_options(env: Mapping[str, str]) -> dict[str, object]:
    """The options of :func:`toolnexus.connect` that a worker's signature variables in
    ``env`` give (none without them): for a part of an adapter served in this process."""
    if "TOOLNEXUS_SIGNING_KEY" not in env:
        return {}
    return {
        "signing_key": env["TOOLNEXUS_SIGNING_KEY"],
        "trusted_keys": env["TOOLNEXUS_TRUSTED_KEYS"],
        "require_signatures": env.get("TOOLNEXUS_REQUIRE_SIGNATURES") == "1",
    }


# -- adapters ---------------------------------------------------------------------


class PlainWorker(Worker):
    """The smallest UI-like worker on the SDK: keeps what it is shown until it is gone."""

    group = "plain"

    def __init__(self) -> None:
        self.shown: dict[str, Pending] = {}

    async def show(self, pending: Pending) -> None:
        self.shown[pending.request.id] = pending

    async def gone(self, pending: Pending, event: Event) -> None:
        self.shown.pop(pending.request.id, None)


class PlainAdapter:
    """A :class:`PlainWorker` served in this process (SIGTERM goes to this process)."""

    env: Mapping[str, str] = NO_ENV

    group = "plain"

    def __init__(self, directory: Path) -> None:
        self.worker = PlainWorker()
        self.run: asyncio.Task[None] | None = None

    async def start(self, url: str, namespace: str, queue: str) -> None:
        self.broker = toolnexus.connect(
            url, namespace=namespace, queue=queue, lease_ms=LEASE_MS, block_ms=200
        )
        await self.broker.__aenter__()
        self.service = Service(self.broker, self.worker, drain_s=2)
        self.run = asyncio.create_task(self.service.run(handle_signals=True))

    async def shows(self, request: Request) -> bool:
        return request.id in self.worker.shown

    async def answer(self, request: Request) -> None:
        await eventually(lambda: self.shows(request), f"{request.id} shown")
        await self.worker.shown.pop(request.id).accept(DATA)

    async def answer_invalidly(self, request: Request) -> str:
        await eventually(lambda: self.shows(request), f"{request.id} shown")
        try:
            await self.worker.shown[request.id].accept(INVALID)
        except InvalidAnswer as exc:
            return str(exc)
        raise AssertionError("an invalid answer was taken")

    async def terminate(self) -> int:
        assert self.run is not None
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.wait_for(self.run, 20)
        return 0

    async def close(self) -> None:
        if self.run is not None and not self.run.done():
            self.service.stop()
            await asyncio.gather(self.run, return_exceptions=True)
        if self.run is not None:
            await self.broker.aclose()


AUTO_RULES = """\
# The conformance suite tells the auto worker what to do through the prompt.
[[rule]]
name = "answer"
prompt = "^conformance answer "
action = "accept"
data = { name = "Ada Lovelace" }

[[rule]]
name = "invalid"
prompt = "^conformance invalid "
action = "accept"
data = { name = "A" }

[[rule]]
name = "hold"
prompt = "^conformance hold "
action = "accept"
data = { name = "Ada Lovelace" }
after_s = 3600
"""


class AutoAdapter:
    """``toolnexus worker auto`` in a subprocess, watched through its decision log."""

    env: Mapping[str, str] = NO_ENV

    group = "auto"

    def __init__(self, directory: Path) -> None:
        self.rules = directory / "rules.toml"
        self.rules.write_text(AUTO_RULES)
        self.process: asyncio.subprocess.Process | None = None
        self.lines: list[str] = []

    async def start(self, url: str, namespace: str, queue: str) -> None:
        command = worker_command("auto", url, namespace, queue, "--rules", str(self.rules))
        self.process = await asyncio.create_subprocess_exec(
            *command, stderr=asyncio.subprocess.PIPE, env=clean_env(**self.env)
        )
        self.reader = asyncio.create_task(self._read())
        await eventually(self._serving, "the auto worker serving", STARTUP_S)

    async def _read(self) -> None:
        assert self.process is not None and self.process.stderr is not None
        async for line in self.process.stderr:
            self.lines.append(line.decode())

    async def _serving(self) -> bool:
        return any("serving" in line for line in self.lines)

    def _last(self, request: Request, *marks: str) -> str | None:
        """The last log line about ``request`` holding one of ``marks``."""
        about = [line for line in self.lines if f"request={request.id} " in line]
        found = [line for line in about if any(mark in line for mark in marks)]
        return found[-1] if found else None

    async def shows(self, request: Request) -> bool:
        last = self._last(request, "decision=", "gone ")
        return last is not None and "outcome=waiting" in last

    async def answer(self, request: Request) -> None:
        """Nothing to do: its rules answer ``conformance answer`` requests."""

    async def answer_invalidly(self, request: Request) -> str:
        async def refused() -> bool:
            return self._last(request, "outcome=refused") is not None

        await eventually(refused, f"{request.id} refused")
        return self._last(request, "outcome=refused") or ""

    async def terminate(self) -> int:
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        return await self.process.wait()

    async def close(self) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.kill()
            await self.process.wait()
        if self.process is not None:
            await asyncio.gather(self.reader, return_exceptions=True)


class TerminalAdapter:
    """``toolnexus worker terminal`` in a pseudo-terminal, read like a person would."""

    env: Mapping[str, str] = NO_ENV

    group = "terminal"

    def __init__(self, directory: Path) -> None:
        self.child: pexpect.spawn | None = None
        self.screen = ""

    async def start(self, url: str, namespace: str, queue: str) -> None:
        command = worker_command("terminal", url, namespace, queue)
        self.child = pexpect.spawn(
            command[0],
            command[1:],
            env=clean_env(TERM="dumb", NO_COLOR="1", **self.env),
            encoding="utf-8",
        )
        await self.wait_for("waiting for requests")

    def _read(self) -> None:
        assert self.child is not None
        with contextlib.suppress(pexpect.TIMEOUT, pexpect.EOF):
            while True:
                self.screen += self.child.read_nonblocking(65536, timeout=0)

    async def wait_for(self, text: str, after: int = 0, timeout_s: float = 15) -> int:
        """Wait until ``text`` is on screen after position ``after``; return where it ends."""

        async def there() -> bool:
            self._read()
            return self.screen.find(text, after) >= 0

        await eventually(there, f"{text!r} on screen:\n{self.screen[after:]}", timeout_s)
        return self.screen.find(text, after) + len(text)

    async def shows(self, request: Request) -> bool:
        self._read()
        start = self.screen.find(request.prompt)  # its header (a later "gone" line repeats it)
        if start < 0:
            return False
        after = self.screen[start:]
        ends = ("✓ answer sent", "✓ dismissed", "✓ declined", "✗ gone:", "no longer open")
        return not any(end in after for end in ends)

    async def answer(self, request: Request) -> None:
        assert self.child is not None
        start = await self.wait_for(request.prompt)
        at = await self.wait_for("Name (at least 2 characters): ", start)
        self.child.sendline(DATA["name"])
        at = await self.wait_for("Guests (integer 1–12) [2]: ", at)
        self.child.sendline("")
        at = await self.wait_for("Send this answer? [y/n]: ", at)
        self.child.sendline("y")
        await self.wait_for("✓ answer sent", at)

    async def answer_invalidly(self, request: Request) -> str:
        assert self.child is not None
        start = await self.wait_for(request.prompt)
        at = await self.wait_for("Name (at least 2 characters): ", start)
        self.child.sendline(INVALID["name"])
        end = await self.wait_for(REFUSAL, at)
        return self.screen[at:end]

    async def terminate(self) -> int:
        assert self.child is not None
        self.child.kill(signal.SIGTERM)
        await eventually(self.exited, "the terminal worker exited", 20)
        status: int = self.child.exitstatus
        return status

    async def exited(self) -> bool:
        assert self.child is not None
        self._read()
        return not self.child.isalive()

    async def close(self) -> None:
        if self.child is not None:
            self.child.close(force=True)


WEB_TOKEN = "conformance-web-token-0123456789"


class WebAdapter:
    """``toolnexus worker web`` in a subprocess, used in Debian's chromium like a person."""

    env: Mapping[str, str] = NO_ENV

    group = "web"

    def __init__(self, directory: Path) -> None:
        self.process: asyncio.subprocess.Process | None = None
        self.lines: list[str] = []
        self.playwright: Playwright | None = None
        self.browser: Browser | None = None

    async def start(self, url: str, namespace: str, queue: str) -> None:
        command = worker_command("web", url, namespace, queue, "--port", "0", "--token", WEB_TOKEN)
        self.process = await asyncio.create_subprocess_exec(
            *command, stderr=asyncio.subprocess.PIPE, env=clean_env(**self.env)
        )
        self.reader = asyncio.create_task(self._read())
        await eventually(self._serving, "the web worker serving", STARTUP_S)
        address = next(m[1] for line in self.lines if (m := re.search(r"page on (\S+/)", line)))
        self.playwright = await async_playwright().start()
        self.browser = await self.playwright.chromium.launch(
            executable_path=CHROMIUM, args=CHROMIUM_ARGS
        )
        self.page = await self.browser.new_page()
        self.page.set_default_timeout(20_000)
        await self.page.goto(f"{address}?token={WEB_TOKEN}")
        await self.page.locator("#live[data-state=live]").wait_for()

    async def _read(self) -> None:
        assert self.process is not None and self.process.stderr is not None
        async for line in self.process.stderr:
            self.lines.append(line.decode())

    async def _serving(self) -> bool:
        return any("web page on" in line for line in self.lines)

    def card(self, request: Request) -> Locator:
        return self.page.locator("article.request", has_text=request.prompt)

    async def shows(self, request: Request) -> bool:
        return await self.card(request).count() == 1

    async def answer(self, request: Request) -> None:
        card = self.card(request)
        await card.get_by_label("Name").fill(DATA["name"])
        await card.get_by_role("button", name="Accept").click()
        await card.wait_for(state="detached")

    async def answer_invalidly(self, request: Request) -> str:
        card = self.card(request)
        await card.get_by_label("Name").fill(INVALID["name"])
        # past the browser's own minlength hint, as an older browser would be
        await card.locator("form").evaluate("form => { form.noValidate = true; }")
        await card.get_by_role("button", name="Accept").click()
        return await card.locator(".field.invalid .error").inner_text()

    async def terminate(self) -> int:
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        return await self.process.wait()

    async def close(self) -> None:
        if self.browser is not None:
            await self.browser.close()
        if self.playwright is not None:
            await self.playwright.stop()
        if self.process is not None and self.process.returncode is None:
            self.process.kill()
            await self.process.wait()
        if self.process is not None:
            await asyncio.gather(self.reader, return_exceptions=True)


class ProcessAdapter:
    """A worker run as a ``toolnexus worker`` process: its log read until it says
    ``ready``, SIGTERM sent to it, killed on close if it still runs."""

    env: Mapping[str, str] = NO_ENV

    group = "worker"
    ready = "serving"
    process: asyncio.subprocess.Process | None = None

    async def launch(self, command: list[str], env: dict[str, str] | None = None) -> None:
        self.lines: list[str] = []
        self.process = await asyncio.create_subprocess_exec(
            *command, stderr=asyncio.subprocess.PIPE, env=env or clean_env(**self.env)
        )
        self.reader = asyncio.create_task(self._read())
        await eventually(self._serving, f"the {self.group} worker serving", STARTUP_S)

    async def _read(self) -> None:
        assert self.process is not None and self.process.stderr is not None
        async for line in self.process.stderr:
            self.lines.append(line.decode())

    async def _serving(self) -> bool:
        return any(self.ready in line for line in self.lines)

    async def terminate(self) -> int:
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        return await self.process.wait()

    async def close(self) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.kill()
            await self.process.wait()
        if self.process is not None:
            await asyncio.gather(self.reader, return_exceptions=True)


class _ChatAdapter(ProcessAdapter):
    """A chat bot's command in a subprocess, talking to a fake chat API in this process."""

    group = "chat"

    def __init__(self, directory: Path) -> None:
        pass


class SlackAdapter(_ChatAdapter):
    """``toolnexus worker slack`` in a subprocess; a local Slack Web API; signed clicks."""

    group = "slack"
    ready = "slack bot serving on"
    user = "UCONFORM"

    def __init__(self, directory: Path) -> None:
        super().__init__(directory)
        self.slack = FakeSlack()
        self.started = False

    async def start(self, url: str, namespace: str, queue: str) -> None:
        await self.slack.__aenter__()
        self.started = True
        slack = ["--bot-token", BOT_TOKEN, "--signing-secret", SIGNING_SECRET, "--port", "0"]
        slack += ["--channel", "C1", "--allow-user", self.user, "--api-url", self.slack.url]
        await self.launch(worker_command("slack", url, namespace, queue, *slack))
        self.endpoint = next(
            m[1] for line in self.lines if (m := re.search(r"serving on (\S+)", line))
        )

    async def shows(self, request: Request) -> bool:
        return bool(chat_actions(self.slack.message_about(request.prompt)))

    async def _submit(self, request: Request, name: str) -> dict[str, object]:
        await eventually(lambda: self.shows(request), f"{request.id} shown")
        message = self.slack.message_about(request.prompt)
        assert message is not None
        opened = len(self.slack.named("views.open"))
        click = block_actions(self.user, message, "tnx.form", request.id)
        await post_interaction(self.endpoint, click)

        async def modal() -> bool:
            return len(self.slack.named("views.open")) > opened

        await eventually(modal, "the modal opened")
        view = self.slack.named("views.open")[-1].params["view"]
        values = {
            "f0": {"v": {"type": "plain_text_input", "value": name}},
            "f1": {"v": {"type": "number_input", "value": "2"}},  # the default, as offered
        }
        reply = await post_interaction(self.endpoint, view_submission(self.user, view, values))
        return dict(reply.json()) if reply.content.strip() else {}

    async def answer(self, request: Request) -> None:
        assert await self._submit(request, DATA["name"]) == {}

    async def answer_invalidly(self, request: Request) -> str:
        return str(await self._submit(request, INVALID["name"]))

    async def close(self) -> None:
        await super().close()
        if self.started:
            await self.slack.__aexit__()


class TelegramAdapter(_ChatAdapter):
    """``toolnexus worker telegram`` in a subprocess; a local Bot API; clicks and replies."""

    group = "telegram"
    ready = "telegram bot polling"
    user, chat = 4242, -100777

    def __init__(self, directory: Path) -> None:
        super().__init__(directory)
        self.telegram = FakeTelegram()
        self.started = False

    async def start(self, url: str, namespace: str, queue: str) -> None:
        await self.telegram.__aenter__()
        self.started = True
        options = ["--bot-token", TELEGRAM_TOKEN, "--chat", str(self.chat), "--allow-user"]
        options += [str(self.user), "--api-url", self.telegram.url, "--polling-timeout-s", "1"]
        await self.launch(worker_command("telegram", url, namespace, queue, *options))

    async def shows(self, request: Request) -> bool:
        message = self.telegram.message_about(request.prompt)
        return message is not None and bool(chat_buttons(message.markup))

    async def _reply(self, request: Request, name: str, expect: str) -> str:
        await eventually(lambda: self.shows(request), f"{request.id} shown")
        message = self.telegram.message_about(request.prompt)
        assert message is not None
        before = len(self.telegram.sent(self.chat))
        self.telegram.click(self.user, message, "f")

        async def said(text: str, after: int) -> bool:
            return any(text in t for t in self.telegram.sent(self.chat)[after:])

        await eventually(lambda: said("1/2 Name", before), "the first question")
        self.telegram.say(self.user, self.chat, name)
        if name == INVALID["name"]:
            await eventually(lambda: said(expect, before), "the refusal")
            return next(t for t in self.telegram.sent(self.chat)[before:] if expect in t)
        await eventually(lambda: said("2/2 Guests", before), "the second question")
        self.telegram.say(self.user, self.chat, "-")  # the default
        await eventually(lambda: said(expect, before), "the answer sent")
        return expect

    async def answer(self, request: Request) -> None:
        await self._reply(request, DATA["name"], "Sent")

    async def answer_invalidly(self, request: Request) -> str:
        return await self._reply(request, INVALID["name"], REFUSAL)

    async def close(self) -> None:
        await super().close()
        if self.started:
            await self.telegram.__aexit__()


HTTP_TOKENS = """[[token]]
name = "conformance"
sha256 = "%s"
queues = ["*"]
"""
HTTP_TOKEN = "conformance-http-token-0123456789"


class HttpAdapter(ProcessAdapter):
    """``toolnexus worker http`` in a subprocess, answered over its HTTP API."""

    group = "http"

    def __init__(self, directory: Path) -> None:
        self.tokens = directory / "tokens.toml"
        self.tokens.write_text(HTTP_TOKENS % hashlib.sha256(HTTP_TOKEN.encode()).hexdigest())
        self.http = httpx.AsyncClient(timeout=20, headers={"Authorization": f"Bearer {HTTP_TOKEN}"})

    async def start(self, url: str, namespace: str, queue: str) -> None:
        command = worker_command(
            "http", url, namespace, queue, "--port", "0", "--tokens", str(self.tokens)
        )
        await self.launch(command)
        line = next(line for line in self.lines if "answering API on" in line)
        self.address = line.split("answering API on ")[1].split()[0]

    async def shows(self, request: Request) -> bool:
        response = await self.http.get(f"{self.address}/v1/requests/{request.id}")
        return response.status_code == 200

    async def _send(self, request: Request, data: object) -> httpx.Response:
        await eventually(lambda: self.shows(request), f"{request.id} shown")
        body = {"action": "accept", "data": data}
        return await self.http.post(f"{self.address}/v1/requests/{request.id}/answer", json=body)

    async def answer(self, request: Request) -> None:
        response = await self._send(request, DATA)
        assert response.status_code == 200, response.text

    async def answer_invalidly(self, request: Request) -> str:
        response = await self._send(request, INVALID)
        assert response.status_code == 422, response.text
        return str(response.json()["error"])

    async def close(self) -> None:
        await self.http.aclose()
        await super().close()


LINK_SECRET_FOR_ADAPTERS = "a link secret for the conformance suite, long enough"


class LinkedAdapter(HttpAdapter):
    """A worker that announces requests with single-use links (webhook, email) in a
    subprocess, beside an HTTP answering API in this process that takes the links: it
    is answered by following the link it sent (as :class:`HttpAdapter` answers, at the
    link), so its answers come from the API's group (``answers_as``)."""

    group = ""
    answers_as = "http"
    name = ""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.http = httpx.AsyncClient(timeout=20)
        self.stack = contextlib.AsyncExitStack()

    def extra(self) -> list[str]:
        """The worker's own options: where it sends."""
        raise NotImplementedError

    def link(self, request: Request) -> str | None:
        """The answer link sent for ``request``, if it was sent."""
        raise NotImplementedError

    def ended(self, request: Request) -> bool:
        """Whether the worker said that ``request`` ended (the email worker does not)."""
        return False

    async def start(self, url: str, namespace: str, queue: str) -> None:
        tokens = self.directory / "tokens.toml"
        add_token(tokens, "nobody", [queue])
        api_broker = toolnexus.connect(
            url, namespace=namespace, queue=queue, block_ms=200, **signing_options(self.env)
        )
        await self.stack.enter_async_context(api_broker)
        links = LinkKey(secret=LINK_SECRET_FOR_ADAPTERS)
        self.api = HttpServer({queue: api_broker}, Tokens(tokens), port=0, links=links)
        await self.stack.enter_async_context(self.api)
        await self.serve_receiver()
        command = worker_command(
            self.name, url, namespace, queue, "--link-base", self.api.url, *self.extra()
        )
        env = clean_env(TOOLNEXUS_LINK_SECRET=LINK_SECRET_FOR_ADAPTERS, **self.env)
        await self.launch(command, env)

    async def serve_receiver(self) -> None:
        """Start where the worker sends (a webhook receiver, an SMTP server)."""

    async def shows(self, request: Request) -> bool:
        link = self.link(request)
        if link is None or self.ended(request):
            return False
        return (await self.http.get(link)).status_code == 200

    async def _send(self, request: Request, data: object) -> httpx.Response:
        await eventually(lambda: self.shows(request), f"{request.id} announced")
        link = self.link(request)
        assert link is not None
        return await self.http.post(link, json={"action": "accept", "data": data})

    async def close(self) -> None:
        await super().close()
        await self.stack.aclose()


class WebhookAdapter(LinkedAdapter):
    """``toolnexus worker webhook``, POSTing to a receiver in this process."""

    group = name = "webhook"

    async def serve_receiver(self) -> None:
        self.recording = Recording()
        self.receiver = await self.stack.enter_async_context(Receiver(self.recording.app()))

    def extra(self) -> list[str]:
        endpoint = f"{self.receiver.url}/hook"
        return [
            "--endpoint",
            endpoint,
            "--webhook-secret",
            WEBHOOK_SECRET,
            "--retry-delay-s",
            "0.1",
        ]

    def link(self, request: Request) -> str | None:
        opened = self.recording.messages.get(f"{request.id}.open")
        return None if opened is None else str(opened["data"]["answer_link"])

    def ended(self, request: Request) -> bool:
        return f"{request.id}.ended" in self.recording.messages


class EmailAdapter(LinkedAdapter):
    """``toolnexus worker email``, mailing to an SMTP server (aiosmtpd) in this process."""

    group = name = "email"

    async def serve_receiver(self) -> None:
        self.inbox, self.smtp_port = await self.stack.enter_async_context(smtp_server())

    def extra(self) -> list[str]:
        return [
            "--smtp-port",
            str(self.smtp_port),
            "--smtp-tls",
            "none",
            "--from",
            "toolnexus@example.com",
            "--to",
            "conformance@example.com",
        ]

    def link(self, request: Request) -> str | None:
        for _, mail in self.inbox.mails:
            if mail["X-Toolnexus-Request"] == request.id:
                return links(mail)["Open the form"]
        return None


Adapter = Callable[[Path], WorkerUnderTest]

ADAPTERS: dict[str, Adapter] = {
    "plain": PlainAdapter,
    "auto": AutoAdapter,
    "terminal": TerminalAdapter,
    "web": WebAdapter,
    "http": HttpAdapter,
    "webhook": WebhookAdapter,
    "email": EmailAdapter,
    "slack": SlackAdapter,
    "telegram": TelegramAdapter,
}
"""Every worker of this repository, by name: the suite runs each check on each."""
