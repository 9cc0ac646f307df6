"""The manual's worker command lines, run as written (issue #33): each is started in a
scratch directory against the test Redis (``TOOLNEXUS_URL``, and a namespace of the
test's own in ``TOOLNEXUS_NAMESPACE``), runs until its heartbeat is in Redis, and stops
on SIGTERM with exit status 0; an ``ask`` beside them is run to its first answer. What
a line names that is the reader's (a listening port, a key file) is given here a value
of the test's own, and said where it is."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

import toolnexus
from conftest import FAST, free_port
from helpers import eventually, opened, page_block
from toolnexus import Request
from toolnexus.security import SigningKey

pytestmark = [pytest.mark.redis, pytest.mark.slow]

TOKEN = "docs-token-0123456789abcdef"


def lines(block: str) -> list[str]:
    """The command lines of a shell block: continuations joined, comments and blank lines
    left out."""
    joined = block.replace("\\\n", " ")
    found = []
    for line in joined.splitlines():
        command = re.sub(r"\s+#.*$", "", line).strip()
        if command and not command.startswith("#"):
            found.append(command)
    return found


@pytest.fixture
def shell(redis_url: str, namespace: str, tmp_path: Path) -> Iterator[dict[str, str]]:
    """The environment the lines run in: this Python's ``toolnexus`` first on the path."""
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]])
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TOOLNEXUS_")}
    yield {
        **clean,
        "PATH": path,
        "TOOLNEXUS_URL": redis_url,
        "TOOLNEXUS_NAMESPACE": namespace,
        "TOKEN": TOKEN,
        "SECRET": "docs-session-secret-0123456789abcdef",
    }


