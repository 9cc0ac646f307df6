"""The Telegram bot: one message per request in a chat, answered with its inline buttons.

Built on aiogram 3: messages through ``sendMessage`` / ``editMessageText``, clicks as
callback queries (answered, privately, with ``answerCallbackQuery``), replies as
messages. A form is asked field by field: the bot names the field and what it takes,
the person replies, a wrong value is explained and asked again, ``-`` keeps the
default (or leaves an optional field out), ``/cancel`` stops.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from aiogram import Bot, Dispatcher
from aiogram.exceptions import TelegramBadRequest
from aiogram.types import (
    CallbackQuery,
    InlineKeyboardButton,
    InlineKeyboardMarkup,
    Message,
    ReplyParameters,
)

from toolnexus import Broker, Pending
from toolnexus.errors import InvalidAnswer
from toolnexus.models import EndedEvent
from toolnexus.rendering import KNOWN_DOMAINS, Field, field_errors, form_data, gone_note

from ..chat import (
    TOO_LATE,
    Allowed,
    ChatBot,
    MessageMap,
    Ref,
    View,
    accepting,
    declining,
    default_text,
    denying,
    field_line,
    view_of,
)

log = logging.getLogger("toolnexus.telegram")

SKIP, CANCEL = "-", "/cancel"
DENY_QUESTION = (
    f"Reply with the message for the agent: why the tool must not run. ({CANCEL} to stop)"
)
_YES = ("y", "yes", "true", "1", "on")
_NO = ("n", "no", "false", "0", "off")


@dataclass
class Conversation:
    """A form being filled in by one person, reply by reply; or (``denying``) the message
    a tool approval's denial gives the agent, asked in one reply."""

    request_id: str
    user_id: int
    fields: tuple[Field, ...]
    index: int = 0
    data: dict[str, Any] = field(default_factory=dict)
    denying: bool = False

    @property
    def current(self) -> Field:
        return self.fields[self.index]


def keyboard(view: View, chosen: frozenset[int] = frozenset()) -> InlineKeyboardMarkup:
    """The inline buttons of ``view`` (``chosen``: the ticked options of a multi-select)."""
    decline = InlineKeyboardButton(text="Decline", callback_data="d")
    rows: list[list[InlineKeyboardButton]]
    if view.problem is not None:
        rows = [[decline]]
    elif view.layout == "authorization":
        rows = [[InlineKeyboardButton(text="Done", callback_data="k"), decline]]
        if view.link is not None and view.link.openable:
            rows.insert(0, [InlineKeyboardButton(text="Open link", url=view.link.url)])
    elif view.layout == "choice":
        choices = view.fields[0].choices
        rows = [
            [InlineKeyboardButton(text=label, callback_data=f"c{i}")]
            for i, (_, label) in enumerate(choices)
        ]
        rows.append([decline])
    elif view.layout == "multi":
        choices = view.fields[0].choices
        rows = [
            [
                InlineKeyboardButton(
                    text=f"{'☑' if i in chosen else '☐'} {label}", callback_data=f"t{i}"
                )
            ]
            for i, (_, label) in enumerate(choices)
        ]
        rows.append([InlineKeyboardButton(text="Done", callback_data="s"), decline])
    elif view.layout == "form":
        rows = [[InlineKeyboardButton(text="Fill in", callback_data="f"), decline]]
    elif view.layout == "tool_call":
        rows = [
            [
                InlineKeyboardButton(text="Approve", callback_data="a"),
                InlineKeyboardButton(text="Deny", callback_data="d"),
            ],
            [InlineKeyboardButton(text="Deny with a message…", callback_data="m")],
        ]
        if view.page is not None:
            rows.append([InlineKeyboardButton(text="Edit on the web page", url=view.page)])
    else:
        rows = [[InlineKeyboardButton(text="Accept", callback_data="a"), decline]]
    return InlineKeyboardMarkup(inline_keyboard=rows)


def _tick(ticked: bool) -> str:
    return "☑" if ticked else "☐"


