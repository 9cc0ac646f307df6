"""Signatures (SPEC §11, Security): keys, keyrings, signed requests and answers, allow-lists,
and the configuration a process reads from its environment."""

from __future__ import annotations

import base64
import stat
from pathlib import Path
from typing import Any

import msgspec
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ec import SECP256R1, generate_private_key
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given
from hypothesis import strategies as st

from toolnexus import (
    Answer,
    ConfigurationError,
    Hop,
    InvalidAnswer,
    OnExpiry,
    Quorum,
    Request,
    Source,
)
from toolnexus.codec import JSON, MSGPACK, Codec
from toolnexus.errors import SignatureError
from toolnexus.models import Signature
from toolnexus.security import Keyring, Signatures, SigningKey
from toolnexus.security._signing import (
    allowed,
    request_digest,
    sign_answer,
    sign_request,
    verify_answer,
    verify_request,
)

CODECS = [MSGPACK, JSON]
AGENT = SigningKey.generate("agent-7")
BOT = SigningKey.generate("ops-bot")
AGENTS = Keyring.of(AGENT)
RESPONDERS = Keyring.of(BOT)


def published(**changes: Any) -> Request:
    """A request as a broker publishes it (deadline and reply route set), signed."""
    fields: dict[str, Any] = {
        "id": "req-1",
        "kind": "input",
        "prompt": "Drop table users?",
        "data": {"schema": {"type": "object", "properties": {"n": {"type": "integer"}}}},
        "source": Source(server="db", tool="drop", agent="agent-7"),
        "expires_at": 1_900_000_000.5,
        "reply_to": "waiter-1",
        **changes,
    }
    return sign_request(Request(**fields), AGENT)


def refused(call: Any, reason: str) -> None:
    with pytest.raises(SignatureError) as info:
        call()
    assert info.value.reason == reason


def raw_private(key: Ed25519PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )


def raw_public(key: SigningKey) -> bytes:
    return key.public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


# -- keys --------------------------------------------------------------------------------


def test_a_saved_key_loads_back_with_its_name_and_a_private_mode(tmp_path: Path) -> None:
    key_path, pub_path = BOT.save(tmp_path / "keys")
    assert (key_path.name, pub_path.name) == ("ops-bot.key", "ops-bot.pub")
    assert stat.S_IMODE(key_path.stat().st_mode) == 0o600
    assert key_path.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")
    loaded = SigningKey.load(key_path)
    assert loaded.name == "ops-bot" and loaded.public_line() == BOT.public_line()
    assert pub_path.read_text() == BOT.public_line() + "\n"
    assert SigningKey.load(key_path, name="web").name == "web"
    assert repr(loaded).startswith("<SigningKey ops-bot ")


def test_saving_never_replaces_a_key(tmp_path: Path) -> None:
    BOT.save(tmp_path)
    with pytest.raises(ConfigurationError, match=r"ops-bot\.key exists already"):
        SigningKey.generate("ops-bot").save(tmp_path)
    assert SigningKey.load(tmp_path / "ops-bot.key").public_line() == BOT.public_line()


def test_keys_load_from_raw_bytes_and_their_base64(tmp_path: Path) -> None:
    private = Ed25519PrivateKey.generate()
    (tmp_path / "raw.key").write_bytes(raw_private(private))
    (tmp_path / "text.key").write_text(base64.b64encode(raw_private(private)).decode() + "\n")
    expected = SigningKey("x", private).public_line().split()[1]
    for name in ("raw", "text"):
        key = SigningKey.load(tmp_path / f"{name}.key")
        assert key.name == name and key.public_line() == f"{name} {expected}"


def test_unusable_key_files_are_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match=r"cannot read signing key .*missing\.key"):
        SigningKey.load(tmp_path / "missing.key")
    (tmp_path / "junk.key").write_text("not a key")
    with pytest.raises(ConfigurationError, match=r"junk\.key: not an Ed25519 private key"):
        SigningKey.load(tmp_path / "junk.key")
    ec = generate_private_key(SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    (tmp_path / "ec.key").write_bytes(ec)
    with pytest.raises(
        ConfigurationError, match=r"ec\.key: not an Ed25519 key but a .*ECPrivateKey"
    ):
        SigningKey.load(tmp_path / "ec.key")
    encrypted = Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"secret"),
    )
    (tmp_path / "locked.key").write_bytes(encrypted)
    with pytest.raises(ConfigurationError, match=r"locked\.key: encrypted keys are not supported"):
        SigningKey.load(tmp_path / "locked.key")


