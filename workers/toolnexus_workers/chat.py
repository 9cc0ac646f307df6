"""What the chat bots (Slack, Telegram) share: how a request reads as a message, which
controls it gets, who may answer, and where its message is kept across restarts.

A :class:`ChatBot` is a :class:`~toolnexus.Worker` that posts one message per
delivered request and edits it when the request ends. The map request id -> message
lives in the broker's store named after the bot's group (:meth:`toolnexus.Broker.store`),
so a restarted bot edits its earlier messages instead of posting new ones, and closes
those whose requests were resolved while it was away (it reads their outcome in the audit trail).
"""

from __future__ import annotations

import abc
import argparse
import asyncio
import dataclasses
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal, Self

from toolnexus import Answer, Broker, Pending, Request, Service, Store, Worker
from toolnexus.errors import (
    AlreadyVoted,
    ConfigurationError,
    InvalidAnswer,
    InvalidRequest,
    NotResolved,
    ToolnexusError,
)
from toolnexus.lifecycle import Status
from toolnexus.models import ApprovedEvent, EndedEvent, EscalatedEvent, ExpiredEvent, WithdrawnEvent
from toolnexus.rendering import (
    KNOWN_DOMAINS,
    Field,
    Link,
    ToolCallView,
    check_link,
    escalated_note,
    form_fields,
    gone_note,
    kind_label,
    page_link,
    standing_notes,
    tool_call_view,
)
from toolnexus.responders import approvals_line

from .reminders import Reminders

log = logging.getLogger("toolnexus.chat")

Layout = Literal["approval", "choice", "multi", "form", "authorization", "tool_call"]
Ref = dict[str, Any]
"""Where a message is, as the platform names it (Slack: channel and ts; Telegram: chat
and message id): JSON-able, kept in Redis."""

MAX_CHOICES = 24
"""Options shown as buttons or toggles at most; a field with more is asked as a form."""
REF_TTL_S = 7 * 24 * 3600
"""How long the message map outlives its last change (requests rarely wait days)."""

TOO_LATE = (
    "Too late: this request is no longer open (answered, expired or withdrawn). "
    "Thank you anyway; nothing was changed."
)
"""What a click on a request no longer open here is told."""
ARGUMENT_CHARS = 80
"""How much of each argument a tool approval's message shows (the web page shows all)."""


@dataclass(frozen=True)
class View:
    """A request as a chat message shows it: the text, and which controls it gets.

    ``layout``: ``approval`` (Accept / Decline), ``choice`` (one button per option of
    ``fields[0]``), ``multi`` (options of ``fields[0]`` to tick, then Send), ``form``
    (every field of ``fields``, asked in a modal or reply by reply), ``authorization``
    (``link`` to open, then Done / Decline), ``tool_call`` (the ``tool`` call and its
    arguments, shortened, with Approve / Deny, and ``page``: the request on the web page,
    to edit the arguments there). ``problem`` is set when the request's schema cannot be
    shown: the message says so and offers Decline only.
    """

    request: Request
    layout: Layout
    lines: tuple[str, ...]
    fields: tuple[Field, ...] = ()
    link: Link | None = None
    problem: str | None = None
    tool: ToolCallView | None = None
    page: str | None = None

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


