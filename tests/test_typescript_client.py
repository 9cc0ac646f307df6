"""The TypeScript client (clients/typescript, issue #47): compiled with ``tsc --strict``, its
Node tests (``node --test``) run against a real wait gateway, a real HTTP answering API and a
real Redis started here; and its ``npm pack`` tarball installed into an empty project runs
the README's example."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import shutil
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import toolnexus
from conftest import FAST
from toolnexus import Broker
from toolnexus.security import SigningKey
from toolnexus_workers.gateway.app import Agents, Gateway
from toolnexus_workers.gateway.server import GatewayServer
from toolnexus_workers.gateway.tokens import Tokens as GatewayTokens
from toolnexus_workers.http.server import HttpServer
from toolnexus_workers.http.tokens import Tokens, add_token
from toolnexus_workers.links import LinkKey

pytestmark = [pytest.mark.redis, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
CLIENT = ROOT / "clients" / "typescript"
README = CLIENT / "README.md"
PAGE = ROOT / "docs" / "how-to" / "typescript.md"
AGENT_TOKEN = "agent-7-token-0123456789"
REFUSED_TOKEN = "agent-9-token-0123456789"  # its requests go to a responder that refuses them
LINK_SECRET = "a-link-secret-of-32-characters-or-more"


def npm(*args: str, cwd: Path = CLIENT, timeout: float = 120) -> str:
    done = subprocess.run(
        ["npm", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert done.returncode == 0, f"npm {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def built() -> Path:
    """``npm ci`` (again only when package-lock.json changed), then ``tsc --strict`` of the
    package and of its tests."""
    if shutil.which("npm") is None:
        pytest.fail("these tests need Node 20 and npm (./run test installs them)")
    lock = hashlib.sha256((CLIENT / "package-lock.json").read_bytes()).hexdigest()
    stamp = CLIENT / "node_modules" / ".toolnexus-lock"
    if not stamp.is_file() or stamp.read_text() != lock:
        npm("ci", "--no-audit", "--no-fund")
        stamp.write_text(lock)
    npm("run", "build")
    npm("run", "build:test")
    return CLIENT


@dataclass
class Servers:
    env: dict[str, str]


async def mint_links(server: HttpServer, key: LinkKey) -> asyncio.Server:
    """``GET /QUEUE/ID/RECIPIENT``: an answer link to an open request (what the webhook
    and email workers send), for the Node tests."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        line = (await reader.readline()).decode()
        while (await reader.readline()).strip():
            pass
        queue, request_id, recipient = line.split()[1].strip("/").split("/")
        held = server.desk.open.get((queue, request_id))
        if held is None:
            status, body = "404 Not Found", f"{queue}/{request_id} is not open"
        else:
            token = key.mint(queue, held.pending.request, recipient)
            status, body = "200 OK", f"{server.url}/v1/links/{token}"
        writer.write(
            f"HTTP/1.1 {status}\r\ncontent-length: {len(body)}\r\nconnection: close\r\n\r\n"
            f"{body}".encode()
        )
        await writer.drain()
        writer.close()

    return await asyncio.start_server(serve, "127.0.0.1", 0)


