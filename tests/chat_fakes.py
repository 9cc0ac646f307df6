"""Local HTTP servers speaking the Slack Web API and the Telegram Bot API shapes, and the
fake-chat protocol (:class:`ChatFake`) the one chat suite (tests/test_chat_bots.py) drives
both bots through.

Neither service can be reached from here, so the bots talk to these instead (both
libraries take another base URL). Each records the calls it gets; the Slack one also
signs interaction payloads as Slack does, and the Telegram one hands out updates
through ``getUpdates`` long polling. :class:`SlackChat` and :class:`TelegramChat` are
the adapters: what a person does (click, pick, fill in a form) and sees (a message, its
controls, what they are told privately), each in its platform's own words.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import itertools
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol
from urllib.parse import urlencode

import httpx2 as httpx
from aiohttp import web

from toolnexus import Broker, Request
from toolnexus_workers.chat import ChatServer
from toolnexus_workers.slack.server import SlackServer
from toolnexus_workers.telegram.server import TelegramServer

SIGNING_SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
BOT_TOKEN = "xoxb-test-token"
TELEGRAM_TOKEN = "123456:TEST-telegram-token"
FORM: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "title": "Name", "minLength": 2},
        "email": {"type": "string", "title": "Email", "format": "email"},
        "day": {"type": "string", "title": "Day", "format": "date"},
        "guests": {"type": "integer", "title": "Guests", "minimum": 1, "maximum": 12, "default": 2},
        "budget": {"type": "number", "title": "Budget"},
        "terrace": {"type": "boolean", "title": "Terrace", "default": False},
        "menu": {"type": "string", "title": "Menu", "enum": ["meat", "fish", "veg"]},
        "extras": {
            "type": "array",
            "title": "Extras",
            "items": {"type": "string", "enum": ["cake", "wine", "flowers"]},
        },
    },
    "required": ["name", "menu"],
}
"""A form with every field kind, asked by both bots."""


async def eventually(check: Callable[[], bool], what: str, timeout_s: float = 20) -> None:
    """Wait until ``check()`` is true (polling), or fail naming ``what``."""
    try:
        async with asyncio.timeout(timeout_s):
            while not check():
                await asyncio.sleep(0.02)
    except TimeoutError:
        raise AssertionError(f"not within {timeout_s} s: {what}") from None


@dataclass
class Call:
    """One API call the fake got: the method and its parameters."""

    method: str
    params: dict[str, Any]


class FakeApi:
    """An aiohttp server on a free loopback port, recording every call."""

    def __init__(self) -> None:
        self.calls: list[Call] = []
        self.runner: web.AppRunner | None = None
        self.port = 0

    def app(self) -> web.Application:
        raise NotImplementedError

    async def __aenter__(self) -> FakeApi:
        self.runner = web.AppRunner(self.app(), access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        server = site._server  # the fake's own site: its port, picked by the OS
        assert server is not None
        self.port = server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.runner is not None
        await self.runner.cleanup()

    def named(self, method: str) -> list[Call]:
        return [c for c in self.calls if c.method == method]


async def _params(request: web.Request) -> dict[str, Any]:
    if request.content_type == "application/json":
        body = await request.json()
        return dict(body) if isinstance(body, dict) else {}
    if request.can_read_body:
        return dict(await request.post())
    return dict(request.query)


class FakeSlack(FakeApi):
    """The Slack Web API methods the bot uses, at ``{url}`` (give it as ``api_url``)."""

    def __init__(self) -> None:
        super().__init__()
        self.messages: dict[str, dict[str, Any]] = {}  # ts -> the message as it is now
        self.ts = itertools.count(1)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api/"

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/api/{method}", self.handle)
        return app

    async def handle(self, request: web.Request) -> web.Response:
        method = request.match_info["method"]
        params = await _params(request)
        for name in ("blocks", "view"):
            if isinstance(params.get(name), str):
                params[name] = json.loads(params[name])
        self.calls.append(Call(method, params))
        reply: dict[str, Any] = {"ok": True}
        if method == "auth.test":
            reply |= {"user_id": "UBOT", "bot_id": "BBOT", "team_id": "T1", "user": "toolnexus"}
        elif method == "chat.postMessage":
            ts = f"1700000000.{next(self.ts):06d}"
            self.messages[ts] = {**params, "ts": ts}
            reply |= {"channel": params["channel"], "ts": ts, "message": self.messages[ts]}
        elif method == "chat.update":
            if params["ts"] not in self.messages:
                return web.json_response({"ok": False, "error": "message_not_found"})
            self.messages[params["ts"]] = {**params}
            reply |= {"channel": params["channel"], "ts": params["ts"], "text": params["text"]}
        elif method == "chat.postEphemeral":
            reply |= {"message_ts": f"1700000001.{next(self.ts):06d}"}
        elif method == "views.open":
            reply |= {"view": {**params["view"], "id": "V1"}}
        else:
            reply = {"ok": False, "error": "unknown_method"}
        return web.json_response(reply)

    def ephemerals(self, user: str) -> list[str]:
        """The ephemeral texts sent to ``user``, oldest first."""
        return [
            c.params["text"] for c in self.named("chat.postEphemeral") if c.params["user"] == user
        ]

    def message_about(self, text: str) -> dict[str, Any] | None:
        """The message whose text holds ``text``, as it is now."""
        found = [m for m in self.messages.values() if text in m.get("text", "")]
        return found[-1] if found else None


def slack_signature(secret: str, timestamp: str, body: bytes) -> str:
    """``X-Slack-Signature`` of ``body``: ``v0=`` and the HMAC-SHA256 of ``v0:ts:body``."""
    base = b"v0:" + timestamp.encode() + b":" + body
    return "v0=" + hmac.new(secret.encode(), base, hashlib.sha256).hexdigest()


async def post_interaction(
    endpoint: str, payload: dict[str, Any], *, secret: str = SIGNING_SECRET
) -> httpx.Response:
    """POST ``payload`` to the bot's endpoint as Slack does: a form field ``payload``,
    signed with ``secret`` and stamped with the time."""
    body = urlencode({"payload": json.dumps(payload)}).encode()
    timestamp = str(int(time.time()))
    headers = {
        "content-type": "application/x-www-form-urlencoded",
        "x-slack-request-timestamp": timestamp,
        "x-slack-signature": slack_signature(secret, timestamp, body),
    }
    async with httpx.AsyncClient(timeout=20) as client:
        return await client.post(endpoint, content=body, headers=headers)


def block_actions(
    user: str,
    message: dict[str, Any],
    action_id: str,
    value: str,
    state: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The ``block_actions`` payload of ``user`` clicking ``action_id`` on ``message``."""
    return {
        "type": "block_actions",
        "user": {"id": user, "username": user.lower(), "team_id": "T1"},
        "api_app_id": "A1",
        "token": "verification-token",
        "team": {"id": "T1", "domain": "toolnexus"},
        "container": {"type": "message", "message_ts": message["ts"], "channel_id": "C1"},
        "trigger_id": f"trigger-{time.monotonic_ns()}",
        "channel": {"id": message["channel"], "name": "ops"},
        "message": {"type": "message", "ts": message["ts"], "text": message["text"]},
        "state": {"values": state or {}},
        "response_url": "https://hooks.slack.invalid/actions/1",
        "actions": [
            {
                "type": "button",
                "action_id": action_id,
                "block_id": "tnx.controls",
                "value": value,
                "action_ts": str(time.time()),
            }
        ],
    }


