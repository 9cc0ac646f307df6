"""Where a listener may bind: one rule for the web page and the metrics endpoint.

A listener without access control (no token, no logins) serves this machine only: it
binds to a loopback address (``127.0.0.1``, ``::1``, ``localhost``) or not at all.
Off loopback it needs a bearer token (and the web page, logins) first.
"""

from __future__ import annotations

import ipaddress
import socket

from .errors import ConfigurationError

MIN_TOKEN_CHARS = 16
"""The shortest bearer token a listener accepts."""


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or ``localhost``) is this machine's loopback."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_listen(host: str, *, guarded: bool, what: str, how: str) -> None:
    """Refuse to ``what`` (e.g. ``listen``) on a non-loopback ``host`` unless ``guarded``
    (the listener asks for a token or a login); ``how`` says what to set instead.

    Raises:
        ConfigurationError: ``host`` is not loopback and the listener is not guarded.
    """
    if not guarded and not is_loopback(host):
        raise ConfigurationError(
            f"refusing to {what} on {host!r} without access control: {how}, or listen on 127.0.0.1"
        )


def check_token(token: str, what: str) -> None:
    """Refuse a bearer token too short to resist guessing; ``what`` names it.

    Raises:
        ConfigurationError: ``token`` has fewer than :data:`MIN_TOKEN_CHARS` characters.
    """
    if len(token) < MIN_TOKEN_CHARS:
        raise ConfigurationError(
            f"{what} must be at least {MIN_TOKEN_CHARS} characters: make one with "
            "`python -c 'import secrets; print(secrets.token_hex())'`"
        )


def listen(host: str, port: int) -> socket.socket:
    """A listening, non-blocking socket on ``host:port`` (check it with :func:`check_listen`
    first).

    Raises:
        ConfigurationError: the address cannot be listened on.
    """
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except OSError as exc:
        raise ConfigurationError(f"cannot listen on {host}:{port}: {exc}") from exc
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise ConfigurationError(f"cannot listen on {host}:{port}: {exc}") from exc
    sock.setblocking(False)
    return sock