@pytest.mark.parametrize("name", ["", "a b", "../etc", ".hidden", "x/y", "slack:bot"])
def test_key_names_are_plain_file_names(name: str) -> None:
    with pytest.raises(ConfigurationError, match="must start with a letter or digit"):
        SigningKey.generate(name)


# -- keyrings ----------------------------------------------------------------------------


def test_a_keyring_reads_a_directory_of_pub_files(tmp_path: Path) -> None:
    BOT.save(tmp_path)  # ops-bot.pub: "ops-bot KEY"
    web = SigningKey.generate("any")
    (tmp_path / "web.pub").write_text(base64.b64encode(raw_public(web)).decode())
    pem = SigningKey.generate("any")
    (tmp_path / "pem.pub").write_bytes(
        pem.public_key.public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    (tmp_path / "notes.txt").write_text("ignored")
    ring = Keyring.load(tmp_path)
    assert sorted(ring) == ["ops-bot", "pem", "web"]
    assert ring.get("web") == web.public_key and ring.get("pem") == pem.public_key


def test_a_keyring_reads_a_file_of_name_key_lines(tmp_path: Path) -> None:
    trusted = tmp_path / "trusted"
    trusted.write_text(f"# responders\n{BOT.public_line()}\n\n{AGENT.public_line()}  # agent\n")
    ring = Keyring.load(trusted)
    assert sorted(ring) == ["agent-7", "ops-bot"] and len(ring) == 2 and "ops-bot" in ring


@pytest.mark.parametrize(
    "line", ["ops-bot", "ops-bot notbase64!", "ops-bot AAAA", "a b c", "bad/name KEY"]
)
def test_a_malformed_trusted_keys_line_is_named_with_its_file_and_line(
    tmp_path: Path, line: str
) -> None:
    trusted = tmp_path / "trusted"
    key = base64.b64encode(raw_public(BOT)).decode()
    trusted.write_text(f"{AGENT.public_line()}\n{line.replace('KEY', key)}\n")
    with pytest.raises(ConfigurationError, match=r"trusted, line 2: "):
        Keyring.load(trusted)


def test_a_name_is_one_identity(tmp_path: Path) -> None:
    key = raw_public(BOT)
    twice = tmp_path / "twice"
    twice.write_text(f"{BOT.public_line()}\nalias {base64.b64encode(key).decode()}\n")
    with pytest.raises(ConfigurationError, match="the key of 'ops-bot' is also named 'alias'"):
        Keyring.load(twice)
    impostor = Keyring.of(SigningKey.generate("ops-bot"))
    with pytest.raises(ConfigurationError, match="two different keys are named 'ops-bot'"):
        RESPONDERS.merge(impostor)
    merged = RESPONDERS.merge(AGENTS).merge(RESPONDERS)
    assert sorted(merged) == ["agent-7", "ops-bot"] and len(RESPONDERS) == 1


def test_a_missing_or_binary_trusted_keys_path_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match=r"cannot read trusted keys .*nowhere: No such"):
        Keyring.load(tmp_path / "nowhere")
    (tmp_path / "binary").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ConfigurationError, match=r"binary: not text, so not trusted keys"):
        Keyring.load(tmp_path / "binary")


# -- signed requests ---------------------------------------------------------------------


def test_a_signed_request_verifies_as_its_agent() -> None:
    request = published()
    assert request.signature is not None and request.signature.key == "agent-7"
    assert verify_request(request, AGENTS) == "agent-7"


@pytest.mark.parametrize(
    "change",
    [
        {"id": "req-2"},
        {"kind": "approval"},
        {"prompt": "Order lunch?"},
        {"data": {"schema": {"type": "object"}}},
        {"url": "https://evil.example.com"},
        {"source": Source(server="db", tool="drop", agent="agent-8")},
        {"expires_at": 1_900_000_900.5},
        {"allow": ["mallory"]},
        {"reply_to": "waiter-2"},
    ],
    ids=lambda change: next(iter(change)),
)
def test_editing_any_signed_field_of_a_request_breaks_its_signature(change: dict[str, Any]) -> None:
    edited = msgspec.structs.replace(published(), **change)
    refused(lambda: verify_request(edited, AGENTS), "bad signature")


