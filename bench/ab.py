"""``python -m bench.ab OLD NEW``: two toolnexus source trees against each other, interleaved.

Each round runs the floor, then both trees (in alternating order), every case in a
fresh process against one private ``redis-server``; ``OLD`` and ``NEW`` are directories
holding a ``toolnexus`` package (``git worktree add /tmp/old <rev>`` gives
``/tmp/old/bridge``), put first on ``PYTHONPATH`` for their cases. It prints the pooled
p50 (or the median throughput) of each and every round's own figure.

On a 2-vCPU VM the three processes of a round trip land on the cores differently from
one process start to the next, and a case's p50 moves with it (the floor's between
about 0.26 and 0.42 ms in one run): read the per-round figures, and compare trees only
within one run of this command.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path
from typing import Any

from bench.runner import RedisServer, Spec, run_case

CASES = ("latency", "signed", "serve")


def _spec(case: str, floor: bool) -> Spec:
    if case == "serve":
        levels = [[1000, 4000, 30000]]
        if floor:
            return Spec(
                "floor", "bench.floor:throughput_case", {"levels": levels, "coalesce": True}
            )
        return Spec(
            "toolnexus", "bench.tnx:throughput_case", {"levels": levels, "responder": "serve"}
        )
    lat = {"warmup": 200, "n": 600}
    if floor:
        return Spec("floor", "bench.floor:latency_case", {**lat, "variant": "direct"})
    return Spec(
        "toolnexus",
        "bench.tnx:latency_case",
        {**lat, "variant": "signed" if case == "signed" else "default"},
    )


def _figure(out: dict[str, Any], case: str) -> list[float]:
    """Throughput (round trips/s) for ``serve``; else the latency samples (µs)."""
    if case == "serve":
        return [float(out["throughput"][0]["per_s"])]
    return [ms * 1000 for ms in out["samples_ms"]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("old", type=Path, help="directory holding the old toolnexus package")
    parser.add_argument("new", type=Path, help="directory holding the new toolnexus package")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--case", choices=CASES, default="latency")
    args = parser.parse_args()
    base = os.environ.get("PYTHONPATH", "")
    trees = {"old": str(args.old.resolve()), "new": str(args.new.resolve())}
    pooled: dict[str, list[float]] = {"floor": [], "old": [], "new": []}
    rounds: dict[str, list[float]] = {"floor": [], "old": [], "new": []}
    with tempfile.TemporaryDirectory() as work, RedisServer(Path(work)) as server:
        for r in range(args.rounds):
            order = ["floor", "old", "new"] if r % 2 == 0 else ["floor", "new", "old"]
            for name in order:
                tree = trees.get(name)
                os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [tree, base]))
                out = run_case(_spec(args.case, tree is None), server.url, Path(work), 300)
                server.flush()
                if "error" in out:
                    raise SystemExit(f"{name}: {out['error']}")
                figures = _figure(out, args.case)
                pooled[name] += figures
                rounds[name].append(statistics.median(figures))
    os.environ["PYTHONPATH"] = base
    floor = statistics.median(pooled["floor"])
    unit = "round trips/s" if args.case == "serve" else "µs p50"
    for name, figures in pooled.items():
        value = statistics.median(figures)
        per_round = " ".join(f"{x:,.0f}" for x in rounds[name])
        ratio = value / floor
        print(f"{name:5s} {value:10,.1f} {unit} = {ratio:.2f}× the floor | rounds: {per_round}")


if __name__ == "__main__":
    main()
