"""The Slack bot: one message per request in a channel, answered with its buttons.

Built on slack-bolt (async): Block Kit messages through ``chat.postMessage`` /
``chat.update``, refusals through ``chat.postEphemeral``, forms in a modal
(``views.open``, answered by a ``view_submission``). Interactions reach the bot on its
HTTP endpoint (signed with the app's signing secret, checked by Bolt) or, with an app
token, over Socket Mode.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any

from slack_bolt.async_app import AsyncAck, AsyncApp
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from toolnexus import Broker, Pending
from toolnexus.errors import InvalidAnswer
from toolnexus.rendering import KNOWN_DOMAINS, Field, field_errors, form_data, message_for_field

from ..chat import (
    Allowed,
    ChatBot,
    MessageMap,
    Ref,
    View,
    accepting,
    declining,
    denying,
    field_line,
)

log = logging.getLogger("toolnexus.slack")

FORM_CALLBACK = "tnx.form"
"""The ``callback_id`` of the form modal."""
DENY_CALLBACK = "tnx.deny"
"""The ``callback_id`` of the modal that asks a tool approval's denial for its message."""


def escape(text: str) -> str:
    """``text`` safe in Slack's mrkdwn (no links, mentions or markup from a request)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _plain(text: str, limit: int = 75) -> dict[str, Any]:
    return {"type": "plain_text", "text": text[:limit] or " ", "emoji": True}


def _button(label: str, action: str, request_id: str, style: str | None = None) -> dict[str, Any]:
    button: dict[str, Any] = {
        "type": "button",
        "text": _plain(label),
        "action_id": action,
        "value": request_id,
    }
    if style:
        button["style"] = style
    return button


def _option(value: int, label: str) -> dict[str, Any]:
    return {"text": _plain(label), "value": str(value)}


def message_blocks(view: View) -> list[dict[str, Any]]:
    """The Block Kit blocks of ``view``: its text, then its controls."""
    request_id = view.request.id
    blocks: list[dict[str, Any]] = [
        {"type": "section", "text": {"type": "mrkdwn", "text": escape(view.text)[:3000]}}
    ]
    decline = _button("Decline", "tnx.decline", request_id, "danger")
    elements: list[dict[str, Any]]
    if view.problem is not None:
        elements = [decline]
    elif view.layout == "authorization":
        elements = [_button("Done", "tnx.done", request_id, "primary"), decline]
        link = view.link
        if link is not None and link.openable:
            opener = {**_button("Open link", "tnx.link", request_id), "url": link.url}
            elements.insert(0, opener)
    elif view.layout == "choice":
        choices = view.fields[0].choices
        elements = [
            _button(label, f"tnx.choice.{i}", request_id) for i, (_, label) in enumerate(choices)
        ]
        elements.append(decline)
    elif view.layout == "multi":
        f = view.fields[0]
        select: dict[str, Any] = {
            "type": "multi_static_select",
            "action_id": "tnx.pick",
            "placeholder": _plain("Choose…"),
            "options": [_option(i, label) for i, (_, label) in enumerate(f.choices)],
        }
        chosen = f.state(None)[1]
        if chosen:
            select["initial_options"] = [
                _option(i, label) for i, (_, label) in enumerate(f.choices) if i in chosen
            ]
        elements = [select, _button("Send", "tnx.send", request_id, "primary"), decline]
    elif view.layout == "form":
        elements = [_button("Fill in…", "tnx.form", request_id, "primary"), decline]
    elif view.layout == "tool_call":
        elements = [
            _button("Approve", "tnx.accept", request_id, "primary"),
            _button("Deny…", "tnx.deny", request_id, "danger"),
        ]
        if view.page is not None:
            elements.append(
                {**_button("Edit on the web page", "tnx.link", request_id), "url": view.page}
            )
    else:
        elements = [_button("Accept", "tnx.accept", request_id, "primary"), decline]
    blocks.append({"type": "actions", "block_id": "tnx.controls", "elements": elements})
    return blocks


def closed_blocks(text: str) -> list[dict[str, Any]]:
    """The blocks of a closed message: its text only, no controls."""
    return [{"type": "section", "text": {"type": "mrkdwn", "text": escape(text)[:3000]}}]


def modal(view: View, channel: str) -> dict[str, Any]:
    """The modal asking ``view``'s form: one input block per field, defaults filled in."""
    blocks = [
        {"type": "section", "text": {"type": "mrkdwn", "text": escape(view.text)[:3000]}},
        *(_input(i, f) for i, f in enumerate(view.fields)),
    ]
    metadata = json.dumps({"id": view.request.id, "channel": channel})
    return {
        "type": "modal",
        "callback_id": FORM_CALLBACK,
        "private_metadata": metadata,
        "title": _plain("Answer the request", 24),
        "submit": _plain("Send", 24),
        "close": _plain("Cancel", 24),
        "blocks": blocks,
    }


