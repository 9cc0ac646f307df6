"""The partition report (issue 40): every scenario, with and without
``durability="wait"``, repeated; the figures as a table, written into
docs/reliability.md between its partition markers with ``--write``.

    ./run partitions --repeats 20 --write docs/reliability.md
    .venv/bin/python tests/partitions/report.py --repeats 20 --write docs/reliability.md

Needs root (network namespaces). Each run prints one ``PARTITION {...}`` JSON line.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

from partition_net import available
from partition_scenarios import SCENARIOS, Figures, Plan, as_json, run_scenario


def markers(section: str) -> tuple[str, str]:
    """The markers between which ``--write`` puts the table of ``section`` (``""``: the
    page's main partition table)."""
    name = f"partitions-{section}" if section else "partitions"
    return f"<!-- {name}:begin -->", f"<!-- {name}:end -->"


DESCRIPTIONS = {
    "isolated-primary": "primary isolated with one Sentinel, one agent and one responder "
    "(the minority) until the majority failed over and 4 s more, then healed",
    "flapping-link": "the primary's link down 1 s, up 1 s, for 12 s",
    "quorum-failover": "as the primary isolated, with requests that need 2 votes (one "
    "responder on each side): a failover during the votes",
    "escalation-failover": "as the primary isolated, with requests that escalate after "
    "1.5 s to the responders' queue: a failover during the hops",
    "cluster-isolated-master": "a Cluster master (the one holding the majority agent's "
    "waiter) isolated with one agent and one responder until its replica took over and "
    "4 s more, then healed",
}


def table(runs: list[Figures], commit: str) -> str:
    by_case: dict[tuple[str, str], list[Figures]] = defaultdict(list)
    for figures in runs:
        by_case[(figures.scenario, figures.durability)].append(figures)
    lines = [
        f"Measured by `tests/partitions/report.py` on {commit} (2 shared cores, Redis 7.0.15):",
        "",
        "| Scenario | `durability` | Runs | Requests | Acknowledged answers | Not confirmed "
        "| Lost acknowledged | Conflicting | Stranded | Expired | Sentinel switched | "
        "Majority's clients served again | Majority's agent answered again |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---|",
    ]
    for (scenario, durability), cases in sorted(by_case.items()):
        switches = sorted(c.switch_s for c in cases if c.switch_s is not None)
        recovers = sorted(c.recover_s for c in cases if c.recover_s is not None)
        reconnects = sorted(c.reconnect_s for c in cases if c.reconnect_s is not None)
        lines.append(
            f"| {DESCRIPTIONS.get(scenario, scenario)} | `{durability}` | {len(cases)} "
            f"| {sum(c.requests for c in cases):,} | {sum(c.acknowledged for c in cases):,} "
            f"| {sum(c.not_confirmed for c in cases):,} | **{sum(c.lost for c in cases)}** "
            f"| **{sum(c.conflicting for c in cases)}** | {sum(c.stranded for c in cases)} "
            f"| {sum(c.expired for c in cases)} | {_span(switches)} | {_span(reconnects)} "
            f"| {_span(recovers)} |"
        )
    return "\n".join(lines)


def _span(values: list[float]) -> str:
    if not values:
        return "—"
    median = values[len(values) // 2]
    return f"median {median:.1f} s after the fault (max {values[-1]:.1f} s)"


def write(path: Path, text: str, section: str = "") -> None:
    begin, end = markers(section)
    page = path.read_text()
    pattern = re.compile(re.escape(begin) + ".*?" + re.escape(end), re.DOTALL)
    if not pattern.search(page):
        raise SystemExit(f"{path}: no {begin} ... {end} markers")
    path.write_text(pattern.sub(lambda _: f"{begin}\n{text}\n{end}", page))


def logged(log: Path) -> list[Figures]:
    """The figures of the ``PARTITION {...}`` lines of an earlier output."""
    prefix = "PARTITION "
    return [
        Figures(**json.loads(line.removeprefix(prefix)))
        for line in log.read_text().splitlines()
        if line.startswith(prefix)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--scenarios", nargs="*", default=list(SCENARIOS))
    parser.add_argument("--durability", nargs="*", default=["none", "wait"])
    parser.add_argument("--write", type=Path, help="the page whose partition table to replace")
    parser.add_argument(
        "--from-log",
        type=Path,
        nargs="*",
        help="run nothing: the table of the PARTITION lines these earlier outputs printed",
    )
    parser.add_argument(
        "--section",
        default="",
        help="write between <!-- partitions-SECTION:begin/end --> (default: the main table)",
    )
    args = parser.parse_args()
    runs: list[Figures] = []
    if args.from_log:
        runs = [r for log in args.from_log for r in logged(log)]
    elif (problem := available()) is not None:
        raise SystemExit(f"partition runs cannot run here: {problem}")
    tmp = Path(tempfile.mkdtemp(prefix="toolnexus-partitions-"))
    for repeat in range(0 if args.from_log else args.repeats):
        for scenario in args.scenarios:
            for durability in args.durability:
                directory = tmp / f"{scenario}-{durability}-{repeat}"
                figures = run_scenario(directory, scenario, durability, Plan())
                print(f"PARTITION {as_json(figures)}", flush=True)
                runs.append(figures)
                if not figures.examples:  # kept otherwise: its logs and histories
                    shutil.rmtree(directory)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    text = table(runs, commit or "this tree")
    print(text)
    if args.write is not None:
        write(args.write, text, args.section)
    bad = [r for r in runs if r.durability == "wait" and (r.lost or r.conflicting)]
    if bad:
        print(json.dumps([r.examples for r in bad]), file=sys.stderr)
        raise SystemExit(1)


if __name__ == "__main__":
    main()
