"""``toolnexus demo`` (SPEC §13), its terminal responder, and the examples, end to end."""

from __future__ import annotations

import asyncio
import io
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pexpect
import pytest

import toolnexus
from helpers import page_block
from mcp_helpers import FAST, answering
from toolnexus import Broker, Pending, Request
from toolnexus.cli import auto_answer, result_text
from toolnexus.cli._demo import BOOKING_FORM, run_demo
from toolnexus.rendering import check_link
from toolnexus.responders import Terminal, validate_form

ROOT = Path(__file__).resolve().parent.parent
TOOLNEXUS = str(Path(sys.executable).with_name("toolnexus"))


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLNEXUS_")}
    return {**env, **extra}


def test_auto_answers_fit_the_form() -> None:
    request = Request(id="elc-1", kind="input", data={"schema": BOOKING_FORM})
    answer = auto_answer(request)
    assert answer.ok
    assert validate_form(BOOKING_FORM, answer.data) == answer.data
    url = Request(id="elc-2", kind="authorization", url="https://x.example/")
    consent = auto_answer(url)
    assert (consent.id, consent.ok, consent.data) == ("elc-2", True, None)


async def test_the_demo_with_the_auto_responder_on_memory() -> None:
    output = io.StringIO()
    result = await run_demo("memory://", responder="auto", restaurant="Noma", output=output)
    assert result_text(result).startswith("Booked: a table for 2 at Noma")
    assert "deposit authorized" in result_text(result)
    assert output.getvalue().count("[auto responder]") == 2
    assert "the auto responder: answers each question for you" in output.getvalue()
    said = result_text(result)  # every answer the form took, said back
    assert "dietary needs: none; high chair: no; budget per person: not given" in said, said


async def test_the_demo_with_a_person_who_declines() -> None:
    answers = "Ada\nada@example.com\n\n2026-09-01\n\n\n\n\nn\n"
    output = io.StringIO()
    result = await run_demo(stdin=io.StringIO(answers), output=output)
    assert result_text(result) == "No booking at Chez Toolnexus: the guest chose 'decline'."
    assert "── input request from toolnexus-booking · book_table · agent demo-" in output.getvalue()


async def test_the_demo_with_a_person_who_walks_away() -> None:
    result = await run_demo(stdin=io.StringIO("Ada\n"), output=io.StringIO())
    assert result_text(result) == "No booking at Chez Toolnexus: the guest chose 'cancel'."


