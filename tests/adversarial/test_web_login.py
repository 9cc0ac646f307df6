"""Observation 11 of issue #24, tried as an outsider on the network: the web page's sign-in
guessed at, logins that stall the page, and a metrics listener open to every interface.

Threat-model line S11: web login is rate limited (429 + Retry-After), password hashing runs
off the event loop, and the metrics listener obeys the page's binding rule."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import ipaddress
import os
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest

import toolnexus
from conftest import free_port
from toolnexus import Broker, ConfigurationError
from toolnexus.observability import Metrics
from toolnexus_workers.options import run_main, worker_parser
from toolnexus_workers.web.access import Access, hash_password
from toolnexus_workers.web.server import WebServer

pytestmark = pytest.mark.timeout(90)

TOKEN = "s3cret-token-for-the-tests"
PASSWORD = "correct horse"
TOOLNEXUS = str(Path(sys.executable).with_name("toolnexus"))


@pytest.fixture(scope="module")
def alice() -> dict[str, str]:
    return {"alice": hash_password(PASSWORD)}


@contextlib.asynccontextmanager
async def page(users: dict[str, str]) -> AsyncIterator[httpx.AsyncClient]:
    """The page with ``users`` and the token, and a client of it (from 127.0.0.1, which
    uvicorn lets name another client address in ``X-Forwarded-For``)."""
    async with (
        toolnexus.connect("memory://") as broker,
        WebServer(broker, port=0, access=Access(token=TOKEN, users=users)) as web,
        httpx.AsyncClient(base_url=web.url, timeout=30) as client,
    ):
        yield client


async def sign_in(
    client: httpx.AsyncClient, name: str, password: str, address: str | None = None
) -> httpx.Response:
    headers = {"x-forwarded-for": address} if address else {}
    form = {"name": name, "password": password}
    return await client.post("/login", data=form, headers=headers)


@pytest.mark.slow
async def test_wrong_passwords_for_one_name_draw_429_with_retry_after(
    alice: dict[str, str],
) -> None:
    """S11, observation 11: 40 wrong passwords for one name drew 401 every time, never a
    429. Now, sent from 40 different addresses, the name backs off after 5 failures: 429
    with Retry-After, without checking (the right password too), and the page tells the
    person when to try again; after that the right password signs in and resets the name."""
    async with page(alice) as client:
        statuses = []
        for i in range(40):
            response = await sign_in(client, "alice", "guess", f"198.51.100.{i + 1}")
            statuses.append(response.status_code)
            if response.status_code == 429:
                break
        assert statuses == [401] * 5 + [429], statuses
        wait_s = int(response.headers["retry-after"])
        assert wait_s >= 1
        assert f"Too many failed sign-ins: try again in {wait_s} s." in response.text
        locked = await sign_in(client, "alice", PASSWORD, "198.51.100.200")
        assert locked.status_code == 429, "the right password was checked during the lockout"
        assert "set-cookie" not in locked.headers

        await asyncio.sleep(int(locked.headers["retry-after"]))
        genuine = await sign_in(client, "alice", PASSWORD, "198.51.100.201")
        assert genuine.status_code == 303 and "toolnexus_session" in genuine.headers["set-cookie"]
        after = await sign_in(client, "alice", "typo", "198.51.100.202")
        assert after.status_code == 401, "a success did not reset the name's failures"


async def test_wrong_sign_ins_from_one_client_draw_429_whatever_the_name(
    alice: dict[str, str],
) -> None:
    """S11, observation 11: one client spraying names (and tokens) was never slowed. Now,
    after 10 failures from one address, its next sign-in gets 429 whatever it tries, while
    another address still signs in."""
    async with page(alice) as client:
        statuses = [(await sign_in(client, f"user{i}", "guess")).status_code for i in range(8)]
        for _ in range(2):
            response = await client.post("/login", data={"token": "not-the-token-at-all"})
            statuses.append(response.status_code)
        assert statuses == [401] * 10
        for attempt in (
            lambda: sign_in(client, "user99", "guess"),
            lambda: sign_in(client, "alice", PASSWORD),
            lambda: client.post("/login", data={"token": TOKEN}),
            lambda: client.get("/", params={"token": TOKEN}),
        ):
            refused = await attempt()
            assert refused.status_code == 429
            assert int(refused.headers["retry-after"]) >= 1
        other = await sign_in(client, "alice", PASSWORD, "203.0.113.7")
        assert other.status_code == 303


async def test_the_page_answers_while_a_password_is_being_checked(
    alice: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """S11, observation 11: scrypt ran on the event loop, so every page waited for every
    login (median page time 1.2 ms -> 1.3 s during 60 logins). Now a page is served, and
    answers 200, while a login's password check is still running (held open here)."""
    hashing, release = threading.Event(), threading.Event()
    scrypt = hashlib.scrypt

    def held_scrypt(*args: Any, **kwargs: Any) -> bytes:
        hashing.set()
        release.wait(timeout=5)  # on the event loop this blocks the page too
        return scrypt(*args, **kwargs)

    async with page(alice) as client:
        monkeypatch.setattr(hashlib, "scrypt", held_scrypt)
        login = asyncio.create_task(sign_in(client, "alice", "guess"))
        assert await asyncio.to_thread(hashing.wait, 10), "the login never checked a password"
        shown = await client.get("/", headers={"authorization": f"Bearer {TOKEN}"})
        pending = not login.done()
        release.set()
        assert (await login).status_code == 401
        assert shown.status_code == 200
        assert pending, "the page was served only after the password check ended"


