"""Who may use the web page: a bearer token, logins from a users file, or (on loopback
only) anyone at this machine; and the sessions and CSRF tokens of those signed in.

A users file is TOML with one password hash per login, made by
``toolnexus worker web --hash-password``::

    [users]
    alice = "scrypt:16384:8:1:9c0f…:5be1…"

Sessions are signed cookies (HMAC-SHA256 over who, the CSRF token and the expiry): every
replica holding the same session secret (``--session-secret`` /
``TOOLNEXUS_WEB_SESSION_SECRET``) accepts them, and a restart signs nobody out. Without
a secret each process draws its own, and its sessions are its own. Signing out ends the
session on the replica that was asked; a copy of the cookie kept elsewhere lasts until
it expires (:data:`SESSION_TTL_S`) on the other replicas.

Sign-ins are rate limited (threat model S11): after :data:`NAME_FREE_FAILURES` wrong
passwords for one name, or :data:`CLIENT_FREE_FAILURES` wrong sign-ins from one client
address, further attempts are refused without checking (the page answers 429 with
``Retry-After``) for a window that doubles with each further failure, up to
:data:`MAX_BACKOFF_S`. A right password resets its name. Password hashes are checked
in worker threads, :data:`HASHING_AT_ONCE` at a time, so the page keeps answering.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import functools
import hashlib
import hmac
import ipaddress
import json
import math
import secrets
import time
import tomllib
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from toolnexus.errors import ConfigurationError
from toolnexus.responders import check_listen as check_listener
from toolnexus.responders import check_token

SESSION_TTL_S = 12 * 3600.0
"""How long a sign-in lasts."""

SESSION_SECRET_ENV = "TOOLNEXUS_WEB_SESSION_SECRET"
"""The environment variable holding the secret that signs sessions (shared by replicas)."""

MIN_SECRET_CHARS = 16
"""The shortest session secret accepted."""

TOKEN_PERSON = "web:token"
"""The answer's ``person`` for someone signed in with the shared bearer token."""

NAME_FREE_FAILURES = 5
"""Wrong passwords for one name before its sign-ins back off."""

CLIENT_FREE_FAILURES = 10
"""Wrong sign-ins (any name, or the token) from one client address before it backs off."""

FIRST_BACKOFF_S = 1.0
"""The first refusal window; each further failure doubles it."""

MAX_BACKOFF_S = 300.0
"""The longest refusal window."""

FORGET_S = 900.0
"""Failures older than this, with no window open, are forgotten."""

MAX_TRACKED = 10_000
"""Names (and, apart, client addresses) whose failures are remembered; the least
recently failed are forgotten first, so spraying names or addresses cannot grow memory."""

HASHING_AT_ONCE = 2
"""Password checks running at once (each takes about 16 MiB and tens of ms of a core)."""

_SCRYPT = (16384, 8, 1)  # n, r, p: about 16 MiB and a few tens of ms per check


@dataclass(frozen=True)
class Session:
    """One signed-in browser: who (``person``, e.g. ``web:alice``) and its CSRF token."""

    person: str
    csrf: str
    expires_at: float


@dataclass(frozen=True)
class SignIn:
    """The outcome of a sign-in attempt: ``person`` if it succeeded; ``retry_after_s`` > 0
    if it was refused unchecked, after too many failures (try again in that many seconds)."""

    person: str | None = None
    retry_after_s: int = 0


@dataclass
class _Failures:
    count: int
    last: float
    until: float


