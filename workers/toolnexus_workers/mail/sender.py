"""Email: each request of a queue mailed by SMTP (aiosmtplib) to the addresses its routes
name, with the question, who asks, the time left and signed single-use links.

An approval (or a tool call, or an authorization) gets an *approve* and a *decline* link;
an input request an *open the form* link (the form on the link's page) and a *decline*
link. Each address gets links of its own, answering as ``link:ADDRESS``; a link's page
asks before it answers (``GET`` never answers: mail scanners prefetch links). A request
still open after ``remind_after_s`` is mailed again, marked as a reminder.

Routes (``--rules FILE``, TOML) name who gets what; ``--to`` addresses get every
request::

    [[route]]
    kind = "tool_call"            # glob patterns, or lists of them, matched against
    tool = ["deploy*", "drop_*"]  #   kind, server, tool and agent (a missing one is "")
    to = ["oncall@example.com"]
"""

from __future__ import annotations

import json
import logging
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from email.message import EmailMessage
from email.utils import make_msgid
from pathlib import Path

import aiosmtplib

from toolnexus import ConfigurationError, Pending, Request, Worker
from toolnexus.models import EndedEvent

from ..auto import MATCHED, Rule
from ..chat import header
from ..delivery import Retry, deliver
from ..links import LinkKey, link_url
from ..reminders import Reminders

log = logging.getLogger("toolnexus.email")

TIMEOUT_S = 30.0
"""How long one SMTP delivery may take."""


@dataclass(frozen=True)
class Route:
    """Requests that ``match`` (the auto worker's matching: glob patterns on the kind and
    the source's server, tool and agent) are mailed to ``to``."""

    to: tuple[str, ...]
    match: Rule

    def matches(self, request: Request) -> bool:
        return self.match.matches(request)


def read_routes(path: Path) -> list[Route]:
    """The routes of a TOML file (``[[route]]`` tables).

    Raises:
        ConfigurationError: the file cannot be read, or a route is not usable (named with
            its number and the reason).
    """
    try:
        document = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigurationError(f"cannot read the routes file {path}: {exc}") from exc
    routes = []
    for number, table in enumerate(document.get("route", []), 1):
        where = f"{path}: route {number}"
        unknown = set(table) - {*MATCHED, "to"}
        if unknown:
            raise ConfigurationError(f"{where}: unknown keys {', '.join(sorted(unknown))}")
        to = table.get("to")
        to = [to] if isinstance(to, str) else to
        if not to or not all(isinstance(a, str) and "@" in a for a in to):
            raise ConfigurationError(f"{where}: 'to' must name one or more email addresses")
        patterns: dict[str, tuple[str, ...]] = {}
        for what in MATCHED:
            globs = table.get(what)
            if globs is None:
                continue
            globs = [globs] if isinstance(globs, str) else globs
            if not isinstance(globs, list) or not all(isinstance(g, str) for g in globs):
                raise ConfigurationError(f"{where}: {what!r} must be a pattern or a list of them")
            patterns[what] = tuple(globs)
        match = Rule(
            number,
            "skip",
            kind=patterns.get("kind"),
            server=patterns.get("server"),
            tool=patterns.get("tool"),
            agent=patterns.get("agent"),
        )
        routes.append(Route(tuple(to), match))
    if not routes:
        raise ConfigurationError(f"{path} has no [[route]]")
    return routes


@dataclass(frozen=True)
class Smtp:
    """Where mail is sent: ``host:port``, with ``tls`` (``none``, ``starttls`` or ``tls``)
    and a login if ``username`` is given."""

    host: str
    port: int
    tls: str = "starttls"
    username: str | None = None
    password: str | None = None

    async def send(self, message: EmailMessage, recipients: Sequence[str]) -> None:
        """Raises: aiosmtplib.SMTPException, OSError: it did not get through."""
        await aiosmtplib.send(
            message,
            recipients=list(recipients),
            hostname=self.host,
            port=self.port,
            username=self.username,
            password=self.password,
            use_tls=self.tls == "tls",
            start_tls=self.tls == "starttls",
            timeout=TIMEOUT_S,
        )


