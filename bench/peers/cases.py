"""Caller side of each peer: enqueue the payload, wait for the worker's return value.

Every peer runs its worker in a subprocess started here (one worker process, its
own default concurrency inside it) against the benchmark's Redis, once with its
defaults and once with its poll interval at the minimum this benchmark uses
(``min_poll_s``; 0 is accepted by some but turns the poll into a busy loop).
Warm-up round trips (which also wait for the worker to come up) are excluded.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from bench.common import (
    ANSWER_DATA,
    PAYLOAD,
    CaseResult,
    measure_sequential,
    measure_sequential_sync,
)
from bench.peers.proc import WorkerProcess


def _result(case: str, variant: str, settings: str, measured: tuple[Any, list[int]]) -> CaseResult:
    lat, samples = measured
    return CaseResult(
        case=case,
        variant=variant,
        settings=settings,
        latency=lat,
        samples_ms=[s / 1e6 for s in samples],
    )


def _check(value: Any) -> None:
    if value != ANSWER_DATA:
        raise RuntimeError(f"peer returned {value!r}, not the answer data")


def _log(params: dict[str, Any], name: str) -> Path:
    return Path(params["logdir"]) / f"{name}-{params['variant']}.log"


def arq_case(url: str, params: dict[str, Any]) -> CaseResult:
    from arq import create_pool
    from arq.connections import RedisSettings

    default = params["variant"] == "default"
    poll_s = float(params["min_poll_s"])
    worker_arg = "default" if default else str(poll_s)
    result_poll = {} if default else {"poll_delay": poll_s}

    async def run() -> CaseResult:
        pool = await create_pool(RedisSettings.from_dsn(url))
        try:

            async def round_trip() -> None:
                job = await pool.enqueue_job("arq_echo", PAYLOAD)
                assert job is not None
                _check(await job.result(timeout=60, **result_poll))

            measured = await measure_sequential(round_trip, params["warmup"], params["n"])
        finally:
            await pool.aclose()
        settings = (
            "worker poll_delay 0.5 s, job.result(poll_delay=0.5 s)"
            if default
            else f"worker poll_delay {poll_s} s, job.result(poll_delay={poll_s} s)"
        )
        return _result("arq", "default" if default else "min poll", settings, measured)

    with WorkerProcess(["-m", "bench.peers.arq_worker", worker_arg], url, _log(params, "arq")):
        return asyncio.run(run())


def celery_case(url: str, params: dict[str, Any]) -> CaseResult:
    os.environ["BENCH_REDIS_URL"] = url
    from bench.peers.celery_app import app, echo

    default = params["variant"] == "default"
    poll_s = float(params["min_poll_s"])
    get_options: dict[str, Any] = {} if default else {"interval": poll_s}

    def round_trip() -> None:
        _check(echo.delay(PAYLOAD).get(timeout=60, **get_options))

    argv = [
        "-m", "celery", "-A", "bench.peers.celery_app", "worker",
        "--concurrency", "1", "--loglevel", "WARNING", "--hostname", f"bench-{os.getpid()}@%h",
    ]  # fmt: skip
    try:
        with WorkerProcess(argv, url, _log(params, "celery")):
            measured = measure_sequential_sync(round_trip, params["warmup"], params["n"])
    finally:
        app.close()
    settings = (
        "prefork worker -c 1; AsyncResult.get() (interval 0.5 s)"
        if default
        else f"prefork worker -c 1; AsyncResult.get(interval={poll_s})"
    )
    return _result("celery", "default" if default else "min poll", settings, measured)


def rq_case(url: str, params: dict[str, Any]) -> CaseResult:
    from redis import Redis
    from rq import Queue
    from rq.job import JobStatus

    from bench.peers.apps import echo

    default = params["variant"] == "default"
    connection = Redis.from_url(url)
    queue = Queue("bench", connection=connection)

    def round_trip() -> None:
        job = queue.enqueue(echo, PAYLOAD)
        result = job.latest_result(timeout=60)
        if result is None:
            raise RuntimeError(f"rq job {job.id} has no result (status {job.get_status()})")
        if job.get_status(refresh=True) != JobStatus.FINISHED:
            raise RuntimeError(f"rq job {job.id} did not finish: {job.get_status()}")
        _check(result.return_value)

    worker_class = "rq.worker.Worker" if default else "rq.worker.SimpleWorker"
    argv = ["-m", "rq.cli", "worker", "--url", url, "--worker-class", worker_class, "-q", "bench"]
    try:
        with WorkerProcess(argv, url, _log(params, "rq")):
            measured = measure_sequential_sync(round_trip, params["warmup"], params["n"])
    finally:
        connection.close()
    if default:
        return _result(
            "rq", "default", "Worker (forks per job); latest_result(timeout=60)", measured
        )
    return _result(
        "rq",
        "no fork",
        "no poll interval to lower (BLPOP + XREAD BLOCK); SimpleWorker, no fork per job",
        measured,
    )


def taskiq_case(url: str, params: dict[str, Any]) -> CaseResult:
    os.environ["BENCH_REDIS_URL"] = url
    from bench.peers.taskiq_app import broker, echo

    default = params["variant"] == "default"
    poll_s = float(params["min_poll_s"])
    wait_options: dict[str, Any] = {} if default else {"check_interval": poll_s}

    async def run() -> CaseResult:
        await broker.startup()  # declares the consumer group before the first kick
        try:

            async def round_trip() -> None:
                task = await echo.kiq(PAYLOAD)
                result = await task.wait_result(timeout=60, **wait_options)
                if result.is_err:
                    raise RuntimeError(f"taskiq task failed: {result.error}")
                _check(result.return_value)

            with WorkerProcess(argv, url, _log(params, "taskiq")):
                measured = await measure_sequential(round_trip, params["warmup"], params["n"])
        finally:
            await broker.shutdown()
        settings = (
            "RedisStreamBroker + RedisAsyncResultBackend, 1 worker; wait_result() (0.2 s)"
            if default
            else f"RedisStreamBroker, 1 worker; wait_result(check_interval={poll_s})"
        )
        return _result("taskiq", "default" if default else "min poll", settings, measured)

    argv = ["-m", "taskiq", "worker", "bench.peers.taskiq_app:broker", "--workers", "1"]
    return asyncio.run(run())