def deny_modal(view: View, channel: str) -> dict[str, Any]:
    """The modal that denies ``view``'s tool call, with a message for the agent (optional:
    the model is told it)."""
    tool = view.tool.call.name if view.tool is not None else "the tool"
    return {
        "type": "modal",
        "callback_id": DENY_CALLBACK,
        "private_metadata": json.dumps({"id": view.request.id, "channel": channel}),
        "title": _plain("Deny the tool call", 24),
        "submit": _plain("Deny", 24),
        "close": _plain("Cancel", 24),
        "blocks": [
            {"type": "section", "text": {"type": "mrkdwn", "text": escape(view.text)[:3000]}},
            {
                "type": "input",
                "block_id": "message",
                "label": _plain(f"Why not? The agent is told (optional) — {tool}", 2000),
                "element": {"type": "plain_text_input", "action_id": "v", "multiline": True},
                "optional": True,
            },
        ],
    }


def _input(index: int, f: Field) -> dict[str, Any]:
    text, chosen = f.state(None)
    element: dict[str, Any]
    options = [_option(i, label) for i, (_, label) in enumerate(f.choices[:100])]
    initial = [o for o in options if int(o["value"]) in chosen]
    if f.widget == "checkbox":
        element = {"type": "checkboxes", "options": [_option(0, f.title)]}
        initial = [element["options"][0]] if chosen else []
    elif f.widget == "checks":
        element = {"type": "multi_static_select", "options": options}
    elif f.widget == "select":
        element = {"type": "static_select", "options": options}
        if initial:
            element["initial_option"] = initial[0]
        initial = []
    elif f.widget in ("number", "integer"):
        element = {"type": "number_input", "is_decimal_allowed": f.widget == "number"}
    elif f.widget == "email":
        element = {"type": "email_text_input"}
    elif f.widget == "url":
        element = {"type": "url_text_input"}
    elif f.widget == "date" and re.fullmatch(r"\d{4}-\d{2}-\d{2}", text or "2000-01-01"):
        element = {"type": "datepicker"}
        if text:
            element["initial_date"] = text
        text = ""
    else:
        element = {"type": "plain_text_input"}
        if f.widget == "date-time":
            element["placeholder"] = _plain("2026-05-01T09:30:00Z")
    element["action_id"] = "v"
    if initial:
        element["initial_options"] = initial
    if text:
        element["initial_value"] = text
    block: dict[str, Any] = {
        "type": "input",
        "block_id": f"f{index}",
        "label": _plain(f.title, 2000),
        "element": element,
        "optional": not f.required or f.widget in ("checkbox", "checks"),
    }
    hint = field_line(f).partition(": ")[2]
    if hint:
        block["hint"] = _plain(hint, 2000)
    return block


def submitted(fields: Sequence[Field], values: Mapping[str, Any]) -> dict[str, list[str]]:
    """A modal's ``view.state.values`` as the submitted form
    :func:`toolnexus.rendering.form_data` reads."""
    sent: dict[str, list[str]] = {}
    for index, f in enumerate(fields):
        value = values.get(f"f{index}", {}).get("v", {})
        if "selected_options" in value:
            picked = [str(o["value"]) for o in value["selected_options"] or []]
            sent[f.input_name] = ["on"] if f.widget == "checkbox" and picked else picked
            if f.widget == "checkbox" and not picked:
                sent[f.input_name] = []
        elif value.get("selected_option"):
            sent[f.input_name] = [str(value["selected_option"]["value"])]
        elif value.get("selected_date"):
            sent[f.input_name] = [str(value["selected_date"])]
        elif value.get("value") is not None:
            sent[f.input_name] = [str(value["value"])]
    return sent


