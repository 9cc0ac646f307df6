"""Single-use answer links (issue #29): tokens made by a sender's link key, taken by the HTTP
answering API at /v1/links/TOKEN over real HTTP and a real Redis, answers signed by the
API's key as the link's recipient."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx2 as httpx
import jsonschema
import pytest

import answering
from answering import Fleet, fleet, form_request
from test_http_api import schema
from toolnexus.security import SigningKey
from toolnexus_workers.links import LinkKey

pytestmark = pytest.mark.redis

PAGE = {"Accept": "text/html"}


setup, http = answering.setup, answering.http  # the fixtures (tests/answering.py)


async def test_a_link_answers_once_and_the_waiter_gets_exactly_that(
    setup: Fleet, http: httpx.AsyncClient
) -> None:
    request = form_request()
    wait = await setup.ask(request)
    url = setup.link(request, "alice@example.com")
    described = (await http.get(url)).json()
    jsonschema.validate(described, schema("LinkDescription"))  # as the OpenAPI document says
    assert described["request"]["id"] == request.id
    assert (described["recipient"], described["action"]) == ("alice@example.com", None)
    invalid = await http.post(url, json={"action": "accept", "data": {"name": "A"}})
    assert (invalid.status_code, invalid.json()["field"]) == (422, "name")
    sent = await http.post(url, json={"action": "accept", "data": {"name": "Ada", "guests": 2}})
    assert sent.json() == {"outcome": "answered"}
    answer = await asyncio.wait_for(wait, 30)
    assert (answer.ok, answer.data) == (True, {"name": "Ada", "guests": 2})
    assert (answer.person, answer.responder) == ("link:alice@example.com", "http-worker")
    again = await http.post(url, json={"action": "decline"})
    assert again.status_code == 410 and "used already" in again.json()["error"]


async def test_an_action_link_takes_only_its_action(setup: Fleet, http: httpx.AsyncClient) -> None:
    request = form_request(kind="approval", data=None, prompt="Deploy?")
    wait = await setup.ask(request)
    url = setup.link(request, "carol", action="accept")
    page = await http.get(url, headers=PAGE)
    assert page.status_code == 200 and "Deploy?" in page.text
    assert 'value="accept"' in page.text and 'value="decline"' not in page.text
    wrong = await http.post(url, json={"action": "decline"})
    assert wrong.status_code == 403 and "only accept" in wrong.json()["error"]
    assert not wait.done()
    done = await http.post(url, data={"action": "accept"}, headers=PAGE)  # the page's form
    assert done.status_code == 200 and "approved" in done.text
    answer = await asyncio.wait_for(wait, 30)
    assert (answer.ok, answer.person) == (True, "link:carol")


async def test_a_link_followed_after_the_request_ended_says_so_politely(
    setup: Fleet, http: httpx.AsyncClient
) -> None:
    request = form_request()
    wait = await setup.ask(request)
    url = setup.link(request, "dave")
    bearer = {"Authorization": f"Bearer {setup.bearer}"}
    answered = await http.post(
        f"{setup.server.url}/v1/requests/{request.id}/answer",
        json={"action": "accept", "data": {"name": "Alice"}},
        headers=bearer,
    )
    assert answered.status_code == 200
    assert (await asyncio.wait_for(wait, 30)).person == "http:alice"
    late = await http.post(url, json={"action": "decline"})
    assert late.status_code == 410
    assert late.json()["error"] == (
        "this request is closed, no answer is needed: Accepted by http:alice over HTTP."
    )
    page = await http.get(url, headers=PAGE)
    assert page.status_code == 410 and "no answer is needed" in page.text


async def test_a_tool_approval_page_shows_the_arguments_and_its_form_answers(
    redis_url: str, namespace: str, tmp_path: Path, http: httpx.AsyncClient
) -> None:
    """With an Ed25519 link key; the page's form sends the (edited) arguments."""
    key = SigningKey.generate("links")
    schema = {
        "type": "object",
        "properties": {
            "to": {"type": "string", "default": "ACME"},
            "amount": {"type": "integer", "default": 10},
        },
    }
    call = {"name": "transfer", "arguments": {"to": "ACME", "amount": 10}}
    async with fleet(redis_url, namespace, tmp_path, LinkKey(key=key)) as setup:
        request = form_request(
            kind="tool_call", prompt="May transfer run?", data={"schema": schema, "tool_call": call}
        )
        wait = await setup.ask(request)
        url = setup.link(request, "erin")
        page = (await http.get(url, headers=PAGE)).text
        assert "transfer" in page and "&quot;amount&quot;: 10" in page
        fields = {f.split('"')[0] for f in page.split('name="')[1:]}
        to_field = next(name for name in fields if name.endswith("to"))
        amount_field = next(name for name in fields if name.endswith("amount"))
        sent = await http.post(
            url, data={to_field: "ACME", amount_field: "5", "action": "accept"}, headers=PAGE
        )
        assert sent.status_code == 200, sent.text
        answer = await asyncio.wait_for(wait, 30)
        assert (answer.ok, answer.data, answer.person) == (
            True,
            {"to": "ACME", "amount": 5},
            "link:erin",
        )
