"""``python -m bench``: start a private redis-server, run every case, write the report.

Floor and toolnexus cases alternate over several rounds (samples pooled,
throughput as the median round) so that drift on a shared machine hits both
alike. Every case runs in a fresh process; Redis is flushed between cases.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.channels import CHANNELS
from bench.harness import uvloop_available
from bench.machine import ROOT, describe

BENCH_DIR = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Plan:
    """Sample counts of one run."""

    rounds: int
    latency_rounds: int  # more, shorter rounds: a process's p50 moves with where it runs
    latency_warmup: int
    latency_n: int
    levels: list[tuple[int, int, int]]  # (concurrent waits, warm-up round trips, measured)
    scale_waits: int
    wakeup: tuple[int, int, int]  # (other waits pending, warm-up round trips, measured)
    peer_default: tuple[int, int]  # (warm-up, measured) with default poll intervals
    peer_min: tuple[int, int]  # (warm-up, measured) with the minimum poll interval
    min_poll_s: float
    channels: tuple[int, int]  # (warm-up, measured) round trips per channel and latency round
    codec_n: int
    codec_repeats: int
    fleet_requests: int  # open requests of the memory case
    fleet_idle: tuple[int, int, int, float]  # (brokers, processes, open each, seconds)
    fleet_dead: int  # open requests of the killed agent
    fleet_channels: tuple[int, int]  # (round trips, consumer groups)
    fleet_durable: tuple[int, int, int]  # (waiting agents, processes, answers)
    fleet_cluster: tuple[int, int, int, int]  # (round trips, queues, durable waits each, agents)
    case_timeout_s: float


FULL = Plan(
    rounds=5,  # the 1,000-wait rows move by ±15 % between rounds on these 2-core VMs
    latency_rounds=8,
    latency_warmup=200,
    latency_n=400,
    levels=[(1, 100, 1000), (100, 1000, 10_000), (1000, 2000, 20_000)],
    scale_waits=10_000,
    wakeup=(10_000, 200, 1000),
    peer_default=(3, 30),
    peer_min=(20, 300),
    min_poll_s=0.001,
    channels=(10, 60),
    codec_n=20_000,
    codec_repeats=5,
    fleet_requests=10_000,
    fleet_idle=(1000, 4, 10, 60.0),
    fleet_dead=10_000,
    fleet_channels=(1000, 10),
    fleet_durable=(1000, 4, 100),
    fleet_cluster=(2000, 6, 100, 96),
    case_timeout_s=900,
)

QUICK = Plan(
    rounds=1,
    latency_rounds=1,
    latency_warmup=20,
    latency_n=100,
    levels=[(1, 10, 50), (100, 100, 500), (1000, 1000, 2000)],
    scale_waits=1000,
    wakeup=(1000, 20, 100),
    peer_default=(1, 3),
    peer_min=(2, 10),
    min_poll_s=0.001,
    channels=(2, 5),
    codec_n=1000,
    codec_repeats=2,
    fleet_requests=200,
    fleet_idle=(20, 2, 2, 6.0),  # at least one liveness renewal (every 5 s)
    fleet_dead=50,
    fleet_channels=(50, 3),
    fleet_durable=(20, 2, 5),
    fleet_cluster=(100, 6, 5, 96),
    case_timeout_s=180,
)


@dataclass
class Spec:
    """One case run: ``fn`` ("module:function") called with ``(url, params)`` in a fresh process."""

    label: str
    fn: str
    params: dict[str, Any] = field(default_factory=dict)


def build_specs(plan: Plan, logdir: Path, only: set[str] | None, loops: list[str]) -> list[Spec]:
    """Every case run, floor and toolnexus alternating round by round (the latency cases
    over ``latency_rounds``, the others over ``rounds``); with ``uvloop`` in ``loops``,
    the latency and 1,000-wait throughput cases again on uvloop."""
    levels = [[c, w, n] for c, w, n in plan.levels]
    lat = {"warmup": plan.latency_warmup, "n": plan.latency_n}
    pending, wake_warmup, wake_n = plan.wakeup
    wake = {"pending": pending, "warmup": wake_warmup, "n": wake_n}
    specs: list[Spec] = []
    for r in range(max(plan.rounds, plan.latency_rounds)):
        if r < plan.latency_rounds:
            specs += [
                Spec("floor", "bench.floor:latency_case", {**lat, "round": r, "variant": "direct"}),
                Spec("toolnexus", "bench.tnx:latency_case",
                     {**lat, "round": r, "variant": "default"}),
                Spec("toolnexus", "bench.tnx:latency_case",
                     {**lat, "round": r, "variant": "signed"}),
            ]  # fmt: skip
            specs += [
                Spec("channel", "bench.channels:channel_case",
                     {"warmup": plan.channels[0], "n": plan.channels[1], "round": r,
                      "variant": channel, "logdir": str(logdir)})
                for channel in CHANNELS
            ]  # fmt: skip
            for loop in loops:
                if loop != "asyncio":
                    specs += [
                        Spec("floor", "bench.floor:latency_case",
                             {**lat, "round": r, "variant": f"direct, {loop}", "loop": loop}),
                        Spec("toolnexus", "bench.tnx:latency_case",
                             {**lat, "round": r, "variant": f"default, {loop}", "loop": loop}),
                    ]  # fmt: skip
        if r >= plan.rounds:
            continue
        specs += [
            Spec("floor", "bench.floor:throughput_case",
                 {"levels": levels, "round": r, "variant": "pool"}),
            Spec("floor", "bench.floor:throughput_case",
                 {"levels": levels, "coalesce": True, "round": r, "variant": "coalesced"}),
            Spec("toolnexus", "bench.tnx:throughput_case",
                 {"levels": levels, "round": r, "variant": "default"}),
            Spec("toolnexus", "bench.tnx:throughput_case",
                 {"levels": levels, "responder": "tasks", "round": r,
                  "variant": "concurrent accepts"}),
            Spec("toolnexus", "bench.tnx:throughput_case",
                 {"levels": levels, "responder": "serve", "round": r, "variant": "serve"}),
            Spec("wakeup", "bench.floor:wakeup_case", {**wake, "round": r}),
            Spec("wakeup", "bench.tnx:wakeup_case", {**wake, "round": r}),
        ]  # fmt: skip
        top = [levels[-1]]
        specs.append(Spec("floor", "bench.floor:throughput_case",
                          {"levels": top, "writes": True, "round": r,
                           "variant": "same writes"}))  # fmt: skip
        for loop in loops:
            if loop == "asyncio":
                continue
            specs += [
                Spec("floor", "bench.floor:throughput_case",
                     {"levels": top, "round": r, "variant": f"pool, {loop}", "loop": loop}),
                Spec("floor", "bench.floor:throughput_case",
                     {"levels": top, "coalesce": True, "round": r,
                      "variant": f"coalesced, {loop}", "loop": loop}),
                Spec("toolnexus", "bench.tnx:throughput_case",
                     {"levels": top, "responder": "serve", "round": r,
                      "variant": f"serve, {loop}", "loop": loop}),
            ]  # fmt: skip
    scale = {"waits": plan.scale_waits}
    specs += [
        Spec("scale", "bench.scale:baseline_case", scale),
        Spec("scale", "bench.floor:scale_case", scale),
        Spec("scale", "bench.tnx:scale_case", scale),
    ]
    for peer in ("arq", "celery", "rq", "taskiq"):
        for variant, (warmup, n) in (("default", plan.peer_default), ("min", plan.peer_min)):
            specs.append(
                Spec(
                    peer,
                    f"bench.peers.cases:{peer}_case",
                    {
                        "variant": variant,
                        "warmup": warmup,
                        "n": n,
                        "min_poll_s": plan.min_poll_s,
                        "logdir": str(logdir),
                    },
                )
            )
    specs.append(Spec("codec", "bench.codec_case:codec_case",
                      {"n": plan.codec_n, "repeats": plan.codec_repeats}))  # fmt: skip
    brokers, processes, each, seconds = plan.fleet_idle
    specs += [
        Spec("memory", "bench.fleet:memory_case", {"requests": plan.fleet_requests}),
        Spec("idle", "bench.fleet:idle_case",
             {"brokers": brokers, "processes": processes, "open": each, "seconds": seconds}),
        Spec("dead", "bench.fleet:dead_case", {"requests": plan.fleet_dead}),
        Spec("channels", "bench.fleet:channels_case",
             {"requests": plan.fleet_channels[0], "groups": plan.fleet_channels[1]}),
        Spec("durable", "bench.fleet:durable_case",
             {"waiters": plan.fleet_durable[0], "processes": plan.fleet_durable[1],
              "answers": plan.fleet_durable[2]}),
        Spec("cluster", "bench.fleet:cluster_case",
             {"requests": plan.fleet_cluster[0], "queues": plan.fleet_cluster[1],
              "durable": plan.fleet_cluster[2], "agents": plan.fleet_cluster[3]}),
    ]  # fmt: skip
    if only:
        specs = [s for s in specs if s.label in only]
    return specs


class RedisServer:
    """A private ``redis-server`` on a free loopback port, nothing persisted."""

    def __init__(self, workdir: Path, *args: str, port: int | None = None) -> None:
        self.workdir = workdir
        self.args = args
        self.port = port or _free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[bytes] | None = None
        self.version = "unknown"

    def __enter__(self) -> RedisServer:
        exe = shutil.which("redis-server") or "/usr/bin/redis-server"
        self.proc = subprocess.Popen(
            [
                exe,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.workdir),
                "--logfile",
                str(self.workdir / "redis.log"),
                "--maxclients",
                "10000",
                *self.args,
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        import redis

        client = redis.Redis.from_url(self.url)
        deadline = time.monotonic() + 15
        try:
            while True:
                try:
                    info = client.info("server")
                    self.version = str(info["redis_version"])
                    break
                except redis.exceptions.ConnectionError:
                    if time.monotonic() > deadline or self.proc.poll() is not None:
                        raise RuntimeError(
                            f"redis-server did not start on port {self.port}"
                        ) from None
                    time.sleep(0.05)
        except BaseException:
            self.__exit__()
            raise
        finally:
            client.close()
        return self

    def flush(self) -> None:
        import redis

        with redis.Redis.from_url(self.url) as client:
            client.flushall()

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class RedisCluster:
    """A private Redis Cluster of ``masters`` masters and no replicas on loopback (for the
    ``cluster`` case), each node a :class:`RedisServer` stopped by its PID."""

    def __init__(self, workdir: Path, masters: int = 3) -> None:
        self.workdir = workdir
        self.masters = masters
        self.servers: list[RedisServer] = []

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{s.port}" for s in self.servers)

    def __enter__(self) -> RedisCluster:
        try:
            for i in range(self.masters):
                node_dir = self.workdir / f"node{i}"
                node_dir.mkdir(parents=True, exist_ok=True)
                server = RedisServer(
                    node_dir, "--cluster-enabled", "yes", port=_free_port(cluster_bus=True)
                )
                self.servers.append(server.__enter__())
            cli = shutil.which("redis-cli") or "/usr/bin/redis-cli"
            subprocess.run(
                [cli, "--cluster", "create", *(f"127.0.0.1:{s.port}" for s in self.servers),
                 "--cluster-replicas", "0", "--cluster-yes"],
                check=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, timeout=60,
            )  # fmt: skip
            self._wait_formed()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _wait_formed(self) -> None:
        import redis

        deadline = time.monotonic() + 30
        for server in self.servers:
            with redis.Redis(port=server.port) as client:
                while b"cluster_state:ok" not in client.execute_command("CLUSTER", "INFO"):
                    if time.monotonic() > deadline:
                        raise RuntimeError("the local Redis Cluster did not form")
                    time.sleep(0.1)

    def __exit__(self, *exc: object) -> None:
        for server in self.servers:
            server.__exit__()
        self.servers = []


def _free_port(cluster_bus: bool = False) -> int:
    """A free loopback port; with ``cluster_bus``, one whose Cluster bus port (+10000) is
    free too."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port: int = s.getsockname()[1]
        if not cluster_bus:
            return port
        if port + 10000 < 65536:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind(("127.0.0.1", port + 10000))
                except OSError:
                    continue
            return port