class SlackBot(ChatBot):
    """Posts each request to ``channel`` and answers it from the clicks of allowed users."""

    group = "slack"

    def __init__(
        self,
        broker: Broker,
        messages: MessageMap,
        allowed: Allowed,
        *,
        app: AsyncApp,
        channel: str,
        known_domains: tuple[str, ...] = KNOWN_DOMAINS,
        web_url: str | None = None,
    ) -> None:
        super().__init__(broker, messages, allowed, known_domains=known_domains, web_url=web_url)
        self.app = app
        self.client: AsyncWebClient = app.client
        self.channel = channel
        app.action(re.compile(r"^tnx\."))(self._on_action)
        app.view(FORM_CALLBACK)(self._on_submission)
        app.view(DENY_CALLBACK)(self._on_denial)

    def __repr__(self) -> str:
        return f"<SlackBot {self.channel} showing {len(self.shown)}>"

    async def post(self, view: View, earlier: Ref | None) -> Ref:
        blocks = message_blocks(view)
        if earlier is not None:
            try:
                await self.client.chat_update(
                    channel=earlier["channel"], ts=earlier["ts"], text=view.text, blocks=blocks
                )
                return dict(earlier)
            except SlackApiError as exc:  # deleted meanwhile, say: posted anew
                log.warning("%s: its earlier message is gone (%s)", view.request.id, exc)
        sent = await self.client.chat_postMessage(
            channel=self.channel, text=view.text, blocks=blocks
        )
        return {"channel": sent["channel"], "ts": sent["ts"]}

    async def close_message(self, ref: Ref, text: str) -> None:
        await self.client.chat_update(
            channel=ref["channel"], ts=ref["ts"], text=text, blocks=closed_blocks(text)
        )

    async def notify(self, ref: Ref, text: str) -> None:
        await self.client.chat_postMessage(channel=ref["channel"], thread_ts=ref["ts"], text=text)

    async def _tell(self, body: Mapping[str, Any], user: str, text: str) -> None:
        channel = (body.get("channel") or {}).get("id") or self.channel
        await self.client.chat_postEphemeral(channel=channel, user=user, text=text)

    async def _on_action(self, ack: AsyncAck, body: dict[str, Any]) -> None:
        await ack()
        action = body["actions"][0]
        name, request_id = action["action_id"], action.get("value", "")
        user = body["user"]["id"]
        if name in ("tnx.pick", "tnx.link"):
            return  # choosing in the menu, or opening the link: nothing is answered yet
        told = await self._act(name, request_id, user, body)
        if told is not None:
            await self._tell(body, user, told)

    async def _act(self, name: str, request_id: str, user: str, body: dict[str, Any]) -> str | None:
        if name == "tnx.decline":
            return await self.resolve(request_id, user, declining, accepted=False)
        pending = self.pending_for(request_id)
        if name == "tnx.form" and pending is not None and user in self.allowed:
            view = self._view(pending)
            await self.client.views_open(
                trigger_id=body["trigger_id"], view=modal(view, self.channel)
            )
            return None
        if name == "tnx.deny":
            if pending is None or user not in self.allowed:  # told why, as for a decline
                return await self.resolve(request_id, user, declining, accepted=False)
            view = self._view(pending)
            await self.client.views_open(
                trigger_id=body["trigger_id"], view=deny_modal(view, self.channel)
            )
            return None
        data: Any = None
        if pending is not None and name.startswith("tnx.choice."):
            f = self._view(pending).fields[0]
            data = {f.name: f.choices[int(name.rsplit(".", 1)[1])][0]}
        elif pending is not None and name == "tnx.send":
            f = self._view(pending).fields[0]
            state = body.get("state", {}).get("values", {})
            picked = [
                str(option["value"])
                for block in state.values()
                for option in (block.get("tnx.pick") or {}).get("selected_options") or []
            ]
            data = form_data([f], {f.input_name: picked})
        try:
            return await self.resolve(request_id, user, accepting(data), accepted=True)
        except InvalidAnswer as exc:
            return f"That answer was refused: {exc}. Please change it and send again."

    async def _on_submission(
        self, ack: AsyncAck, body: dict[str, Any], view: dict[str, Any]
    ) -> None:
        meta = json.loads(view.get("private_metadata") or "{}")
        request_id, user = str(meta.get("id", "")), body["user"]["id"]
        pending = self.pending_for(request_id)
        if pending is None or user not in self.allowed:
            await ack()
            told = await self.resolve(request_id, user, accepting(None), accepted=True)
            if told is not None:
                await self._tell({"channel": {"id": meta.get("channel")}}, user, told)
            return
        shown = self._view(pending)
        schema = pending.request.schema or {}
        data = form_data(shown.fields, submitted(shown.fields, view["state"]["values"]))
        errors = field_errors(schema, shown.fields, data)
        if errors:
            index = {f.name: i for i, f in enumerate(shown.fields)}
            await ack(
                response_action="errors", errors={f"f{index[n]}": m for n, m in errors.items()}
            )
            return
        try:
            told = await self.resolve(request_id, user, accepting(data), accepted=True)
        except InvalidAnswer as exc:
            name = shown.fields[0].name if shown.fields else ""
            await ack(response_action="errors", errors={"f0": message_for_field(exc, name)})
            return
        await ack()
        if told is not None:
            await self._tell({"channel": {"id": meta.get("channel")}}, user, told)

    async def _on_denial(self, ack: AsyncAck, body: dict[str, Any], view: dict[str, Any]) -> None:
        await ack()
        meta = json.loads(view.get("private_metadata") or "{}")
        request_id, user = str(meta.get("id", "")), body["user"]["id"]
        state = view.get("state", {}).get("values", {})
        message = str((state.get("message", {}).get("v") or {}).get("value") or "")
        told = await self.resolve(request_id, user, denying(message), accepted=False)
        if told is not None:
            await self._tell({"channel": {"id": meta.get("channel")}}, user, told)

    def _view(self, pending: Pending) -> View:
        return self.view(pending.request)


__all__ = ["SlackBot", "deny_modal", "message_blocks", "modal", "submitted"]
