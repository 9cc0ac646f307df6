"""Time-limited grants (issue 45): a person answering a tool approval lets the auto
worker accept the same tool, for the same agent, for N minutes.

A :class:`~toolnexus.models.Grant` is signed by the granting responder's key
(:func:`toolnexus.security.sign_grant`) and kept in the queue's worker store ``grants``
(:data:`GRANTS_STORE`), one entry per grant id, the store's Redis TTL outliving the grant.
Redis is a bulletin board: what the store holds is trusted only once its signature is a
trusted key's, and a grant counts only while its signed ``expires_at`` is ahead, never
longer than the reader's own maximum (:meth:`Grants.honoured`). Revoking deletes the
entry; an auto worker reads the store for every tool approval it decides, so a revocation
holds from the next request on.

A grant covers a request (:func:`covers`) only for exactly its agent (the request's
verified signer, never a claimed name), exactly its tool, and, when it names
``arguments``, a call whose arguments hold each of them with an equal JSON value.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any, Final

import msgspec

from ._broker import Broker
from .errors import ConfigurationError, SignatureError
from .models import Grant, new_id
from .security import Keyring, SigningKey, sign_grant, verify_grant

log = logging.getLogger("toolnexus.grants")

GRANTS_STORE: Final = "grants"
"""The worker store (:meth:`toolnexus.Broker.store`) of a queue's grants."""

_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(Grant)
_SAME = msgspec.json.Encoder(order="sorted")  # equal JSON values: 1 is neither 1.0 nor true


def make_grant(
    key: SigningKey,
    *,
    agent: str,
    tool: str,
    minutes: float,
    arguments: Mapping[str, Any] | None = None,
    person: str | None = None,
    now: float | None = None,
) -> Grant:
    """A fresh grant to ``agent`` for ``tool`` over the next ``minutes``, signed by ``key``.

    Raises:
        ConfigurationError: ``minutes`` is not a positive number, or ``agent`` or ``tool``
            is empty.
    """
    if isinstance(minutes, bool) or not isinstance(minutes, int | float) or not minutes > 0:
        raise ConfigurationError(f"a grant lasts a positive number of minutes, not {minutes!r}")
    if not agent or not tool:
        raise ConfigurationError("a grant names an agent (its verified key) and a tool")
    granted_at = time.time() if now is None else now
    grant = Grant(
        id=new_id("grant"),
        agent=agent,
        tool=tool,
        arguments=dict(arguments) if arguments is not None else None,
        granted_at=granted_at,
        expires_at=granted_at + minutes * 60,
        person=person,
    )
    return sign_grant(grant, key)


def covers(grant: Grant, agent: str | None, tool: str, arguments: Mapping[str, Any]) -> bool:
    """Whether ``grant`` names this verified ``agent`` (None: unverified, never covered),
    this ``tool``, and arguments that ``arguments`` hold, each with an equal JSON value.
    It judges neither signature nor time (:meth:`Grants.honoured` does)."""
    if agent is None or grant.agent != agent or grant.tool != tool:
        return False
    return all(
        name in arguments and _same(arguments[name], value)
        for name, value in (grant.arguments or {}).items()
    )


def _same(a: Any, b: Any) -> bool:
    try:
        return _SAME.encode(a) == _SAME.encode(b)
    except (TypeError, ValueError, OverflowError):
        return False


def why_not_valid(grant: Grant, keyring: Keyring, max_s: float, now: float) -> str | None:
    """Why ``grant`` does not count now (None: it does): its signature is not a trusted
    key's, it has expired, or it runs longer than ``max_s`` seconds (from when it was
    granted, or from now: a grant dated ahead cannot outlast the maximum)."""
    try:
        verify_grant(grant, keyring)
    except SignatureError as exc:
        return str(exc)
    if not now < grant.expires_at:
        return "expired"
    if grant.expires_at - min(grant.granted_at, now) > max_s:
        return f"longer than the maximum of {max_s / 60:g} minutes"
    return None


class Grants:
    """The grants of ``broker``'s queue, in its worker store :data:`GRANTS_STORE`."""

    def __init__(self, broker: Broker) -> None:
        self.store = broker.store(GRANTS_STORE)

    async def keep(self, grant: Grant) -> None:
        """Store ``grant`` (signed) until it expires.

        Raises:
            ConfigurationError: it is unsigned, or already expired.
            BrokerUnavailable: the broker stayed unreachable.
        """
        if grant.signature is None:
            raise ConfigurationError(f"grant {grant.id!r} is not signed: sign_grant first")
        left_s = grant.expires_at - time.time()
        if left_s <= 0:
            raise ConfigurationError(f"grant {grant.id!r} has expired already")
        await self.store.set(grant.id, _ENCODER.encode(grant), ttl_s=left_s)

    async def all(self) -> list[Grant]:
        """Every readable grant in the store, oldest first, expired or not, signed or
        not (entries that are not grants are logged and left out).

        Raises:
            BrokerUnavailable: the broker stayed unreachable.
        """
        grants = []
        for entry, value in (await self.store.items()).items():
            try:
                grant = _DECODER.decode(value)
            except msgspec.DecodeError as exc:
                log.warning("grants: entry %r is not a grant, ignored: %s", entry[:80], exc)
                continue
            if grant.id != entry:
                log.warning("grants: entry %r holds grant %r, ignored", entry[:80], grant.id)
                continue
            grants.append(grant)
        return sorted(grants, key=lambda g: (g.granted_at, g.id))

    async def revoke(self, grant_id: str) -> bool:
        """Delete grant ``grant_id``; whether it was there.

        Raises:
            ConfigurationError: ``grant_id`` cannot be a store key.
            BrokerUnavailable: the broker stayed unreachable.
        """
        held = await self.store.get(grant_id)
        await self.store.delete(grant_id)
        return held is not None

    async def honoured(
        self,
        agent: str | None,
        tool: str,
        arguments: Mapping[str, Any],
        keyring: Keyring,
        *,
        max_s: float,
    ) -> Grant | None:
        """The first grant that covers this call (:func:`covers`) and counts now
        (:func:`why_not_valid`); None: none does, and the request falls through.

        Raises:
            BrokerUnavailable: the broker stayed unreachable.
        """
        if agent is None:
            return None
        now = time.time()
        for grant in await self.all():
            if not covers(grant, agent, tool, arguments):
                continue
            problem = why_not_valid(grant, keyring, max_s, now)
            if problem is None:
                return grant
            log.info("grants: %s for %s/%s does not count: %s", grant.id, agent, tool, problem)
        return None


__all__ = ["GRANTS_STORE", "Grants", "covers", "make_grant", "why_not_valid"]
