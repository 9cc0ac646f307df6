"""Who may use the HTTP answering API: bearer tokens, each naming a person (or a system) and
the queues it may read and answer.

A tokens file is TOML, one ``[[token]]`` table per token; the token itself is never stored,
only its SHA-256 digest (a token is 32 random bytes, so a fast digest is enough)::

    [[token]]
    name = "alice"                 # the worker answers as the person http:alice
    sha256 = "9f86d081884c7d65…"   # hex digest of the token
    queues = ["ops"]               # or ["*"]: every queue the worker serves
    created = "2026-12-02T01:00:00Z"
    revoked = false

``toolnexus worker http tokens add|list|revoke`` edits it (:func:`add_token`,
:func:`revoke_tokens`); the worker rereads it when it changes, so a revocation holds at once.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import secrets
import tomllib
from dataclasses import dataclass
from pathlib import Path

from toolnexus.errors import ConfigurationError
from toolnexus.keys import agent_problem

PERSON_PREFIX = "http:"
"""What the person a token names starts with."""

EVERY_QUEUE = "*"
"""A token scope that covers every queue the worker serves."""


def digest(token: str) -> str:
    """The hex SHA-256 digest a tokens file keeps for ``token``."""
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class Grant:
    """One token's entry: who it names, the queues it may use, whether it is revoked."""

    name: str
    sha256: str
    queues: tuple[str, ...]
    created: str = ""
    revoked: bool = False

    @property
    def person(self) -> str:
        """Who answers with this token: ``http:NAME``, as the web page's logins are
        ``web:NAME`` (allow-lists name persons so: ``http:alice``, ``http:*``)."""
        return f"{PERSON_PREFIX}{self.name}"

    def may(self, queue: str) -> bool:
        """Whether this token may read and answer ``queue``'s requests."""
        return EVERY_QUEUE in self.queues or queue in self.queues


def _grant(entry: object, where: str) -> Grant:
    if not isinstance(entry, dict):
        raise ConfigurationError(f"{where}: each [[token]] must be a table")
    name, sha, queues = entry.get("name"), entry.get("sha256"), entry.get("queues")
    revoked, created = entry.get("revoked", False), entry.get("created", "")
    if not isinstance(name, str) or agent_problem(name) is not None:
        raise ConfigurationError(f"{where}: token name {name!r} is not a valid name")
    if not isinstance(sha, str) or len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha):
        raise ConfigurationError(f"{where}: the sha256 of {name!r} must be 64 hex digits")
    if (
        not isinstance(queues, list)
        or not queues
        or not all(isinstance(q, str) and q for q in queues)
    ):
        raise ConfigurationError(f"{where}: the queues of {name!r} must be a list of names")
    if not isinstance(revoked, bool) or not isinstance(created, str):
        raise ConfigurationError(f"{where}: {name!r}: revoked is true/false, created a string")
    return Grant(name, sha, tuple(queues), created, revoked)


def read_grants(path: Path) -> list[Grant]:
    """Every entry of the tokens file ``path`` (none if it does not exist).

    Raises:
        ConfigurationError: the file cannot be read, or an entry is malformed.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigurationError(f"tokens file {path}: {exc}") from exc
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigurationError(f"tokens file {path}: {exc}") from exc
    entries = document.get("token", [])
    if not isinstance(entries, list):
        raise ConfigurationError(f"tokens file {path}: token must be an array of tables")
    grants = [_grant(entry, f"tokens file {path}") for entry in entries]
    if len({g.sha256 for g in grants}) != len(grants):
        raise ConfigurationError(f"tokens file {path}: one token is listed twice")
    return grants


def write_grants(path: Path, grants: list[Grant]) -> None:
    """Replace the tokens file ``path`` with ``grants`` (atomically, readable by its owner)."""
    lines = ["# toolnexus worker http tokens: SHA-256 digests only (tokens add|list|revoke)"]
    for g in grants:
        lines += [
            "",
            "[[token]]",
            f"name = {json.dumps(g.name)}",
            f'sha256 = "{g.sha256}"',
            f"queues = {json.dumps(list(g.queues))}",
            f"created = {json.dumps(g.created)}",
            f"revoked = {'true' if g.revoked else 'false'}",
        ]
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write("\n".join(lines) + "\n")
    os.replace(temporary, path)


def add_token(path: Path, name: str, queues: list[str]) -> str:
    """Make a new token for ``name``, scoped to ``queues``; store its digest; return it (the
    only time it is shown).

    Raises:
        ConfigurationError: a bad name or no queue, or the file is malformed.
    """
    problem = agent_problem(name)
    if problem is not None:
        raise ConfigurationError(f"token name {name!r} {problem}")
    if not queues or not all(queues):
        raise ConfigurationError("a token needs at least one queue (--queue NAME, or '*')")
    token = secrets.token_urlsafe(32)
    created = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    grants = read_grants(path)
    grants.append(Grant(name, digest(token), tuple(queues), created))
    write_grants(path, grants)
    return token


def revoke_tokens(path: Path, name: str) -> int:
    """Revoke every token of ``name``; return how many were not revoked yet.

    Raises:
        ConfigurationError: the file is malformed, or has no token named ``name``.
    """
    grants = read_grants(path)
    if not any(g.name == name for g in grants):
        raise ConfigurationError(f"tokens file {path}: no token named {name!r}")
    count = sum(1 for g in grants if g.name == name and not g.revoked)
    changed = [
        Grant(g.name, g.sha256, g.queues, g.created, True) if g.name == name else g for g in grants
    ]
    write_grants(path, changed)
    return count


class Tokens:
    """The tokens file the worker checks bearer tokens against, reread when it changes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp: tuple[int, int] | None = None
        self._by_digest: dict[str, Grant] = {}
        self.reload()

    def reload(self) -> None:
        """Read the file again if it changed since it was last read.

        Raises:
            ConfigurationError: it is malformed (every token is refused until it is fixed).
        """
        try:
            info = self.path.stat()
            stamp = (info.st_mtime_ns, info.st_size)
        except OSError:
            stamp = (0, 0)
        if stamp == self._stamp:
            return
        self._by_digest, self._stamp = {}, None
        grants = read_grants(self.path)
        self._by_digest = {g.sha256: g for g in grants if not g.revoked}
        self._stamp = stamp

    def grant(self, token: str) -> Grant | None:
        """The unrevoked entry for ``token``, or None.

        Raises:
            ConfigurationError: the file became malformed.
        """
        self.reload()
        return self._by_digest.get(digest(token))