@pytest.mark.slow
async def test_password_checks_run_a_bounded_number_at_once(
    alice: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """S11, observation 11: off the event loop, but not without bound: 12 logins at once
    (different names and addresses, so none is refused) hash at most HASHING_AT_ONCE
    passwords at a time (each takes 16 MiB), and every one is answered."""
    from toolnexus_workers.web.access import HASHING_AT_ONCE

    scrypt, lock = hashlib.scrypt, threading.Lock()
    inside, most = 0, 0

    def counted_scrypt(*args: Any, **kwargs: Any) -> bytes:
        nonlocal inside, most
        with lock:
            inside += 1
            most = max(most, inside)
        try:
            return scrypt(*args, **kwargs)
        finally:
            with lock:
                inside -= 1

    async with page(alice) as client:
        monkeypatch.setattr(hashlib, "scrypt", counted_scrypt)
        logins = [sign_in(client, f"user{i}", "guess", f"192.0.2.{i + 1}") for i in range(12)]
        statuses = [response.status_code for response in await asyncio.gather(*logins)]
    assert statuses == [401] * 12
    assert 1 <= most <= HASHING_AT_ONCE, most


def test_spraying_names_or_addresses_keeps_the_failure_tables_bounded() -> None:
    """S11, observation 11: the failures remembered for backing off are capped (the least
    recently failed forgotten first), so an attacker spraying names or addresses cannot
    grow the worker's memory; a key still failing stays refused."""
    from toolnexus_workers.web.access import Backoff

    backoff = Backoff(5, capacity=100)
    for _ in range(5):
        backoff.failed("alice")
    assert backoff.wait_s("alice") > 0
    for i in range(1000):
        backoff.failed(f"spray-{i}" * 1000)  # long names, too: kept as digests
        if i % 50 == 0:
            backoff.failed("alice")
    assert len(backoff) == 100
    assert backoff.wait_s("alice") > 0
    backoff.succeeded("alice")
    assert backoff.wait_s("alice") == 0


# -- the metrics listener --------------------------------------------------------------


def listening_addresses(port: int) -> set[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    """The addresses a TCP socket listens on at ``port`` on this machine (Linux /proc)."""
    found: set[ipaddress.IPv4Address | ipaddress.IPv6Address] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, port_hex = local.split(":")
            if state != "0A" or int(port_hex, 16) != port:  # 0A: LISTEN
                continue
            raw = bytes.fromhex(address)
            words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
            if len(raw) == 4:
                found.add(ipaddress.IPv4Address(words))
            else:
                found.add(ipaddress.IPv6Address(words))
    return found


def test_metrics_without_a_token_are_refused_off_loopback() -> None:
    """S11, observation 11: ``Metrics.serve`` listened on every interface, unguarded. Now
    it refuses a non-loopback address without a token, as the page does; with a token it
    serves there, and a scrape without the token gets 401."""
    metrics = Metrics()
    with pytest.raises(ConfigurationError, match=r"refusing to serve metrics on '0\.0\.0\.0'"):
        metrics.serve(0, host="0.0.0.0")
    metrics.close()
    port = metrics.serve(0, host="0.0.0.0", token=TOKEN)
    try:
        url = f"http://127.0.0.1:{port}/metrics"
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(url, timeout=10)
        refused.value.close()
        assert refused.value.code == 401
        scrape = urllib.request.Request(url, headers={"Authorization": f"Bearer {TOKEN}"})
        with urllib.request.urlopen(scrape, timeout=10) as response:
            assert b"toolnexus_requests_published_total" in response.read()
    finally:
        metrics.close()


@pytest.mark.redis
def test_a_worker_s_metrics_listen_on_loopback_by_default(redis_url: str, namespace: str) -> None:
    """S11, observation 11: ``--metrics-port`` listened on every interface. Now a worker's
    metrics listen on loopback unless told otherwise (and then only with a token)."""
    port = free_port()
    parser = worker_parser("test", "A test worker.", group="test")
    args = parser.parse_args(
        ["--url", redis_url, "--namespace", namespace, "--metrics-port", str(port)]
    )
    seen: set[Any] = set()

    async def work(broker: Broker) -> int:
        seen.update(listening_addresses(port))
        return 0

    assert run_main(args, work) == 0
    assert seen, f"nothing listened on port {port}"
    assert all(address.is_loopback for address in seen), seen


@pytest.mark.redis
def test_the_web_worker_refuses_metrics_off_loopback_without_a_token(namespace: str) -> None:
    """S11, observation 11: with its page on 0.0.0.0 behind a token, the web worker served
    unguarded metrics on every interface. Now its metrics follow the page's --host and its
    rule: off loopback without --metrics-token the worker refuses to start (status 2)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLNEXUS_")}
    command = [TOOLNEXUS, "worker", "web", "--namespace", namespace, "--host", "0.0.0.0"]
    command += ["--port", "0", "--token", TOKEN, "--metrics-port", str(free_port())]
    worker = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)
    try:
        _, stderr = worker.communicate(timeout=15)
    except subprocess.TimeoutExpired:
        worker.kill()
        worker.communicate()
        pytest.fail("the web worker served metrics on 0.0.0.0 without a token")
    assert worker.returncode == 2, stderr
    assert "refusing to serve metrics on '0.0.0.0' without access control" in stderr