def test_unsigned_request_metadata_may_change_in_flight() -> None:
    edited = msgspec.structs.replace(
        published(), meta={"hops": 2}, trace={"traceparent": "00-1-2-01"}, created_at=1.0
    )
    assert verify_request(edited, AGENTS) == "agent-7"


def test_unsigned_untrusted_and_impostor_requests_are_refused() -> None:
    refused(lambda: verify_request(Request(id="r", kind="input"), AGENTS), "missing signature")
    refused(lambda: verify_request(published(), RESPONDERS), "unknown key 'agent-7'")
    impostor = sign_request(Request(id="req-1", kind="input"), SigningKey.generate("agent-7"))
    refused(lambda: verify_request(impostor, AGENTS), "bad signature")


def test_an_integer_deadline_signs_the_same_as_the_float_it_decodes_to() -> None:
    request = published(expires_at=1_900_000_000)
    for codec in CODECS:
        assert verify_request(codec.decode_as(codec.encode(request), Request), AGENTS)


def test_the_digest_covers_exactly_the_in_flight_fields() -> None:
    request = published()
    assert request_digest(request) == request_digest(
        msgspec.structs.replace(request, meta={"a": 1})
    )
    assert request_digest(request) != request_digest(msgspec.structs.replace(request, allow=[]))
    assert len(request_digest(request)) == 32


# -- signed answers ----------------------------------------------------------------------


def test_a_signed_answer_names_its_responder_and_verifies() -> None:
    request = published()
    answer = sign_answer(
        Answer(id="req-1", ok=True, data={"n": 1}, person="slack:U1"), request, BOT
    )
    assert answer.responder == "ops-bot" and answer.signature is not None
    assert answer.signature.digest == request_digest(request)
    assert verify_answer(answer, request, RESPONDERS) == "ops-bot"
    assert answer.answered_by == "ops-bot / slack:U1"


@pytest.mark.parametrize(
    "change",
    [{"ok": False}, {"data": {"n": 2}}, {"reason": "declined"}, {"person": "web:eve"}],
    ids=lambda change: next(iter(change)),
)
def test_editing_a_signed_answer_breaks_its_signature(change: dict[str, Any]) -> None:
    request = published()
    answer = sign_answer(Answer(id="req-1", ok=True, data={"n": 1}), request, BOT)
    edited = msgspec.structs.replace(answer, **change)
    refused(lambda: verify_answer(edited, request, RESPONDERS), "bad signature")
    later = msgspec.structs.replace(answer, answered_at=answer.answered_at + 1)
    refused(lambda: verify_answer(later, request, RESPONDERS), "bad signature")


def test_an_answer_copied_from_another_request_is_refused() -> None:
    other = published(id="req-2")
    answer = sign_answer(Answer(id="req-2", ok=True), other, BOT)
    request = published()
    refused(lambda: verify_answer(answer, request, RESPONDERS), "signed for another request")
    relabelled = msgspec.structs.replace(answer, id="req-1")
    refused(lambda: verify_answer(relabelled, request, RESPONDERS), "bad signature")


def test_an_answer_to_a_spoofed_prompt_is_refused_by_the_real_request() -> None:
    asked = published(prompt="Drop table users?")
    spoofed = msgspec.structs.replace(asked, prompt="Order lunch?")  # what the responder saw
    answer = sign_answer(Answer(id="req-1", ok=True, data={"n": 1}), spoofed, BOT)
    refused(lambda: verify_answer(answer, asked, RESPONDERS), "signed for another request")


def test_claims_that_the_signature_does_not_back_are_refused() -> None:
    request = published()
    unsigned = Answer(id="req-1", ok=True, responder="alice@ops")
    refused(lambda: verify_answer(unsigned, request, RESPONDERS), "missing signature")
    by_stranger = sign_answer(Answer(id="req-1", ok=True), request, SigningKey.generate("mallory"))
    refused(lambda: verify_answer(by_stranger, request, RESPONDERS), "unknown key 'mallory'")
    impostor = sign_answer(Answer(id="req-1", ok=True), request, SigningKey.generate("ops-bot"))
    refused(lambda: verify_answer(impostor, request, RESPONDERS), "bad signature")
    answer = sign_answer(Answer(id="req-1", ok=True), request, BOT)
    renamed = msgspec.structs.replace(answer, responder="web/security-officer")
    refused(
        lambda: verify_answer(renamed, request, RESPONDERS), "responder name does not match key"
    )
    assert answer.signature is not None
    undigested = msgspec.structs.replace(
        answer, signature=msgspec.structs.replace(answer.signature, digest=None)
    )
    refused(lambda: verify_answer(undigested, request, RESPONDERS), "bad signature")