def view_of(
    request: Request,
    known_domains: tuple[str, ...] = KNOWN_DOMAINS,
    approvals: str | None = None,
    *,
    web_url: str | None = None,
) -> View:
    """How ``request`` is shown: its header lines (who asks, the prompt, the time left; a
    quorum's ``approvals`` so far, SPEC §14), and its layout (see :class:`View`).
    ``web_url``: the web page's address, linked from a tool approval to edit it there."""
    lines = [*header(request)]
    if request.quorum is not None:
        lines.append(f"🗳️ {approvals or f'0 of {request.quorum.need} approvals'}")
    if request.kind == "tool_call":
        try:
            tool = tool_call_view(request)
        except InvalidRequest as exc:  # shown as what it is: a request that cannot be run
            lines.append(f"This tool call cannot be shown: {exc}")
            return View(request, "approval", tuple(lines), problem=str(exc))
        lines += tool.lines(limit=ARGUMENT_CHARS)
        page = page_link(web_url, request.id) if web_url else None
        if page:
            lines.append("To change the arguments before approving, open it on the web page.")
        return View(request, "tool_call", tuple(lines), tool=tool, page=page)
    if request.kind == "authorization":
        link = check_link(request.url or "", known_domains)
        lines.append(f"Address: {request.url or '(none given)'}")
        if link.domain:
            lines.append(f"Domain: {link.unicode_host or link.host} — site {link.domain}")
        if link.other_form:
            lines.append(f"Also written: {link.other_form}")
        lines += [f"⚠️ {warning}" for warning in link.warnings]
        lines.append("Open the link yourself, finish there, then press Done (or Decline).")
        return View(request, "authorization", tuple(lines), link=link)
    schema = request.schema
    if schema is None:
        return View(request, "approval", tuple(lines))
    try:
        fields = tuple(form_fields(schema))
    except InvalidRequest as exc:
        lines.append(f"This request's form cannot be shown: {exc}")
        return View(request, "approval", tuple(lines), problem=str(exc))
    if not fields:
        return View(request, "approval", tuple(lines))
    few = len(fields) == 1 and len(fields[0].choices) <= MAX_CHOICES
    if few and fields[0].widget == "select" and fields[0].required:
        return View(request, "choice", tuple(lines), fields)
    if few and fields[0].widget == "checks":
        return View(request, "multi", (*lines, field_line(fields[0])), fields)
    return View(request, "form", tuple(lines), fields)


def header(request: Request, now_s: float | None = None) -> list[str]:
    """The lines above every request: what it is, who asks, the prompt, the time left."""
    source = request.source
    who = [
        f"{label} {value}"
        for label, value in (
            ("server", source.server),
            ("tool", source.tool),
            ("agent", source.agent),
        )
        if value
    ]
    kind = kind_label(request.kind)
    lines = [f"{kind} from {', '.join(who)}" if who else kind]
    if request.prompt:
        lines.append(request.prompt)
    lines.append(time_left(request, now_s))
    lines.extend(standing_notes(request))
    return lines


def time_left(request: Request, now_s: float | None = None) -> str:
    """``"Time left: 4 min 10 s (until 09:30:00 UTC)"``, or that it has no deadline."""
    if request.expires_at is None:
        return "Time left: no deadline set by the asker"
    now_s = time.time() if now_s is None else now_s
    left_s = max(0, round(request.expires_at - now_s))
    minutes, seconds = divmod(left_s, 60)
    hours, minutes = divmod(minutes, 60)
    parts = [f"{hours} h"] if hours else []
    parts += [f"{minutes} min"] if minutes else []
    parts += [f"{seconds} s"] if seconds or not parts else []
    until = time.strftime("%H:%M:%S UTC", time.gmtime(request.expires_at))
    return f"Time left: {' '.join(parts)} (until {until})"


def field_line(f: Field) -> str:
    """A field as one line: its title, then what it takes (``Guests: a whole number ...``)."""
    extra = [part for part in (f.description, f.hint) if part]
    optional = "" if f.required or f.widget in ("checkbox", "checks") else " (optional)"
    return f"{f.title}{optional}" + (f": {'; '.join(extra)}" if extra else "")


def default_text(f: Field) -> str | None:
    """A field's default as shown to a person, or None without one."""
    if not f.has_default:
        return None
    if f.choices:
        wanted = f.default if isinstance(f.default, list) else [f.default]
        labels = [label for value, label in f.choices if value in wanted]
        return ", ".join(labels)
    if f.widget == "checkbox":
        return "yes" if f.default is True else "no"
    return str(f.default)


def answered_note(person: str, *, accepted: bool, kind: str = "") -> str:
    """What a message says once its request (of ``kind``) was answered here: a tool
    approval is approved or denied."""
    if kind == "tool_call":
        return f"✅ Approved by {person}." if accepted else f"❌ Denied by {person}."
    return f"✅ Answered by {person}." if accepted else f"❌ Declined by {person}."


