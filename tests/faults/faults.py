"""What the fault scenarios share: their size, their figures, their processes.

Reduced counts by default (what ``.ci/run`` runs); ``TOOLNEXUS_FAULTS=full`` runs every
scenario at full size (the figures in docs/reliability.md). Each scenario prints one
``FAULT {...}`` JSON line with its figures (``pytest -s`` shows them)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import toolnexus
from toolnexus import Answer

FULL = os.environ.get("TOOLNEXUS_FAULTS") == "full"
REQUESTS = 1000 if FULL else 200
"""Requests (or pending waits) per scenario."""

RESPONDER = Path(__file__).with_name("accepting_responder.py")


def responder_process(
    url: str, namespace: str, accepted: Path, delay_s: float = 0.0
) -> subprocess.Popen[bytes]:
    """An accepting responder in its own process (see accepting_responder.py)."""
    return subprocess.Popen(
        [sys.executable, str(RESPONDER), url, namespace, str(accepted), str(delay_s)],
        stdout=subprocess.DEVNULL,
    )


def figures(
    scenario: str, sent: int, answers: list[Answer], accepted: Path | None = None, **extra: object
) -> dict[str, object]:
    """The scenario's figures: sent, answered, lost, duplicated (acceptances Redis took
    for a request more than once, read from the responders' ``accepted`` file)."""
    answered = sum(1 for a in answers if a.ok)
    duplicated = 0
    if accepted is not None and accepted.exists():
        counts = Counter(accepted.read_text().split())
        duplicated = sum(n - 1 for n in counts.values() if n > 1)
    result: dict[str, object] = {
        "scenario": scenario,
        "sent": sent,
        "answered": answered,
        "lost": sent - answered,
        "duplicated": duplicated,
        **extra,
    }
    print("FAULT " + json.dumps(result), flush=True)
    return result


async def accept_all(broker: toolnexus.Broker, group: str = "bot") -> None:
    """Accept every request of the queue, in this process, until cancelled."""
    async with broker.responder(group) as responder:
        async for pending in responder:
            try:
                await pending.accept()
            except toolnexus.ToolnexusError:
                continue
