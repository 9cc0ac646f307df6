"""Ed25519 signatures on requests and answers: who asked, and provably who answered.

An agent signs each request it publishes (:func:`sign_request`); a responder signs
each answer together with the digest of the exact request it answered
(:func:`sign_answer`). A waiter that trusts the responder's public key then knows
that this key answered this request as published: not a copy of another answer,
not an answer to a spoofed prompt. ``Answer.responder`` becomes the verified key name;
the person behind a worker (a web login, ``slack:U123``) is a separate signed field.

Signatures are made and checked by libsodium (PyNaCl, twice as fast as OpenSSL), key files
read and written by ``cryptography``: Ed25519 (RFC 8032) signs the same bytes in either.

Keys are files made by ``toolnexus keygen NAME``: ``NAME.key`` (private, mode 0600)
and ``NAME.pub`` (one ``NAME <base64 key>`` line). A trusted-keys file is such lines
concatenated; a directory of ``.pub`` files works as well.

    >>> agent, bot = SigningKey.generate("agent-7"), SigningKey.generate("ops-bot")
    >>> request = sign_request(Request(id="req-1", kind="approval", prompt="Deploy?"), agent)
    >>> verify_request(request, Keyring.of(agent))
    'agent-7'
    >>> answer = sign_answer(Answer(id="req-1", ok=True), request, bot)
    >>> verify_answer(answer, request, Keyring.of(bot))
    'ops-bot'
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import msgspec
import nacl.bindings
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from nacl.exceptions import BadSignatureError

from ..codec import ENCODING_ERRORS, unencodable_field
from ..errors import ConfigurationError, InvalidAnswer, InvalidRequest, SignatureError
from ..models import Answer, Request, Signature

_REQUEST_DIGEST: Final = b"toolnexus request digest v1\n"
_REQUEST_SIGNATURE: Final = b"toolnexus request signature v1\n"
_ANSWER_SIGNATURE: Final = b"toolnexus answer signature v1\n"
_REQUEST_BYTES: Final = b"toolnexus request bytes v1\n"
_REFUSAL_SIGNATURE: Final = b"toolnexus refusal signature v1\n"
_OWN_SIGNATURE: Final = b"toolnexus own record signature v1\n"
"""Prefixes that keep a signature made for one purpose from being valid for another."""

_CANONICAL = msgspec.msgpack.Encoder(order="sorted")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+-]*")
_RAW_KEY_BYTES = 32


def check_key_name(name: str) -> str:
    """``name`` if it can name a key (and its files).

    Raises:
        ConfigurationError: it is empty, or has characters other than letters, digits
            and ``. _ @ + -``, or does not start with a letter or digit.
    """
    if not _NAME.fullmatch(name):
        raise ConfigurationError(
            f"key name {name!r} must start with a letter or digit and use only letters, "
            "digits and . _ @ + -"
        )
    return name


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def _raw_key(text: str) -> bytes | None:
    try:
        raw = base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None
    return raw if len(raw) == _RAW_KEY_BYTES else None


class SigningKey:
    """A named Ed25519 private key: this process's identity when it signs."""

    __slots__ = ("_private", "_secret", "name", "public_key")

    def __init__(self, name: str, private_key: Ed25519PrivateKey) -> None:
        self.name = check_key_name(name)
        self._private = private_key
        self.public_key = private_key.public_key()
        raw = serialization.Encoding.Raw, serialization.PrivateFormat.Raw
        seed = private_key.private_bytes(*raw, serialization.NoEncryption())
        self._secret = nacl.bindings.crypto_sign_seed_keypair(seed)[1]  # libsodium's form

    @classmethod
    def generate(cls, name: str) -> SigningKey:
        """A fresh key named ``name``.

        Raises:
            ConfigurationError: ``name`` is not a valid key name.
        """
        return cls(name, Ed25519PrivateKey.generate())

    @classmethod
    def load(cls, path: str | os.PathLike[str], name: str | None = None) -> SigningKey:
        """The key in ``path`` (PEM, 32 raw bytes, or their base64), named ``name`` or
        else the file's stem (``ops-bot.key`` is ``ops-bot``).

        Raises:
            ConfigurationError: the file cannot be read or holds no Ed25519 private key.
        """
        file = Path(path)
        try:
            data = file.read_bytes()
        except OSError as exc:
            raise ConfigurationError(f"cannot read signing key {file}: {exc.strerror}") from exc
        return cls(name or file.stem, _private_key(data, file))

    def save(self, directory: str | os.PathLike[str] = ".") -> tuple[Path, Path]:
        """Write ``NAME.key`` (PEM, mode 0600) and ``NAME.pub`` (a trusted-keys line)
        into ``directory`` (made if missing); their paths are returned. Existing files are
        never replaced.

        Raises:
            ConfigurationError: a file exists already, or cannot be written.
        """
        folder = Path(directory)
        key_path, pub_path = folder / f"{self.name}.key", folder / f"{self.name}.pub"
        for path in (key_path, pub_path):
            if path.exists():
                raise ConfigurationError(f"{path} exists already: not replacing a key")
        pem = self._private.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as out:
                os.fchmod(out.fileno(), 0o600)  # whatever the umask
                out.write(pem)
            pub_path.write_text(self.public_line() + "\n")
        except OSError as exc:
            raise ConfigurationError(f"cannot write {exc.filename}: {exc.strerror}") from exc
        return key_path, pub_path

    def sign(self, message: bytes) -> bytes:
        """The Ed25519 signature of ``message``."""
        return nacl.bindings.crypto_sign(message, self._secret)[: nacl.bindings.crypto_sign_BYTES]

    def public_line(self) -> str:
        """``NAME <base64 public key>``: the line a trusted-keys file holds for this key."""
        return f"{self.name} {_b64(_public_raw(self.public_key))}"

    def __repr__(self) -> str:
        return f"<SigningKey {self.name} {fingerprint(self.public_key)}>"