class EmailWorker(Worker):
    """Mails every request of ``queue`` to the addresses of ``to`` and of the matching
    ``routes``, from ``sender`` through ``smtp``, with links made by ``links`` for the
    HTTP answering API at ``link_base``; again after ``remind_after_s`` if given."""

    group = "email"

    def __init__(
        self,
        queue: str,
        smtp: Smtp,
        sender: str,
        links: LinkKey,
        link_base: str,
        *,
        to: Sequence[str] = (),
        routes: Sequence[Route] = (),
        retry: Retry | None = None,
        remind_after_s: float | None = None,
    ) -> None:
        self.queue, self.smtp, self.sender = queue, smtp, sender
        self.links, self.link_base = links, link_base
        self.to, self.routes = list(to), list(routes)
        self.retry = retry or Retry(attempts=5)
        self.reminders = Reminders(remind_after_s, self._remind)
        self.mailed: set[str] = set()
        self.sent = self.failed = 0

    def addresses(self, request: Request) -> list[str]:
        """Who is mailed ``request``: every ``to`` and the matching routes' addresses."""
        named = [*self.to, *(a for r in self.routes if r.matches(request) for a in r.to)]
        return list(dict.fromkeys(named))

    async def show(self, pending: Pending) -> None:
        request = pending.request
        if request.id in self.mailed:  # delivered again (at least once): mailed already
            return
        addresses = self.addresses(request)
        if not addresses:
            log.info("request %s: no route names an address; left to other channels", request.id)
            await pending.skip()
            return
        self.mailed.add(request.id)
        self.reminders.start(pending)
        for address in addresses:
            await self._mail(pending, address, reminder=0)

    async def gone(self, pending: Pending, event: EndedEvent) -> None:
        self.reminders.stop(pending.request.id)
        self.mailed.discard(pending.request.id)

    async def _remind(self, pending: Pending, count: int) -> None:
        for address in self.addresses(pending.request):
            await self._mail(pending, address, reminder=count)

    def message(self, pending: Pending, address: str, *, reminder: int = 0) -> EmailMessage:
        """The mail telling ``address`` of ``pending`` (``reminder``: the how-many-th
        reminder, 0 for the first mail)."""
        request = pending.request

        def link(action: str | None) -> str:
            token = self.links.mint(self.queue, request, address, action=action)
            return link_url(self.link_base, token)

        prompt = request.prompt or "(no question)"
        lines = [*header(request), f"Queue: {self.queue}"]
        call = request.data.get("tool_call") if isinstance(request.data, dict) else None
        if isinstance(call, dict):
            arguments = json.dumps(call.get("arguments"), indent=2, ensure_ascii=False)
            lines += ["", f"Tool call: {call.get('name')}", arguments]
        if request.url:
            lines += ["", f"It asks you to go to: {request.url}"]
        lines.append("")
        if request.kind == "input" or (request.schema and not isinstance(call, dict)):
            lines += [f"Open the form: {link(None)}", f"Decline: {link('decline')}"]
        else:
            lines += [f"Approve: {link('accept')}", f"Decline: {link('decline')}"]
        lines += [
            "",
            "Each link works once, until the request ends; it asks before it answers.",
            f"You answer as link:{address}.",
        ]
        message = EmailMessage()
        subject = prompt if len(prompt) <= 70 else prompt[:69] + "…"
        message["Subject"] = f"{'Reminder: ' if reminder else ''}{subject}"
        message["From"] = self.sender
        message["To"] = address
        message["Message-ID"] = make_msgid(domain=self.sender.rpartition("@")[2] or None)
        message["X-Toolnexus-Request"] = request.id
        message.set_content("\n".join(lines) + "\n")
        return message

    async def _mail(self, pending: Pending, address: str, *, reminder: int) -> None:
        message = self.message(pending, address, reminder=reminder)

        async def attempt() -> str | None:
            try:
                await self.smtp.send(message, [address])
            except (aiosmtplib.SMTPException, OSError) as exc:
                return f"{type(exc).__name__}: {exc}"
            return None

        what = f"mail of {pending.request.id} to {address}" + (
            f" (reminder {reminder})" if reminder else ""
        )
        if await deliver(attempt, self.retry, what):
            self.sent += 1
        else:
            self.failed += 1

    async def aclose(self) -> None:
        """Stop the reminders."""
        await self.reminders.aclose()

    def __repr__(self) -> str:
        return f"<EmailWorker {self.queue!r} sent={self.sent} failed={self.failed}>"


def checked_addresses(addresses: Sequence[str], what: str) -> list[str]:
    """Raises: ConfigurationError for an address without ``@``."""
    for address in addresses:
        if "@" not in address:
            raise ConfigurationError(f"{what} {address!r} is not an email address")
    return list(addresses)


__all__ = ["EmailWorker", "Route", "Smtp", "checked_addresses", "read_routes"]