Answering = Callable[[Pending, str], Awaitable[ApprovedEvent | None]]
"""How a click answers: ``async (pending, person) -> progress`` (a quorum's, if the vote
did not decide: see :meth:`toolnexus.Pending.answer`)."""


async def declining(pending: Pending, person: str) -> ApprovedEvent | None:
    """Answer ``pending`` no, for ``person``."""
    return await pending.decline(person=person)


def denying(message: str) -> Answering:
    """Answer no with ``message`` (a tool approval's: the model is told it), for the person."""

    async def deny(pending: Pending, person: str) -> ApprovedEvent | None:
        return await pending.decline(message.strip() or None, person=person)

    return deny


def accepting(data: Any) -> Answering:
    """Answer yes with ``data``, for the person."""

    async def accept(pending: Pending, person: str) -> ApprovedEvent | None:
        return await pending.accept(data, person=person)

    return accept


class Allowed:
    """Who may answer: chat user ids (``U123``, ``12345``); ``*`` lets anyone in.

    Raises:
        ConfigurationError: no id at all.
    """

    def __init__(self, platform: str, ids: Iterable[str]) -> None:
        self.platform = platform
        self.ids = frozenset(i.strip() for i in ids if i.strip())
        if not self.ids:
            raise ConfigurationError(
                f"the {platform} bot needs the ids of the people who may answer "
                f"(--allow-user, or '*' for everyone in the {platform} conversation)"
            )

    def __contains__(self, user_id: object) -> bool:
        return "*" in self.ids or str(user_id) in self.ids

    def person(self, user_id: object) -> str:
        """The person an answer names: ``slack:U123``, ``telegram:12345``."""
        return f"{self.platform}:{user_id}"


class MessageMap:
    """A chat bot's messages, in its broker's store (:meth:`toolnexus.Broker.store`, named
    after its group): request id -> :data:`Ref` (JSON).

    Best effort: the map only lets a restarted bot find its messages, so a broker error
    (after the broker's own retries) is logged and never stops a request from being shown.
    What the store returns is read as untrusted: an entry that is not a :data:`Ref` is
    skipped.
    """

    def __init__(self, store: Store) -> None:
        self.store = store

    async def put(self, request_id: str, ref: Ref) -> None:
        try:
            await self.store.set(request_id, json.dumps(ref), ttl_s=REF_TTL_S)
        except ToolnexusError as exc:
            log.warning("%s: keeping where its message is failed: %s", request_id, exc)

    async def get(self, request_id: str) -> Ref | None:
        try:
            raw = await self.store.get(request_id)
        except ToolnexusError as exc:
            log.warning("%s: looking up an earlier message failed: %s", request_id, exc)
            return None
        return None if raw is None else _ref(request_id, raw)

    async def drop(self, request_id: str) -> None:
        try:
            await self.store.delete(request_id)
        except ToolnexusError as exc:
            log.warning("%s: forgetting its message failed: %s", request_id, exc)

    async def all(self) -> dict[str, Ref]:
        """Every kept message.

        Raises:
            BrokerUnavailable: the broker stayed unreachable (at start: the bot does not
                run without knowing its earlier messages).
        """
        refs = {
            request_id: _ref(request_id, raw)
            for request_id, raw in (await self.store.items()).items()
        }
        return {request_id: ref for request_id, ref in refs.items() if ref is not None}


def _ref(request_id: str, raw: bytes) -> Ref | None:
    try:
        value = json.loads(raw)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        log.warning("%s: skipping a kept message that is not a JSON object: %.80r", request_id, raw)
        return None
    return value


