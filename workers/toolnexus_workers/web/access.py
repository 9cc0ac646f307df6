"""Who may use the web page: a bearer token, logins from a users file, or (on loopback
only) anyone at this machine; and the sessions and CSRF tokens of those signed in.

A users file is TOML with one password hash per login, made by
``toolnexus worker web --hash-password``::

    [users]
    alice = "scrypt:16384:8:1:9c0f…:5be1…"

Sessions live in memory: restarting the worker signs everyone out.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import ipaddress
import secrets
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

from toolnexus.errors import ConfigurationError

SESSION_TTL_S = 12 * 3600.0
"""How long a sign-in lasts."""

TOKEN_PERSON = "web:token"
"""The answer's ``person`` for someone signed in with the shared bearer token."""

_SCRYPT = (16384, 8, 1)  # n, r, p: about 16 MiB and a few tens of ms per check


@dataclass(frozen=True)
class Session:
    """One signed-in browser: who (``person``, e.g. ``web:alice``) and its CSRF token."""

    person: str
    csrf: str
    expires_at: float


class Access:
    """The page's access rules and its signed-in sessions.

    With neither ``token`` nor ``users``, everyone reaching the page may answer
    (``open``); :func:`check_listen` refuses that off loopback.
    """

    def __init__(self, *, token: str | None = None, users: dict[str, str] | None = None) -> None:
        if token is not None and len(token) < 16:
            raise ConfigurationError(
                "the web token must be at least 16 characters: make one with "
                "`python -c 'import secrets; print(secrets.token_urlsafe())'`"
            )
        self.token = token
        self.users = dict(users or {})
        for name, stored in self.users.items():
            _parse_hash(stored, name)
        self._sessions: dict[str, Session] = {}

    @property
    def open(self) -> bool:
        """Whether anyone may answer without signing in (no token, no users)."""
        return self.token is None and not self.users

    def person_for_token(self, token: str) -> str | None:
        """``TOKEN_PERSON`` if ``token`` is the configured token, else ``None``."""
        if self.token is not None and hmac.compare_digest(token.encode(), self.token.encode()):
            return TOKEN_PERSON
        return None

    def person_for_login(self, name: str, password: str) -> str | None:
        """``web:<name>`` if ``password`` is ``name``'s in the users file, else ``None``."""
        stored = self.users.get(name)
        if stored is None:
            verify_password(password, _dummy_hash())  # the same time for unknown names
            return None
        return f"web:{name}" if verify_password(password, stored) else None

    def sign_in(self, person: str) -> str:
        """Open a session for ``person``; return its id (the cookie's value)."""
        now = time.time()
        for sid in [sid for sid, s in self._sessions.items() if s.expires_at <= now]:
            del self._sessions[sid]
        sid = secrets.token_urlsafe(32)
        self._sessions[sid] = Session(person, secrets.token_urlsafe(32), now + SESSION_TTL_S)
        return sid

    def session(self, sid: str | None) -> Session | None:
        """The live session with id ``sid``, if any."""
        session = self._sessions.get(sid or "")
        if session is None or session.expires_at <= time.time():
            return None
        return session

    def sign_out(self, sid: str | None) -> None:
        """End the session ``sid`` (nothing if there is none)."""
        self._sessions.pop(sid or "", None)


def check_listen(host: str, access: Access) -> None:
    """Refuse to serve an open page (no token, no users) on a non-loopback address.

    Raises:
        ConfigurationError: ``host`` is not loopback and ``access`` is open.
    """
    if access.open and not is_loopback(host):
        raise ConfigurationError(
            f"refusing to listen on {host!r} without access control: set --token "
            "(or TOOLNEXUS_WEB_TOKEN) or --users, or listen on 127.0.0.1"
        )


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or ``localhost``) is this machine's loopback."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def hash_password(password: str) -> str:
    """A salted scrypt hash of ``password`` for a users file."""
    salt = secrets.token_bytes(16)
    n, r, p = _SCRYPT
    digest = hashlib.scrypt(password.encode(), salt=salt, n=n, r=r, p=p)
    return f"scrypt:{n}:{r}:{p}:{salt.hex()}:{digest.hex()}"


def verify_password(password: str, stored: str) -> bool:
    """Whether ``password`` matches the hash ``stored`` (in constant time)."""
    n, r, p, salt, digest = _parse_hash(stored, "?")
    actual = hashlib.scrypt(password.encode(), salt=salt, n=n, r=r, p=p, maxmem=256 * 1024 * 1024)
    return hmac.compare_digest(actual, digest)


def load_users(path: Path) -> dict[str, str]:
    """The logins of a users file: name → password hash.

    Raises:
        ConfigurationError: the file cannot be read, is not TOML, has no ``[users]``
            table, or holds a value that is not a password hash (the message names it).
    """
    try:
        document = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigurationError(f"cannot read the users file {str(path)!r}: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigurationError(f"the users file {str(path)!r} is not TOML: {exc}") from exc
    users = document.get("users")
    if not isinstance(users, dict) or not users:
        raise ConfigurationError(f"the users file {str(path)!r} needs a [users] table of logins")
    for name, stored in users.items():
        if not isinstance(stored, str):
            raise ConfigurationError(
                f"users file {str(path)!r}: user {name!r} must have a password hash string"
            )
        _parse_hash(stored, name)
    return users


def _parse_hash(stored: str, name: str) -> tuple[int, int, int, bytes, bytes]:
    parts = stored.split(":")
    try:
        if len(parts) != 6 or parts[0] != "scrypt":
            raise ValueError("not scrypt:n:r:p:salt:hash")
        n, r, p = (int(part) for part in parts[1:4])
        return n, r, p, bytes.fromhex(parts[4]), bytes.fromhex(parts[5])
    except ValueError as exc:
        raise ConfigurationError(
            f"user {name!r}: the value is not a password hash ({exc}); "
            "make one with `toolnexus worker web --hash-password`"
        ) from exc


@functools.cache
def _dummy_hash() -> str:
    return hash_password(secrets.token_urlsafe())
