"""Codec: encode + decode of a typical Request and Answer.

``toolnexus.codec.MSGPACK`` (the wire default) and ``toolnexus.codec.JSON``
against stdlib ``json`` of the same message as a dict, and pydantic v2 models of
the same shape (``model_validate_json`` / ``dump_json``). Each figure is the best
of ``repeats`` loops of ``n`` calls, per call.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from functools import partial
from typing import Any, Literal

from bench.common import ANSWER_DATA, PAYLOAD, CaseResult, CodecRow


def _best_per_call_us(fn: Callable[[], object], n: int, repeats: int) -> float:
    best = float("inf")
    clock = time.perf_counter_ns
    for _ in range(repeats):
        t0 = clock()
        for _ in range(n):
            fn()
        best = min(best, (clock() - t0) / n)
    return best / 1000.0


def _decode_as(codec: Any, cls: type[Any], data: bytes) -> object:
    return codec.decode_as(data, cls)


def _json_encode(value: Any) -> bytes:
    return json.dumps(value).encode()


def _pydantic_models() -> tuple[Any, Any]:
    from pydantic import BaseModel, Field

    class SourceModel(BaseModel):
        server: str | None = None
        tool: str | None = None
        agent: str | None = None

    class RequestModel(BaseModel):
        type: Literal["request"] = "request"
        id: str
        kind: str
        prompt: str = ""
        data: Any = None
        url: str | None = None
        source: SourceModel = Field(default_factory=SourceModel)
        created_at: float
        expires_at: float | None = None
        reply_to: str | None = None
        trace: dict[str, str] | None = None
        meta: dict[str, Any] = Field(default_factory=dict)

    class AnswerModel(BaseModel):
        type: Literal["answer"] = "answer"
        id: str
        ok: bool
        data: Any = None
        reason: str | None = None
        responder: str | None = None
        answered_at: float
        meta: dict[str, Any] = Field(default_factory=dict)

    return RequestModel, AnswerModel


def codec_case(url: str, params: dict[str, Any]) -> CaseResult:
    import msgspec
    from pydantic import TypeAdapter

    import toolnexus
    from toolnexus.codec import JSON, MSGPACK
    from toolnexus.models import new_id

    n, repeats = int(params["n"]), int(params["repeats"])
    now = time.time()
    request = toolnexus.Request(
        id=new_id(),
        kind="input",
        prompt="Approve the production deploy?",
        data=PAYLOAD,
        source=toolnexus.Source(server="ops-mcp", tool="deploy", agent="agent-7f3a"),
        created_at=now,
        expires_at=now + 600,
        reply_to="5f0c2a7e9b1d4c3a",
    )
    answer = toolnexus.Answer(
        id=request.id, ok=True, data=ANSWER_DATA, responder="auto/host-1", answered_at=now + 1
    )
    request_model, answer_model = _pydantic_models()
    rows: list[CodecRow] = []
    for name, message, cls, model in (
        ("Request", request, toolnexus.Request, request_model),
        ("Answer", answer, toolnexus.Answer, answer_model),
    ):
        as_dict = msgspec.to_builtins(message)
        instance = model.model_validate(as_dict)
        adapter: Any = TypeAdapter(model)
        cases: list[tuple[str, Callable[[], bytes], Callable[[bytes], object]]] = [
            (
                "toolnexus MSGPACK",
                partial(MSGPACK.encode, message),
                partial(_decode_as, MSGPACK, cls),
            ),
            ("toolnexus JSON", partial(JSON.encode, message), partial(_decode_as, JSON, cls)),
            ("stdlib json (dict)", partial(_json_encode, as_dict), json.loads),
            ("pydantic v2 (JSON)", partial(adapter.dump_json, instance), model.model_validate_json),
        ]
        for codec_name, encode, decode in cases:
            data = encode()
            check = decode(data)
            if check is None:
                raise RuntimeError(f"{codec_name} decoded nothing")
            rows.append(
                CodecRow(
                    codec=codec_name,
                    message=name,
                    bytes=len(data),
                    n=n,
                    encode_us=_best_per_call_us(encode, n, repeats),
                    decode_us=_best_per_call_us(partial(decode, data), n, repeats),
                )
            )
    return CaseResult(
        case="codec",
        variant="",
        settings=f"best of {repeats} loops of {n} calls",
        codec=rows,
    )
