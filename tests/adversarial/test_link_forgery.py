"""Issue #29 (observation 2 of its Done when): a single-use answer link answers once, and a
second use, a forged token and a token for another request are refused (threat-model S1:
the link is signed material bound to the request's digest). Over real HTTP and a real
Redis with signatures required; nothing of a link is kept in Redis, so what Redis holds
can neither make a link nor use one up."""

from __future__ import annotations

import asyncio
import time

import httpx2 as httpx
import msgspec
import pytest
import redis.asyncio as redis

import answering
from answering import QUEUE, Fleet, form_request
from toolnexus_workers.links import LinkKey, link_url

pytestmark = pytest.mark.redis


setup, http = answering.setup, answering.http  # the fixtures (tests/answering.py)


async def test_forged_expired_and_other_requests_links_are_refused(
    setup: Fleet, http: httpx.AsyncClient
) -> None:
    """Observation 2, S1: damaged, foreign-key, spliced, edited-request, expired and garbage
    tokens are refused and the request stays open; the genuine link then answers."""
    request = form_request()
    wait = await setup.ask(request)
    delivered = setup.delivered(request)
    token = setup.link_key.mint(QUEUE, delivered, "bob")
    prefix, payload, signature = token.split(".")
    other_key = LinkKey(secret="another secret of at least thirty-two characters")
    edited = msgspec.structs.replace(delivered, prompt="Book the whole restaurant?")
    past = msgspec.structs.replace(delivered, expires_at=time.time() - 1)
    refused = {
        "damaged": f"{prefix}.{payload[:-2]}xx.{signature}",
        "not ours": other_key.mint(QUEUE, delivered, "bob"),
        "spliced": f"{prefix}.{other_key.mint(QUEUE, delivered, 'eve').split('.')[1]}.{signature}",
        "another request": setup.link_key.mint(QUEUE, edited, "bob"),
        "expired": setup.link_key.mint(QUEUE, past, "bob"),
        "garbage": "tnl1.%%%.!!!",
    }
    for what, bad in refused.items():
        sent = await http.post(link_url(setup.server.url, bad), json={"action": "accept"})
        expected = 410 if what == "expired" else 403
        assert sent.status_code == expected, (what, sent.text)
        assert sent.json()["error"], what
    assert (
        "another request"
        in (await http.get(link_url(setup.server.url, refused["another request"]))).json()["error"]
    )
    assert not wait.done()
    # the genuine link still answers
    sent = await http.post(link_url(setup.server.url, token), json={"action": "decline"})
    assert sent.json() == {"outcome": "answered"}
    answer = await asyncio.wait_for(wait, 30)
    assert (answer.ok, answer.reason, answer.person) == (False, "declined", "link:bob")


async def test_redis_holds_nothing_of_a_link_and_a_used_link_stays_used(
    setup: Fleet, http: httpx.AsyncClient, redis_url: str
) -> None:
    """Observation 2, S1: after a link answered, no key of the namespace holds its token or
    its nonce (a reader of Redis has nothing to replay), and the used link is refused
    because the request took its one answer, not because of a mark anyone could write."""
    request = form_request()
    wait = await setup.ask(request)
    url = setup.link(request, "frank")
    token = url.rsplit("/", 1)[1]
    sent = await http.post(url, json={"action": "accept", "data": {"name": "Frank"}})
    assert sent.json() == {"outcome": "answered"}
    assert (await asyncio.wait_for(wait, 30)).person == "link:frank"
    client = redis.Redis.from_url(redis_url)
    try:
        keys = [k async for k in client.scan_iter(match=f"*{setup.namespace}*")]
        assert keys
        dumped = b"".join([await client.dump(k) or b"" for k in keys])
    finally:
        await client.aclose()
    payload = token.split(".")[1]
    assert token.encode() not in dumped and payload.encode() not in dumped
    setup.server.links.used.clear()  # as after a restart: the link's use is forgotten here
    again = await http.post(url, json={"action": "decline"})
    assert again.status_code == 410 and "closed" in again.json()["error"]


async def test_a_link_used_twice_at_once_answers_once(
    setup: Fleet, http: httpx.AsyncClient
) -> None:
    """Observation 2, S1: two uses of one link sent together: one answers, the other is
    refused, and the waiter gets the one answer."""
    request = form_request()
    wait = await setup.ask(request)
    url = setup.link(request, "gail")
    bodies = [{"action": "accept", "data": {"name": f"Gail {n}"}} for n in (1, 2)]
    sent = await asyncio.gather(*(http.post(url, json=body) for body in bodies))
    statuses = sorted(response.status_code for response in sent)
    assert statuses[0] == 200 and statuses[1] in (409, 410), [r.text for r in sent]
    taken = next(n for n, r in enumerate(sent) if r.status_code == 200)
    answer = await asyncio.wait_for(wait, 30)
    assert (answer.data, answer.person) == (bodies[taken]["data"], "link:gail")
