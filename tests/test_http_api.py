"""The HTTP answering API (``toolnexus worker http``, issue #29): real HTTP (uvicorn) over a
real Redis, answers signed with the worker's key as the person a bearer token names,
exercised by Node's ``fetch``, curl and schemathesis against the API's own OpenAPI document."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx2 as httpx
import jsonschema
import pytest

import toolnexus
from conftest import FAST
from toolnexus import Answer, Broker, Quorum, Request, Source, new_id
from toolnexus.frameworks import decide, tool_call_digest, tool_call_request
from toolnexus.security import SigningKey
from toolnexus_workers.http import main as http_main
from toolnexus_workers.http.app import openapi_document
from toolnexus_workers.http.server import HttpServer
from toolnexus_workers.http.tokens import Tokens, add_token

pytestmark = pytest.mark.redis

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "how-to" / "http-api.md"
CLIENT = ROOT / "examples" / "http_api" / "answer.mjs"
DOCUMENT = openapi_document()
FORM = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 2},
        "guests": {"type": "integer", "minimum": 1, "maximum": 12},
    },
    "required": ["name"],
}


def schema(name: str) -> dict[str, Any]:
    found: dict[str, Any] = {**DOCUMENT["components"]["schemas"][name]}
    found["$defs"] = DOCUMENT["components"]["schemas"]
    return json.loads(json.dumps(found).replace("#/components/schemas/", "#/$defs/"))


@dataclass
class Setup:
    url: str
    http: httpx.AsyncClient
    askers: dict[str, Broker]  # by queue
    server: HttpServer
    tokens_file: Path
    tokens: dict[str, str]  # person -> token

    def headers(self, person: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[person]}"}

    async def get(self, path: str, person: str = "alice", **params: Any) -> httpx.Response:
        return await self.http.get(f"{self.url}{path}", params=params, headers=self.headers(person))

    async def post(
        self, path: str, body: Any, person: str = "alice", **params: Any
    ) -> httpx.Response:
        return await self.http.post(
            f"{self.url}{path}", json=body, params=params, headers=self.headers(person)
        )

    async def ask(self, queue: str, request: Request) -> asyncio.Task[Answer]:
        """Wait for ``request`` on ``queue`` in the background, once the API shows it."""
        wait = asyncio.create_task(self.askers[queue].wait_for(request, timeout_s=60))
        async with asyncio.timeout(15):
            while (queue, request.id) not in self.server.desk.open:
                assert not wait.done(), wait
                await asyncio.sleep(0.02)
        return wait

    async def withdraw(self, *waits: asyncio.Task[Answer]) -> None:
        for wait in waits:
            wait.cancel()
        await asyncio.gather(*waits, return_exceptions=True)


def form_request(**extra: Any) -> Request:
    return Request(
        id=extra.pop("id", None) or new_id("http"),
        kind="input",
        prompt="Book a table?",
        data={"schema": FORM},
        source=Source(server="bookings", tool="book", agent="agent-1"),
        **extra,
    )


@pytest.fixture
async def setup(redis_url: str, namespace: str, tmp_path: Path) -> AsyncIterator[Setup]:
    keys, trusted_by_asker, trusted_by_worker = tmp_path / "k", tmp_path / "ta", tmp_path / "tw"
    for directory in (keys, trusted_by_asker, trusted_by_worker):
        directory.mkdir()
    for name, trusted in (("agent-1", trusted_by_worker), ("http-worker", trusted_by_asker)):
        SigningKey.generate(name).save(keys)
        (trusted / f"{name}.pub").write_text((keys / f"{name}.pub").read_text())
    tokens_file = tmp_path / "tokens.toml"
    tokens = {
        "alice": add_token(tokens_file, "alice", ["ops"]),
        "bob": add_token(tokens_file, "bob", ["billing"]),
        "ci": add_token(tokens_file, "ci", ["*"]),
    }

    def connect(queue: str, key: str, trusted: Path) -> Broker:
        return toolnexus.connect(
            redis_url,
            namespace=namespace,
            queue=queue,
            signing_key=keys / f"{key}.key",
            trusted_keys=trusted,
            require_signatures=True,
            **FAST,
        )

    asks_ops = connect("ops", "agent-1", trusted_by_asker)
    asks_billing = connect("billing", "agent-1", trusted_by_asker)
    ops = connect("ops", "http-worker", trusted_by_worker)
    billing = connect("billing", "http-worker", trusted_by_worker)
    async with asks_ops, asks_billing, ops, billing:
        brokers = {"ops": ops, "billing": billing}
        async with (
            HttpServer(brokers, Tokens(tokens_file), port=0) as server,
            httpx.AsyncClient(timeout=30) as http,
        ):
            askers = {"ops": asks_ops, "billing": asks_billing}
            yield Setup(server.url, http, askers, server, tokens_file, tokens)


async def run(
    *command: str, timeout_s: float = 60, cwd: Path | None = None, **env: str
) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        *command,
        cwd=cwd,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, **env},
    )
    out, err = await asyncio.wait_for(process.communicate(), timeout_s)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def test_nodes_fetch_lists_is_refused_then_answers_and_the_waiter_gets_exactly_that(
    setup: Setup,
) -> None:
    """examples/http_api/answer.mjs, run by Node: lists, sends a form the schema refuses (422
    naming the field), then a valid one; the waiter gets exactly that data, signed by the
    worker's key as the token's person."""
    node = shutil.which("node")
    assert node is not None, "node is needed for this test"
    request = form_request()
    wait = await setup.ask("ops", request)
    env = {"TOOLNEXUS_HTTP_URL": setup.url, "TOOLNEXUS_HTTP_TOKEN": setup.tokens["alice"]}

    async def node_client(*args: str) -> Any:
        code, out, err = await run(node, str(CLIENT), *args, **env)
        assert code == 0, err
        return json.loads(out)

    listed = (await node_client("list"))["body"]
    invalid = {"action": "accept", "data": {"name": "A"}}
    refused = await node_client("answer", request.id, json.dumps(invalid))
    valid = {"action": "accept", "data": {"name": "Ada Lovelace", "guests": 3}}
    sent = await node_client("answer", request.id, json.dumps(valid))
    assert [r["id"] for r in listed["requests"]] == [request.id]
    jsonschema.validate(listed, schema("RequestList"))
    assert listed["requests"][0]["source"] == {
        "server": "bookings",
        "tool": "book",
        "agent": "agent-1",
    }
    assert listed["requests"][0]["signer"] == "agent-1"
    assert refused["status"] == 422 and refused["body"]["field"] == "name"
    assert refused["body"]["rule"] == "minLength"
    jsonschema.validate(refused["body"], schema("Error"))
    assert sent == {"status": 200, "body": {"outcome": "answered"}}
    answer = await asyncio.wait_for(wait, 30)
    assert (answer.ok, answer.data) == (True, {"name": "Ada Lovelace", "guests": 3})
    assert (answer.person, answer.responder) == ("http:alice", "http-worker")
    # answered: gone from the API
    assert (await setup.get(f"/v1/requests/{request.id}")).status_code == 404
    assert (await setup.get("/v1/requests")).json()["requests"] == []


@pytest.mark.parametrize("action", ["decline", "dismiss"])
async def test_curl_declines_or_dismisses_as_the_tokens_person(setup: Setup, action: str) -> None:
    curl = shutil.which("curl")
    assert curl is not None, "curl is needed for this test"
    request = form_request()
    wait = await setup.ask("ops", request)
    code, out, err = await run(
        curl,
        "-sS",
        "-w",
        "\n%{http_code}",
        "-H",
        f"Authorization: Bearer {setup.tokens['ci']}",
        "-H",
        "Content-Type: application/json",
        "--data",
        json.dumps({"action": action}),
        f"{setup.url}/v1/requests/{request.id}/answer",
    )
    assert code == 0, err
    body, status = out.rsplit("\n", 1)
    assert (status, json.loads(body)) == ("200", {"outcome": "answered"})
    answer = await asyncio.wait_for(wait, 30)
    reason = action.rstrip("e") + "ed"
    assert (answer.ok, answer.reason, answer.person) == (False, reason, "http:ci")
    # a second answer finds it gone
    again = await setup.post(f"/v1/requests/{request.id}/answer", {"action": "accept"}, "ci")
    assert again.status_code == 404


async def test_a_token_scoped_to_one_queue_cannot_read_or_answer_another(setup: Setup) -> None:
    request = form_request()
    wait = await setup.ask("billing", request)
    path = f"/v1/requests/{request.id}"
    # alice may use ops only: billing's request does not exist for her
    assert (await setup.get(path)).status_code == 404
    assert (await setup.get(path, queue="billing")).status_code == 403
    assert (await setup.get("/v1/requests", queue="billing")).status_code == 403
    assert (await setup.get("/v1/events", queue="billing", wait=0)).status_code == 403
    assert (await setup.get("/v1/requests")).json()["requests"] == []
    refused = await setup.post(f"{path}/answer", {"action": "accept", "data": {"name": "Eve"}})
    assert refused.status_code == 404
    assert not wait.done()
    # bob's token is for billing: he sees it and answers it
    shown = await setup.get(path, "bob")
    assert shown.status_code == 200 and shown.json()["queue"] == "billing"
    jsonschema.validate(shown.json(), schema("OpenRequest"))
    sent = await setup.post(f"{path}/answer", {"action": "accept", "data": {"name": "Bob"}}, "bob")
    assert sent.status_code == 200
    answer = await asyncio.wait_for(wait, 30)
    assert (answer.data, answer.person) == ({"name": "Bob"}, "http:bob")


async def test_unknown_and_revoked_tokens_are_refused(
    setup: Setup, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (await setup.http.get(f"{setup.url}/v1/requests")).status_code == 401
    wrong = {"Authorization": "Bearer " + "x" * 43}
    response = await setup.http.get(f"{setup.url}/v1/requests", headers=wrong)
    assert response.status_code == 401 and response.headers["www-authenticate"] == "Bearer"
    assert (await setup.get("/v1/requests", "bob")).status_code == 200
    assert http_main(["tokens", "revoke", "bob", "--tokens", str(setup.tokens_file)]) == 0
    assert (await setup.get("/v1/requests", "bob")).status_code == 401  # at once
    assert (await setup.get("/v1/requests", "alice")).status_code == 200
    capsys.readouterr()
    assert http_main(["tokens", "list", "--tokens", str(setup.tokens_file)]) == 0
    listed = [line.split("\t") for line in capsys.readouterr().out.splitlines()]
    assert [(row[0], row[1], row[3]) for row in listed] == [
        ("alice", "ops", "active"),
        ("bob", "billing", "revoked"),
        ("ci", "*", "active"),
    ]
    # only digests are stored
    text = setup.tokens_file.read_text()
    assert not any(token in text for token in setup.tokens.values())


async def test_a_filter_by_kind_and_source(setup: Setup) -> None:
    form = form_request(id=f"a/{new_id('b')}%c")
    approval = Request(
        id=new_id("http"), kind="approval", prompt="Deploy?", source=Source(agent="deployer")
    )
    waits = [await setup.ask("ops", form), await setup.ask("ops", approval)]
    ids = lambda response: [r["id"] for r in response.json()["requests"]]  # noqa: E731
    assert ids(await setup.get("/v1/requests", "ci")) == [approval.id, form.id]  # newest first
    assert ids(await setup.get("/v1/requests", kind="approval")) == [approval.id]
    assert ids(await setup.get("/v1/requests", source="deployer")) == [approval.id]
    assert ids(await setup.get("/v1/requests", source="bookings")) == [form.id]
    assert ids(await setup.get("/v1/requests", source="nobody")) == []
    # an id with / and %, percent-encoded
    path = f"/v1/requests/{quote(form.id, safe='')}"
    assert (await setup.get(path)).json()["id"] == form.id
    decline = await setup.post(f"{path}/answer", {"action": "decline"})
    assert decline.status_code == 200
    assert (await waits[0]).reason == "declined"
    await setup.withdraw(*waits)


@pytest.mark.slow
async def test_long_polling_follows_shown_and_gone(setup: Setup) -> None:
    cursor = (await setup.get("/v1/requests")).json()["cursor"]
    idle = await setup.get("/v1/events", after=cursor, wait=0.2)
    assert idle.json() == {"events": [], "cursor": cursor, "reset": False}
    request = form_request()
    polling = asyncio.create_task(setup.get("/v1/events", after=cursor, wait=20))
    wait = await setup.ask("ops", request)
    shown = (await asyncio.wait_for(polling, 20)).json()
    jsonschema.validate(shown, schema("Events"))
    assert [(e["event"], e["id"]) for e in shown["events"]] == [("shown", request.id)]
    assert shown["events"][0]["request"]["prompt"] == "Book a table?"
    polling = asyncio.create_task(setup.get("/v1/events", after=shown["cursor"], wait=20))
    wait.cancel()  # the asker withdraws it
    gone = (await asyncio.wait_for(polling, 20)).json()
    assert [(e["event"], e["id"]) for e in gone["events"]] == [("gone", request.id)]
    assert "withdrawn" in gone["events"][0]["note"].lower()
    # another queue's changes are not shown to a token scoped elsewhere
    other = form_request()
    polling = asyncio.create_task(setup.get("/v1/events", after=gone["cursor"], wait=1))
    other_wait = await setup.ask("billing", other)
    assert (await polling).json()["events"] == []
    await setup.withdraw(other_wait)
    # a cursor from the future (a restarted worker) says: list again
    assert (await setup.get("/v1/events", after=10**6, wait=0)).json()["reset"] is True


async def test_bad_bodies_and_parameters_are_named(setup: Setup) -> None:
    request = form_request()
    wait = await setup.ask("ops", request)
    path = f"/v1/requests/{request.id}/answer"
    bad = await setup.http.post(
        f"{setup.url}{path}", content=b"{nope", headers=setup.headers("alice")
    )
    assert bad.status_code == 400 and "not JSON" in bad.json()["error"]
    action = await setup.post(path, {"action": "maybe"})
    assert (action.status_code, action.json()["field"]) == (400, "action")
    data = await setup.post(path, {"action": "decline", "data": {"x": 1}})
    assert (data.status_code, data.json()["field"]) == (400, "data")
    missing = await setup.post(path, {"action": "accept", "data": {}})
    assert missing.status_code == 422 and missing.json()["rule"] == "required"
    wait_param = await setup.get("/v1/events", wait="soon")
    assert (wait_param.status_code, wait_param.json()["field"]) == (400, "wait")
    huge = await setup.get("/v1/events", after="9" * 400)
    assert (huge.status_code, huge.json()["field"]) == (400, "after")
    assert not wait.done()
    await setup.withdraw(wait)


@pytest.mark.slow
async def test_schemathesis_finds_no_server_error(setup: Setup, tmp_path: Path) -> None:
    """schemathesis against the API's own OpenAPI document: no 5xx, and every status,
    content type and body as documented, with requests open on both queues."""
    setup.server.api.max_wait_s = 0.2  # long polls return within schemathesis's timeout
    waits = [await setup.ask("ops", form_request()), await setup.ask("billing", form_request())]
    code, out, err = await run(
        str(Path(sys.executable).with_name("schemathesis")),
        "run",
        f"{setup.url}/openapi.json",
        "--header",
        f"Authorization: Bearer {setup.tokens['alice']}",
        "--checks",
        "not_a_server_error,status_code_conformance,content_type_conformance,"
        "response_schema_conformance",
        "--max-examples",
        "5",
        "--phases",
        "examples,coverage,fuzzing",
        "--workers",
        "1",
        timeout_s=180,
        cwd=tmp_path,  # its cache (.schemathesis/) goes there
    )
    assert code == 0, out[-4000:] + err[-2000:]
    generated = re.search(r"(\d+) generated", out)
    assert generated is not None and int(generated[1]) >= 50, out[-2000:]
    print(out[out.index("Test cases:") :].splitlines()[1])
    # schemathesis reuses ids it read and may answer ops' request, as alice; never billing's
    ops, billing = waits
    assert not ops.done() or ops.result().person == "http:alice"
    assert not billing.done()
    await setup.withdraw(*waits)


async def test_an_allow_list_is_kept_by_person(setup: Setup) -> None:
    request = form_request(allow=["http:ci"])
    wait = await setup.ask("ops", request)
    path = f"/v1/requests/{request.id}/answer"
    refused = await setup.post(path, {"action": "accept", "data": {"name": "Alice"}})
    assert refused.status_code == 403 and "'http:alice' may not answer" in refused.json()["error"]
    assert not wait.done()
    sent = await setup.post(path, {"action": "accept", "data": {"name": "CI"}}, "ci")
    assert sent.status_code == 200
    answer = await asyncio.wait_for(wait, 30)
    assert (answer.data, answer.person) == ({"name": "CI"}, "http:ci")


async def test_a_broken_tokens_file_refuses_every_token(setup: Setup) -> None:
    assert (await setup.get("/v1/requests")).status_code == 200
    setup.tokens_file.write_text(setup.tokens_file.read_text() + "\n[[token]]\nname = 3\n")
    broken = await setup.get("/v1/requests")
    assert broken.status_code == 503 and "tokens file" in broken.json()["error"]


def test_the_command_line_refuses_a_bad_configuration(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert http_main(["--url", "redis://127.0.0.1:1/0"]) == 2
    assert "give --tokens FILE" in capsys.readouterr().err
    missing = str(tmp_path / "none.toml")
    assert http_main(["--tokens", missing]) == 2
    assert "does not exist" in capsys.readouterr().err
    tokens = str(tmp_path / "tokens.toml")
    assert http_main(["tokens", "add", "no body", "--queue", "ops", "--tokens", tokens]) == 2
    assert "token name 'no body'" in capsys.readouterr().err
    assert http_main(["tokens", "revoke", "alice", "--tokens", tokens]) == 2
    assert "no token named 'alice'" in capsys.readouterr().err
    assert http_main(["tokens", "add", "alice", "--queue", "ops", "--tokens", tokens]) == 0
    out = capsys.readouterr()
    token = out.out.strip()
    assert len(token) >= 40 and "keep it secret" in out.err
    assert Tokens(Path(tokens)).grant(token) is not None


async def test_the_documented_curl_calls_answer_a_request(setup: Setup) -> None:
    """The curl block of docs/how-to/http-api.md, run by bash: it lists the request and
    answers it; the waiter gets exactly the documented data."""
    blocks = re.findall(r"```sh\n(curl .*?)```", PAGE.read_text(), re.S)
    assert len(blocks) == 1
    request = Request(id=new_id("http"), kind="input", prompt="Name?", data={"schema": FORM})
    wait = await setup.ask("ops", request)
    code, out, err = await run(
        "bash",
        "-euc",
        blocks[0],
        TOOLNEXUS_HTTP_URL=setup.url,
        TOKEN=setup.tokens["alice"],
        ID=request.id,
    )
    assert code == 0, err
    listed = json.loads(out[: out.index("}{") + 1])
    assert [r["id"] for r in listed["requests"]] == [request.id]
    assert json.loads(out[out.index("}{") + 1 :]) == {"outcome": "answered"}
    answer = await asyncio.wait_for(wait, 30)
    assert (answer.data, answer.person) == ({"name": "Ada Lovelace"}, "http:alice")


async def test_a_quorum_counts_each_tokens_person_once(setup: Setup) -> None:
    request = Request(id=new_id("http"), kind="approval", prompt="Deploy?", quorum=Quorum(need=2))
    wait = await setup.ask("ops", request)
    path = f"/v1/requests/{request.id}/answer"
    first = await setup.post(path, {"action": "accept"})
    assert first.status_code == 200 and first.json()["outcome"] == "voted"
    assert first.json()["approvals"].startswith("1 of 2 approvals")
    shown = (await setup.get(f"/v1/requests/{request.id}")).json()
    assert shown["approvals"] == first.json()["approvals"]
    again = await setup.post(path, {"action": "accept"})  # alice again: not counted
    assert again.status_code == 409 and "not counted" in again.json()["error"]
    assert not wait.done()
    second = await setup.post(path, {"action": "accept"}, "ci")
    assert second.json() == {"outcome": "answered"}
    answer = await asyncio.wait_for(wait, 30)
    assert answer.ok and {a.person for a in answer.approvals or []} == {"http:alice", "http:ci"}


async def test_a_tool_approval_shows_its_call_and_an_edit_is_checked(setup: Setup) -> None:
    """The API returns a tool approval's call (name, arguments, framework, run, digest) and
    the tool's schema in its JSON; an edit that breaks the schema is refused naming the
    argument, a valid one is what the agent is told to run."""
    tool_schema = {
        "type": "object",
        "properties": {"to": {"type": "string"}, "amount": {"type": "integer", "maximum": 100}},
        "required": ["to", "amount"],
    }
    arguments = {"to": "ACME", "amount": 10}
    request = tool_call_request(
        "transfer", arguments, framework="test", run="run-42", schema=tool_schema
    )
    wait = await setup.ask("ops", request)
    body = (await setup.get(f"/v1/requests/{request.id}")).json()
    jsonschema.validate(body, schema("OpenRequest"))
    assert body["kind"] == "tool_call"
    assert body["data"]["tool_call"] == {
        "name": "transfer",
        "arguments": arguments,
        "framework": "test",
        "run": "run-42",
        "call_id": None,
        "digest": tool_call_digest("transfer", arguments),
    }
    assert body["data"]["schema"]["properties"]["amount"]["default"] == 10
    path = f"/v1/requests/{request.id}/answer"
    refused = await setup.post(path, {"action": "accept", "data": {**arguments, "amount": 500}})
    assert refused.status_code == 422 and refused.json()["field"] == "amount"
    sent = await setup.post(path, {"action": "accept", "data": {**arguments, "amount": 5}})
    assert sent.status_code == 200
    decision = decide(request, await asyncio.wait_for(wait, 30))
    assert decision.edited and decision.arguments == {"to": "ACME", "amount": 5}


async def test_a_decline_carries_its_message_to_a_tool_approval(setup: Setup) -> None:
    request = tool_call_request("transfer", {"to": "ACME"}, framework="test")
    wait = await setup.ask("ops", request)
    path = f"/v1/requests/{request.id}/answer"
    wrong = await setup.post(path, {"action": "accept", "message": "why"})
    assert wrong.status_code == 400 and wrong.json()["field"] == "message"
    sent = await setup.post(path, {"action": "decline", "message": "Not this quarter"})
    assert sent.status_code == 200
    decision = decide(request, await asyncio.wait_for(wait, 30))
    assert not decision.approved and decision.message == "Not this quarter"
