"""``toolnexus worker terminal`` in a pseudo-terminal: a form answered with mistakes
corrected, Ctrl-C dismissing a request, and a second Ctrl-C quitting cleanly."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import toolnexus
from conformance import TerminalAdapter
from conftest import FAST
from helpers import eventually
from toolnexus import Request, Source, new_id
from toolnexus.cli._demo import BOOKING_FORM
from toolnexus.models import Hop

pytestmark = pytest.mark.redis


@pytest.mark.slow
async def test_a_form_with_mistakes_corrected_then_ctrl_c_twice(
    redis_url: str, namespace: str, tmp_path: Path
) -> None:
    terminal = TerminalAdapter(tmp_path)
    waits: list[asyncio.Task[toolnexus.Answer]] = []
    async with toolnexus.connect(redis_url, namespace=namespace, queue="tty", **FAST) as broker:
        try:
            await terminal.start(redis_url, namespace, "tty")
            child = terminal.child
            assert child is not None
            booking = Request(
                id=new_id(),
                kind="input",
                prompt="Book a table?",
                data={"schema": BOOKING_FORM},
                source=Source(server="booking", tool="book_table", agent="agent-7"),
            )
            wait = asyncio.create_task(broker.wait_for(booking, timeout_s=60))
            waits.append(wait)
            at = await terminal.wait_for(
                "── input request from booking · book_table · agent agent-7"
            )
            steps = [
                ("Name for the booking (2–60 characters): ", "A"),
                ("'A' is shorter than the minimum length of 2", None),
                ("Name for the booking (2–60 characters): ", "Ada Lovelace"),
                ("Email (email): ", "ada.example.com"),
                ("'ada.example.com' is not a valid email", None),
                ("Email (email): ", "ada@example.com"),
                ("Guests (integer 1–12) [2]: ", "twelve"),
                ("'twelve' is not a whole number", None),
                ("Guests (integer 1–12) [2]: ", "3"),
                ("Date (date, YYYY-MM-DD): ", "2026-02-30"),
                ("is not a valid date", None),
                ("Date (date, YYYY-MM-DD): ", "2026-09-01"),
                ("Seating (1-3) [1]: ", "4"),
                ("'4' is not one of the choices 1-3", None),
                ("Seating (1-3) [1]: ", "2"),
                ("Dietary needs (numbers 1-4, comma-separated) [none]: ", "1,3"),
                ("High chair needed (y/n) [n]: ", "y"),
                ("Budget per person (EUR) (number ≥ 0; optional): ", "-5"),
                ("less than the minimum of 0", None),
                ("Budget per person (EUR) (number ≥ 0; optional): ", "42.5"),
                ("Send this answer? [y/n]: ", "y"),
                ("✓ answer sent", None),
            ]
            for expect, reply in steps:
                at = await terminal.wait_for(expect, at)
                if reply is not None:
                    child.sendline(reply)
            answer = await asyncio.wait_for(wait, 20)
            assert answer.ok and answer.data == {
                "name": "Ada Lovelace",
                "email": "ada@example.com",
                "guests": 3,
                "date": "2026-09-01",
                "seating": "terrace",
                "diet": ["vegetarian", "gluten-free"],
                "high_chair": True,
                "budget": 42.5,
            }
            assert answer.responder is not None and answer.responder.startswith("terminal/")

            approval = Request(id=new_id(), kind="approval", prompt="Restart the cache?")
            wait = asyncio.create_task(broker.wait_for(approval, timeout_s=60))
            waits.append(wait)
            at = await terminal.wait_for("Accept? [y/n]: ", at)
            child.sendintr()  # Ctrl-C: dismiss this one
            at = await terminal.wait_for("✓ dismissed", at)
            assert (await asyncio.wait_for(wait, 20)).reason == "dismissed"
            at = await terminal.wait_for("waiting for requests", at)
            await asyncio.sleep(2.5)  # past the double-press window: this Ctrl-C is idle
            child.sendintr()  # nothing asked: quit
            await terminal.wait_for("bye", at)
            await eventually(terminal.exited, "the worker quit")
            assert child.exitstatus == 0
            assert "Traceback" not in terminal.screen
        finally:
            for task in waits:
                task.cancel()
            await asyncio.gather(*waits, return_exceptions=True)
            await terminal.close()


@pytest.mark.slow
async def test_an_escalated_request_says_so_and_is_gone_once_answered_on_the_next_queue(
    redis_url: str, namespace: str, tmp_path: Path
) -> None:
    terminal = TerminalAdapter(tmp_path)
    async with (
        toolnexus.connect(redis_url, namespace=namespace, queue="tty", **FAST) as broker,
        toolnexus.connect(redis_url, namespace=namespace, queue="oncall", **FAST) as oncall,
        oncall.responder("pager") as pager,
    ):
        try:
            await terminal.start(redis_url, namespace, "tty")
            request = Request(
                id=new_id(),
                kind="approval",
                prompt="Drain the node?",
                escalate=[Hop(0.3, "oncall")],
            )
            wait = asyncio.create_task(broker.wait_for(request, timeout_s=60))
            at = await terminal.wait_for("Accept? [y/n]: ")
            at = await terminal.wait_for("⏫ escalated to oncall: Drain the node? (still open", at)
            await (await anext(pager)).accept(person="pager:ada")
            assert (await asyncio.wait_for(wait, 20)).person == "pager:ada"
            await terminal.wait_for("✗ gone: Drain the node?", at)
        finally:
            await terminal.close()
