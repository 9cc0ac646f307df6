"""The question builtin (SPEC §10): free text, a choice or a form, through one wait_for."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator
from typing import Any

import pytest
from jsonschema import Draft202012Validator

import toolnexus
from mcp_helpers import FAST, FILLED, FORM, WITH_DEFAULTS, answering
from toolnexus import (
    QUESTION_TOOL,
    Answer,
    Broker,
    InvalidAnswer,
    InvalidRequest,
    Pending,
    QuestionResult,
    Request,
    Source,
    question,
    question_tool,
)
from toolnexus._question import question_schema


def replying(data: Any = None, *, ok: bool = True, reason: str | None = None) -> Any:
    """A local wait_for giving one answer; ``.asked`` holds the requests."""
    asked: list[Request] = []

    async def wait_for(request: Request) -> Answer:
        asked.append(request)
        return Answer(id=request.id, ok=ok, data=data, reason=reason)

    wait_for.asked = asked  # type: ignore[attr-defined]
    return wait_for


async def test_free_text() -> None:
    wait_for = replying({"answer": "Paris"})
    result = await question("Where to?", wait_for=wait_for, agent="a-1", timeout_s=30)
    assert result == QuestionResult(ok=True, answer="Paris")
    [request] = wait_for.asked
    assert request.kind == "input" and request.prompt == "Where to?"
    assert request.id.startswith("qst-")
    assert request.source == Source(tool="question", agent="a-1")
    assert request.expires_at == pytest.approx(request.created_at + 30)
    assert request.schema == {
        "type": "object",
        "properties": {"answer": {"type": "string", "title": "Answer"}},
        "required": ["answer"],
    }


async def test_a_choice_and_several_choices() -> None:
    one = await question("Region?", options=["eu", "us"], wait_for=replying({"answer": "us"}))
    assert one.answer == "us"
    many = await question(
        "Regions?", options=["eu", "us"], multiple=True, wait_for=replying({"answer": ["eu"]})
    )
    assert many.answer == ["eu"]


async def test_a_schema_answer_gets_its_defaults() -> None:
    result = await question("Details?", schema=FORM, wait_for=replying(FILLED))
    assert result == QuestionResult(ok=True, answer=WITH_DEFAULTS)


@pytest.mark.parametrize("reason", ["declined", "dismissed", "expired"])
async def test_no_answer_is_a_result_not_an_exception(reason: str) -> None:
    result = await question("Sure?", wait_for=replying(ok=False, reason=reason))
    assert result == QuestionResult(ok=False, reason=reason)
    assert result.to_dict() == {"ok": False, "reason": reason}


async def test_a_wait_for_that_breaks_the_form_is_misuse() -> None:
    with pytest.raises(InvalidAnswer):
        await question("Region?", options=["eu"], wait_for=replying({"answer": "mars"}))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"options": ["a"], "schema": FORM},
        {"options": []},
        {"options": ["a", 2]},
        {"multiple": True},
        {"schema": {"type": "object", "properties": {"x": {"type": "object"}}}},
    ],
)
def test_arguments_that_make_no_question_are_refused(kwargs: dict[str, Any]) -> None:
    with pytest.raises(InvalidRequest):
        question_schema(**kwargs)


async def test_an_empty_prompt_is_refused() -> None:
    with pytest.raises(InvalidRequest):
        await question("  ", wait_for=replying())


def test_the_tool_description_is_valid_and_matches_the_callable() -> None:
    assert set(QUESTION_TOOL) == {"name", "description", "inputSchema"}
    Draft202012Validator.check_schema(QUESTION_TOOL["inputSchema"])
    tool = question_tool(replying())
    assert tool.__name__ == "question"
    assert set(inspect.signature(tool).parameters) == set(
        QUESTION_TOOL["inputSchema"]["properties"]
    )


async def test_the_tool_returns_json_for_the_model() -> None:
    tool = question_tool(replying({"answer": "eu"}), agent="a-2")
    assert await tool(prompt="Region?", options=["eu", "us"]) == {"ok": True, "answer": "eu"}
    assert await tool(prompt="Region?", options=[]) == {
        "ok": False,
        "error": "options must be a non-empty list of strings",
    }


@pytest.fixture
async def rbroker(redis_url: str, namespace: str) -> AsyncIterator[Broker]:
    async with toolnexus.connect(redis_url, namespace=namespace, **FAST) as broker:
        yield broker


@pytest.mark.redis
async def test_a_question_through_redis(rbroker: Broker) -> None:
    async def pick(pending: Pending) -> None:
        await pending.accept({"answer": ["us", "eu"]})

    async with answering(rbroker, pick) as seen:
        result = await question(
            "Where should we deploy?",
            options=["eu", "us", "ap"],
            multiple=True,
            wait_for=rbroker.wait_for,
            agent="deployer",
        )
    assert result == QuestionResult(ok=True, answer=["us", "eu"])
    assert seen[0].source == Source(tool="question", agent="deployer")


@pytest.mark.redis
async def test_an_unanswered_question_through_redis_expires(rbroker: Broker) -> None:
    async with asyncio.timeout(5):
        result = await question("Anyone?", wait_for=rbroker.wait_for, timeout_s=0.3)
    assert result == QuestionResult(ok=False, reason="expired")
