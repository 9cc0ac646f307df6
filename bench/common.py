"""What every case shares: the payload, the statistics, the result shapes, process helpers."""

from __future__ import annotations

import asyncio
import gc
import itertools
import multiprocessing
import multiprocessing.context
import os
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Final, TypedDict

# One payload for every case: the request data an agent sends and the answer
# data a responder returns. Floor, toolnexus and the peers all carry exactly
# these dicts (each in its own envelope), so no case is faster for carrying less.
PAYLOAD: Final[dict[str, Any]] = {
    "question": "Deploy release 2024.11.3 of billing-api to production?",
    "context": "Canary healthy for 30 min; error rate 0.02%; 3 migrations pending.",
    "options": ["approve", "reject", "postpone"],
    "ticket": "OPS-48213",
    "requested_by": "agent-7f3a",
}
ANSWER_DATA: Final[dict[str, Any]] = {"choice": "approve", "note": "go ahead", "v": 1}

SPAWN: Final = multiprocessing.get_context("spawn")


class Latency(TypedDict):
    """Round-trip latency of ``n`` measured samples (``warmup`` more ran first, excluded)."""

    n: int
    warmup: int
    p50_ms: float
    p90_ms: float
    p99_ms: float
    mean_ms: float
    min_ms: float
    max_ms: float


class Throughput(TypedDict):
    """``n`` round trips with ``concurrency`` waits in flight, after ``warmup`` excluded ones."""

    concurrency: int
    n: int
    warmup: int
    elapsed_s: float
    per_s: float
    p50_ms: float
    p99_ms: float


class Scale(TypedDict):
    """Many waits pending at once in one process."""

    waits: int
    rss_before_bytes: int
    rss_delta_bytes: int
    per_wait_bytes: float
    connections: int  # Redis connections of the waiting process with every wait pending
    connections_at_one: int  # ... with one wait pending
    publish_s: float
    resolve_s: float


class Wakeup(TypedDict):
    """Sequential round trips with no other wait pending, then with ``pending`` more."""

    pending: int
    none: Latency
    loaded: Latency
    none_samples_ms: list[float]
    loaded_samples_ms: list[float]


class CodecRow(TypedDict):
    codec: str
    message: str
    bytes: int
    n: int
    encode_us: float
    decode_us: float


class CaseResult(TypedDict, total=False):
    """What one case process reports back to the runner (as JSON)."""

    case: str  # "floor", "toolnexus", "arq", ...
    variant: str  # "default", "min poll", ...
    skipped: str  # why the case did not run
    settings: str  # the settings in words, for the report
    latency: Latency
    samples_ms: list[float]  # the raw latency samples, for pooling rounds
    throughput: list[Throughput]
    scale: Scale
    wakeup: Wakeup
    codec: list[CodecRow]


def percentile(sorted_values: list[float], q: float) -> float:
    """Linear-interpolated percentile ``q`` (0-100) of already sorted values."""
    if not sorted_values:
        return float("nan")
    k = (len(sorted_values) - 1) * q / 100.0
    lo = int(k)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (k - lo)


def _summary(ms: list[float], warmup: int) -> Latency:
    """Percentiles of sorted samples ``ms`` (milliseconds)."""
    return Latency(
        n=len(ms),
        warmup=warmup,
        p50_ms=percentile(ms, 50),
        p90_ms=percentile(ms, 90),
        p99_ms=percentile(ms, 99),
        mean_ms=sum(ms) / len(ms) if ms else float("nan"),
        min_ms=ms[0] if ms else float("nan"),
        max_ms=ms[-1] if ms else float("nan"),
    )


def latency(samples_ns: Iterable[int], warmup: int) -> Latency:
    """Summarise round-trip samples given in nanoseconds."""
    return _summary(sorted(s / 1e6 for s in samples_ns), warmup)


def merge_latency(parts: list[Latency], samples_ms: list[list[float]]) -> Latency:
    """Pool the raw samples of several rounds (``samples_ms`` per round)."""
    pooled = sorted(x for part in samples_ms for x in part)
    return _summary(pooled, sum(p["warmup"] for p in parts))


async def measure_sequential(
    round_trip: Callable[[], Awaitable[object]], warmup: int, n: int
) -> tuple[Latency, list[int]]:
    """Time ``n`` sequential round trips after ``warmup`` untimed ones."""
    for _ in range(warmup):
        await round_trip()
    samples: list[int] = []
    clock = time.perf_counter_ns
    for _ in range(n):
        t0 = clock()
        await round_trip()
        samples.append(clock() - t0)
    return latency(samples, warmup), samples


