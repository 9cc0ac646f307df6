"""The README's example is real: its waiter and responder run against Redis."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from toolnexus import Answer, Request, Signatures

README = Path(__file__).parents[1] / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


@pytest.mark.redis
def test_the_readme_waiter_is_answered_by_the_readme_responder(redis_url: str) -> None:
    waiter, responder = python_blocks()[:2]
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


def test_the_readme_signature_setup_works_between_two_hosts(tmp_path: Path) -> None:
    setup = re.search(r"## Signatures\n.*?```sh\n(.*?)```", README.read_text(), flags=re.S)
    assert setup is not None
    keygen_agent, keygen_bot, _copy, export_agent, export_bot = setup.group(1).splitlines()
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