def run_case(spec: Spec, url: str, workdir: Path, timeout_s: float) -> dict[str, Any]:
    """Run ``spec`` in a fresh interpreter; its result, or ``{"error": ...}``."""
    spec_path = workdir / "spec.json"
    out_path = workdir / "out.json"
    out_path.unlink(missing_ok=True)
    spec_path.write_text(
        json.dumps({"label": spec.label, "fn": spec.fn, "url": url, "params": spec.params})
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "bench._case", str(spec_path), str(out_path)],
            cwd=ROOT,
            env=env,
            timeout=timeout_s,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
        )
    except subprocess.TimeoutExpired:
        return {"case": spec.label, "variant": str(spec.params.get("variant", "")),
                "error": f"timed out after {timeout_s:.0f} s"}  # fmt: skip
    if not out_path.exists():
        return {"case": spec.label, "variant": str(spec.params.get("variant", "")),
                "error": f"exit {proc.returncode}: {proc.stderr[-2000:]}"}  # fmt: skip
    result: dict[str, Any] = json.loads(out_path.read_text())
    result.setdefault("case", spec.label)
    result.setdefault("variant", str(spec.params.get("variant", "")))
    if "error" in result and proc.stderr:
        result["stderr"] = proc.stderr[-4000:]
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument(
        "--quick", action="store_true", help="tiny sample counts; writes to a temporary directory"
    )
    parser.add_argument("--out", type=Path, help="where RESULTS.md and results.png go")
    parser.add_argument(
        "--only",
        help="comma-separated case labels "
        "(floor,toolnexus,wakeup,scale,arq,celery,rq,taskiq,codec,memory,idle,dead,channels,durable,"
        "cluster)",
    )
    parser.add_argument(
        "--uvloop",
        choices=["auto", "yes", "no"],
        default="auto",
        help="also run the latency and 1,000-wait cases on uvloop: auto = if it is installed",
    )
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else FULL
    out: Path = args.out or (
        Path(tempfile.mkdtemp(prefix="toolnexus-bench-")) if args.quick else BENCH_DIR
    )
    out.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="toolnexus-bench-work-"))
    only = set(args.only.split(",")) if args.only else None
    loops = ["asyncio"]
    if args.uvloop == "yes" or (args.uvloop == "auto" and uvloop_available()):
        loops.append("uvloop")
    specs = build_specs(plan, workdir / "logs", only, loops)

    from bench.report import write_report

    results: list[dict[str, Any]] = []
    started = time.perf_counter()
    with RedisServer(workdir) as server:
        print(f"redis-server {server.version} on {server.url}; {len(specs)} case runs", flush=True)
        for i, spec in enumerate(specs, 1):
            server.flush()
            t0 = time.perf_counter()
            if spec.label == "cluster":  # a 3-master Cluster of its own, for this case alone
                with RedisCluster(workdir / f"cluster-{i}") as cluster:
                    params = {**spec.params, "cluster": cluster.url}
                    result = run_case(
                        Spec(spec.label, spec.fn, params), server.url, workdir, plan.case_timeout_s
                    )
            else:
                result = run_case(spec, server.url, workdir, plan.case_timeout_s)
            status = "FAILED" if "error" in result else "skipped" if "skipped" in result else "ok"
            variant = result.get("variant") or spec.params.get("variant", "")
            print(
                f"[{i}/{len(specs)}] {spec.label} {variant} ({spec.fn.split(':')[1]}): "
                f"{status} in {time.perf_counter() - t0:.1f} s",
                flush=True,
            )
            if status == "FAILED":
                print(result["error"], file=sys.stderr, flush=True)
                print(result.get("stderr", ""), file=sys.stderr, flush=True)
            results.append(result)
        machine = describe(server.version)
    elapsed = time.perf_counter() - started
    quick_note = "--quick: tiny sample counts, figures not meaningful" if args.quick else ""
    command = shlex.join(["python", "-m", "bench", *(sys.argv[1:] if argv is None else argv)])
    write_report(out, results, machine, elapsed, note=quick_note, command=command)
    (out / "results.json").write_text(
        json.dumps(
            {"machine": machine, "elapsed_s": elapsed, "results": _without_samples(results)},
            indent=1,
        )
    )
    print(f"wrote {out / 'RESULTS.md'} and {out / 'results.png'} in {elapsed:.0f} s")
    print(f"worker logs: {workdir / 'logs'}")
    return 1 if any("error" in r for r in results) else 0


def _without_samples(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k not in ("samples_ms", "stderr")} for r in results]
