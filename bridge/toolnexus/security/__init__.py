"""Security (docs/security.md): who may say what, and the record of what was said.

:class:`SigningKey` signs a request or an answer; a :class:`Keyring` holds the public
keys a process trusts and who may answer what, and :func:`sign_answer` /
:func:`verify_answer` sign and check one answer, as a responder and a waiter do, so that
a test can show a replayed approval refused (:mod:`._signing`); :class:`Signatures`
is one process's signing configuration, from arguments or ``TOOLNEXUS_*`` variables
(:mod:`._signatures`); :class:`AuditRecord` is one line of the audit trail, and
:func:`verify_record` proves a record's outcome from its signatures later
(:mod:`._audit`); :func:`voter_of` names who cast a quorum's vote (:mod:`._voting`).
"""

from ._audit import AuditRecord, verify_record
from ._signatures import (
    REQUIRE_ENV,
    SIGNING_KEY_ENV,
    TRUSTED_KEYS_ENV,
    Signatures,
    signatures_required,
)
from ._signing import Keyring, SigningKey, sign_answer, verify_answer
from ._voting import voter_of

__all__ = [
    "REQUIRE_ENV",
    "SIGNING_KEY_ENV",
    "TRUSTED_KEYS_ENV",
    "AuditRecord",
    "Keyring",
    "Signatures",
    "SigningKey",
    "sign_answer",
    "signatures_required",
    "verify_answer",
    "verify_record",
    "voter_of",
]
