"""The README's and the tutorials' examples are real: the README's agent is answered on the web
page its shell block starts; the fleet tutorial's waiter is answered by its responder, over
Redis; the security page's signature setup works between two hosts. (tests/test_docs_examples.py
checks that every example is run or checked.)"""

from __future__ import annotations

import asyncio
import os
import re
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import httpx2 as httpx
import pytest

from toolnexus import Answer, Request
from toolnexus.security import Signatures

ROOT = Path(__file__).parents[1]
README = ROOT / "README.md"
FLEET = ROOT / "docs" / "tutorials" / "fleet.md"
SECURITY = ROOT / "docs" / "security.md"
URL = "redis://127.0.0.1:6379/0"


def blocks(page: Path, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", page.read_text(), flags=re.S)


def in_namespace(program: str, namespace: str) -> str:
    """The program, connecting in a namespace of the test's own."""
    placed = program.replace(f'connect("{URL}")', f'connect("{URL}", namespace={namespace!r})')
    assert placed != program, "the example no longer connects to the test Redis"
    return placed


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@pytest.mark.redis
@pytest.mark.slow
def test_the_fleet_waiter_is_answered_by_the_fleet_responder(
    redis_url: str, namespace: str
) -> None:
    waiter, responder = (in_namespace(b, namespace) for b in blocks(FLEET, "python")[:2])
    assert "wait_for" in waiter and "responder(" in responder
    answering = subprocess.Popen(
        [sys.executable, "-c", responder], stdout=subprocess.PIPE, text=True
    )
    try:
        done = subprocess.run(
            [sys.executable, "-c", waiter], capture_output=True, text=True, timeout=30
        )
    finally:
        answering.kill()
        out, _ = answering.communicate()
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "approved"
    assert "approving: Deploy to production?" in out


async def readme_round_trip(
    toolnexus: str, python: str, env: dict[str, str], redis_url: str, namespace: str
) -> str:
    """What the README's agent prints once a person accepts its question on the web page the
    README's shell block starts (word for word, but on a free port and in the test's
    namespace), with ``toolnexus`` the command and ``python`` the interpreter to run them."""
    [shell] = [b for b in blocks(README, "sh") if "worker web" in b]
    make_token, start = shell.strip().splitlines()
    token = subprocess.run(
        ["bash", "-c", f'{make_token}; printf %s "$TOKEN"'],
        capture_output=True,
        text=True,
        env={**env, "PATH": os.pathsep.join([str(Path(python).parent), os.environ["PATH"]])},
    ).stdout
    assert len(token) >= 16
    port = free_port()
    command = [*shlex.split(start.split("#")[0]), "--port", str(port)]
    assert command[:3] == ["toolnexus", "worker", "web"] and command[4] == "$TOKEN"
    command[0], command[4] = toolnexus, token
    env = {**env, "TOOLNEXUS_URL": redis_url, "TOOLNEXUS_NAMESPACE": namespace}
    [agent] = [b for b in blocks(README, "python") if "broker.wait_for(question" in b]
    web = await asyncio.create_subprocess_exec(*command, env=env, stderr=subprocess.DEVNULL)
    asking = await asyncio.create_subprocess_exec(
        python, "-c", in_namespace(agent, namespace), stdout=subprocess.PIPE, env=env
    )
    try:
        base = f"http://127.0.0.1:{port}"
        async with httpx.AsyncClient(base_url=base, follow_redirects=True) as page:
            async with asyncio.timeout(30):
                while True:  # the link the README's comment says to open: signs in
                    try:
                        signed_in = await page.get("/", params={"token": token})
                        break
                    except httpx.TransportError:
                        await asyncio.sleep(0.1)  # not listening yet
                assert signed_in.status_code == 200, signed_in.text
                while "Deploy to production?" not in (text := (await page.get("/")).text):
                    await asyncio.sleep(0.1)
            request = re.search(r'name="request" value="([^"]+)"', text)
            csrf = re.search(r'name="csrf" value="([^"]+)"', text)
            assert request is not None and csrf is not None
            form = {"request": request[1], "csrf": csrf[1], "action": "accept"}
            sent = await page.post("/answer", data=form)  # what the page's Accept sends
            assert [r.status_code for r in sent.history] == [303], sent.text  # to the page
        out, _ = await asyncio.wait_for(asking.communicate(), 30)
    finally:
        for process in (asking, web):
            if process.returncode is None:
                process.kill()
                await process.wait()
    return out.decode().strip()


@pytest.mark.redis
@pytest.mark.slow
async def test_the_readme_agent_is_answered_on_the_readme_web_page(
    redis_url: str, namespace: str
) -> None:
    toolnexus = str(Path(sys.executable).with_name("toolnexus"))
    env = dict(os.environ)
    printed = await readme_round_trip(toolnexus, sys.executable, env, redis_url, namespace)
    assert printed == "approved"


@pytest.mark.slow
def test_the_signature_setup_works_between_two_hosts(tmp_path: Path) -> None:
    [setup] = [b for b in blocks(SECURITY, "sh") if b.startswith("toolnexus keygen agent-7")]
    keygen_agent, keygen_bot, _copy, export_agent, export_bot = setup.splitlines()
    hosts = {"agent": tmp_path / "agent-host", "responder": tmp_path / "responder-host"}
    toolnexus = Path(sys.executable).with_name("toolnexus")
    for host, line in zip(hosts.values(), [keygen_agent, keygen_bot], strict=True):
        command = line.split("#")[0].replace("/etc/toolnexus", str(host)).split()
        subprocess.run([str(toolnexus), *command[1:]], check=True, capture_output=True)
    for source, target in [("agent", "responder"), ("responder", "agent")]:
        (hosts[target] / "trusted").mkdir()
        for pub in hosts[source].glob("*.pub"):  # the copy the third line asks for
            (hosts[target] / "trusted" / pub.name).write_text(pub.read_text())

    def environment(line: str, host: Path) -> Signatures:
        assignments = line.split("#")[0].replace("/etc/toolnexus", str(host)).split()[1:]
        return Signatures.from_env(dict(a.split("=", 1) for a in assignments))

    agent = environment(export_agent, hosts["agent"])
    bot = environment(export_bot, hosts["responder"])
    assert agent.required and bot.required
    request = agent.sign_request(Request(id="req-1", kind="approval", reply_to="w"))
    assert bot.admit_request(request) == "agent-7"
    answer = bot.sign_answer(Answer(id="req-1", ok=True), request)
    assert agent.admit_answer(answer, request) == "ops-bot"