def _public_raw(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def fingerprint(key: Ed25519PublicKey) -> str:
    """A short stable name for a public key: the first 8 bytes of its SHA-256, in hex."""
    return hashlib.sha256(_public_raw(key)).hexdigest()[:16]


def _private_key(data: bytes, file: Path) -> Ed25519PrivateKey:
    if data.lstrip().startswith(b"-----BEGIN"):
        try:
            key = serialization.load_pem_private_key(data, password=None)
        except TypeError as exc:
            raise ConfigurationError(f"{file}: encrypted keys are not supported") from exc
        except ValueError as exc:
            raise ConfigurationError(f"{file}: not a readable PEM private key") from exc
        if not isinstance(key, Ed25519PrivateKey):
            raise ConfigurationError(
                f"{file}: not an Ed25519 key but a {type(key).__name__} (toolnexus keygen)"
            )
        return key
    raw = data if len(data) == _RAW_KEY_BYTES else _raw_key(data.decode("latin-1"))
    if raw is None:
        raise ConfigurationError(
            f"{file}: not an Ed25519 private key (PEM, 32 raw bytes or their base64)"
        )
    return Ed25519PrivateKey.from_private_bytes(raw)


class Keyring:
    """Trusted Ed25519 public keys by name. A name is an identity: two names for one key
    are refused, since either could then be claimed."""

    __slots__ = ("_keys", "_raw")

    def __init__(self, keys: Mapping[str, Ed25519PublicKey] | None = None) -> None:
        self._keys: dict[str, Ed25519PublicKey] = {}
        self._raw: dict[str, bytes] = {}  # each key's 32 bytes, as libsodium verifies with
        for name, key in (keys or {}).items():
            self._add(name, key, "keyring")

    def _add(self, name: str, key: Ed25519PublicKey, where: str) -> None:
        if not _NAME.fullmatch(name):
            raise ConfigurationError(
                f"{where}: {name!r} is not a key name (letters, digits and . _ @ + -)"
            )
        raw = _public_raw(key)
        for known, other in self._raw.items():
            if known == name and other != raw:
                raise ConfigurationError(f"{where}: two different keys are named {name!r}")
            if known != name and other == raw:
                raise ConfigurationError(f"{where}: the key of {known!r} is also named {name!r}")
        self._keys[name] = key
        self._raw[name] = raw

    @classmethod
    def of(cls, *keys: SigningKey) -> Keyring:
        """A keyring trusting the public halves of ``keys``."""
        return cls({key.name: key.public_key for key in keys})

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Keyring:
        """The keys of a directory of ``.pub`` files, or of a file of ``NAME KEY`` lines.

        Raises:
            ConfigurationError: ``path`` is missing or a file in it is malformed (the
                message names the file and line).
        """
        where = Path(path)
        return cls.from_dir(where) if where.is_dir() else cls.from_file(where)

    @classmethod
    def from_dir(cls, path: str | os.PathLike[str]) -> Keyring:
        """The keys of every ``*.pub`` file in ``path``: each a ``NAME KEY`` line, a bare
        base64 key or a PEM public key (both named by the file's stem).

        Raises:
            ConfigurationError: as :meth:`load`.
        """
        ring = cls()
        for file in sorted(Path(path).glob("*.pub")):
            ring._read(file, default_name=file.stem)
        return ring

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> Keyring:
        """The keys of a file of ``NAME KEY`` lines (base64 raw keys; ``#`` comments).

        Raises:
            ConfigurationError: as :meth:`load`.
        """
        ring = cls()
        ring._read(Path(path), default_name=None)
        return ring

    def _read(self, file: Path, default_name: str | None) -> None:
        try:
            text = file.read_text()
        except OSError as exc:
            raise ConfigurationError(f"cannot read trusted keys {file}: {exc.strerror}") from exc
        except UnicodeDecodeError as exc:
            raise ConfigurationError(f"{file}: not text, so not trusted keys") from exc
        if default_name is not None and text.lstrip().startswith("-----BEGIN"):
            try:
                key = serialization.load_pem_public_key(text.encode())
            except ValueError as exc:
                raise ConfigurationError(f"{file}: not a readable PEM public key") from exc
            if not isinstance(key, Ed25519PublicKey):
                raise ConfigurationError(f"{file}: not an Ed25519 key but a {type(key).__name__}")
            self._add(default_name, key, str(file))
            return
        for number, line in enumerate(text.splitlines(), 1):
            words = line.split("#", 1)[0].split()
            if not words:
                continue
            if len(words) == 1 and default_name is not None:
                words = [default_name, *words]
            raw = _raw_key(words[1]) if len(words) == 2 else None
            if raw is None:
                raise ConfigurationError(
                    f"{file}, line {number}: expected 'NAME KEY' with KEY the base64 of a "
                    "32-byte Ed25519 public key (the line toolnexus keygen prints)"
                )
            self._add(words[0], Ed25519PublicKey.from_public_bytes(raw), f"{file}, line {number}")

    def merge(self, other: Keyring) -> Keyring:
        """A keyring trusting the keys of both.

        Raises:
            ConfigurationError: a name stands for different keys, or a key has two names.
        """
        merged = Keyring(self._keys)
        for name, key in other._keys.items():
            merged._add(name, key, "merging keyrings")
        return merged

    def get(self, name: str) -> Ed25519PublicKey | None:
        """The trusted key named ``name``, if any."""
        return self._keys.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._keys

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def __repr__(self) -> str:
        return f"Keyring({sorted(self._keys)})"


# -- digests and signatures ---------------------------------------------------------


def _canonical(fields: dict[str, Any], what: str) -> bytes:
    try:
        return _CANONICAL.encode(fields)
    except ENCODING_ERRORS as exc:
        error = InvalidRequest if what == "request" else InvalidAnswer
        field = unencodable_field(fields.items())
        raise error(
            f"cannot sign this {what}: its field {field!r} cannot be encoded "
            f"({type(exc).__name__}: {exc})"
        ) from exc


def _time(value: float | None) -> float | None:
    return None if value is None else float(value)  # an int would encode differently


def request_digest(request: Request) -> bytes:
    """SHA-256 over the fields of ``request`` that must not change in flight: id, kind,
    prompt, data, url, source, expires_at, allow and reply_to (sorted msgpack), and the
    §14 fields (quorum, escalate with created_at, on_expiry, durable) where they are set,
    so that a request without them keeps the digest it always had. ``created_at`` counts
    only for an escalating request: its hops are due that long after it (SPEC §11).

    Raises:
        InvalidRequest: ``data`` holds something msgpack cannot encode.
    """
    source = request.source
    fields = {
        "id": request.id,
        "kind": request.kind,
        "prompt": request.prompt,
        "data": request.data,
        "url": request.url,
        "source": {"server": source.server, "tool": source.tool, "agent": source.agent},
        "expires_at": _time(request.expires_at),
        "allow": request.allow,
        "reply_to": request.reply_to,
    }
    if request.quorum is not None:
        fields["quorum"] = {"need": request.quorum.need, "decline": request.quorum.decline}
    if request.escalate:
        fields["escalate"] = [[float(hop.after_s), hop.queue] for hop in request.escalate]
        fields["created_at"] = _time(request.created_at)
    if request.on_expiry is not None:
        fields["on_expiry"] = {"ok": request.on_expiry.ok, "data": request.on_expiry.data}
    if request.durable:
        fields["durable"] = True
    return hashlib.sha256(_REQUEST_DIGEST + _canonical(fields, "request")).digest()


def _answer_message(answer: Answer, digest: bytes, key: str) -> bytes:
    fields = {
        "id": answer.id,
        "ok": answer.ok,
        "data": answer.data,
        "reason": answer.reason,
        "person": answer.person,
        "answered_at": _time(answer.answered_at),
        "request": digest,
        "key": key,
    }
    if answer.meta:  # signed where set, so that an answer without it keeps its signature
        fields["meta"] = answer.meta
    return _ANSWER_SIGNATURE + _canonical(fields, "answer")


def sign_request(request: Request, key: SigningKey) -> Request:
    """``request`` signed by ``key``. Sign it as it will be published (with its
    ``expires_at`` and ``reply_to`` set): a change to a signed field breaks the signature.

    Raises:
        InvalidRequest: ``data`` holds something msgpack cannot encode.
    """
    sig = key.sign(_REQUEST_SIGNATURE + request_digest(request))
    return msgspec.structs.replace(request, signature=Signature(key=key.name, sig=sig))


def _check(public: bytes, sig: bytes, message: bytes, what: str) -> None:
    if len(sig) != nacl.bindings.crypto_sign_BYTES:
        raise SignatureError(what, "bad signature")
    try:
        nacl.bindings.crypto_sign_open(sig + message, public)
    except BadSignatureError:
        raise SignatureError(what, "bad signature") from None


def _trusted(signature: Signature | None, keyring: Keyring, what: str) -> tuple[Signature, bytes]:
    if signature is None:
        raise SignatureError(what, "missing signature")
    public = keyring._raw.get(signature.key)
    if public is None:
        raise SignatureError(what, f"unknown key {signature.key!r}")
    return signature, public


def verify_request(request: Request, keyring: Keyring) -> str:
    """The name of the trusted key that signed ``request`` as it is.

    Raises:
        SignatureError: with ``reason`` ``"missing signature"``, ``"unknown key 'x'"`` or
            ``"bad signature"`` (a signed field was changed, or the signature is not its key's).
    """
    return verify_request_digest(request.id, request_digest(request), request.signature, keyring)


def verify_request_digest(
    request_id: str, digest: bytes, signature: Signature | None, keyring: Keyring
) -> str:
    """As :func:`verify_request`, for the request of ``request_id`` known by its digest
    (:func:`request_digest`) and ``signature`` alone: an audit record keeps no more.

    Raises:
        SignatureError: as :func:`verify_request`.
    """
    what = f"request {request_id!r}"
    signature, public = _trusted(signature, keyring, what)
    _check(public, signature.sig, _REQUEST_SIGNATURE + digest, what)
    return signature.key


def sign_answer(answer: Answer, request: Request, key: SigningKey) -> Answer:
    """``answer`` to ``request`` signed by ``key``, bound to the request's digest, with
    ``responder`` set to the key's name. Sign the answer as it will be stored (after
    :func:`toolnexus._schema.check_answer` filled in defaults).

    Raises:
        InvalidAnswer: ``answer.id`` is not ``request.id``, or ``data`` cannot be encoded.
    """
    if answer.id != request.id:
        raise InvalidAnswer(f"answer id {answer.id!r} does not match request id {request.id!r}")
    digest = request_digest(request)
    sig = key.sign(_answer_message(answer, digest, key.name))
    signature = Signature(key=key.name, sig=sig, digest=digest)
    return msgspec.structs.replace(answer, responder=key.name, signature=signature)


def verify_answer(answer: Answer, request: Request, keyring: Keyring) -> str:
    """The name of the trusted key that signed ``answer`` for exactly ``request``.

    Raises:
        SignatureError: with ``reason`` ``"missing signature"``, ``"unknown key 'x'"``,
            ``"bad signature"`` (a signed field was changed, or forged), ``"signed for
            another request"`` (another id, or another prompt, deadline, ... than
            ``request``'s) or ``"responder name does not match key"``.
    """
    return _verify_answer(answer, request.id, functools.partial(request_digest, request), keyring)


def verify_answer_digest(answer: Answer, request_id: str, digest: bytes, keyring: Keyring) -> str:
    """As :func:`verify_answer`, for the request of ``request_id`` known by its digest
    (:func:`request_digest`) alone: an audit record keeps no more of a large request
    than its digest and an excerpt.

    Raises:
        SignatureError: as :func:`verify_answer`.
    """
    return _verify_answer(answer, request_id, lambda: digest, keyring)


def _verify_answer(
    answer: Answer, request_id: str, digest: Callable[[], bytes], keyring: Keyring
) -> str:
    """:func:`verify_answer`, the request's ``digest()`` computed only once the answer's
    own signature checked out."""
    what = f"answer to {request_id!r}"
    signature, public = _trusted(answer.signature, keyring, what)
    if signature.digest is None:
        raise SignatureError(what, "bad signature")
    _check(public, signature.sig, _answer_message(answer, signature.digest, signature.key), what)
    if answer.id != request_id or signature.digest != digest():
        raise SignatureError(what, "signed for another request")
    if answer.responder is not None and answer.responder != signature.key:
        raise SignatureError(what, "responder name does not match key")
    return signature.key


def payload_digest(payload: bytes) -> bytes:
    """SHA-256 over a request exactly as published (its encoded bytes): what a refusal
    (:func:`sign_refusal`) is bound to, since a responder refuses bytes it may not be able
    to read as a request."""
    return hashlib.sha256(_REQUEST_BYTES + payload).digest()


def _refusal_message(request_id: str, digest: bytes, reason: str, key: str) -> bytes:
    fields = {"id": request_id, "request": digest, "reason": reason, "key": key}
    return _REFUSAL_SIGNATURE + _canonical(fields, "answer")


def sign_refusal(request_id: str, payload: bytes, reason: str, key: SigningKey) -> Signature:
    """A responder's signature on its refusal of the request published as ``payload``
    (its id ``request_id``), for ``reason``: bound to those bytes (:func:`payload_digest`)."""
    digest = payload_digest(payload)
    sig = key.sign(_refusal_message(request_id, digest, reason, key.name))
    return Signature(key=key.name, sig=sig, digest=digest)


def verify_refusal(
    request_id: str, payload: bytes, reason: str, signature: Signature | None, keyring: Keyring
) -> str:
    """The name of the trusted key that refused exactly the request this waiter published as
    ``payload``, for exactly ``reason``.

    Raises:
        SignatureError: ``"missing signature"``, ``"unknown key 'x'"``, ``"bad signature"``
            or ``"signed for another request"``.
    """
    what = f"refusal of {request_id!r}"
    signature, public = _trusted(signature, keyring, what)
    if signature.digest is None:
        raise SignatureError(what, "bad signature")
    _check(
        public,
        signature.sig,
        _refusal_message(request_id, signature.digest, reason, signature.key),
        what,
    )
    if signature.digest != payload_digest(payload):
        raise SignatureError(what, "signed for another request")
    return signature.key


def _own_message(kind: str, fields: Mapping[str, Any], key: str) -> bytes:
    return _OWN_SIGNATURE + _CANONICAL.encode({"kind": kind, "fields": fields, "key": key})


def sign_own(kind: str, fields: Mapping[str, Any], key: SigningKey) -> Signature:
    """``key``'s signature on a record this process keeps for itself in Redis, of kind
    ``kind`` (``"mcp-task"``), over ``fields`` (msgpack-encodable; sorted) and the key's
    name: only a process holding the key makes one, and :func:`verify_own` refuses it for
    any other kind or fields (bind what the record is for among them)."""
    return Signature(key=key.name, sig=key.sign(_own_message(kind, fields, key.name)))


def verify_own(
    kind: str, fields: Mapping[str, Any], signature: Signature | None, key: SigningKey, what: str
) -> None:
    """Check that ``key`` itself signed exactly ``fields`` as a record of kind ``kind``.

    Raises:
        SignatureError: about ``what``, with ``reason`` ``"missing signature"``, ``"signed
            by key 'x', not this process's 'y'"`` or ``"bad signature"`` (a field was
            changed, or the record was made for something else).
    """
    if signature is None:
        raise SignatureError(what, "missing signature")
    if signature.key != key.name:
        raise SignatureError(
            what, f"signed by key {signature.key!r}, not this process's {key.name!r}"
        )
    _check(_public_raw(key.public_key), signature.sig, _own_message(kind, fields, key.name), what)


# -- who may answer -----------------------------------------------------------------


@functools.lru_cache(maxsize=1024)
def _pattern(pattern: str) -> re.Pattern[str]:
    return re.compile(".*".join(re.escape(part) for part in pattern.split("*")), re.S)


def allowed(allow: Sequence[str] | None, responder: str | None, person: str | None) -> bool:
    """Whether an allow-list admits this responder (key name) or this person.

    Entries are exact names or patterns where ``*`` stands for any text (``slack:*``,
    ``web:*@ops.example.com``). ``None`` or an empty list admits everyone.
    """
    if not allow:
        return True
    names = [name for name in (responder, person) if name]
    return any(_pattern(entry).fullmatch(name) for entry in allow for name in names)
