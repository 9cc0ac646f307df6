"""The one place that turns messages into bytes and back.

Every message travels as a two-element array ``[protocol, message]`` in msgpack (the
default) or JSON: the number of the protocol it was written in (see
:mod:`toolnexus.protocol`; a codec writes its ``protocol``, or the one an ``encode`` call
names, and reads every protocol of :data:`~toolnexus.protocol.READS`). Messages are
tagged (``"type": "request"``...), so one reused decoder reads any of them; fields a newer
peer added are ignored and fields an older peer omits take their defaults. Protocols 1
and 2 encode a message alike: only the number differs.

    >>> from toolnexus.codec import MSGPACK
    >>> MSGPACK.decode(MSGPACK.encode(Answer(id="req-1", ok=True))).ok
    True
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final, Literal, TypeVar

import msgspec

from ._wire10 import (
    Request10,
    answer_from_json,
    answer_to_dict,
    answer_to_json,
    as_request,
    request_from_json,
    request_to_dict,
    request_to_json,
)
from .errors import (
    ConfigurationError,
    DecodeError,
    InvalidAnswer,
    InvalidRequest,
    ToolnexusError,
)
from .models import EVENTS, Answer, Event, Heartbeat, Message, Request
from .protocol import PREVIOUS_PROTOCOL, PROTOCOL, READS, check_read, check_write_protocol, newer

MAX_MESSAGE_BYTES: Final = 1024 * 1024  # default size limit of one encoded message

Format = Literal["msgpack", "json"]
M = TypeVar("M", Request, Answer, Heartbeat)

_Envelope = tuple[int, Message]


class Codec:
    """Encodes and decodes every message: requests, answers, events and heartbeats.

    Decoders are created once per codec and reused. ``max_bytes`` bounds what
    :meth:`decode` accepts; ``protocol`` is the one it writes unless told otherwise.

    Raises:
        ConfigurationError: ``protocol`` is not one this toolnexus writes.
    """

    def __init__(
        self,
        format: Format = "msgpack",
        *,
        max_bytes: int = MAX_MESSAGE_BYTES,
        protocol: int = PROTOCOL,
    ) -> None:
        self.format: Format = format
        self.max_bytes = max_bytes
        self.protocol = check_write_protocol(protocol)
        mod: Any = msgspec.msgpack if format == "msgpack" else msgspec.json
        self._encoder = mod.Encoder()
        self._decoder = mod.Decoder(_Envelope)
        self._raw = mod.Decoder()
        self._writing: dict[int, Codec] = {self.protocol: self}

    def __repr__(self) -> str:
        return f"Codec({self.format!r}, max_bytes={self.max_bytes}, protocol={self.protocol})"

    def writing(self, protocol: int) -> Codec:
        """This codec, or one like it that writes ``protocol``.

        Raises:
            ConfigurationError: ``protocol`` is not one this toolnexus writes.
        """
        codec = self._writing.get(protocol)
        if codec is None:
            codec = Codec(self.format, max_bytes=self.max_bytes, protocol=protocol)
            codec._writing = self._writing
            self._writing[protocol] = codec
        return codec

    def encode(self, message: Message, protocol: int | None = None) -> bytes:
        """Encode one message in ``protocol`` (by default this codec's), its number
        included.

        Raises:
            InvalidRequest: a request or event with a field that cannot be encoded (see
                :data:`ENCODING_ERRORS`); the message names the field.
            InvalidAnswer: the same for an answer.
            ConfigurationError: the same for a heartbeat (its ``info``).
        """
        try:
            data: bytes = self._encoder.encode((protocol or self.protocol, message))
        except ENCODING_ERRORS as exc:
            raise unencodable(message, exc) from exc
        return data

    def encode_request(self, request: Request, protocol: int | None = None) -> bytes:
        """Encode a request to publish, refusing one over the size limit.

        Raises:
            InvalidRequest: a field cannot be encoded, or the encoded request is larger
                than ``max_bytes``.
        """
        data = self.encode(request, protocol)
        if len(data) > self.max_bytes:
            raise InvalidRequest(
                f"request {request.id!r} is {len(data)} bytes encoded, over the limit of "
                f"{self.max_bytes} bytes"
            )
        return data

    def decode(self, data: bytes | bytearray | memoryview | str) -> Message:
        """Decode one message, written in any protocol of :data:`READS`.

        Raises:
            DecodeError: the input is oversized, not this format, not a message of a known
                type, or written in a protocol newer than this toolnexus reads; the message
                says which.
        """
        return self.decode_with_protocol(data)[1]

    def decode_with_protocol(self, data: bytes | bytearray | memoryview | str) -> _Envelope:
        """Decode one message: the protocol it was written in, and the message.

        Raises:
            DecodeError: as :meth:`decode`.
        """
        if isinstance(data, str):
            data = data.encode()
        if len(data) > self.max_bytes:
            raise DecodeError(
                f"message of {len(data)} bytes exceeds the limit of {self.max_bytes} bytes"
            )
        try:
            envelope: _Envelope = self._decoder.decode(data)
        except msgspec.DecodeError as exc:
            raise DecodeError(self._explain(data, exc)) from exc
        check_read(envelope[0], "message")
        return envelope

    def encode_answer(self, answer: Answer, protocol: int | None = None) -> bytes:
        """Encode an answer a responder gives, refusing one over the size limit.

        Raises:
            InvalidAnswer: a field cannot be encoded, or the encoded answer is larger than
                ``max_bytes``.
        """
        data = self.encode(answer, protocol)
        if len(data) > self.max_bytes:
            raise InvalidAnswer(
                f"the answer is {len(data)} bytes encoded, over the limit of {self.max_bytes} "
                "bytes: send less data",
                rule="maxBytes",
            )
        return data

    def decode_as(self, data: bytes | bytearray | memoryview | str, cls: type[M]) -> M:
        """Decode one message that must be of type ``cls``.

        Raises:
            DecodeError: as :meth:`decode`, or the message is another type.
        """
        return self.decode_as_with_protocol(data, cls)[1]

    def decode_as_with_protocol(
        self, data: bytes | bytearray | memoryview | str, cls: type[M]
    ) -> tuple[int, M]:
        """Decode one message that must be of type ``cls``: the protocol it was written in,
        and the message.

        Raises:
            DecodeError: as :meth:`decode_as`.
        """
        protocol, message = self.decode_with_protocol(data)
        if not isinstance(message, cls):
            expected = getattr(cls, "__name__", "event").lower()  # (Event is a union)
            raise DecodeError(
                f"expected a {expected} message, got {type(message).__name__.lower()!r}"
            )
        return protocol, message

    def decode_event(self, data: bytes | bytearray | memoryview | str) -> Event:
        """Decode one event (any of :data:`~toolnexus.models.Event`'s structs).

        Raises:
            DecodeError: as :meth:`decode`, or the message is not an event.
        """
        message = self.decode(data)
        if not isinstance(message, EVENTS):
            raise DecodeError(f"expected an event message, got {type(message).__name__.lower()!r}")
        return message

    def newer(self, data: bytes | bytearray | memoryview | str) -> bool:
        """Whether ``data`` looks like a message of a protocol newer than this toolnexus
        reads (a two-element array whose first is a larger number): a newer process can
        read it, so a reader that cannot leaves it be rather than remove it."""
        if isinstance(data, str):
            data = data.encode()
        try:
            raw = self._raw.decode(data)
        except msgspec.DecodeError:
            return False
        return (
            isinstance(raw, list)
            and len(raw) == 2
            and isinstance(raw[0], int)
            and not isinstance(raw[0], bool)
            and raw[0] > PROTOCOL
        )

    def _explain(self, data: bytes | bytearray | memoryview, exc: msgspec.DecodeError) -> str:
        try:
            raw = self._raw.decode(data)
        except msgspec.DecodeError:
            return f"not a {self.format} message: {exc}"
        if self.newer(data):
            return newer(raw[0], "message")
        return f"not a toolnexus message: {exc}"


ENCODING_ERRORS: Final = (
    msgspec.EncodeError,
    TypeError,
    ValueError,
    OverflowError,
    RecursionError,
)
"""What msgspec raises for a value it cannot encode: a type it does not know, text that
is not Unicode (a lone surrogate: ``UnicodeEncodeError``, a ``ValueError``), an integer
beyond 64 bits, nesting too deep."""

_PLAIN = msgspec.msgpack.Encoder()


def unencodable_field(fields: Iterable[tuple[str, Any]]) -> str | None:
    """The name of the first of ``fields`` (name, value) whose value cannot be encoded."""
    for name, value in fields:
        try:
            _PLAIN.encode(value)
        except ENCODING_ERRORS:
            return name
    return None


def unencodable(message: Message, exc: BaseException) -> ToolnexusError:
    """The error for ``message``, which cannot be encoded (``exc`` says why): naming the
    field at fault; :class:`InvalidAnswer` for an answer, :class:`ConfigurationError` for a
    heartbeat, else :class:`InvalidRequest`."""
    names = message.__struct_fields__
    field = unencodable_field((name, getattr(message, name)) for name in names)
    what = type(message).__name__.lower()
    text = f"{what} field {field!r}" if field else f"this {what}"
    problem = f"{text} cannot be encoded: {type(exc).__name__}: {exc}"
    if isinstance(message, Answer):
        return InvalidAnswer(problem, rule="encodable")
    if isinstance(message, Heartbeat):
        return ConfigurationError(problem)
    return InvalidRequest(problem)


MSGPACK: Final = Codec("msgpack")
JSON: Final = Codec("json")


__all__ = [
    "ENCODING_ERRORS",
    "JSON",
    "MAX_MESSAGE_BYTES",
    "MSGPACK",
    "PREVIOUS_PROTOCOL",
    "PROTOCOL",
    "READS",
    "Codec",
    "Format",
    "Request10",
    "answer_from_json",
    "answer_to_dict",
    "answer_to_json",
    "as_request",
    "request_from_json",
    "request_to_dict",
    "request_to_json",
    "unencodable",
    "unencodable_field",
]
