"""The benchmark still runs: ``python -m bench --quick`` exits 0 and writes its tables.

No figure is asserted: the quick mode's sample counts are too small to mean anything.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.redis
@pytest.mark.timeout(900)
@pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server")
def test_quick_benchmark_runs_every_case(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--out", str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=840,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    report = (tmp_path / "RESULTS.md").read_text()
    assert (tmp_path / "results.png").stat().st_size > 0
    assert (tmp_path / "results.json").exists()
    for heading in (
        "## Round-trip latency",
        "## Throughput with concurrent waits",
        "## Scale: pending waits in one process",
        "## Codec: one typical message",
        "## Fleet: what agents cost the Redis they share",
        "## Channels: each way a person answers or an agent waits",
    ):
        assert heading in report
    for row in (
        "| floor | direct |",
        "| toolnexus | default |",
        "| floor | pool | 1,000 |",
        "| toolnexus | default | 1,000 |",
        "| bare task | baseline |",
        "| toolnexus MSGPACK | Request |",
        "| pydantic v2 (JSON) | Answer |",
        "| requests | encoded request B | floor B/request |",
        "| brokers | processes | open each |",
        "| requests | liveness s | withdrawn after s |",
        "| groups | Redis CPU µs per round trip, one group |",
        "| waiters | processes | answers | reads per answer, durable |",
        "| node | slots | queues' slots served | Redis CPU µs per round trip, one queue |",
        "| standalone node | all | – |",
        "| master 3 | 10923–16383 |",
        "| what | arithmetic | one node | bound by |",
    ):
        assert row in report, row
    for target in (
        "Redis memory per open request",
        "Redis memory per ended request",
        "an idle broker",
        "an open request held by a responder",
        "open requests withdrawn",
        "consumer groups on one queue",
        "p50 delivery lag",
        "a durable answer with",
        "the 3-master Cluster's Redis CPU per round trip, one queue",
        "the 3-master Cluster's Redis CPU per round trip, 6 queues",
        "one agent's durable states on one queue share one slot",
    ):
        assert target in report, target
    # Every channel is measured through its worker's process, with its budget's target line.
    for channel in ("http", "link", "webhook", "email", "gateway", "auto"):
        assert f"\n| {channel} | " in report, channel
        assert f" channel {channel}: p50 " in report, channel
    # A peer is either measured or listed as skipped (its import failed), never silently gone.
    for peer in ("arq", "celery", "rq", "taskiq"):
        assert f"| {peer} | " in report or f"- {peer} " in report, peer
    # Every durable state of one agent on one queue was found on one master (else the case
    # fails); the report names the master of each queue's states.
    assert "q-5 → master " in report
    # Quick mode never overwrites the committed results.
    assert "--quick" in report