def question(conversation: Conversation) -> str:
    """How the current field of ``conversation`` is asked."""
    f = conversation.current
    lines = [f"{conversation.index + 1}/{len(conversation.fields)} {field_line(f)}"]
    if f.choices:
        lines += [f"{i + 1}. {label}" for i, (_, label) in enumerate(f.choices)]
        many = f.widget == "checks"
        lines.append(
            "Reply with the numbers, separated by commas." if many else "Reply with a number."
        )
    elif f.widget == "checkbox":
        lines.append("Reply yes or no.")
    else:
        lines.append("Reply with the value.")
    shown = default_text(f)
    if shown is not None:
        lines.append(f"Default: {shown}. Reply {SKIP} to keep it.")
    elif not f.required:
        lines.append(f"Reply {SKIP} to leave it out.")
    lines.append(f"({CANCEL} to stop)")
    return "\n".join(lines)


def read_reply(f: Field, text: str) -> dict[str, list[str]] | None:
    """``text`` as the submitted form :func:`toolnexus.rendering.form_data` reads for ``f``
    (None: ``-``).

    A choice is its number or its label; anything else is kept as sent for the
    schema check to name.

    Raises:
        ValueError: a yes/no field got neither (the message says what to reply).
    """
    text = text.strip()
    if text == SKIP:
        return None
    if f.widget == "checkbox":
        word = text.lower()
        if word not in _YES + _NO:
            raise ValueError(f"“{text}” is neither yes nor no")
        return {f.input_name: ["on"] if word in _YES else []}
    if f.choices:
        parts = [p.strip() for p in text.split(",")] if f.widget == "checks" else [text]
        return {f.input_name: [_position(f, p) for p in parts if p]}
    return {f.input_name: [text]}


def _position(f: Field, text: str) -> str:
    if text.isdigit() and 1 <= int(text) <= len(f.choices):
        return str(int(text) - 1)
    for i, (_, label) in enumerate(f.choices):
        if label.lower() == text.lower():
            return str(i)
    return text


