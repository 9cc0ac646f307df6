"""How one process signs and verifies (:class:`Signatures`): its own key, the keys it
trusts and whether signatures are required, from options or ``TOOLNEXUS_*`` variables.
The signatures themselves are :mod:`toolnexus.security._signing`'s."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from ..errors import ConfigurationError, SignatureError
from ..models import Answer, Request
from ._signing import (
    Keyring,
    SigningKey,
    allowed,
    sign_answer,
    sign_request,
    verify_answer,
    verify_request,
)

SIGNING_KEY_ENV: Final = "TOOLNEXUS_SIGNING_KEY"
SIGNING_NAME_ENV: Final = "TOOLNEXUS_SIGNING_NAME"
TRUSTED_KEYS_ENV: Final = "TOOLNEXUS_TRUSTED_KEYS"
REQUIRE_ENV: Final = "TOOLNEXUS_REQUIRE_SIGNATURES"


SIGNING_OPTIONS: Final = ("signing_key", "trusted_keys", "require_signatures")
"""The broker options that :meth:`Signatures.configure` takes."""


def signatures_required(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``TOOLNEXUS_REQUIRE_SIGNATURES`` (in ``environ``, else the process's
    environment) requires signatures.

    Raises:
        ConfigurationError: the variable is neither 1 nor 0 (nor true, false, ...).
    """
    env = os.environ if environ is None else environ
    return _flag(env.get(REQUIRE_ENV, ""), REQUIRE_ENV)


def _flag(value: str, variable: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("", "0", "false", "no", "off"):
        return False
    raise ConfigurationError(f"{variable}={value!r}: expected 1 or 0")


@dataclass(frozen=True, slots=True)
class Signatures:
    """How one process signs and verifies: its own ``key``, the ``keyring`` of keys it
    trusts (an agent trusts responders' keys, a responder agents'), and whether
    signatures are ``required``. Not required, checks are advisory: a signature that
    verifies names the responder, anything else passes unverified.

    Raises:
        ConfigurationError: ``required`` without an own key or without trusted keys.
    """

    key: SigningKey | None = None
    keyring: Keyring = field(default_factory=Keyring)
    required: bool = False

    def __post_init__(self) -> None:
        if self.required and (self.key is None or not len(self.keyring)):
            raise ConfigurationError(
                f"signatures are required ({REQUIRE_ENV}=1) but this process has "
                + ("no signing key" if self.key is None else "no trusted keys")
                + f": set {SIGNING_KEY_ENV} and {TRUSTED_KEYS_ENV} (toolnexus keygen makes keys)"
            )

    @classmethod
    def configure(
        cls,
        signing_key: SigningKey | str | os.PathLike[str] | None = None,
        trusted_keys: Keyring | str | os.PathLike[str] | None = None,
        require_signatures: bool | None = None,
        *,
        environ: Mapping[str, str] | None = None,
    ) -> Signatures:
        """The configuration from these options (a key or its path, a keyring or its path,
        a flag), each one not given taken from the environment (:meth:`from_env`).

        Raises:
            ConfigurationError: a key file or trusted-keys path is unreadable or malformed,
                or a variable is malformed; the message names the variable and the file.
        """
        env = os.environ if environ is None else environ
        if signing_key is None and env.get(SIGNING_KEY_ENV):
            try:
                signing_key = SigningKey.load(env[SIGNING_KEY_ENV], env.get(SIGNING_NAME_ENV))
            except ConfigurationError as exc:
                raise ConfigurationError(f"{SIGNING_KEY_ENV}: {exc}") from exc
        elif isinstance(signing_key, str | os.PathLike):
            signing_key = SigningKey.load(signing_key)
        if trusted_keys is None and env.get(TRUSTED_KEYS_ENV):
            try:
                trusted_keys = Keyring.load(env[TRUSTED_KEYS_ENV])
            except ConfigurationError as exc:
                raise ConfigurationError(f"{TRUSTED_KEYS_ENV}: {exc}") from exc
        elif isinstance(trusted_keys, str | os.PathLike):
            trusted_keys = Keyring.load(trusted_keys)
        if require_signatures is None:
            require_signatures = signatures_required(env)
        return cls(signing_key, trusted_keys or Keyring(), require_signatures)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Signatures:
        """The configuration in ``TOOLNEXUS_SIGNING_KEY`` (path of this process's private
        key, named by its stem unless ``TOOLNEXUS_SIGNING_NAME`` is set),
        ``TOOLNEXUS_TRUSTED_KEYS`` (a directory of ``.pub`` files or a ``NAME KEY`` file)
        and ``TOOLNEXUS_REQUIRE_SIGNATURES=1``.

        Raises:
            ConfigurationError: as :meth:`configure`.
        """
        return cls.configure(environ=environ)

    def sign_request(self, request: Request) -> Request:
        """``request`` signed with this process's key (unchanged without one)."""
        return request if self.key is None else sign_request(request, self.key)

    def sign_answer(self, answer: Answer, request: Request) -> Answer:
        """``answer`` signed with this process's key (unchanged without one)."""
        return answer if self.key is None else sign_answer(answer, request, self.key)

    def admit_request(self, request: Request) -> str | None:
        """The verified key name of the agent that signed ``request``; ``None`` when it
        did not verify and signatures are not required.

        Raises:
            SignatureError: signatures are required and it does not verify.
        """
        if not self.required and (not self.keyring or request.signature is None):
            return None  # what verifying it would conclude, without raising on the way
        try:
            return verify_request(request, self.keyring)
        except SignatureError:
            if self.required:
                raise
            return None

    def admit_answer(self, answer: Answer, request: Request) -> str | None:
        """The verified key name of the responder of ``answer`` (set it as
        ``answer.responder``); ``None`` when it did not verify and signatures are not
        required. The request's allow-list is checked against the verified name, or
        without one against the claimed ``responder``: advisory, since anyone can claim.

        Raises:
            SignatureError: required signatures do not verify (see :func:`verify_answer`),
                or the allow-list excludes this responder and person (``"not allowed"``).
        """
        name: str | None = None
        if self.keyring:  # else nothing can verify, and nothing is required (__post_init__)
            try:
                name = verify_answer(answer, request, self.keyring)
            except SignatureError:
                if self.required:
                    raise
        if not allowed(request.allow, name or answer.responder, answer.person):
            raise SignatureError(f"answer to {request.id!r}", "not allowed")
        return name