def test_an_answer_is_signed_only_for_its_own_request() -> None:
    with pytest.raises(InvalidAnswer, match="answer id 'req-2' does not match request id 'req-1'"):
        sign_answer(Answer(id="req-2", ok=True), published(), BOT)


def test_a_signature_of_the_wrong_length_is_bad() -> None:
    request = published()
    assert request.signature is not None
    for sig in (request.signature.sig[:63], request.signature.sig + b"\0", b""):
        cut = msgspec.structs.replace(request, signature=Signature(key="agent-7", sig=sig))
        refused(lambda cut=cut: verify_request(cut, AGENTS), "bad signature")


# -- the wire format ---------------------------------------------------------------------

RFC_8032 = [  # RFC 8032 section 7.1, tests 1 and 2: secret key, public key, message, signature
    (
        "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60",
        "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a",
        "",
        "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e06522490155"
        "5fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b",
    ),
    (
        "4ccd089b28ff96da9db6c346ec114e0f5b8a319f35aba624da8cf6ed4fb8a6fb",
        "3d4017c3e843895a92b70aa74d1b7ebc9c982ccf2ec4968cc0cd55f12af4660c",
        "72",
        "92a009a9f0d4cab8720e820b5f642540a2b27b5416503f8fb3762223ebdb69da"
        "085ac1e43e15996e458f3613d0f11d8c387b2eaeb4302aeeb00d291612bb0c00",
    ),
]


@pytest.mark.parametrize(("secret", "public", "message", "signature"), RFC_8032)
def test_keys_sign_as_rfc_8032_says(secret: str, public: str, message: str, signature: str) -> None:
    key = SigningKey("rfc", Ed25519PrivateKey.from_private_bytes(bytes.fromhex(secret)))
    assert raw_public(key).hex() == public
    assert key.sign(bytes.fromhex(message)).hex() == signature


@given(message=st.binary(max_size=300))
def test_a_key_signs_exactly_as_openssl_does(message: bytes) -> None:
    private = Ed25519PrivateKey.generate()
    assert SigningKey("k", private).sign(message) == private.sign(message)


def test_requests_and_answers_signed_with_openssl_verify() -> None:
    """The documented messages, signed by ``cryptography`` (OpenSSL), as before."""
    agent, bot = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    keys = Keyring({"agent-7": agent.public_key(), "ops-bot": bot.public_key()})
    request = Request(id="req-1", kind="input", prompt="Deploy?", expires_at=1.9e9, reply_to="w-1")
    digest = request_digest(request)
    sig = agent.sign(b"toolnexus request signature v1\n" + digest)
    request = msgspec.structs.replace(request, signature=Signature(key="agent-7", sig=sig))
    assert verify_request(request, keys) == "agent-7"
    fields = {
        "id": "req-1",
        "ok": True,
        "data": {"n": 1},
        "reason": None,
        "person": "slack:U1",
        "answered_at": 1.9e9 + 1,
        "request": digest,
        "key": "ops-bot",
    }
    message = b"toolnexus answer signature v1\n" + msgspec.msgpack.Encoder(order="sorted").encode(
        fields
    )
    answer = Answer(
        id="req-1",
        ok=True,
        data={"n": 1},
        person="slack:U1",
        answered_at=1.9e9 + 1,
        signature=Signature(key="ops-bot", sig=bot.sign(message), digest=digest),
    )
    assert verify_answer(answer, request, keys) == "ops-bot"
    assert sign_answer(answer, request, SigningKey("ops-bot", bot)).signature == answer.signature


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.floats(-1e9, 1e9) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=10,
)


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.format)
@given(
    prompt=st.text(max_size=80),
    data=json_values,
    answer_data=json_values,
    allow=st.none() | st.lists(st.text(min_size=1, max_size=10), max_size=3),
    person=st.none() | st.text(max_size=20),
)
@pytest.mark.slow
def test_signatures_survive_the_wire(
    codec: Codec,
    prompt: str,
    data: Any,
    answer_data: Any,
    allow: list[str] | None,
    person: str | None,
) -> None:
    request = published(prompt=prompt, data=data, allow=allow)
    answer = sign_answer(Answer(id="req-1", ok=True, data=answer_data, person=person), request, BOT)
    request_there = codec.decode_as(codec.encode(request), Request)
    answer_back = codec.decode_as(codec.encode(answer), Answer)
    assert verify_request(request_there, AGENTS) == "agent-7"
    assert verify_answer(answer_back, request, RESPONDERS) == "ops-bot"