class ChatBot(Worker):
    """A request per message: post on :meth:`show`, edit on :meth:`gone` and on answers.

    Subclasses say how a message is posted (:meth:`post`, given the earlier message's
    ref after a restart) and closed (:meth:`close_message`: edited to a note, controls
    removed). Clicks come to :meth:`pending_for` and :meth:`resolve`.
    """

    def __init__(
        self,
        broker: Broker,
        messages: MessageMap,
        allowed: Allowed,
        *,
        known_domains: tuple[str, ...] = KNOWN_DOMAINS,
        web_url: str | None = None,
    ) -> None:
        self.broker = broker
        self.messages = messages
        self.allowed = allowed
        self.known_domains = known_domains
        self.web_url = web_url
        self.shown: dict[str, Pending] = {}
        self.refs: dict[str, Ref] = {}
        self.posting: dict[str, asyncio.Future[None]] = {}
        self.escalations: dict[str, list[str]] = {}  # request id -> queues it escalated to
        self.reminders = Reminders(None, self._remind)
        """Reminders of the requests still open (``remind_after_s`` of the server)."""

    def view(self, request: Request) -> View:
        """How ``request`` is shown here: :func:`view_of`, and where it escalated to."""
        view = view_of(request, self.known_domains, web_url=self.web_url)
        queues = self.escalations.get(request.id)
        if not queues:
            return view
        return dataclasses.replace(view, lines=(*view.lines, f"⏫ {escalated_note(queues)}"))

    @abc.abstractmethod
    async def post(self, view: View, earlier: Ref | None) -> Ref:
        """Show ``view`` in a message (editing ``earlier`` if given); return its ref."""

    @abc.abstractmethod
    async def close_message(self, ref: Ref, text: str) -> None:
        """Edit the message at ``ref`` to say ``text``, without controls."""

    @abc.abstractmethod
    async def notify(self, ref: Ref, text: str) -> None:
        """Say ``text`` in reply to the message at ``ref`` (a reminder)."""

    async def show(self, pending: Pending) -> None:
        request = pending.request
        self.shown[request.id] = pending
        posting = asyncio.ensure_future(self._post(request))
        self.posting[request.id] = posting
        self.reminders.start(pending)
        # not cut short when the request ends meanwhile: gone() waits for it, then edits it
        await asyncio.shield(posting)

    async def _remind(self, pending: Pending, count: int) -> None:
        """A reminder (SPEC §12): the message shows the time left now, and a reply says the
        request is still open."""
        request = pending.request
        if request.id not in self.shown or request.id not in self.refs:
            return
        await self._post(request)
        ref = self.refs.get(request.id)
        if ref is not None:
            await self.notify(ref, f"⏰ Reminder: still open. {time_left(request)}")

    async def _post(self, request: Request) -> None:
        try:
            earlier = self.refs.get(request.id) or await self.messages.get(request.id)
            ref = await self.post(self.view(request), earlier)
            ref["created_at"] = request.created_at
            ref["summary"] = "\n".join(header(request)[:-1])  # without the time left
            self.refs[request.id] = ref
            await self.messages.put(request.id, ref)
        finally:
            self.posting.pop(request.id, None)

    async def escalated(self, pending: Pending, event: EscalatedEvent) -> None:
        """Edit the request's message to say where it escalated (SPEC §14); it stays open."""
        request = pending.request
        queues = self.escalations.setdefault(request.id, [])
        queues.append(event.queue or "another queue")
        posting = self.posting.get(request.id)
        if posting is not None:
            await asyncio.gather(posting, return_exceptions=True)
        if request.id in self.shown and request.id in self.refs:
            await self._post(request)

    async def gone(self, pending: Pending, event: EndedEvent) -> None:
        request_id = pending.request.id
        self.shown.pop(request_id, None)
        posting = self.posting.get(request_id)
        if posting is not None:
            await asyncio.gather(posting, return_exceptions=True)
        await self.finish(request_id, gone_note(event))

    async def progress(self, pending: Pending, event: ApprovedEvent) -> None:
        """A quorum's vote was counted (SPEC §14): the message is edited to show how many
        approved and who; its controls stay, for others to vote."""
        request = pending.request
        posting = self.posting.get(request.id)
        if posting is not None:
            await asyncio.gather(posting, return_exceptions=True)
        ref = self.refs.get(request.id)
        if ref is None or request.id not in self.shown:
            return
        view = view_of(request, self.known_domains, approvals_line(event), web_url=self.web_url)
        edited = {**ref, **await self.post(view, ref)}
        self.refs[request.id] = edited
        await self.messages.put(request.id, edited)

    async def finish(self, request_id: str, note: str) -> None:
        """Close request ``request_id``'s message (who asked, what) with ``note`` and
        forget it."""
        self.reminders.stop(request_id)
        self.escalations.pop(request_id, None)
        ref = self.refs.pop(request_id, None) or await self.messages.get(request_id)
        if ref is not None:
            summary = str(ref.get("summary") or "")
            try:
                await self.close_message(ref, f"{summary}\n{note}" if summary else note)
            finally:
                await self.messages.drop(request_id)

    async def catch_up(self) -> int:
        """After a restart: close the messages whose requests were resolved meanwhile;
        keep the others' refs, for their redelivery to edit. Returns how many were closed."""
        closed = 0
        for request_id, ref in (await self.messages.all()).items():
            since = ref.get("created_at")
            try:
                records = await self.broker.audit(
                    since=float(since) - 1 if isinstance(since, int | float) else None,
                    request_id=request_id,
                )
            except ToolnexusError as exc:  # a Redis user without the audit trail (ACLs)
                log.warning(
                    "%s: cannot read its outcome (%s); its message is kept", request_id, exc
                )
                records = []
            if not records:
                self.refs.setdefault(request_id, ref)
                continue
            record = records[-1]
            who = record.person or record.responder
            if record.status in (Status.EXPIRED, Status.WITHDRAWN):
                outcome = Answer(
                    id=request_id, ok=bool(record.ok), reason=record.reason,
                    defaulted=record.defaulted,
                )  # fmt: skip
                ended = ExpiredEvent if record.status == Status.EXPIRED else WithdrawnEvent
                note = gone_note(ended(id=request_id, answer=outcome))
            else:
                note = f"Answered elsewhere{f' by {who}' if who else ''}."
            await self.finish(request_id, note)
            closed += 1
        return closed

    def pending_for(self, request_id: str) -> Pending | None:
        """The open request ``request_id`` shown by this bot, if it still is."""
        return self.shown.get(request_id)

    async def resolve(
        self,
        request_id: str,
        user_id: object,
        answer: Answering,
        *,
        accepted: bool,
    ) -> str | None:
        """Answer ``request_id`` for ``user_id`` with ``answer(pending, person)``; close
        its message on success. Returns what the person should be told privately (a
        refusal, a late click, an invalid answer, a quorum's vote counted: the message
        then shows the count), or None when it was answered.

        Raises:
            InvalidAnswer: the data fails the schema (the request stays open).
        """
        if user_id not in self.allowed:
            return (
                f"Sorry, you ({user_id}) are not on the list of people who may answer "
                "these requests. Nothing was changed."
            )
        pending = self.pending_for(request_id)
        if pending is None:
            return TOO_LATE
        person = self.allowed.person(user_id)
        try:
            progress = await answer(pending, person)
        except AlreadyVoted as exc:
            if exc.contested:  # another vote in this person's name: perhaps a forgery
                return (
                    "Another vote in your name is stored: it is being checked, and if it "
                    "is not genuine it is removed and yours counts."
                )
            return "You voted on this request already: a second vote is not counted."
        except NotResolved as exc:
            self.shown.pop(request_id, None)
            return f"Too late: this request was {exc.reason} before your answer. Thank you anyway."
        except InvalidAnswer:
            raise
        except ToolnexusError as exc:
            log.warning("%s: answering failed: %s", request_id, exc)
            return f"Your answer did not get through ({exc}); please try again."
        if progress is not None:  # a quorum's vote: the message shows the count for all
            await self.progress(pending, progress)
            return f"Your vote is counted: {approvals_line(progress)}."
        self.shown.pop(request_id, None)
        note = answered_note(person, accepted=accepted, kind=pending.request.kind)
        await self.finish(request_id, note)
        return None

    async def start(self) -> None:
        """Before serving: catch up with what happened while the bot was away."""
        closed = await self.catch_up()
        if closed:
            log.info("closed %d messages of requests resolved while away", closed)