def view_submission(user: str, view: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    """The ``view_submission`` payload of ``user`` sending ``view`` filled with ``values``."""
    return {
        "type": "view_submission",
        "team": {"id": "T1", "domain": "toolnexus"},
        "user": {"id": user, "username": user.lower(), "team_id": "T1"},
        "api_app_id": "A1",
        "token": "verification-token",
        "trigger_id": f"trigger-{time.monotonic_ns()}",
        "view": {**view, "id": "V1", "state": {"values": values}},
    }


# -- Telegram -------------------------------------------------------------------------


@dataclass
class TelegramMessage:
    chat_id: int
    message_id: int
    text: str
    markup: dict[str, Any] | None


class FakeTelegram(FakeApi):
    """The Bot API methods the bot uses; updates queued by :meth:`click` and :meth:`say`
    are handed out by ``getUpdates`` (long polling)."""

    def __init__(self) -> None:
        super().__init__()
        self.messages: dict[int, TelegramMessage] = {}
        self.message_ids = itertools.count(100)
        self.update_ids = itertools.count(1)
        self.updates: list[dict[str, Any]] = []  # not yet confirmed by a getUpdates offset
        self.arrived = asyncio.Event()
        self.answers: list[dict[str, Any]] = []  # answerCallbackQuery calls

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/bot{token}/{method}", self.handle)
        return app

    async def handle(self, request: web.Request) -> web.Response:
        method = request.match_info["method"]
        params = await _params(request)
        if isinstance(params.get("reply_markup"), str):
            params["reply_markup"] = json.loads(params["reply_markup"])
        self.calls.append(Call(method, params))
        if method == "getMe":
            return _ok({"id": 42, "is_bot": True, "first_name": "toolnexus", "username": "tnx_bot"})
        if method == "getUpdates":
            return _ok(await self._updates(params))
        if method == "sendMessage":
            mid = next(self.message_ids)
            message = TelegramMessage(
                int(params["chat_id"]), mid, params["text"], params.get("reply_markup")
            )
            self.messages[mid] = message
            return _ok(self._message_json(message))
        if method == "editMessageText":
            mid = int(params["message_id"])
            if mid not in self.messages:
                return _error(400, "Bad Request: message to edit not found")
            message = TelegramMessage(
                int(params["chat_id"]), mid, params["text"], params.get("reply_markup")
            )
            self.messages[mid] = message
            return _ok(self._message_json(message))
        if method == "answerCallbackQuery":
            self.answers.append(params)
            return _ok(True)
        if method in ("deleteWebhook", "close", "logOut"):
            return _ok(True)
        return _error(404, "Not Found: method not found")

    async def _updates(self, params: dict[str, Any]) -> list[dict[str, Any]]:
        """As the Bot API does: confirm the updates below ``offset``, then hand out the
        rest, waiting up to ``timeout`` seconds for one to arrive."""
        offset = int(params.get("offset") or 0)
        self.updates = [u for u in self.updates if u["update_id"] >= offset]
        if not self.updates:
            self.arrived.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.arrived.wait(), float(params.get("timeout") or 0))
        return list(self.updates)

    def _push(self, update: dict[str, Any]) -> None:
        self.updates.append(update)
        self.arrived.set()

    @staticmethod
    def _message_json(message: TelegramMessage) -> dict[str, Any]:
        body: dict[str, Any] = {
            "message_id": message.message_id,
            "date": int(time.time()),
            "chat": {"id": message.chat_id, "type": "group", "title": "ops"},
            "from": {"id": 42, "is_bot": True, "first_name": "toolnexus"},
            "text": message.text,
        }
        if message.markup:
            body["reply_markup"] = message.markup
        return body

    def message_about(self, text: str) -> TelegramMessage | None:
        found = [m for m in self.messages.values() if text in m.text]
        return found[-1] if found else None

    def sent(self, chat_id: int) -> list[str]:
        """The texts of every message sent to ``chat_id``, oldest first."""
        return [
            c.params["text"]
            for c in self.named("sendMessage")
            if int(c.params["chat_id"]) == chat_id
        ]

    def click(self, user: int, message: TelegramMessage, data: str) -> str:
        """Queue ``user`` pressing the button ``data`` of ``message``; return the query id."""
        query_id = f"q{next(self.update_ids)}"
        self._push(
            {
                "update_id": next(self.update_ids),
                "callback_query": {
                    "id": query_id,
                    "from": {"id": user, "is_bot": False, "first_name": f"user{user}"},
                    "chat_instance": "ci-1",
                    "data": data,
                    "message": self._message_json(message),
                },
            }
        )
        return query_id

    def say(self, user: int, chat_id: int, text: str) -> None:
        """Queue ``user`` writing ``text`` in chat ``chat_id``."""
        self._push(
            {
                "update_id": next(self.update_ids),
                "message": {
                    "message_id": next(self.message_ids),
                    "date": int(time.time()),
                    "chat": {"id": chat_id, "type": "group", "title": "ops"},
                    "from": {"id": user, "is_bot": False, "first_name": f"user{user}"},
                    "text": text,
                },
            }
        )

    def answer_to(self, query_id: str) -> dict[str, Any] | None:
        found = [a for a in self.answers if a.get("callback_query_id") == query_id]
        return found[-1] if found else None


