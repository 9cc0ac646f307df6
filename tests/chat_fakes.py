"""Local HTTP servers speaking the Slack Web API and the Telegram Bot API shapes.

Neither service can be reached from here, so the bots talk to these instead (both
libraries take another base URL). Each records the calls it gets; the Slack one also
signs interaction payloads as Slack does, and the Telegram one hands out updates
through ``getUpdates`` long polling.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import itertools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import httpx2 as httpx
from aiohttp import web

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