@pytest.mark.slow
def test_toolnexus_demo_auto_as_a_command() -> None:
    done = subprocess.run(
        [TOOLNEXUS, "demo", "--responder", "auto"],
        capture_output=True,
        text=True,
        timeout=30,
        env=clean_env(),
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "Tool result: Booked: a table for 2 at Chez Toolnexus" in done.stdout


@pytest.mark.redis
@pytest.mark.slow
def test_toolnexus_demo_auto_over_redis(redis_url: str, namespace: str) -> None:
    done = subprocess.run(
        [TOOLNEXUS, "demo", "--responder", "auto", "--url", redis_url, "--namespace", namespace],
        capture_output=True,
        text=True,
        timeout=30,
        env=clean_env(),
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "Tool result: Booked: a table for 2 at Chez Toolnexus" in done.stdout


@pytest.mark.slow
def test_toolnexus_demo_with_the_terminal_responder_in_a_pty() -> None:
    child = pexpect.spawn(
        TOOLNEXUS, ["demo"], env=clean_env(TERM="xterm"), encoding="utf-8", timeout=15
    )
    try:
        # what the three parts are, before anything is asked
        child.expect("an MCP server \\(an example restaurant's, in this process\\)")
        child.expect("an agent \\(in this process\\): calls book_table")
        child.expect("you, at this terminal: the responder")
        child.expect("Name for the booking")
        child.sendline("A")  # too short: refused, asked again
        child.expect("shorter than the minimum length of 2")
        child.expect("Name for the booking")
        child.sendline("Ada Lovelace")
        child.expect(r"Email \(email\): ")
        child.sendline("not-an-email")
        child.expect("is not a valid email")
        child.sendline("ada@example.com")
        child.expect(r"Guests \(integer 1–12\) \[2\]: ")
        child.sendline("20")
        child.expect("greater than the maximum of 12")
        child.sendline("3")
        child.expect(r"Date \(date, YYYY-MM-DD\): ")
        child.sendline("tomorrow")  # refused, saying how a date is written
        child.expect(r"'tomorrow' is not a valid date \(write it as YYYY-MM-DD\)")
        child.expect(r"Date \(date, YYYY-MM-DD\): ")
        child.sendline("2026-09-01")
        child.expect(r"Seating \(1-3\) \[1\]: ")
        child.sendline("2")
        child.expect(r"Dietary needs \(numbers 1-4, comma-separated\) \[none\]: ")
        child.sendline("1,3")
        child.expect(r"High chair needed \(y/n\) \[n\]: ")
        child.sendline("y")
        child.expect(r"Budget per person \(EUR\) \(number ≥ 0; optional\): ")
        child.sendline("")
        # the answer as it will be sent, before it is
        child.expect("Your answer:")
        for line in (
            "Name for the booking: Ada Lovelace",
            "Email: ada@example.com",
            "Guests: 3",
            "Date: 2026-09-01",
            "Seating: Terrace",
            "Dietary needs: vegetarian, gluten-free",
            "High chair needed: yes",
            r"Budget per person \(EUR\): \(left out\)",
        ):
            child.expect(f"    {line}\r\n")
        child.expect(r"Send this answer\? \[y/n\]: ")
        child.sendline("sure")  # neither: said so, and asked again
        child.expect("'sure' is not an answer: type y \\(yes\\) or n \\(no\\)")
        child.expect(r"Send this answer\? \[y/n\]: ")
        child.sendline("y")
        child.expect("authorization request from toolnexus-booking")
        # the registrable domain highlighted within the host, as the web page does
        child.expect("URL:    https://pay.\x1b\\[1;4;33mexample.com\x1b\\[0m/authorize")
        child.expect("Domain: \x1b\\[1mexample.com\x1b\\[0m\r\n")
        child.expect(r"Continue with this authorization\? \[y/n\]: ")
        child.sendline("y")
        # every answer said back in the result, then what happened and what next
        child.expect(
            "Tool result: Booked: a table for 3 at Chez Toolnexus on 2026-09-01, terrace, in "
            "the name of Ada Lovelace \\(ada@example.com\\); dietary needs: vegetarian, "
            "gluten-free; high chair: yes; budget per person: not given; deposit authorized."
        )
        child.expect("What happened: the agent called the MCP tool book_table")
        child.expect("toolnexus worker terminal --queue demo --url redis://127.0.0.1:6379/0")
        child.expect("A small fleet on Redis")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0


@pytest.mark.slow
def test_the_first_pause_tutorial_demo_lines_run_as_written() -> None:
    """docs/tutorials/first-pause.md: ``toolnexus demo`` answered at a terminal (a pty,
    every default taken), then ``toolnexus demo --responder auto``."""
    block = page_block("docs/tutorials/first-pause.md", "toolnexus demo ", language="sh")
    at_terminal, auto = [line.split("#")[0].strip() for line in block.splitlines()]
    env = {**clean_env(TERM="xterm"), "PATH": f"{Path(TOOLNEXUS).parent}:{os.environ['PATH']}"}
    child = pexpect.spawn("bash", ["-c", at_terminal], env=env, encoding="utf-8", timeout=15)
    try:
        for prompt, reply in [
            ("Name for the booking", "Ada Lovelace"),
            (r"Email \(email\): ", "ada@example.com"),
            (r"Guests \(integer 1–12\) \[2\]: ", ""),
            (r"Date \(date, YYYY-MM-DD\): ", "2026-09-01"),
            (r"Seating \(1-3\) \[1\]: ", ""),
            (r"Dietary needs \(numbers 1-4, comma-separated\) \[none\]: ", ""),
            (r"High chair needed \(y/n\) \[n\]: ", ""),
            (r"Budget per person \(EUR\) \(number ≥ 0; optional\): ", ""),
            (r"Send this answer\? \[y/n\]: ", "y"),
            (r"Continue with this authorization\? \[y/n\]: ", "y"),
        ]:
            child.expect(prompt)
            child.sendline(reply)
        child.expect("Tool result: Booked: a table for 2 at Chez Toolnexus on 2026-09-01")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0
    done = subprocess.run(
        ["bash", "-c", auto], capture_output=True, text=True, timeout=60, env=env, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "Tool result: Booked: a table for 2 at Chez Toolnexus" in done.stdout


@pytest.fixture
async def rbroker(redis_url: str, namespace: str) -> AsyncIterator[Broker]:
    async with toolnexus.connect(redis_url, namespace=namespace, **FAST) as broker:
        yield broker


@pytest.mark.redis
@pytest.mark.slow
async def test_the_example_agent_waits_for_a_responder_elsewhere(
    rbroker: Broker, redis_url: str, namespace: str
) -> None:
    async def answer(pending: Pending) -> None:
        await pending.answer(auto_answer(pending.request))

    async with answering(rbroker, answer) as seen:
        agent = await asyncio.create_subprocess_exec(
            sys.executable,
            str(ROOT / "examples" / "agent.py"),
            "--url",
            redis_url,
            "--namespace",
            namespace,
            "--inprocess",
            stdout=subprocess.PIPE,
            env=clean_env(),
        )
        stdout, _ = await agent.communicate()
    assert agent.returncode == 0
    assert "toolnexus-booking: tools book_table" in stdout.decode()
    assert "deposit authorized" in stdout.decode()
    assert [r.kind for r in seen] == ["input", "authorization"]
    assert seen[0].source.agent is not None and seen[0].source.agent.startswith("example-agent-")


async def test_the_terminal_shows_the_domain_the_web_page_shows() -> None:
    """Issue #43: the terminal said ``pay.example.com`` where the page said
    ``example.com``; both now show the registrable domain (``check_link``'s), within the
    whole host, with the page's warnings."""
    url = "http://pay.example.com/authorize"
    output = io.StringIO()
    terminal = Terminal(stdin=io.StringIO("n\n"), output=output)
    await terminal.ask(Request(id="auth-1", kind="authorization", url=url, prompt="Pay?"))
    shown = output.getvalue()
    link = check_link(url)
    assert f"  URL:    {url}\n" in shown and f"  Domain: {link.domain}\n" in shown, shown
    assert link.domain == "example.com"
    assert f"  ⚠ {link.warnings[0]}" in shown and "not https" in link.warnings[0]


async def test_the_terminal_asks_for_consent_to_an_approval() -> None:
    terminal = Terminal(stdin=io.StringIO("maybe\ny\n"), output=io.StringIO())
    answer = await terminal.ask(Request(id="apr-1", kind="approval", prompt="Deploy?"))
    assert answer.ok