def _ok(result: Any) -> web.Response:
    return web.json_response({"ok": True, "result": result})


def _error(code: int, description: str) -> web.Response:
    return web.json_response({"ok": False, "error_code": code, "description": description})


def buttons(markup: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Every inline button of a Telegram ``reply_markup``, row by row."""
    rows = (markup or {}).get("inline_keyboard", [])
    return [button for row in rows for button in row]


def actions(message: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Every interactive element of a Slack message's blocks."""
    blocks = (message or {}).get("blocks", [])
    return [e for b in blocks if b.get("type") == "actions" for e in b.get("elements", [])]


# -- the fake-chat protocol -------------------------------------------------------------


@dataclass
class Click:
    """A person's click as the chat sent it: who, and how to find what they were told."""

    user: str
    token: Any  # Slack: (ephemerals before it, the endpoint's reply); Telegram: the query id


class ChatFake(Protocol):
    """A chat platform faked for one test, as the chat suite drives it. Messages are the
    platform's own (a Slack message dict, a :class:`TelegramMessage`); actions are named
    alike on both: ``accept``, ``decline``, ``done``, ``form``, ``choice:<position>``."""

    platform: str
    allowed: str
    other: str
    home: object
    """Where the bot posts: a Slack channel, a Telegram chat."""
    posted_method: str
    edited_method: str
    missing: ClassVar[Sequence[tuple[tuple[str, ...], str]]]
    """Command lines of ``toolnexus worker <platform>`` missing something, and what the
    error then names; the last one lacks only the allowed users."""

    def server(self, broker: Broker, **options: Any) -> ChatServer: ...
    def message_about(self, text: str) -> Any: ...
    def text(self, message: Any) -> str: ...
    def controls(self, message: Any) -> list[dict[str, Any]]: ...
    def labels(self, message: Any) -> list[str]: ...
    def where(self, message: Any) -> object: ...
    def approval_controls(self, request: Request) -> list[tuple[str, str]]: ...
    def control_ids(self, message: Any) -> list[tuple[str, str]]: ...
    def edits_of(self, message: Any) -> list[Call]: ...
    def named(self, method: str) -> list[Call]: ...
    async def click(self, user: str, message: Any, request: Request, action: str) -> Click: ...
    async def told(self, click: Click) -> str: ...
    async def told_privately(self, click: Click) -> str: ...
    async def quiet(self, click: Click) -> None: ...
    async def forge(self, message: Any, request: Request) -> None: ...
    def check_link_controls(self, message: Any, url: str) -> None: ...
    def choices(self, message: Any) -> list[tuple[str, bool]]: ...
    async def pick(
        self, user: str, message: Any, request: Request, positions: set[int]
    ) -> None: ...
    async def fill_form(self, message: Any, request: Request, answered: Any) -> dict[str, Any]: ...


SLACK_ACTIONS = {"accept": "tnx.accept", "decline": "tnx.decline", "done": "tnx.done"}
TELEGRAM_ACTIONS = {"accept": "a", "decline": "d", "done": "k", "form": "f"}


class SlackChat(FakeSlack):
    """Slack through its Web API (:class:`FakeSlack`) and the bot's Bolt endpoint, where
    clicks are POSTed signed as Slack signs them."""

    platform, allowed, other, home = "slack", "UALLOW", "UOTHER", "C1"
    posted_method, edited_method = "chat.postMessage", "chat.update"
    missing: ClassVar[Sequence[tuple[tuple[str, ...], str]]] = (
        ((), "no Slack bot token"),
        (("--bot-token", "xoxb-1"), "--signing-secret"),
        (("--bot-token", "x", "--signing-secret", "s"), "no Slack channel"),
        (("--bot-token", "x", "--signing-secret", "s", "--channel", "C1"), "--allow-user"),
    )

    def __init__(self) -> None:
        super().__init__()
        self.running: Any = None

    def server(self, broker: Broker, **options: Any) -> ChatServer:
        self.running = SlackServer(
            broker,
            bot_token=BOT_TOKEN,
            signing_secret=SIGNING_SECRET,
            channel=self.home,
            allowed=[self.allowed],
            port=0,
            api_url=self.url,
            drain_s=2,
            **options,
        )
        return self.running  # type: ignore[no-any-return]

    def text(self, message: Any) -> str:
        return str((message or {}).get("text", ""))

    def controls(self, message: Any) -> list[dict[str, Any]]:
        return actions(message)

    def labels(self, message: Any) -> list[str]:
        return [e["text"]["text"] for e in actions(message)]

    def where(self, message: Any) -> object:
        return message["channel"]

    def approval_controls(self, request: Request) -> list[tuple[str, str]]:
        return [("tnx.accept", request.id), ("tnx.decline", request.id)]

    def control_ids(self, message: Any) -> list[tuple[str, str]]:
        return [(e["action_id"], e["value"]) for e in actions(message)]

    def edits_of(self, message: Any) -> list[Call]:
        return [c for c in self.named("chat.update") if c.params["ts"] == message["ts"]]

    async def click(self, user: str, message: Any, request: Request, action: str) -> Click:
        name = SLACK_ACTIONS.get(action) or "tnx." + action.replace(":", ".")
        before = len(self.ephemerals(user))
        reply = await post_interaction(
            self.running.url, block_actions(user, message, name, request.id)
        )
        return Click(user, (before, reply))

    async def told(self, click: Click) -> str:
        before = click.token[0]
        await eventually(lambda: len(self.ephemerals(click.user)) > before, "an ephemeral sent")
        return self.ephemerals(click.user)[before]

    async def told_privately(self, click: Click) -> str:
        return await self.told(click)  # an ephemeral: shown to that person only

    async def quiet(self, click: Click) -> None:
        assert click.token[1].status_code == 200

    async def forge(self, message: Any, request: Request) -> None:
        """A forged click (the wrong signing secret) is refused by Bolt before anything."""
        forged = block_actions(self.allowed, message, "tnx.accept", request.id)
        reply = await post_interaction(self.running.url, forged, secret="not-the-secret")
        assert reply.status_code == 401

    def check_link_controls(self, message: Any, url: str) -> None:
        controls = actions(message)
        assert controls[0]["url"] == url
        assert [c["action_id"] for c in controls] == ["tnx.link", "tnx.done", "tnx.decline"]

    def choices(self, message: Any) -> list[tuple[str, bool]]:
        menu = actions(message)[0]
        assert menu["type"] == "multi_static_select"
        chosen = {o["value"] for o in menu.get("initial_options", ())}
        return [(o["text"]["text"], o["value"] in chosen) for o in menu["options"]]

    async def pick(self, user: str, message: Any, request: Request, positions: set[int]) -> None:
        picked = {
            "tnx.controls": {
                "tnx.pick": {
                    "type": "multi_static_select",
                    "selected_options": [{"value": str(p)} for p in sorted(positions)],
                }
            }
        }
        click = block_actions(user, message, "tnx.send", request.id, state=picked)
        await post_interaction(self.running.url, click)

    async def fill_form(self, message: Any, request: Request, answered: Any) -> dict[str, Any]:
        """A modal whose mistakes are shown and whose submission answers; the data sent."""
        url = self.running.url
        await post_interaction(url, block_actions(self.allowed, message, "tnx.form", request.id))
        await eventually(lambda: bool(self.named("views.open")), "the modal opened")
        opened = self.named("views.open")[0].params
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

        wrong = await post_interaction(url, view_submission(self.allowed, view, values("A", "40")))
        errors = wrong.json()
        assert errors["response_action"] == "errors"
        assert "shorter than the minimum length of 2" in errors["errors"]["f0"]
        assert "12" in errors["errors"]["f3"]
        assert not answered()
        right = await post_interaction(url, view_submission(self.allowed, view, values("Ada", "4")))
        assert right.status_code == 200 and not right.content.strip(b" {}")
        return {
            "name": "Ada",
            "email": "ada@example.org",
            "day": "2026-05-01",
            "guests": 4,
            "budget": 99.5,
            "terrace": True,
            "menu": "fish",
            "extras": ["cake", "wine"],
        }


class TelegramChat(FakeTelegram):
    """Telegram through its Bot API (:class:`FakeTelegram`): clicks and replies are
    updates the bot long-polls for."""

    platform, allowed, other, home = "telegram", "555", "666", -1001
    posted_method, edited_method = "sendMessage", "editMessageText"
    missing: ClassVar[Sequence[tuple[tuple[str, ...], str]]] = (
        ((), "no Telegram bot token"),
        (("--bot-token", TELEGRAM_TOKEN), "no Telegram chat"),
        (("--bot-token", TELEGRAM_TOKEN, "--chat", "ops"), "is a number"),
        (("--bot-token", TELEGRAM_TOKEN, "--chat", "-100"), "--allow-user"),
    )

    def server(self, broker: Broker, **options: Any) -> ChatServer:
        return TelegramServer(
            broker,
            bot_token=TELEGRAM_TOKEN,
            chat_id=self.home,
            allowed=[self.allowed],
            api_url=self.url,
            polling_timeout_s=1,
            drain_s=2,
            **options,
        )

    def text(self, message: Any) -> str:
        return "" if message is None else str(message.text)

    def controls(self, message: Any) -> list[dict[str, Any]]:
        return [] if message is None else buttons(message.markup)

    def labels(self, message: Any) -> list[str]:
        return [b["text"] for b in self.controls(message)]

    def where(self, message: Any) -> object:
        return message.chat_id

    def approval_controls(self, request: Request) -> list[tuple[str, str]]:
        return [("Accept", "a"), ("Decline", "d")]

    def control_ids(self, message: Any) -> list[tuple[str, str]]:
        return [(b["text"], b["callback_data"]) for b in self.controls(message)]

    def edits_of(self, message: Any) -> list[Call]:
        return [
            c
            for c in self.named("editMessageText")
            if int(c.params["message_id"]) == message.message_id
        ]

    async def click(self, user: str, message: Any, request: Request, action: str) -> Click:
        data = TELEGRAM_ACTIONS.get(action) or "c" + action.removeprefix("choice:")
        return Click(user, super().click(int(user), message, data))

    async def _answer(self, click: Click) -> dict[str, Any]:
        query = click.token
        await eventually(lambda: self.answer_to(query) is not None, f"query {query} answered")
        answer = self.answer_to(query)
        assert answer is not None
        return answer

    async def told(self, click: Click) -> str:
        return str((await self._answer(click))["text"])

    async def told_privately(self, click: Click) -> str:
        answer = await self._answer(click)
        assert str(answer["show_alert"]).lower() == "true"  # shown to that person only
        return str(answer["text"])

    async def quiet(self, click: Click) -> None:
        assert (await self._answer(click)).get("show_alert") in (None, False, "false")

    async def forge(self, message: Any, request: Request) -> None:
        """Nothing to forge: clicks come from the Bot API over the bot's own polling."""

    def check_link_controls(self, message: Any, url: str) -> None:
        controls = buttons(message.markup)
        assert controls[0] == {"text": "Open link", "url": url}
        assert [b.get("callback_data") for b in controls[1:]] == ["k", "d"]

    def choices(self, message: Any) -> list[tuple[str, bool]]:
        toggles = buttons(message.markup)[:-2]
        assert [b["text"] for b in buttons(message.markup)[-2:]] == ["Done", "Decline"]
        return [(b["text"][2:], b["text"].startswith("☑")) for b in toggles]

    async def pick(self, user: str, message: Any, request: Request, positions: set[int]) -> None:
        """Toggle the options whose state differs from ``positions``, then press Done."""
        ticked = {i for i, (_, on) in enumerate(self.choices(message)) if on}
        for position in sorted(ticked ^ positions):
            await self._answer(Click(user, super().click(int(user), message, f"t{position}")))
        now = self.message_about(request.prompt)
        assert now is not None
        assert [on for _, on in self.choices(now)] == [
            i in positions for i in range(len(self.choices(now)))
        ]
        super().click(int(user), message, "s")

    async def fill_form(self, message: Any, request: Request, answered: Any) -> dict[str, Any]:
        """A reply sequence that asks again after a mistake; the data sent."""
        chat, allowed, other = self.home, int(self.allowed), int(self.other)
        super().click(allowed, message, "f")
        asked = 0

        async def question(containing: str) -> str:
            nonlocal asked
            await eventually(
                lambda: len(self.sent(chat)) > asked + 1, f"a question about {containing}"
            )
            asked += 1
            text = self.sent(chat)[asked]
            assert containing in text, text
            return text

        assert "1/8 Name" in await question("Name")
        self.say(other, chat, "Mallory")  # someone else's message is not an answer
        self.say(allowed, chat, "A")
        assert "shorter than the minimum length of 2" in await question("1/8 Name")
        self.say(allowed, chat, "Ada")
        await question("2/8 Email")
        self.say(allowed, chat, "not an email")
        await question("2/8 Email")
        self.say(allowed, chat, "ada@example.org")
        await question("3/8 Day")
        self.say(allowed, chat, "2026-05-01")
        assert "Default: 2" in await question("4/8 Guests")
        self.say(allowed, chat, "-")  # the default
        await question("5/8 Budget")
        self.say(allowed, chat, "99.5")
        assert "yes or no" in await question("6/8 Terrace")
        self.say(allowed, chat, "maybe")
        assert "neither yes nor no" in await question("6/8 Terrace")
        self.say(allowed, chat, "yes")
        menu = await question("7/8 Menu")
        assert "2. fish" in menu
        self.say(allowed, chat, "4")
        await question("7/8 Menu")  # no option 4: asked again
        assert not answered()
        self.say(allowed, chat, "2")
        await question("8/8 Extras")
        self.say(allowed, chat, "1, wine")
        return {
            "name": "Ada",
            "email": "ada@example.org",
            "day": "2026-05-01",
            "guests": 2,
            "budget": 99.5,
            "terrace": True,
            "menu": "fish",
            "extras": ["cake", "wine"],
        }
