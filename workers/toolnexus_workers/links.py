"""Single-use answer links (issue #29): a capability token bound to one request, naming its
recipient and expiring with the request.

The webhook and email workers make links; the HTTP answering API (``toolnexus worker
http``, ``/v1/links/TOKEN``) is their one home: it checks a link and answers the request as
``link:RECIPIENT``, signed with its own key. Every worker involved is given the same link
key: an HMAC secret (``--link-secret``, ``$TOOLNEXUS_LINK_SECRET``, 32 characters or more)
or an Ed25519 key made by ``toolnexus keygen`` (``--link-key FILE``,
``$TOOLNEXUS_LINK_KEY``).

A token is ``tnl1.PAYLOAD.SIGNATURE`` (base64url): the payload names the queue, the
request's id, a SHA-256 digest of the request as published, the recipient, the expiry
and, for an email's approve or decline link, the one action it may take. Nothing about a
link is kept in Redis: a forged or edited token fails its signature, a token for another
version of the request fails its digest, and a link answers once because the request
takes one answer (a quorum: one vote per person) -- so a write to Redis can neither mint
a link nor use one up.

    key = LinkKey(secret="...32 characters or more...")
    token = key.mint("ops", request, "alice@example.com", action="accept")
    claims = key.read(token)          # raises BadLink for a forged or expired token
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

from toolnexus import ConfigurationError, Request
from toolnexus.codec import JSON, PREVIOUS_PROTOCOL
from toolnexus.security import SigningKey

__all__ = [
    "ACTIONS",
    "LINK_KEY_ENV",
    "LINK_SECRET_ENV",
    "MIN_SECRET_CHARS",
    "NO_EXPIRY_TTL_S",
    "BadLink",
    "Claims",
    "LinkKey",
    "add_link_flags",
    "link_key",
    "link_url",
    "request_digest",
    "sender_links",
]

LINK_SECRET_ENV = "TOOLNEXUS_LINK_SECRET"
LINK_KEY_ENV = "TOOLNEXUS_LINK_KEY"
MIN_SECRET_CHARS = 32
NO_EXPIRY_TTL_S = 24 * 3600.0
"""How long a link to a request without a deadline lasts."""
ACTIONS = ("accept", "decline", "dismiss")
_PREFIX = "tnl1"
_CONTEXT = b"toolnexus answer links"


class BadLink(Exception):
    """A link token that cannot be used: ``status`` is the HTTP status to answer with."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Claims:
    """What a genuine token says: the request it answers and who it was sent to."""

    queue: str
    request_id: str
    digest: str
    recipient: str
    expires_at: float
    action: str | None
    nonce: str

    @property
    def person(self) -> str:
        """Who answers through the link: ``link:RECIPIENT``."""
        return f"link:{self.recipient}"