def test_json_carries_signatures_as_base64() -> None:
    request = published()
    assert request.signature is not None
    wire = msgspec.json.decode(JSON.encode(request))[1]["signature"]
    assert wire == {"key": "agent-7", "sig": base64.b64encode(request.signature.sig).decode()}


def test_peers_without_signature_fields_read_signed_messages() -> None:
    class OldAnswer(msgspec.Struct, tag="answer", tag_field="type"):
        id: str
        ok: bool

    answer = sign_answer(Answer(id="req-1", ok=True), published(), BOT)
    old = msgspec.msgpack.decode(MSGPACK.encode(answer), type=tuple[int, OldAnswer])[1]
    assert (old.id, old.ok) == ("req-1", True)
    assert MSGPACK.decode_as(msgspec.msgpack.encode((1, old)), Answer).signature is None


# -- who may answer ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("allow", "responder", "person", "expected"),
    [
        (None, "anyone", None, True),
        ([], None, None, True),
        (["ops-bot"], "ops-bot", None, True),
        (["ops-bot"], "ops-bot2", None, False),
        (["slack:*"], "slack-bridge", "slack:U123", True),
        (["slack:*"], "slack-bridge", "web:alice", False),
        (["web:*@ops.example.com"], "web", "web:alice@ops.example.com", True),
        (["web:*@ops.example.com"], "web", "web:alice@ops.example.com.evil", False),
        (["web:*@ops.example.com"], "web", "web:alice@opsXexample.com", False),
        (["a.b"], "axb", None, False),
        (["ops-bot", "slack:*"], None, "slack:U9", True),
        (["*"], None, None, False),
    ],
)
def test_allow_lists_match_names_and_simple_patterns(
    allow: list[str] | None, responder: str | None, person: str | None, expected: bool
) -> None:
    assert allowed(allow, responder, person) is expected


# -- configuration -----------------------------------------------------------------------


@pytest.fixture
def keys(tmp_path: Path) -> Path:
    BOT.save(tmp_path / "responders")
    AGENT.save(tmp_path / "agents")
    return tmp_path


def test_the_environment_configures_a_responder(keys: Path) -> None:
    signatures = Signatures.from_env(
        {
            "TOOLNEXUS_SIGNING_KEY": str(keys / "responders" / "ops-bot.key"),
            "TOOLNEXUS_TRUSTED_KEYS": str(keys / "agents"),
            "TOOLNEXUS_REQUIRE_SIGNATURES": "1",
        }
    )
    assert signatures.key is not None and signatures.key.name == "ops-bot"
    assert list(signatures.keyring) == ["agent-7"] and signatures.required
    assert signatures.admit_request(published()) == "agent-7"
    refused(lambda: signatures.admit_request(Request(id="r", kind="input")), "missing signature")


def test_the_signing_name_overrides_the_file_stem(keys: Path) -> None:
    signatures = Signatures.from_env(
        {
            "TOOLNEXUS_SIGNING_KEY": str(keys / "responders" / "ops-bot.key"),
            "TOOLNEXUS_SIGNING_NAME": "night-shift",
        }
    )
    assert signatures.key is not None and signatures.key.name == "night-shift"
    assert not signatures.required


def test_nothing_set_means_unsigned_and_advisory() -> None:
    signatures = Signatures.from_env({})
    request = Request(id="req-1", kind="approval", allow=["ops-bot"])
    assert signatures.sign_request(request) is request
    answer = Answer(id="req-1", ok=True, responder="ops-bot")
    assert signatures.sign_answer(answer, request) is answer
    assert signatures.admit_request(request) is None
    assert signatures.admit_answer(answer, request) is None  # the claim passes the list
    claimed_by_other = Answer(id="req-1", ok=True, responder="mallory")
    refused(lambda: signatures.admit_answer(claimed_by_other, request), "not allowed")


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("TOOLNEXUS_SIGNING_KEY", "missing.key", r"TOOLNEXUS_SIGNING_KEY: cannot read .*missing"),
        ("TOOLNEXUS_SIGNING_KEY", "agents/agent-7.pub", r"TOOLNEXUS_SIGNING_KEY: .*agent-7\.pub"),
        ("TOOLNEXUS_TRUSTED_KEYS", "nowhere", r"TOOLNEXUS_TRUSTED_KEYS: cannot read .*nowhere"),
        ("TOOLNEXUS_TRUSTED_KEYS", "agents/agent-7.key", r"TOOLNEXUS_TRUSTED_KEYS: .*7\.key"),
        ("TOOLNEXUS_REQUIRE_SIGNATURES", "sure", r"TOOLNEXUS_REQUIRE_SIGNATURES='sure'"),
    ],
)
def test_bad_settings_name_the_variable_and_the_file(
    keys: Path, variable: str, value: str, message: str
) -> None:
    resolved = value if variable.endswith("SIGNATURES") else str(keys / value)
    with pytest.raises(ConfigurationError, match=message):
        Signatures.from_env({variable: resolved})