class Backoff:
    """Failures per key (a name, a client address), each remembered by a digest, at most
    ``capacity`` keys (the least recently failed are forgotten first).

    After ``free`` failures a key is refused for ``first_s``, doubled with each further
    failure up to ``max_s``; failures older than ``forget_s`` are forgotten.
    """

    def __init__(
        self,
        free: int,
        *,
        first_s: float = FIRST_BACKOFF_S,
        max_s: float = MAX_BACKOFF_S,
        forget_s: float = FORGET_S,
        capacity: int = MAX_TRACKED,
    ) -> None:
        self.free, self.first_s, self.max_s = free, first_s, max_s
        self.forget_s, self.capacity = forget_s, capacity
        self._failures: OrderedDict[bytes, _Failures] = OrderedDict()

    def __len__(self) -> int:
        return len(self._failures)

    def wait_s(self, key: str) -> float:
        """Seconds until ``key`` may try again (0: now)."""
        entry = self._entry(_digest(key), time.monotonic())
        return 0.0 if entry is None else max(0.0, entry.until - time.monotonic())

    def failed(self, key: str) -> None:
        """Count a failure of ``key``, opening (or widening) its refusal window."""
        digest, now = _digest(key), time.monotonic()
        entry = self._entry(digest, now) or _Failures(0, now, now)
        entry.count += 1
        entry.last = now
        if entry.count >= self.free:
            entry.until = now + min(self.max_s, self.first_s * 2 ** (entry.count - self.free))
        self._failures[digest] = entry
        self._failures.move_to_end(digest)
        while len(self._failures) > self.capacity:
            self._failures.popitem(last=False)

    def succeeded(self, key: str) -> None:
        """Forget ``key``'s failures."""
        self._failures.pop(_digest(key), None)

    def _entry(self, digest: bytes, now: float) -> _Failures | None:
        entry = self._failures.get(digest)
        if entry is not None and entry.until <= now and now - entry.last > self.forget_s:
            del self._failures[digest]
            return None
        return entry


