"""The short form of the partition report (issue 40): the primary isolated with clients on
both sides, once, with ``durability="wait"``. No acknowledged answer is lost, no two
conflict, no wait is stranded, and the majority's clients are served by the new primary
within seconds of Sentinel's switch (not after its 10 s command timeouts against the
old one). tests/partitions/report.py runs every scenario, repeated, with and without
the option."""

from __future__ import annotations

from pathlib import Path

import pytest
from partition_net import available
from partition_scenarios import Plan, run_scenario

problem = available()

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(240),
    pytest.mark.skipif(problem is not None, reason=f"partition runs: {problem}"),
]


def test_an_isolated_primary_loses_no_acknowledged_answer_with_wait(tmp_path: Path) -> None:
    figures = run_scenario(tmp_path, "isolated-primary", "wait", Plan())
    print(f"PARTITION {figures}")
    assert figures.requests > 0 and figures.acknowledged > 0
    assert (figures.lost, figures.conflicting, figures.stranded) == (0, 0, 0), figures.examples
    assert figures.phantom == 0, figures.examples
    assert figures.switch_s is not None and figures.reconnect_s is not None
    assert figures.reconnect_s - figures.switch_s < 5  # a command timeout is 10 s