class TelegramBot(ChatBot):
    """Posts each request to chat ``chat_id``; answers come from allowed users' clicks."""

    group = "telegram"

    def __init__(
        self,
        broker: Broker,
        messages: MessageMap,
        allowed: Allowed,
        *,
        bot: Bot,
        dispatcher: Dispatcher,
        chat_id: int,
        known_domains: tuple[str, ...] = KNOWN_DOMAINS,
        web_url: str | None = None,
    ) -> None:
        super().__init__(broker, messages, allowed, known_domains=known_domains, web_url=web_url)
        self.bot = bot
        self.chat_id = chat_id
        self.ticked: dict[str, frozenset[int]] = {}
        self.conversations: dict[int, Conversation] = {}  # by user id
        dispatcher.callback_query.register(self._on_click)
        dispatcher.message.register(self._on_message)

    def __repr__(self) -> str:
        return f"<TelegramBot {self.chat_id} showing {len(self.shown)}>"

    async def post(self, view: View, earlier: Ref | None) -> Ref:
        if view.layout == "multi":
            self.ticked.setdefault(view.request.id, view.fields[0].state(None)[1])
        markup = keyboard(view, self.ticked.get(view.request.id, frozenset()))
        if earlier is not None:
            try:
                await self._edit(earlier, view.text, markup)
                return dict(earlier)
            except TelegramBadRequest as exc:  # deleted meanwhile, say: sent anew
                log.warning("%s: its earlier message is gone (%s)", view.request.id, exc)
        sent = await self.bot.send_message(self.chat_id, view.text, reply_markup=markup)
        return {"chat_id": sent.chat.id, "message_id": sent.message_id}

    async def close_message(self, ref: Ref, text: str) -> None:
        await self._edit(ref, text, None)

    async def notify(self, ref: Ref, text: str) -> None:
        reply = ReplyParameters(message_id=ref["message_id"])
        await self.bot.send_message(ref["chat_id"], text, reply_parameters=reply)

    async def _edit(self, ref: Ref, text: str, markup: InlineKeyboardMarkup | None) -> None:
        """Edit the message at ``ref``; one already so is left alone."""
        try:
            await self.bot.edit_message_text(
                text=text, chat_id=ref["chat_id"], message_id=ref["message_id"], reply_markup=markup
            )
        except TelegramBadRequest as exc:
            if "not modified" not in str(exc):
                raise

    async def gone(self, pending: Pending, event: EndedEvent) -> None:
        request_id = pending.request.id
        self.ticked.pop(request_id, None)
        for user_id, conversation in list(self.conversations.items()):
            if conversation.request_id == request_id:
                del self.conversations[user_id]
                unsent = "message was" if conversation.denying else "answers to the form were"
                await self.bot.send_message(
                    self.chat_id, f"{gone_note(event)} Your {unsent} not sent."
                )
        await super().gone(pending, event)

    def _request_of(self, message: Any) -> str | None:
        if message is None:
            return None
        for request_id, ref in self.refs.items():
            if (
                ref.get("message_id") == message.message_id
                and ref.get("chat_id") == message.chat.id
            ):
                return request_id
        return None

    async def _on_click(self, query: CallbackQuery) -> None:
        request_id = self._request_of(query.message)
        user_id, action = query.from_user.id, query.data or ""
        if request_id is None:
            await query.answer(TOO_LATE, show_alert=True)
            return
        told = await self._act(request_id, user_id, action)
        await query.answer(told or None, show_alert=bool(told))

    async def _act(self, request_id: str, user_id: int, action: str) -> str | None:
        if action == "d":
            return await self.resolve(request_id, user_id, declining, accepted=False)
        pending = self.pending_for(request_id)
        if pending is not None and user_id in self.allowed:
            view = self.view(pending.request)
            if action.startswith("t"):
                ticked = self.ticked.get(request_id, frozenset()) ^ {int(action[1:])}
                self.ticked[request_id] = ticked
                await self._edit(self.refs[request_id], view.text, keyboard(view, ticked))
                return None
            if action == "f":
                conversation = Conversation(request_id, user_id, view.fields)
                self.conversations[user_id] = conversation
                await self.bot.send_message(self.chat_id, question(conversation))
                return None
            if action == "m":
                self.conversations[user_id] = Conversation(request_id, user_id, (), denying=True)
                await self.bot.send_message(self.chat_id, DENY_QUESTION)
                return None
        data: Any = None
        fields = view_of(pending.request).fields if pending is not None else ()
        if fields and action.startswith("c"):
            f = fields[0]
            data = {f.name: f.choices[int(action[1:])][0]}
        elif fields and action == "s":
            f = fields[0]
            positions = sorted(self.ticked.get(request_id, frozenset()))
            data = form_data([f], {f.input_name: [str(p) for p in positions]})
        try:
            told = await self.resolve(request_id, user_id, accepting(data), accepted=True)
        except InvalidAnswer as exc:
            return f"That answer was refused: {exc}"
        if told is None:
            self.ticked.pop(request_id, None)
        return told

    async def _on_message(self, message: Message) -> None:
        user = message.from_user
        if message.chat.id != self.chat_id or user is None or message.text is None:
            return
        conversation = self.conversations.get(user.id)
        if conversation is None:
            return
        if message.text.strip() == CANCEL:
            del self.conversations[user.id]
            again = "Deny with a message" if conversation.denying else "Fill in"
            await message.reply(f"Stopped; nothing was sent. Press {again} to start again.")
            return
        pending = self.pending_for(conversation.request_id)
        if pending is None:
            del self.conversations[user.id]
            await message.reply(TOO_LATE)
            return
        if conversation.denying:
            del self.conversations[user.id]
            told = await self.resolve(
                conversation.request_id, user.id, denying(message.text), accepted=False
            )
            await message.reply(told or "✓ Denied; the agent is told your message.")
            return
        f = conversation.current
        try:
            sent = read_reply(f, message.text)
        except ValueError as exc:
            await message.reply(f"✗ {exc}\n\n{question(conversation)}")
            return
        value = form_data([f], sent) if sent is not None else {}
        errors = field_errors(pending.request.schema or {}, [f], value)
        if f.name in errors:
            await message.reply(f"✗ {errors[f.name]}\n\n{question(conversation)}")
            return
        conversation.data.update(value)
        conversation.index += 1
        if conversation.index < len(conversation.fields):
            await message.reply(question(conversation))
            return
        del self.conversations[user.id]
        try:
            told = await self.resolve(
                conversation.request_id, user.id, accepting(conversation.data), accepted=True
            )
        except InvalidAnswer as exc:
            told = f"That answer was refused: {exc}. Press Fill in to start again."
        await message.reply(told or "✓ Sent. Thank you.")


__all__ = ["TelegramBot", "keyboard", "question", "read_reply"]
