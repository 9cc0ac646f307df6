"""The wire codec (SPEC §10): round trips, schema evolution, and clear refusals."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from toolnexus import Answer, Event, Request, Source
from toolnexus.codec import JSON, MSGPACK, PROTOCOL, READS, Codec
from toolnexus.errors import ConfigurationError, DecodeError
from toolnexus.models import AnsweredEvent

CODECS = [MSGPACK, JSON]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)

requests = st.builds(
    Request,
    id=st.text(min_size=1, max_size=40),
    kind=st.sampled_from(["input", "authorization", "approval", "custom"]),
    prompt=st.text(max_size=200),
    data=json_values,
    url=st.none() | st.just("https://example.com/oauth?state=1"),
    source=st.builds(
        Source, server=st.none() | st.text(max_size=10), tool=st.none() | st.text(max_size=10)
    ),
    expires_at=st.none() | st.floats(0, 2e9),
    meta=st.dictionaries(st.text(max_size=8), json_values, max_size=3),
)
answers = st.builds(
    Answer,
    id=st.text(min_size=1, max_size=40),
    ok=st.booleans(),
    data=json_values,
    reason=st.none() | st.sampled_from(["declined", "dismissed", "expired", "withdrawn"]),
)


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.format)
@given(message=requests | answers)
@pytest.mark.slow
def test_every_message_survives_a_round_trip(codec: Codec, message: Request | Answer) -> None:
    assert codec.decode(codec.encode(message)) == message


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.format)
def test_events_round_trip_with_their_answer(codec: Codec) -> None:
    event = AnsweredEvent(id="elc-1", answer=Answer(id="elc-1", ok=True, data={"a": 1}))
    assert codec.decode_as(codec.encode(event), Event) == event


def test_the_protocol_number_leads_every_message() -> None:
    answer = Answer(id="a", ok=True, answered_at=1.0)
    raw = msgspec.json.decode(JSON.encode(answer))
    assert raw[0] == PROTOCOL == 2 and raw[1]["type"] == "answer"
    previous = msgspec.json.decode(JSON.writing(1).encode(answer))
    assert previous[0] == 1 and previous[1] == raw[1]
    assert msgspec.json.decode(JSON.encode(answer, 1))[0] == 1


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.format)
@pytest.mark.parametrize("protocol", READS)
def test_either_protocol_is_read_and_the_caller_told_which(codec: Codec, protocol: int) -> None:
    answer = Answer(id="a", ok=True, answered_at=1.0)
    data = codec.writing(protocol).encode(answer)
    assert codec.decode_with_protocol(data) == (protocol, answer)
    assert codec.decode_as_with_protocol(data, Answer) == (protocol, answer)
    assert codec.writing(protocol).decode(data) == answer


def test_a_codec_writes_only_a_protocol_this_toolnexus_writes() -> None:
    with pytest.raises(ConfigurationError, match=r"write_protocol=3 .* give 1 or 2"):
        Codec("msgpack", protocol=3)


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.format)
def test_fields_from_a_newer_peer_are_ignored_and_missing_ones_defaulted(codec: Codec) -> None:
    encode = msgspec.msgpack.encode if codec is MSGPACK else msgspec.json.encode
    newer = encode(
        [
            1,
            {
                "type": "request",
                "id": "r1",
                "kind": "input",
                "priority": 9,
                "source": {"server": "s", "region": "eu"},
            },
        ]
    )
    request = codec.decode_as(newer, Request)
    assert (request.id, request.kind, request.prompt, request.source) == (
        "r1",
        "input",
        "",
        Source(server="s"),
    )
    assert request.meta == {} and request.reply_to is None


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"\xc1", "not a msgpack message"),
        (msgspec.msgpack.encode({"id": "x"}), r"not a msgpack message|not a toolnexus message"),
        (
            msgspec.msgpack.encode([1, {"type": "nope", "id": "x"}]),
            r"not a toolnexus message.*\$\[1\]\.type",
        ),
        (
            msgspec.msgpack.encode([1, {"type": "answer", "ok": True}]),
            "missing required field `id`",
        ),
        (
            msgspec.msgpack.encode([1, {"type": "answer", "id": 5, "ok": True}]),
            r"Expected `str`, got `int`",
        ),
        (
            msgspec.msgpack.encode([3, {"type": "answer", "ok": True}]),
            r"protocol 3 is newer than this toolnexus reads \(1, 2\): upgrade this process",
        ),
        (
            msgspec.msgpack.encode([0, {"type": "answer", "id": "a", "ok": True}]),
            "0 is not a protocol number",
        ),
        (  # a well-formed message of a newer protocol is refused, not read as ours
            msgspec.msgpack.encode([3, {"type": "answer", "id": "a", "ok": True}]),
            r"message: protocol 3 is newer than this toolnexus reads \(1, 2\): upgrade this",
        ),
    ],
)
def test_garbage_is_refused_with_a_message_naming_what_is_wrong(data: bytes, message: str) -> None:
    with pytest.raises(DecodeError, match=message):
        MSGPACK.decode(data)


def test_oversized_input_is_refused_before_decoding() -> None:
    small = Codec("msgpack", max_bytes=64)
    payload = MSGPACK.encode(Request(id="r", kind="input", prompt="x" * 100))
    with pytest.raises(
        DecodeError, match=rf"message of {len(payload)} bytes exceeds the limit of 64 bytes"
    ):
        small.decode(payload)


def test_decode_as_names_the_type_it_got() -> None:
    with pytest.raises(DecodeError, match="expected a request message, got 'answer'"):
        MSGPACK.decode_as(MSGPACK.encode(Answer(id="a", ok=True)), Request)


def test_json_decodes_text_too() -> None:
    answer = JSON.decode_as(
        '[1, {"type": "answer", "id": "a", "ok": false, "reason": "declined"}]', Answer
    )
    assert (answer.id, answer.ok, answer.reason) == ("a", False, "declined")