class Access:
    """The page's access rules and its signed-in sessions.

    With neither ``token`` nor ``users``, everyone reaching the page may answer
    (``open``); :func:`check_listen` refuses that off loopback.
    """

    def __init__(
        self,
        *,
        token: str | None = None,
        users: dict[str, str] | None = None,
        session_secret: str | None = None,
    ) -> None:
        if token is not None:
            check_token(token, "the web token")
        if session_secret is not None and len(session_secret) < MIN_SECRET_CHARS:
            raise ConfigurationError(
                f"the session secret must have at least {MIN_SECRET_CHARS} characters "
                f"(--session-secret or ${SESSION_SECRET_ENV}); make one with "
                "`python -c 'import secrets; print(secrets.token_hex(32))'`"
            )
        self.token = token
        self.users = dict(users or {})
        for name, stored in self.users.items():
            _parse_hash(stored, name)
        self.shared_sessions = session_secret is not None
        """Whether sessions are signed with a given secret (so other replicas accept them)."""
        secret = session_secret.encode() if session_secret else secrets.token_bytes(32)
        self._session_key = hmac.digest(secret, b"toolnexus web sessions", "sha256")
        self._signed_out: dict[str, float] = {}  # session nonce -> its expiry
        self.names = Backoff(NAME_FREE_FAILURES)
        self.clients = Backoff(CLIENT_FREE_FAILURES)
        self._hashing = asyncio.Semaphore(HASHING_AT_ONCE)
        self._checking: set[asyncio.Future[SignIn]] = set()

    @property
    def open(self) -> bool:
        """Whether anyone may answer without signing in (no token, no users)."""
        return self.token is None and not self.users

    def person_for_token(self, token: str) -> str | None:
        """``TOKEN_PERSON`` if ``token`` is the configured token, else ``None``."""
        if self.token is not None and hmac.compare_digest(token.encode(), self.token.encode()):
            return TOKEN_PERSON
        return None

    def sign_in_with_token(self, client: str, token: str) -> SignIn:
        """Check ``token`` sent by ``client`` (its address), unless ``client`` must wait."""
        client = client_key(client)
        wait_s = self.clients.wait_s(client)
        if wait_s > 0:
            return SignIn(retry_after_s=math.ceil(wait_s))
        person = self.person_for_token(token)
        if person is None:
            self.clients.failed(client)
        return SignIn(person)

    async def sign_in_with_password(self, client: str, name: str, password: str) -> SignIn:
        """Check ``name``'s ``password`` sent by ``client`` (its address), in a worker
        thread, unless ``name`` or ``client`` must wait after too many failures.

        The check runs to its end and is counted even if the caller is cancelled (a
        client hanging up cannot start hashing beyond :data:`HASHING_AT_ONCE`)."""
        client = client_key(client)
        refused = self._refused(client, name)
        if refused is not None:
            return refused
        checking = asyncio.ensure_future(self._check_password(client, name, password))
        self._checking.add(checking)
        checking.add_done_callback(self._checking.discard)
        return await asyncio.shield(checking)

    async def _check_password(self, client: str, name: str, password: str) -> SignIn:
        async with self._hashing:
            refused = self._refused(client, name)  # failures counted while this one waited
            if refused is not None:
                return refused
            person = await asyncio.to_thread(self.person_for_login, name, password)
        if person is None:
            self.names.failed(name)
            self.clients.failed(client)
        else:
            self.names.succeeded(name)
        return SignIn(person)

    def _refused(self, client: str, name: str) -> SignIn | None:
        wait_s = max(self.clients.wait_s(client), self.names.wait_s(name))
        return SignIn(retry_after_s=math.ceil(wait_s)) if wait_s > 0 else None

    def person_for_login(self, name: str, password: str) -> str | None:
        """``web:<name>`` if ``password`` is ``name``'s in the users file, else ``None``
        (blocking for tens of ms: :meth:`sign_in_with_password` runs it in a thread)."""
        stored = self.users.get(name)
        if stored is None:
            verify_password(password, _dummy_hash())  # the same time for unknown names
            return None
        return f"web:{name}" if verify_password(password, stored) else None

    def sign_in(self, person: str) -> str:
        """Open a session for ``person``; return its signed token (the cookie's value)."""
        fields = [person, secrets.token_urlsafe(32), int(time.time() + SESSION_TTL_S)]
        body = _b64(json.dumps(fields).encode())
        return f"{body}.{_b64(self._mac(body))}"

    def session(self, sid: str | None) -> Session | None:
        """The live session of the signed token ``sid``, if it is one this page signed."""
        body, _, mac = (sid or "").partition(".")
        try:
            if not hmac.compare_digest(_unb64(mac), self._mac(body)):
                return None
            person, csrf, expires = json.loads(_unb64(body))
        except ValueError:  # not base64, not JSON (UnicodeDecodeError too), not 3 fields
            return None
        if not (isinstance(person, str) and isinstance(csrf, str) and type(expires) is int):
            return None
        if expires <= time.time() or csrf in self._signed_out or not self._admits(person):
            return None
        return Session(person, csrf, float(expires))

    def _admits(self, person: str) -> bool:
        """Whether ``person`` may still sign in here (a login removed from the users file,
        or a token no longer configured, ends its sessions)."""
        if person == TOKEN_PERSON:
            return self.token is not None
        return person.startswith("web:") and person[4:] in self.users

    def sign_out(self, sid: str | None) -> None:
        """End the session ``sid`` here (nothing if there is none)."""
        session = self.session(sid)
        if session is None:
            return
        now = time.time()
        for csrf in [c for c, until in self._signed_out.items() if until <= now]:
            del self._signed_out[csrf]
        if len(self._signed_out) < MAX_TRACKED:
            self._signed_out[session.csrf] = session.expires_at

    def _mac(self, body: str) -> bytes:
        return hmac.digest(self._session_key, body.encode(), "sha256")


def check_listen(host: str, access: Access) -> None:
    """Refuse to serve an open page (no token, no users) on a non-loopback address
    (the rule of :func:`toolnexus.responders.check_listen`, which the metrics obey too).

    Raises:
        ConfigurationError: ``host`` is not loopback and ``access`` is open.
    """
    check_listener(
        host,
        guarded=not access.open,
        what="listen",
        how="set --token (or TOOLNEXUS_WEB_TOKEN) or --users",
    )


def client_key(address: str) -> str:
    """Whom a client address counts as: the address itself, or for IPv6 its /64 (one
    host usually holds a whole /64)."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)


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


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError) as exc:
        raise ValueError("not base64") from exc


def _digest(key: str) -> bytes:
    return hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=16).digest()
