"""``python -m bench.profile``: where a toolnexus round trip spends its time, next to the floor.

For the floor and for toolnexus, sequentially and with many concurrent waits,
it reports per round trip: wall time, CPU time of the waiting process, of the
responder process and of redis-server, and the Redis commands sent (from
``INFO commandstats``). With ``--signed``, the toolnexus runs require Ed25519
signatures on both sides (the latency case's ``signed`` variant). With
``--profiler cprofile`` (pstats dumps plus a text summary) or ``--profiler
pyinstrument`` (text) it also profiles the toolnexus waiter and responder
processes into ``--out``. cProfile counts CPU time (``time.process_time``): on a
machine with fewer cores than busy processes, a ``send()`` that wakes Redis can
be preempted for the whole of Redis's turn, and wall-clock profiles then blame
the socket for other processes' work.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import redis

from bench import floor, tnx
from bench.common import measure_throughput
from bench.runner import RedisServer


def _proc_cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _self_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


class Probe:
    """CPU of waiter, responder and Redis, and Redis command counts, over one measured span."""

    def __init__(self, url: str, responder_pid: int) -> None:
        self.client = redis.Redis.from_url(url)
        self.responder_pid = responder_pid

    def _redis_cpu_s(self) -> float:
        info = self.client.info("cpu")
        return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])

    def start(self) -> None:
        self.client.config_resetstat()
        self.t0 = time.perf_counter()
        self.w0 = _self_cpu_s()
        self.r0 = _proc_cpu_s(self.responder_pid)
        self.s0 = self._redis_cpu_s()

    def stop(self, n: int) -> dict[str, Any]:
        wall = time.perf_counter() - self.t0
        waiter = _self_cpu_s() - self.w0
        responder = _proc_cpu_s(self.responder_pid) - self.r0
        server = self._redis_cpu_s() - self.s0
        stats = self.client.info("commandstats")
        commands = {
            name.removeprefix("cmdstat_"): (int(v["calls"]) / n, float(v["usec"]) / n)
            for name, v in stats.items()
            if name not in ("cmdstat_config", "cmdstat_info")
        }
        return {
            "n": n,
            "wall_us": wall / n * 1e6,
            "waiter_cpu_us": waiter / n * 1e6,
            "responder_cpu_us": responder / n * 1e6,
            "redis_cpu_us": server / n * 1e6,
            "commands": commands,
        }


def _print(title: str, m: dict[str, Any]) -> None:
    print(f"\n== {title}: {m['n']:,} round trips")
    print(
        f"   wall {m['wall_us']:8.1f} µs/rt | CPU µs/rt: waiter {m['waiter_cpu_us']:7.1f}, "
        f"responder {m['responder_cpu_us']:7.1f}, redis-server {m['redis_cpu_us']:7.1f}"
    )
    total_calls = sum(c for c, _u in m["commands"].values())
    total_usec = sum(u for _c, u in m["commands"].values())
    print(f"   Redis commands/rt: {total_calls:.2f} ({total_usec:.1f} µs inside Redis)")
    for name, (calls, usec) in sorted(m["commands"].items(), key=lambda kv: -kv[1][0]):
        print(f"     {name:<28} {calls:6.2f}/rt  {usec:7.1f} µs/rt")


async def _sequential(round_trip: Callable[[], Awaitable[object]], n: int) -> None:
    for _ in range(n):
        await round_trip()


class WaiterProfiler:
    """cProfile or pyinstrument around the measured span of the waiter, or nothing."""

    def __init__(self, kind: str, out: Path, name: str) -> None:
        self.kind, self.out, self.name = kind, out, name
        self.profiler: Any = None

    def start(self) -> None:
        if self.kind == "cprofile":
            import cProfile

            self.profiler = cProfile.Profile(time.process_time)  # CPU time
            self.profiler.enable()
        elif self.kind == "pyinstrument":
            from pyinstrument import Profiler

            self.profiler = Profiler(interval=0.001)
            self.profiler.start()

    def stop(self) -> None:
        if self.kind == "cprofile":
            self.profiler.disable()
            self.profiler.dump_stats(str(self.out / f"waiter-{self.name}.prof"))
        elif self.kind == "pyinstrument":
            self.profiler.stop()
            (self.out / f"waiter-{self.name}.txt").write_text(
                self.profiler.output_text(unicode=True, color=False)
            )


def summarize_pstats(path: Path, top: int = 45) -> str:
    """The ``top`` functions by cumulative time, as pstats prints them."""
    import io
    import pstats

    buf = io.StringIO()
    stats = pstats.Stats(str(path), stream=buf)
    stats.strip_dirs().sort_stats("cumulative").print_stats(top)
    return buf.getvalue()


def run(
    url: str,
    n: int,
    concurrency: int,
    out: Path,
    profiler_kind: str,
    responder: str = "loop",
    signed: bool = False,
) -> None:
    results: dict[str, dict[str, Any]] = {}
    flusher = redis.Redis.from_url(url)

    # --- floor
    flusher.flushall()
    with floor.Responder(url) as fr:
        probe = Probe(url, fr.proc.pid or 0)

        async def floor_run() -> None:
            waiter = floor.DirectWaiter(url)
            await _sequential(waiter.round_trip, 200)
            probe.start()
            await _sequential(waiter.round_trip, n)
            results["floor sequential"] = probe.stop(n)
            await waiter.aclose()
            for label in ("pool", "coalesced", "same writes"):
                client = floor.FloorClient(
                    url, coalesce=label == "coalesced", writes=label == "same writes"
                )
                await client.start()
                await measure_throughput(client.round_trip, concurrency, 0, 2000)
                probe.start()
                await measure_throughput(client.round_trip, concurrency, 0, n * 4)
                results[f"floor {label} x{concurrency}"] = probe.stop(n * 4)
                await client.aclose()

        asyncio.run(floor_run())

    # --- toolnexus
    import toolnexus

    keys = tempfile.TemporaryDirectory(prefix="toolnexus-profile-keys-")
    agent_options, responder_options = tnx.signing_options(keys.name) if signed else ({}, {})
    for mode in ("sequential", f"x{concurrency}"):
        flusher.flushall()
        suffix = {"cprofile": ".prof", "pyinstrument": ".txt"}.get(profiler_kind)
        profile_to = str(out / f"responder-{mode}{suffix}") if suffix else None
        with tnx.Responder(
            url, profile_to=profile_to, mode=responder, signing=responder_options
        ) as tr:
            probe = Probe(url, tr.proc.pid or 0)

            async def tnx_run(mode: str = mode, probe: Probe = probe) -> None:
                async with toolnexus.connect(
                    url, namespace=tnx.NAMESPACE, **agent_options
                ) as broker:
                    round_trip = tnx.round_trip_fn(broker)
                    await _sequential(round_trip, 200)
                    profiler = WaiterProfiler(profiler_kind, out, mode)
                    profiler.start()
                    probe.start()
                    if mode == "sequential":
                        await _sequential(round_trip, n)
                        count = n
                    else:
                        count = n * 4
                        await measure_throughput(round_trip, concurrency, 0, count)
                    results[f"toolnexus {mode}"] = probe.stop(count)
                    profiler.stop()

            asyncio.run(tnx_run())
    keys.cleanup()
    flusher.close()
    for title, m in results.items():
        _print(title, m)
    if profiler_kind == "cprofile":
        for prof in sorted(out.glob("*.prof")):
            text = summarize_pstats(prof)
            prof.with_suffix(".txt").write_text(text)
    if profiler_kind != "none":
        print(f"\nprofiles (note: profiling slows the profiled process) in {out}")


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__)
    parser.add_argument("--n", type=int, default=2000, help="sequential round trips")
    parser.add_argument("--concurrency", type=int, default=1000)
    parser.add_argument("--profiler", choices=["none", "cprofile", "pyinstrument"], default="none")
    parser.add_argument("--out", type=Path, help="where profiles go (default: a temp dir)")
    parser.add_argument(
        "--responder",
        choices=sorted(tnx.RESPONDERS),
        default="loop",
        help="how the toolnexus responder answers (see bench.tnx.RESPONDERS)",
    )
    parser.add_argument(
        "--signed",
        action="store_true",
        help="require Ed25519 signatures on both toolnexus sides (bench.tnx.signing_options)",
    )
    args = parser.parse_args()
    out: Path = args.out or Path(tempfile.mkdtemp(prefix="toolnexus-profile-"))
    out.mkdir(parents=True, exist_ok=True)
    with RedisServer(Path(tempfile.mkdtemp(prefix="toolnexus-profile-redis-"))) as server:
        run(server.url, args.n, args.concurrency, out, args.profiler, args.responder, args.signed)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