def split_ids(text: str | None) -> list[str]:
    """Ids from a comma-separated environment variable (``"U1, U2"``); none for None."""
    return [part.strip() for part in (text or "").split(",") if part.strip()]


def add_chat_flags(group: Any, platform: str) -> None:
    """The flags every chat bot takes besides its platform's own: ``--known-domain`` and
    ``--web-url`` (``$TOOLNEXUS_WEB_URL``)."""
    group.add_argument(
        "--known-domain",
        action="append",
        default=[],
        metavar="DOMAIN",
        help="a domain to guard against look-alikes, besides the built-in list (repeatable)",
    )
    group.add_argument(
        "--web-url",
        default=os.environ.get("TOOLNEXUS_WEB_URL"),
        metavar="URL",
        help=f"the web page's address (toolnexus worker web), linked from each {platform} "
        "tool approval to edit its arguments there ($TOOLNEXUS_WEB_URL)",
    )


def server_options(args: argparse.Namespace) -> dict[str, Any]:
    """What every chat server takes from the worker flags they share (see
    :func:`add_chat_flags`): the known domains (``--known-domain`` added), the web page's
    address (``--web-url``), where it reads (group, consumer: the namespace and queue
    are the broker's) and how it serves (concurrency, drain, heartbeat)."""
    return {
        "known_domains": KNOWN_DOMAINS + tuple(d.lower() for d in args.known_domain),
        "web_url": args.web_url,
        "group": args.group,
        "consumer": args.consumer,
        "concurrency": args.concurrency,
        "drain_s": args.drain_s,
        "heartbeat_ttl_s": args.heartbeat_ttl_s,
        "remind_after_s": args.remind_after_s,
    }