@pytest.fixture
async def servers(redis_url: str, namespace: str, tmp_path: Path) -> AsyncIterator[Servers]:
    """A wait gateway whose agents ask on queue ``ops``, and an HTTP answering API serving
    ``ops`` and ``billing``: alice may use ``ops``, bob only ``billing``. Agent-9 asks on
    queue ``signed``, whose responder requires signatures and refuses its unsigned requests."""

    def connect(queue: str, agent: str | None = None) -> Broker:
        return toolnexus.connect(redis_url, namespace=namespace, queue=queue, agent=agent, **FAST)

    tokens_file = tmp_path / "tokens.toml"
    alice = add_token(tokens_file, "alice", ["ops"])
    bob = add_token(tokens_file, "bob", ["billing"])
    gateway = Gateway(
        Agents(lambda agent: connect("signed" if agent == "agent-9" else "ops", agent)),
        GatewayTokens([("agent-7", AGENT_TOKEN), ("agent-9", REFUSED_TOKEN)]),
        keepalive_s=0.2,
    )
    links = LinkKey(secret=LINK_SECRET)
    ops, billing = connect("ops"), connect("billing")
    keys, trusted = tmp_path / "keys", tmp_path / "trusted"  # agent-9 signs nothing anyway
    for directory in (keys, trusted):
        directory.mkdir()
    SigningKey.generate("refuser").save(keys)
    SigningKey.generate("someone").save(trusted)
    (trusted / "someone.key").unlink()
    refuser = toolnexus.connect(
        redis_url,
        namespace=namespace,
        queue="signed",
        signing_key=keys / "refuser.key",
        trusted_keys=trusted,
        require_signatures=True,
        **FAST,
    )
    async with ops, billing, refuser, refuser.responder("web") as refused:
        refusing = asyncio.create_task(anext(refused))  # it refuses what it reads
        brokers = {"ops": ops, "billing": billing}
        try:
            async with (
                GatewayServer(gateway, port=0) as gateway_server,
                HttpServer(brokers, Tokens(tokens_file), port=0, links=links) as http_server,
            ):
                minting = await mint_links(http_server, links)
                port = minting.sockets[0].getsockname()[1]
                async with minting:
                    yield Servers(
                        {
                            "TOOLNEXUS_GATEWAY_URL": gateway_server.url,
                            "TOOLNEXUS_GATEWAY_TOKEN": AGENT_TOKEN,
                            "TOOLNEXUS_GATEWAY_REFUSED_TOKEN": REFUSED_TOKEN,
                            "TOOLNEXUS_HTTP_URL": http_server.url,
                            "TOOLNEXUS_HTTP_TOKEN": alice,
                            "TOOLNEXUS_HTTP_OTHER_TOKEN": bob,
                            "TOOLNEXUS_MINT_URL": f"http://127.0.0.1:{port}",
                        }
                    )
        finally:
            refusing.cancel()
            await asyncio.gather(refusing, return_exceptions=True)


async def run(
    command: list[str], cwd: Path, env: dict[str, str], limit_s: float = 90
) -> tuple[int, str]:
    """Run ``command`` while this event loop goes on serving the servers."""
    process = await asyncio.create_subprocess_exec(
        *command,
        cwd=cwd,
        env={**os.environ, **env},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        async with asyncio.timeout(limit_s):
            out, _ = await process.communicate()
    except TimeoutError:
        process.kill()
        await process.wait()
        raise
    assert process.returncode is not None
    return process.returncode, out.decode()


async def test_the_node_tests_pass_against_a_real_gateway_http_api_and_redis(
    built: Path, servers: Servers
) -> None:
    """Accept, decline, expiry, abort, another queue's token, a link used twice, a tool-call
    approval with an edit, the toolkit port's agent loop, the generated types' drift:
    clients/typescript/test/*.test.ts."""
    code, out = await run(["npm", "test"], built, servers.env)
    assert code == 0, out
    passed = re.search(r"^# pass (\d+)$", out, re.M)
    failed = re.search(r"^# fail (\d+)$", out, re.M)
    assert passed and failed, out
    assert int(passed.group(1)) >= 10 and failed.group(1) == "0", out


def readme_example() -> str:
    block: str
    [block] = re.findall(r"^```js\n(.*?)^```\n", README.read_text(), re.S | re.M)
    return block


def test_the_docs_page_shows_the_readmes_example() -> None:
    """docs/how-to/typescript.md shows the example the packed tarball runs, word for word."""
    assert readme_example() in PAGE.read_text()


async def test_the_packed_tarball_installs_into_an_empty_project_and_runs_the_readme_example(
    built: Path, servers: Servers, tmp_path: Path
) -> None:
    tarball = npm("pack", "--pack-destination", str(tmp_path), "--json")
    [packed] = json.loads(tarball)
    files = {f["path"] for f in packed["files"]}
    assert "dist/index.js" in files and "dist/index.d.ts" in files and "README.md" in files
    assert not any(f.startswith(("src/", "test/", "build/", "node_modules/")) for f in files)
    project = tmp_path / "project"
    project.mkdir()
    (project / "package.json").write_text('{"name": "empty", "private": true, "type": "module"}')
    npm(
        "install",
        "--no-audit",
        "--no-fund",
        "--offline",
        str(tmp_path / packed["filename"]),
        cwd=project,
    )
    assert not (project / "node_modules" / "toolnexus-client" / "node_modules").exists()
    (project / "example.mjs").write_text(readme_example())
    code, out = await run(["node", "example.mjs"], project, servers.env, limit_s=30)
    assert code == 0, out
    assert json.loads(out.strip().splitlines()[-1])["ok"] is True, out