def measure_sequential_sync(
    round_trip: Callable[[], object], warmup: int, n: int
) -> tuple[Latency, list[int]]:
    """:func:`measure_sequential` for blocking clients."""
    for _ in range(warmup):
        round_trip()
    samples: list[int] = []
    clock = time.perf_counter_ns
    for _ in range(n):
        t0 = clock()
        round_trip()
        samples.append(clock() - t0)
    return latency(samples, warmup), samples


async def measure_throughput(
    round_trip: Callable[[], Awaitable[object]], concurrency: int, warmup: int, n: int
) -> Throughput:
    """Run ``n`` round trips from ``concurrency`` loops, each starting the next as one ends."""

    async def run(total: int, samples: list[int] | None) -> float:
        left = total
        clock = time.perf_counter_ns

        async def loop() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                t0 = clock()
                await round_trip()
                if samples is not None:
                    samples.append(clock() - t0)

        t0 = time.perf_counter()
        await asyncio.gather(*(loop() for _ in range(min(concurrency, total))))
        return time.perf_counter() - t0

    if warmup:
        await run(warmup, None)
    samples: list[int] = []
    elapsed = await run(n, samples)
    ms = sorted(s / 1e6 for s in samples)
    return Throughput(
        concurrency=concurrency,
        n=n,
        warmup=warmup,
        elapsed_s=elapsed,
        per_s=n / elapsed,
        p50_ms=percentile(ms, 50),
        p99_ms=percentile(ms, 99),
    )


def rss_bytes() -> int:
    """Resident set size of this process, from ``/proc/self/statm``."""
    with open("/proc/self/statm") as f:
        resident_pages = int(f.read().split()[1])
    return resident_pages * os.sysconf("SC_PAGE_SIZE")


def settled_rss() -> int:
    """RSS after a full garbage collection."""
    gc.collect()
    return rss_bytes()


def local_ports_connected_to(port: int, pid: int | None = None) -> set[int]:
    """Local ports of this process's established TCP connections to ``port`` (from /proc)."""
    pid = os.getpid() if pid is None else pid
    inodes: set[int] = set()
    fd_dir = f"/proc/{pid}/fd"
    for fd in os.listdir(fd_dir):
        try:
            link = os.readlink(f"{fd_dir}/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(int(link[8:-1]))
    ports: set[int] = set()
    for table in (f"/proc/{pid}/net/tcp", f"/proc/{pid}/net/tcp6"):
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    cols = line.split()
                    local, remote, state, inode = cols[1], cols[2], cols[3], int(cols[9])
                    if (
                        inode in inodes
                        and state == "01"
                        and int(remote.rsplit(":", 1)[1], 16) == port
                    ):
                        ports.add(int(local.rsplit(":", 1)[1], 16))
        except FileNotFoundError:
            continue
    return ports


async def redis_clients_of_this_process(url: str) -> int:
    """Connections Redis holds for this process: CLIENT LIST entries whose peer port is ours.

    The probe's own connection is excluded.
    """
    import redis.asyncio as aioredis

    probe = aioredis.Redis.from_url(url)
    try:
        own_id = await probe.client_id()
        port = int(probe.connection_pool.connection_kwargs.get("port", 6379))
        ours = local_ports_connected_to(port)
        count = 0
        for client in await probe.client_list():
            addr = str(client.get("addr", ""))
            if int(client.get("id", -1)) == own_id or ":" not in addr:
                continue
            if int(addr.rsplit(":", 1)[1]) in ours:
                count += 1
        return count
    finally:
        await probe.aclose()


async def stream_entries(url: str) -> int:
    """Total entries in every stream of the database: tells how many requests were published."""
    import redis.asyncio as aioredis

    probe = aioredis.Redis.from_url(url)
    try:
        total = 0
        async for key in probe.scan_iter(_type="STREAM", count=1000):
            total += int(await probe.xlen(key))
        return total
    finally:
        await probe.aclose()


async def wait_for_entries(url: str, at_least: int, timeout_s: float = 300.0) -> None:
    """Return once the streams of the database hold ``at_least`` entries in all."""
    deadline = time.monotonic() + timeout_s
    for _ in itertools.count():
        if await stream_entries(url) >= at_least:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"fewer than {at_least} stream entries after {timeout_s} s")
        await asyncio.sleep(0.01)


def stop_process(proc: multiprocessing.process.BaseProcess, grace_s: float = 5.0) -> None:
    """Join a child process, terminating then killing it if it does not exit in time."""
    proc.join(grace_s)
    if proc.is_alive():
        proc.terminate()
        proc.join(grace_s)
    if proc.is_alive():
        proc.kill()
        proc.join()