class ChatServer(abc.ABC):
    """A chat bot running: its transport (how clicks arrive) and its responder service.

    Use ``async with`` (started on entry, stopped on exit) or :meth:`run` (until
    SIGTERM/SIGINT). Subclasses open and close the transport.
    """

    def __init__(
        self,
        broker: Broker,
        bot: ChatBot,
        *,
        group: str,
        consumer: str | None,
        concurrency: int,
        drain_s: float,
        heartbeat_ttl_s: float,
        remind_after_s: float | None = None,
    ) -> None:
        self.broker = broker
        self.bot = bot
        bot.reminders.after_s = remind_after_s
        self.service = Service(
            broker,
            bot,
            group=group,
            consumer=consumer,
            concurrency=concurrency,
            drain_s=drain_s,
            heartbeat_ttl_s=heartbeat_ttl_s,
        )
        self._serving: asyncio.Task[None] | None = None

    @abc.abstractmethod
    async def open_transport(self) -> None:
        """Start taking clicks and replies."""

    @abc.abstractmethod
    async def close_transport(self) -> None:
        """Stop taking clicks and replies."""

    async def start(self, *, handle_signals: bool = False) -> None:
        """Catch up with messages of an earlier run, take clicks, show requests.

        Raises:
            ConfigurationError: the transport cannot start (an address in use, ...).
            BrokerUnavailable: Redis cannot be reached.
        """
        await self.bot.start()
        await self.open_transport()
        self._serving = asyncio.get_running_loop().create_task(
            self.service.run(handle_signals=handle_signals), name=f"{self.service.group}-service"
        )

    async def stop(self) -> None:
        """Stop showing requests (held ones go back to the group), then the transport."""
        self.service.stop()
        try:
            if self._serving is not None:
                await self._serving
        finally:
            await self.bot.reminders.aclose()
            await self.close_transport()

    async def run(self) -> None:
        """Serve until SIGTERM or SIGINT (running requests drain, held ones go back)."""
        await self.start(handle_signals=True)
        assert self._serving is not None
        await asyncio.wait([self._serving])
        await self.stop()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