def request_digest(request: Request) -> str:
    """The SHA-256 (hex) of ``request``: a link answers only this request. Over its JSON
    in the envelope of protocol 1, ``[1, {...}]``, whatever protocol it travelled in: a
    layout of its own that no ``write_protocol`` changes, so that a link one release made
    is read by another (docs/reference/protocol.md, "Answer links")."""
    return hashlib.sha256(JSON.encode(request, PREVIOUS_PROTOCOL)).hexdigest()


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class LinkKey:
    """Signs and checks link tokens: HMAC-SHA256 under ``secret``, or Ed25519 under ``key``.

    Raises:
        ConfigurationError: neither or both are given, or the secret is too short.
    """

    def __init__(self, *, secret: str | None = None, key: SigningKey | None = None) -> None:
        if (secret is None) == (key is None):
            raise ConfigurationError("a link key is an HMAC secret or an Ed25519 key: give one")
        if secret is not None and len(secret) < MIN_SECRET_CHARS:
            raise ConfigurationError(
                f"the link secret must have at least {MIN_SECRET_CHARS} characters "
                f"(--link-secret or ${LINK_SECRET_ENV}); make one with "
                "`python -c 'import secrets; print(secrets.token_urlsafe(32))'`"
            )
        self._mac = hmac.digest(secret.encode(), _CONTEXT, "sha256") if secret else None
        self._key = key

    def _sign(self, message: bytes) -> bytes:
        if self._mac is not None:
            return hmac.digest(self._mac, message, "sha256")
        assert self._key is not None
        return self._key.sign(message)

    def _genuine(self, message: bytes, signature: bytes) -> bool:
        if self._mac is not None:
            return hmac.compare_digest(hmac.digest(self._mac, message, "sha256"), signature)
        assert self._key is not None
        try:
            self._key.public_key.verify(signature, message)
        except Exception:  # cryptography's InvalidSignature, or a signature of a wrong size
            return False
        return True

    def mint(
        self,
        queue: str,
        request: Request,
        recipient: str,
        *,
        action: str | None = None,
        now: float | None = None,
    ) -> str:
        """A token answering ``request`` of ``queue`` as ``recipient`` (only by ``action``,
        if given) until the request expires (a request without a deadline: a day)."""
        if action is not None and action not in ACTIONS:
            raise ValueError(f"action must be one of {', '.join(ACTIONS)}, not {action!r}")
        expires_at = request.expires_at or (now or time.time()) + NO_EXPIRY_TTL_S
        payload = {
            "q": queue,
            "id": request.id,
            "d": request_digest(request),
            "to": recipient,
            "exp": expires_at,
            "do": action,
            "n": _b64(secrets.token_bytes(12)),
        }
        body = f"{_PREFIX}.{_b64(json.dumps(payload, separators=(',', ':')).encode())}"
        return f"{body}.{_b64(self._sign(body.encode()))}"

    def read(self, token: str, *, now: float | None = None) -> Claims:
        """The claims of a genuine, unexpired ``token``.

        Raises:
            BadLink: 403 for a token that is damaged or not signed with this key, 410 for
                an expired one.
        """
        forged = BadLink(403, "this link is not valid: it is damaged or was not made here")
        prefix, _, rest = token.partition(".")
        payload_text, _, signature_text = rest.partition(".")
        if prefix != _PREFIX or not payload_text or not signature_text or len(token) > 4096:
            raise forged
        try:
            signature = _unb64(signature_text)
        except (binascii.Error, ValueError):
            raise forged from None
        if not self._genuine(f"{prefix}.{payload_text}".encode(), signature):
            raise forged  # checked before the payload is read: nothing forged is parsed
        try:
            payload = json.loads(_unb64(payload_text))
        except (binascii.Error, ValueError):
            raise forged from None
        claims = Claims(
            queue=str(payload["q"]),
            request_id=str(payload["id"]),
            digest=str(payload["d"]),
            recipient=str(payload["to"]),
            expires_at=float(payload["exp"]),
            action=payload["do"],
            nonce=str(payload["n"]),
        )
        if claims.expires_at <= (now or time.time()):
            raise BadLink(410, "this link has expired, with its request: no answer is needed now")
        return claims


def link_url(base_url: str, token: str) -> str:
    """Where a link is followed: the HTTP answering API at ``base_url``, ``/v1/links/TOKEN``."""
    return f"{base_url.rstrip('/')}/v1/links/{token}"


def add_link_flags(group: object, *, base: bool) -> None:
    """``--link-secret`` and ``--link-key`` (with ``base``: ``--link-base``, the HTTP
    API's public address) in the argument ``group``."""
    add = getattr(group, "add_argument")  # noqa: B009 (an argparse group of any kind)
    add(
        "--link-secret",
        default=os.environ.get(LINK_SECRET_ENV) or None,
        help="HMAC secret that signs answer links, the same for every worker making or "
        f"taking them (default: ${LINK_SECRET_ENV})",
    )
    add(
        "--link-key",
        type=Path,
        default=os.environ.get(LINK_KEY_ENV) or None,
        help="Ed25519 key (toolnexus keygen) that signs answer links instead of a secret "
        f"(default: ${LINK_KEY_ENV})",
    )
    if base:
        add(
            "--link-base",
            default=os.environ.get("TOOLNEXUS_LINK_BASE") or None,
            help="the public address of the HTTP answering API that takes the links, e.g. "
            "https://answers.example.com (default: $TOOLNEXUS_LINK_BASE)",
        )


def sender_links(secret: str | None, key_file: Path | None, base: str | None) -> LinkKey:
    """The link key of a worker that sends links (webhook, email), which must have one
    and ``--link-base``.

    Raises:
        ConfigurationError: either is missing, or :func:`link_key` refuses the key.
    """
    key = link_key(secret, key_file)
    if key is None or not base:
        raise ConfigurationError(
            "every message carries answer links: give the link key (--link-secret or "
            "--link-key, the same as the HTTP answering API's) and --link-base (its address)"
        )
    return key


def link_key(secret: str | None, key_file: Path | None) -> LinkKey | None:
    """The link key the flags name, or None when neither is given.

    Raises:
        ConfigurationError: both are given, the secret is too short, or the key file
            cannot be read.
    """
    if secret is None and key_file is None:
        return None
    if secret is not None and key_file is not None:
        raise ConfigurationError("give --link-secret or --link-key, not both")
    key = SigningKey.load(key_file) if key_file is not None else None
    return LinkKey(secret=secret, key=key)
