"""``python -m bench.ab OLD NEW [MORE...]``: toolnexus source trees against each other.

Each round runs the floor, then every tree (their order rotating from round to round),
every case in a fresh process against one private ``redis-server``; a tree is a
directory holding a ``toolnexus`` package (``git worktree add /tmp/old <rev>`` gives
``/tmp/old/bridge``), put first on ``PYTHONPATH`` for its cases, optionally followed by
``:NAME=VALUE,...``, environment variables for its cases (``bridge
bridge:TOOLNEXUS_REDIS_PUBLIC_API=1`` measures the public-API-only mode against the
default). It prints the pooled p50 (or the median throughput) of each and every round's
own figure.

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


def _tree(arg: str) -> tuple[str, dict[str, str]]:
    """``DIR`` or ``DIR:NAME=VALUE[,NAME=VALUE...]``: a tree, and the environment
    variables set for its cases."""
    path, _, assignments = arg.partition(":")
    env = dict(a.split("=", 1) for a in assignments.split(",") if a)
    return str(Path(path).resolve()), env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "trees",
        nargs="+",
        metavar="TREE",
        help="a directory holding a toolnexus package, optionally with ':NAME=VALUE,...' "
        "(environment variables for its cases); the first is 'old', the second 'new', "
        "more are named by their position",
    )
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--case", choices=CASES, default="latency")
    args = parser.parse_args()
    if len(args.trees) < 2:
        parser.error("give at least two trees")
    base = dict(os.environ)
    names = ["old", "new", *(f"t{i}" for i in range(2, len(args.trees)))]
    trees = dict(zip(names, map(_tree, args.trees), strict=True))
    pooled: dict[str, list[float]] = {"floor": [], **{n: [] for n in names}}
    rounds: dict[str, list[float]] = {"floor": [], **{n: [] for n in names}}
    with tempfile.TemporaryDirectory() as work, RedisServer(Path(work)) as server:
        for r in range(args.rounds):
            shift = r % len(names)  # each tree in each position, round after round
            order = ["floor", *names[shift:], *names[:shift]]
            if r % 2:
                order[1:] = order[:0:-1]
            for name in order:
                tree, env = trees.get(name, ("", {}))
                os.environ.clear()
                os.environ.update(base)
                os.environ.update(env)
                os.environ["PYTHONPATH"] = os.pathsep.join(
                    filter(None, [tree, base.get("PYTHONPATH", "")])
                )
                out = run_case(_spec(args.case, not tree), server.url, Path(work), 300)
                server.flush()
                if "error" in out:
                    raise SystemExit(f"{name}: {out['error']}")
                figures = _figure(out, args.case)
                pooled[name] += figures
                rounds[name].append(statistics.median(figures))
    os.environ.clear()
    os.environ.update(base)
    floor = statistics.median(pooled["floor"])
    unit = "round trips/s" if args.case == "serve" else "µs p50"
    for name, figures in pooled.items():
        value = statistics.median(figures)
        per_round = " ".join(f"{x:,.0f}" for x in rounds[name])
        ratio = value / floor
        print(f"{name:5s} {value:10,.1f} {unit} = {ratio:.2f}× the floor | rounds: {per_round}")
    for name, (tree, env) in trees.items():
        print(f"{name:5s} {tree} {' '.join(f'{k}={v}' for k, v in env.items())}".rstrip())


if __name__ == "__main__":
    main()
