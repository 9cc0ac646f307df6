"""Mixed fleets on one Redis: the last release's agents answered by this tree's responders,
and this tree's agents (writing protocol 1, as docs/how-to/upgrade.md says while any
process of the last release runs) answered by the last release's responders. Each side is
its own release's processes: ``toolnexus ask``, an agent script of public API calls (a
form, and a durable form), and ``toolnexus worker auto``, ``web`` (answered through its
HTTP endpoints as a browser does: token sign-in, the page's CSRF token, the form) or
``http`` (the answering API, with a bearer token)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import toolnexus
from fleet import (
    WRITE_PROTOCOL_ENV,
    Agent,
    Asked,
    Process,
    Release,
    environment,
    free_port,
    redis_server,
    run,
)

pytestmark = [pytest.mark.redis, pytest.mark.slow, pytest.mark.timeout(180)]

QUEUE = "ops"
FORM = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
WEB_TOKEN = "mixed-fleet-web-token-0123456789"
RULES = """
[[rule]]
name = "ci"
prompt = "^cli "
action = "accept"

[[rule]]
name = "forms"
prompt = "^form "
action = "accept"
data = { n = 3 }
"""
PERSON = {
    "auto": {"cli": "auto:ci", "form": "auto:forms"},
    "web": "web:token",
    "http": "http:alice",
}


@contextlib.asynccontextmanager
async def responder(
    kind: str, release: Release, url: str, tmp: Path, env: dict[str, str]
) -> AsyncIterator[dict[str, Any]]:
    """Responder ``kind`` of ``release`` serving the queue; what a person needs to reach it."""
    common = ["--url", url, "--queue", QUEUE, "--consumer", f"{kind}-1"]
    reach: dict[str, Any] = {}
    if kind == "auto":
        (tmp / "rules.toml").write_text(RULES)
        command = ["auto", "--rules", str(tmp / "rules.toml")]
    elif kind == "web":
        reach["port"] = free_port()
        command = ["web", "--port", str(reach["port"]), "--token", WEB_TOKEN]
    else:
        tokens = tmp / "tokens.toml"
        add = [release.toolnexus, "worker", "http", "tokens", "add", "alice", "--queue", QUEUE]
        reach["token"] = run(*add, "--tokens", tokens, env=env).strip()
        reach["port"] = free_port()
        command = ["http", "--port", str(reach["port"]), "--tokens", str(tokens)]
    process = Process(
        kind, [str(release.toolnexus), "worker", *command, *common], env, tmp / f"{kind}.log"
    )
    try:
        async with toolnexus.connect(url, queue=QUEUE) as broker:
            for _ in range(600):
                if f"{kind}-1" in {beat.consumer for beat in await broker.heartbeats()}:
                    break
                await asyncio.sleep(0.1)
            else:
                raise AssertionError(f"no heartbeat of the {kind} worker:\n{process.said}")
        yield reach
    finally:
        await asyncio.to_thread(process.stop)


async def answer_on_the_page(port: int, prompts: dict[str, str]) -> None:
    """As a browser: sign in with the token, wait for each prompt's card, send its form."""
    base = f"http://127.0.0.1:{port}"
    async with httpx.AsyncClient(base_url=base, follow_redirects=True, timeout=30) as browser:
        signed_in = await browser.get("/", params={"token": WEB_TOKEN})
        assert signed_in.status_code == 200, signed_in.text
        for _ in range(300):
            page = (await browser.get("/")).text
            if all(prompt in page for prompt in prompts.values()):
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError(f"not every prompt on the page: {prompts}")
        csrf = re.search(r'name="csrf" value="([^"]+)"', page)
        assert csrf is not None
        for request_id, prompt in prompts.items():
            form = {"request": request_id, "csrf": csrf[1], "action": "accept"}
            if prompt.startswith("form "):
                form["field.n"] = "3"
            sent = await browser.post("/answer", data=form, follow_redirects=False)
            assert sent.status_code == 303, sent.text


async def answer_by_the_api(port: int, token: str, prompts: dict[str, str]) -> None:
    """As an HTTP client: list the open requests until each is there, answer each."""
    headers = {"Authorization": f"Bearer {token}"}
    base = f"http://127.0.0.1:{port}"
    async with httpx.AsyncClient(base_url=base, headers=headers, timeout=30) as client:
        for _ in range(300):
            listed = (await client.get("/v1/requests")).json()["requests"]
            if {r["id"] for r in listed} >= set(prompts):
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError(f"not every request listed: {prompts}")
        for request_id, prompt in prompts.items():
            body: dict[str, Any] = {"action": "accept"}
            if prompt.startswith("form "):
                body["data"] = {"n": 3}
            sent = await client.post(f"/v1/requests/{request_id}/answer", json=body)
            assert sent.json() == {"outcome": "answered"}, sent.text


@pytest.mark.parametrize("kind", ["auto", "web", "http"])
@pytest.mark.parametrize("agents_of", ["previous", "current"])
async def test_each_release_answers_the_others_agents(
    kind: str, agents_of: str, previous: Release, current: Release, tmp_path: Path
) -> None:
    agents = previous if agents_of == "previous" else current
    responders = current if agents_of == "previous" else previous
    # a process of this tree beside the last release's writes what the last release reads
    agents_env = environment(**({WRITE_PROTOCOL_ENV: "1"} if agents is current else {}))
    responders_env = environment(**({WRITE_PROTOCOL_ENV: "1"} if responders is current else {}))
    with redis_server(tmp_path) as port:
        url = f"redis://127.0.0.1:{port}/0"
        async with responder(kind, responders, url, tmp_path, responders_env) as reach:
            ask = await asyncio.create_subprocess_exec(
                str(agents.toolnexus),
                *("ask", "cli 1", "--id", "cli-1", "--json", "--timeout", "90"),
                *("--url", url, "--queue", QUEUE),
                env=agents_env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            agent = await Agent.start("agent", agents, url, QUEUE, agents_env)
            asked = [
                Asked({"id": "form-1", "prompt": "form 1", "schema": FORM, "timeout_s": 90}, {}),
                Asked(
                    {"id": "form-2", "prompt": "form 2 (durable)", "schema": FORM},
                    {},
                ),
            ]
            asked[1].request.update(durable=True, timeout_s=90)
            for one in asked:
                agent.ask(one)
            prompts = {"cli-1": "cli 1", **{a.request["id"]: a.request["prompt"] for a in asked}}
            if kind == "web":
                await answer_on_the_page(reach["port"], prompts)
            elif kind == "http":
                await answer_by_the_api(reach["port"], reach["token"], prompts)
            out, err = await asyncio.wait_for(ask.communicate(), 90)
            said = await agent.drain()
    assert ask.returncode == 0, err.decode()
    cli = json.loads(out)
    persons = PERSON[kind]
    assert (cli["ok"], cli.get("person")) == (
        True,
        persons["cli"] if isinstance(persons, dict) else persons,
    )
    got = {line["id"]: line["answer"] for line in said}
    for one in asked:
        answer = got[one.request["id"]]
        person = persons["form"] if isinstance(persons, dict) else persons
        assert (answer["ok"], answer["data"], answer["person"]) == (True, {"n": 3}, person)