@contextlib.asynccontextmanager
async def running(
    commands: list[str], env: dict[str, str], cwd: Path
) -> AsyncIterator[list[subprocess.Popen[str]]]:
    """``commands`` started, each a process of its own (``exec`` by bash, unless the
    command says where); on leaving, each is sent SIGTERM and must end with status 0
    (killed, with what it said, if it does not)."""
    started = [
        subprocess.Popen(
            ["bash", "-c", command if "exec " in command else f"exec {command}"],
            env=env,
            cwd=cwd,
            stdin=subprocess.PIPE,  # kept open: the terminal worker reads it
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for command in commands
    ]
    try:
        yield started
    finally:
        for process in started:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process, command in zip(started, commands, strict=True):
            try:
                _, err = await asyncio.to_thread(process.communicate, timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                _, err = process.communicate()
            assert process.returncode == 0, f"{command}: {process.returncode}\n{err}"


async def serving(redis_url: str, namespace: str, groups: set[str], queue: str = "default") -> None:
    """Wait until a worker of each of ``groups`` beats on ``queue``."""
    async with toolnexus.connect(redis_url, namespace=namespace, queue=queue, **FAST) as b:

        async def beating() -> bool:
            return groups <= {beat.group for beat in await b.heartbeats()}

        await eventually(beating, f"heartbeats of {sorted(groups)}", timeout_s=60)


def quiet(stderr: str) -> str:
    """``stderr`` of an ``ask`` that went as the page says: its one status line, "waiting
    for an answer", and nothing else (no warning: a warning on a page's own example
    teaches readers to ignore warnings)."""
    said = [line for line in stderr.splitlines() if line.strip()]
    unexpected = [line for line in said if not line.startswith("toolnexus ask: waiting for ")]
    assert not unexpected, f"unexpected on stderr:\n{stderr}"
    return stderr


def with_port(command: str, port: int) -> str:
    """``command`` listening on ``port`` (a free one: the machine is shared)."""
    if "--port " in command:
        return re.sub(r"--port \d+", f"--port {port}", command)
    return f"{command} --port {port}"


async def test_the_workers_page_starts_each_worker(
    shell: dict[str, str], redis_url: str, namespace: str, tmp_path: Path
) -> None:
    """docs/how-to/workers.md: the terminal, auto and web workers (``rules.toml`` is a
    rule file of the test's; the web page on a free port)."""
    block = page_block("docs/how-to/workers.md", "toolnexus worker terminal", language="sh")
    commands = lines(block)
    assert [c.split()[2] for c in commands] == ["terminal", "auto", "web"]
    (tmp_path / "rules.toml").write_text('[[rule]]\naction = "skip"\n')
    commands[2] = with_port(commands[2], free_port())
    async with running(commands, shell, tmp_path):
        await serving(redis_url, namespace, {"terminal", "auto", "web"})


async def test_the_deploy_page_starts_two_web_replicas(
    shell: dict[str, str], redis_url: str, namespace: str, tmp_path: Path
) -> None:
    """docs/how-to/deploy.md: two web replicas sharing a session secret (each on a free
    port instead of 8700 and 8701)."""
    block = page_block("docs/how-to/deploy.md", "toolnexus worker web --group web-0", "sh")
    commands = [with_port(command, free_port()) for command in lines(block)]
    assert len(commands) == 2
    async with running(commands, shell, tmp_path):
        await serving(redis_url, namespace, {"web-0", "web-1"})


async def test_the_http_api_page_starts_the_answering_api(
    shell: dict[str, str], redis_url: str, namespace: str, tmp_path: Path
) -> None:
    """docs/how-to/http-api.md: the answering API (its Redis the test's, its key made
    here instead of /etc/toolnexus/http.key, on a free port), after the page's token
    commands made tokens.toml."""
    page = "docs/how-to/http-api.md"
    tokens = lines(page_block(page, "toolnexus worker http tokens add", "sh"))
    for command in tokens:
        subprocess.run(["bash", "-c", command], env=shell, cwd=tmp_path, check=True, timeout=60)
    [command] = lines(page_block(page, "toolnexus worker http --url", "sh"))
    SigningKey.generate("http").save(tmp_path)
    command = command.replace("/etc/toolnexus/http.key", str(tmp_path / "http.key"))
    command = command.replace("redis://127.0.0.1:6379/0", redis_url)
    async with running([with_port(command, free_port())], shell, tmp_path):
        await serving(redis_url, namespace, {"http"}, queue="ops")


async def test_the_upgrade_page_starts_responders_writing_protocol_1(
    shell: dict[str, str], redis_url: str, namespace: str, tmp_path: Path
) -> None:
    """docs/how-to/upgrade.md: the responders of a fleet being upgraded, with the page's
    ``export`` (``rules.toml`` a rule file of the test's, the web page on a free port)."""
    block = page_block("docs/how-to/upgrade.md", "export TOOLNEXUS_WRITE_PROTOCOL=1", "sh")
    exports, commands = [], []
    for line in lines(block):
        (exports if line.startswith("export ") else commands).append(line)
    assert exports == ["export TOOLNEXUS_WRITE_PROTOCOL=1"]
    assert [c.split()[2] for c in commands] == ["auto", "web"]
    (tmp_path / "rules.toml").write_text('[[rule]]\naction = "skip"\n')
    commands[1] = with_port(commands[1], free_port())
    env = {**shell, "TOOLNEXUS_WRITE_PROTOCOL": "1"}
    async with running(commands, env, tmp_path):
        await serving(redis_url, namespace, {"bot-1", "web-0"})


async def test_the_fleet_tutorial_asks_and_the_page_serves(
    shell: dict[str, str], redis_url: str, namespace: str, tmp_path: Path
) -> None:
    """docs/tutorials/fleet.md: the token, the web page (on a free port) and the ask,
    run to its first answer (given here by a responder beside the page)."""
    block = page_block("docs/tutorials/fleet.md", "export TOKEN=", "sh")
    export, web, ask = lines(block)
    env = {k: v for k, v in shell.items() if k != "TOKEN"}
    async with running([f"{export}; exec {with_port(web, free_port())}"], env, tmp_path):
        await serving(redis_url, namespace, {"web"})
        asking = asyncio.create_task(
            asyncio.to_thread(
                subprocess.run,
                ["bash", "-c", f"{export}; {ask}"],
                env=env,
                cwd=tmp_path,
                capture_output=True,
                text=True,
                timeout=60,
            )
        )
        async with toolnexus.connect(redis_url, namespace=namespace, **FAST) as broker:
            async with broker.responder("ops") as requests, asyncio.timeout(30):
                pending = await anext(requests)
            assert pending.request.prompt == "Deploy build 412 to production?"
            await pending.accept()
        done = await asyncio.wait_for(asking, 60)
    assert (done.returncode, done.stdout.strip().splitlines()[-1]) == (0, "deploying")
    quiet(done.stderr)


async def test_the_fleet_tutorial_form_is_asked_and_answered(
    shell: dict[str, str], redis_url: str, namespace: str, tmp_path: Path
) -> None:
    """docs/tutorials/fleet.md: the form.json the page writes, asked with ``toolnexus
    ask --schema``, answered by a responder with the form's fields."""
    block = page_block("docs/tutorials/fleet.md", "cat > form.json", "sh")
    asking = asyncio.create_task(
        asyncio.to_thread(
            subprocess.run,
            ["bash", "-euc", block],
            env=shell,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )
    )
    async with toolnexus.connect(redis_url, namespace=namespace, **FAST) as broker:
        async with broker.responder("web") as requests, asyncio.timeout(30):
            pending = await anext(requests)
        schema = pending.request.schema
        assert schema is not None and set(schema["properties"]) == {"seats", "window"}
        await pending.accept({"seats": 3, "window": True})
    done = await asyncio.wait_for(asking, 60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"seats": 3, "window": True}
    quiet(done.stderr)


def made_token(line: str, env: dict[str, str]) -> str:
    """The token made by ``line`` (an ``export TOKEN=...`` or a bare command) in bash."""
    script = line if line.startswith("export TOKEN=") else f"export TOKEN=$({line})"
    done = subprocess.run(
        ["bash", "-c", f'{script}; printf %s "$TOKEN"'],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return done.stdout


@pytest.mark.parametrize("page", ["README.md", "docs/tutorials/fleet.md"])
def test_a_documented_token_is_a_value_the_token_flag_takes(
    page: str, shell: dict[str, str]
) -> None:
    """The pages' token (and the hint of a too-short one) is made of hex digits: a token
    of ``secrets.token_urlsafe()`` starts with ``-`` once in 64, and ``--token "$TOKEN"``
    then reads it as an option, so the worker exits 2 before its first heartbeat (the
    fleet tutorial's test hung on that once in 55 runs)."""
    from toolnexus_workers import web

    export = lines(page_block(page, "export TOKEN=", "sh"))[0]
    refused = subprocess.run(
        ["toolnexus", "worker", "web", "--token", "short", "--port", str(free_port())],
        env=shell,
        capture_output=True,
        text=True,
        timeout=60,
    )
    hint = re.search(r"make one with `([^`]+)`", refused.stderr)
    assert (refused.returncode, bool(hint)) == (2, True), refused.stderr
    assert hint is not None
    for line in (export, hint.group(1)):
        token = made_token(line, shell)
        assert re.fullmatch(r"[0-9a-f]{32,}", token), (line, token)
        assert web.parser().parse_args(["--token", token]).token == token


FORM = {"type": "object", "properties": {"seats": {"type": "integer"}}, "required": ["seats"]}


async def test_the_operating_page_commands_run_against_a_fleet(
    shell: dict[str, str], redis_url: str, namespace: str, tmp_path: Path
) -> None:
    """docs/how-to/operating.md's command lines, each run in turn: the asks answered by a
    responder beside them (as a person of ops.example.com where the allow-list says so),
    the answer given to an open request of the line's id, the operator's commands on
    the same namespace (``./deploy.sh`` and ``form.json`` are the test's)."""
    block = page_block("docs/how-to/operating.md", 'toolnexus ask "Deploy build 412', "sh")
    gate, region, seats, answer, dead_letters, status, check, audit = lines(block)
    (tmp_path / "deploy.sh").write_text("#!/bin/sh\necho deployed\n")
    (tmp_path / "deploy.sh").chmod(0o755)
    (tmp_path / "form.json").write_text(json.dumps(FORM))

    def run(command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", "-c", command],
            env=shell,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )

    replies = {
        "Deploy build 412 to production?": ({}, None),
        "Region?": ({"answer": "eu"}, None),
        "Seats?": ({"seats": 2}, "web:ada@ops.example.com"),
    }
    async with toolnexus.connect(redis_url, namespace=namespace, **FAST) as broker:

        async def person() -> None:
            async with broker.responder("ops") as requests:
                async for pending in requests:
                    data, who = replies[pending.request.prompt]
                    await pending.accept(data or None, person=who)

        answering = asyncio.create_task(person())
        try:
            done = [await asyncio.to_thread(run, line) for line in (gate, region, seats)]
        finally:
            answering.cancel()
            await asyncio.gather(answering, return_exceptions=True)
        assert [d.returncode for d in done] == [0, 0, 0], [d.stderr for d in done]
        for each in done:
            quiet(each.stderr)
        assert done[0].stdout.splitlines()[-1] == "deployed"
        assert done[1].stdout.strip() == "eu"
        assert json.loads(done[2].stdout) == {"seats": 2}

        request_id = answer.split()[2]  # the line's own id: an open request has it here
        request = Request(id=request_id, kind="input", prompt="Seats?", data={"schema": FORM})
        waiting = asyncio.create_task(broker.wait_for(request, timeout_s=60))
        await opened(broker, request_id)
        answered = await asyncio.to_thread(run, answer)
        assert answered.returncode == 0, answered.stderr
        got = await asyncio.wait_for(waiting, 20)
        assert (got.ok, got.data, got.person) == (True, {"seats": 2}, "ops:alice")

    for line in (dead_letters, status, audit):
        done_line = await asyncio.to_thread(run, line)
        assert done_line.returncode == 0, (line, done_line.stderr)
    assert "Seats?" in (await asyncio.to_thread(run, audit)).stdout
    checked = await asyncio.to_thread(run, check)  # no web worker here: 1, and why
    assert checked.returncode == 1 and "web" in checked.stdout + checked.stderr


async def test_the_signatures_tutorial_runs_step_by_step(
    shell: dict[str, str], redis_url: str, namespace: str, tmp_path: Path
) -> None:
    """docs/tutorials/signatures.md, its steps in order in one directory, each step's
    visible result as the page says: the keys made; the bot requiring signatures serving;
    the signed ask accepted, signed by ops-bot; a forged answer refused and the genuine one
    taken after it; an unsigned ask refused, exit 5 with the reason. (Terminal 3's ``ID=``
    line is given the id terminal 2 printed.)"""
    page = "docs/tutorials/signatures.md"

    def run(script: str, flags: str = "-euc") -> subprocess.CompletedProcess[str]:
        """``script`` in bash (``flags="-c"``: as typed at a prompt, on past a failure)."""
        return subprocess.run(
            ["bash", flags, script],
            env=shell,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )

    keys = run(page_block(page, "mkdir -p agent/trusted", "sh"))  # 1. two keys
    assert keys.returncode == 0 and keys.stderr == "", keys.stderr
    assert re.search(r"^agent-7 \S+=$", keys.stdout, re.M), keys.stdout
    assert sorted(p.name for p in (tmp_path / "ops" / "trusted").iterdir()) == ["agent-7.pub"]
    assert sorted(p.name for p in (tmp_path / "agent" / "trusted").iterdir()) == ["ops-bot.pub"]

    *setup, start = lines(page_block(page, "cat > rules.toml", "sh"))  # 2. the responder
    heredoc = page_block(page, "cat > rules.toml", "sh").split("export ", 1)[0]
    assert setup[-1].startswith("export ") and start == "toolnexus worker auto --rules rules.toml"
    bot = f"{heredoc}{setup[-1]}\nexec {start}"
    async with running([bot], shell, tmp_path) as [worker]:
        await serving(redis_url, namespace, {"auto"})
        agent_env, ask = lines(page_block(page, "export TOOLNEXUS_SIGNING_KEY=agent/", "sh"))
        signed = await asyncio.to_thread(run, f"{agent_env}\n{ask}")  # 3. ask, signed
        assert signed.returncode == 0, signed.stderr
        quiet(signed.stderr)
        answer = json.loads(signed.stdout)
        assert (answer["ok"], answer["responder"], answer["person"]) == (
            True,
            "ops-bot",
            "auto:deploys",
        )
        assert answer["signature"]["key"] == "ops-bot"

        [restart] = lines(page_block(page, 'toolnexus ask "Restart', "sh"))  # 4. forge
        terminal2 = subprocess.Popen(
            ["bash", "-euc", f"{agent_env}\n{restart}"],
            env=shell,
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert terminal2.stderr is not None
        first = await asyncio.wait_for(asyncio.to_thread(terminal2.stderr.readline), 30)
        printed = re.match(r"toolnexus ask: waiting for an answer to (req-\S+) \(", first)
        assert printed is not None, first
        request_id = printed[1]
        assign, forge = lines(page_block(page, "ID=req-", "sh"))
        assert assign.startswith("ID=req-")
        forged = await asyncio.to_thread(run, f"ID={request_id}\n{forge}")
        assert forged.returncode == 1, forged.stderr
        assert "refused" in forged.stderr and "missing signature" in forged.stderr
        [genuine] = lines(page_block(page, 'toolnexus answer "$ID" --decline', "sh"))
        taken = await asyncio.to_thread(run, f"ID={request_id}\n{genuine}")
        assert taken.returncode == 0, taken.stderr
        assert "declined by ops-bot / ops:alice, taken by the waiter" in taken.stdout
        _, said = await asyncio.to_thread(terminal2.communicate, timeout=60)
        assert terminal2.returncode == 1, said
        assert f"refused an answer to {request_id}: missing signature" in said, said
        assert f"{request_id} declined by ops-bot / ops:alice" in said, said

        [unsigned] = lines(page_block(page, 'toolnexus ask "Deploy build 413', "sh"))  # 5.
        refused = await asyncio.to_thread(run, unsigned, "-c")
        assert refused.stdout.strip().splitlines()[-1] == "exit status 5", refused.stderr
        assert "missing signature (unverified): withdrawn" in refused.stderr, refused.stderr
        assert worker.poll() is None