def test_bad_pub_file_in_a_trusted_directory_is_named(keys: Path) -> None:
    (keys / "agents" / "broken.pub").write_text("agent-8 AAAA\n")
    with pytest.raises(ConfigurationError, match=r"TOOLNEXUS_TRUSTED_KEYS: .*broken\.pub, line 1"):
        Signatures.from_env({"TOOLNEXUS_TRUSTED_KEYS": str(keys / "agents")})


def test_required_signatures_need_a_key_and_trusted_keys(keys: Path) -> None:
    with pytest.raises(ConfigurationError, match="no signing key: set TOOLNEXUS_SIGNING_KEY"):
        Signatures.from_env({"TOOLNEXUS_REQUIRE_SIGNATURES": "1"})
    with pytest.raises(ConfigurationError, match="no trusted keys"):
        Signatures(key=BOT, required=True)


def test_options_override_the_environment(keys: Path) -> None:
    environ = {
        "TOOLNEXUS_SIGNING_KEY": str(keys / "agents" / "agent-7.key"),
        "TOOLNEXUS_TRUSTED_KEYS": str(keys / "agents"),
    }
    signatures = Signatures.configure(
        keys / "responders" / "ops-bot.key", AGENTS.merge(RESPONDERS), True, environ=environ
    )
    assert signatures.key is not None and signatures.key.name == "ops-bot"
    assert sorted(signatures.keyring) == ["agent-7", "ops-bot"] and signatures.required


def test_a_waiter_admits_only_allowed_verified_answers() -> None:
    waiter = Signatures(key=AGENT, keyring=RESPONDERS, required=True)
    request = waiter.sign_request(
        Request(id="req-1", kind="approval", reply_to="w", allow=["slack:*"])
    )
    responder = Signatures(key=BOT, keyring=AGENTS, required=True)
    assert responder.admit_request(request) == "agent-7"
    by_slack = responder.sign_answer(Answer(id="req-1", ok=True, person="slack:U1"), request)
    assert waiter.admit_answer(by_slack, request) == "ops-bot"
    by_web = responder.sign_answer(Answer(id="req-1", ok=True, person="web:bob"), request)
    refused(lambda: waiter.admit_answer(by_web, request), "not allowed")
    forged = Answer(id="req-1", ok=True, responder="ops-bot", person="slack:U1")
    refused(lambda: waiter.admit_answer(forged, request), "missing signature")


def test_the_digest_covers_the_beyond_fields_and_leaves_plain_requests_alone() -> None:
    """SPEC §14: quorum, escalation, default on expiry and durability are signed (a relay
    cannot lower a quorum), and a request without them keeps its old digest."""
    plain = Request(id="req-1", kind="approval", prompt="Deploy?")
    rich = msgspec.structs.replace(
        plain,
        quorum=Quorum(2),
        escalate=[Hop(900, "oncall")],
        on_expiry=OnExpiry(ok=True),
        durable=True,
    )
    digest = request_digest(rich)
    assert digest != request_digest(plain)
    # an int 900 and the 900.0 a reader decodes give one digest
    assert request_digest(msgspec.json.decode(msgspec.json.encode(rich), type=Request)) == digest
    for change in (
        {"quorum": Quorum(1)},
        {"quorum": Quorum(2, decline="count")},
        {"escalate": [Hop(900, "managers")]},
        {"on_expiry": OnExpiry(ok=False)},
        {"durable": False},
    ):
        assert request_digest(msgspec.structs.replace(rich, **change)) != digest, change
    bare = msgspec.structs.replace(rich, quorum=None, escalate=None, on_expiry=None, durable=False)
    assert request_digest(bare) == request_digest(plain)
