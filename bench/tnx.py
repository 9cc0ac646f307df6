"""toolnexus: the same round trip through ``toolnexus.connect(redis)``.

The waiter runs in the case process; an auto responder (accept every request
with the benchmark's answer data) runs in another process, written as a user
would write it from the README.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any, Final

from bench.common import (
    ANSWER_DATA,
    PAYLOAD,
    SPAWN,
    CaseResult,
    Scale,
    measure_sequential,
    measure_throughput,
    redis_clients_of_this_process,
    settled_rss,
    stop_process,
    stream_entries,
    wait_for_entries,
)

NAMESPACE: Final = "bench"
QUEUE: Final = "default"
GROUP: Final = "auto"


# --- responder process -------------------------------------------------------------


def responder_main(
    url: str,
    ready: Any,
    go: Any,
    stop: Any,
    concurrent: bool,
    profile_to: str | None = None,
    signing: dict[str, Any] | None = None,
) -> None:
    """Entry point of the responder process; answers until ``stop`` is set.

    With ``profile_to``, the process runs under cProfile (a ``.prof`` path: pstats
    dump) or pyinstrument (any other path: text profile), written on exit.
    """
    if profile_to is None:
        asyncio.run(_responder(url, ready, go, stop, concurrent, signing or {}))
        return
    if profile_to.endswith(".prof"):
        import cProfile

        cprofiler = cProfile.Profile(time.process_time)  # CPU time
        cprofiler.enable()
        try:
            asyncio.run(_responder(url, ready, go, stop, concurrent, signing or {}))
        finally:
            cprofiler.disable()
            cprofiler.dump_stats(profile_to)
        return
    from pyinstrument import Profiler

    profiler = Profiler(interval=0.001)
    profiler.start()
    try:
        asyncio.run(_responder(url, ready, go, stop, concurrent, signing or {}))
    finally:
        profiler.stop()
        with open(profile_to, "w") as f:
            f.write(profiler.output_text(unicode=True, color=False))


async def _responder(
    url: str, ready: Any, go: Any, stop: Any, concurrent: bool, signing: dict[str, Any]
) -> None:
    import toolnexus

    async with toolnexus.connect(url, namespace=NAMESPACE, queue=QUEUE, **signing) as broker:
        ready.set()
        await asyncio.to_thread(go.wait)

        async def answer_all() -> None:
            async with broker.responder(GROUP) as responder:
                if not concurrent:
                    async for pending in responder:
                        await pending.accept(ANSWER_DATA)
                    return
                tasks: set[asyncio.Task[None]] = set()
                async for pending in responder:
                    task = asyncio.create_task(pending.accept(ANSWER_DATA))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)

        main = asyncio.create_task(answer_all())
        stopped = asyncio.create_task(asyncio.to_thread(stop.wait))
        await asyncio.wait({main, stopped}, return_when=asyncio.FIRST_COMPLETED)
        main.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await main


class Responder:
    """A toolnexus auto responder in another process."""

    def __init__(
        self,
        url: str,
        *,
        start_answering: bool = True,
        concurrent: bool = False,
        profile_to: str | None = None,
        signing: dict[str, Any] | None = None,
    ) -> None:
        self.ready = SPAWN.Event()
        self.go = SPAWN.Event()
        self.stop = SPAWN.Event()
        if start_answering:
            self.go.set()
        self.profile_to = profile_to
        self.proc = SPAWN.Process(
            target=responder_main,
            args=(url, self.ready, self.go, self.stop, concurrent, profile_to, signing),
            daemon=True,
        )

    def __enter__(self) -> Responder:
        self.proc.start()
        if not self.ready.wait(60):
            raise RuntimeError("toolnexus responder did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.go.set()
        stop_process(self.proc, grace_s=5.0 if self.profile_to is None else 60.0)


# --- waiter side -----------------------------------------------------------------------


def round_trip_fn(broker: Any) -> Any:
    import toolnexus
    from toolnexus.models import new_id

    async def round_trip() -> Any:
        answer = await broker.wait_for(
            toolnexus.Request(id=new_id(), kind="input", prompt="bench", data=PAYLOAD),
            timeout_s=60,
        )
        if not answer.ok:
            raise RuntimeError(f"toolnexus wait ended without an answer: {answer.reason}")
        return answer

    return round_trip


def signing_options(directory: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Keys for an agent and a responder made in ``directory``: each side's ``connect``
    options, with signatures required."""
    from pathlib import Path

    from toolnexus import SigningKey

    agent, bot = SigningKey.generate("bench-agent"), SigningKey.generate("bench-bot")
    for key in (agent, bot):
        key.save(directory)
    base = Path(directory)
    return (
        {
            "signing_key": str(base / "bench-agent.key"),
            "trusted_keys": str(base / "bench-bot.pub"),
            "require_signatures": True,
        },
        {
            "signing_key": str(base / "bench-bot.key"),
            "trusted_keys": str(base / "bench-agent.pub"),
            "require_signatures": True,
        },
    )


def latency_case(url: str, params: dict[str, Any]) -> CaseResult:
    import tempfile

    import toolnexus

    signed = params.get("variant") == "signed"
    keys = tempfile.TemporaryDirectory(prefix="toolnexus-bench-keys-")
    agent_options, responder_options = signing_options(keys.name) if signed else ({}, {})

    async def run() -> CaseResult:
        async with toolnexus.connect(url, namespace=NAMESPACE, queue=QUEUE, **agent_options) as b:
            lat, samples = await measure_sequential(round_trip_fn(b), params["warmup"], params["n"])
        return CaseResult(
            case="toolnexus",
            variant="signed" if signed else "default",
            settings=(
                "Ed25519 signatures required on both sides; responder accepts one at a time"
                if signed
                else "connect(redis) defaults; responder accepts one at a time"
            ),
            latency=lat,
            samples_ms=[s / 1e6 for s in samples],
        )

    with keys, Responder(url, signing=responder_options):
        return asyncio.run(run())


def throughput_case(url: str, params: dict[str, Any]) -> CaseResult:
    import toolnexus

    concurrent = bool(params.get("concurrent_responder", False))

    async def run() -> CaseResult:
        async with toolnexus.connect(url, namespace=NAMESPACE, queue=QUEUE) as broker:
            round_trip = round_trip_fn(broker)
            rows = [await measure_throughput(round_trip, c, w, n) for c, w, n in params["levels"]]
        return CaseResult(
            case="toolnexus",
            variant="concurrent accepts" if concurrent else "default",
            settings=(
                "responder accepts each pending in its own task"
                if concurrent
                else "connect(redis) defaults; responder accepts one at a time"
            ),
            throughput=rows,
        )

    with Responder(url, concurrent=concurrent):
        return asyncio.run(run())


def scale_case(url: str, params: dict[str, Any]) -> CaseResult:
    """``waits`` pending at once; the responder starts answering only once all are published."""
    import toolnexus
    from toolnexus.models import new_id

    waits = int(params["waits"])
    concurrent = bool(params.get("concurrent_responder", False))

    async def run(responder: Responder) -> CaseResult:
        async with toolnexus.connect(url, namespace=NAMESPACE, queue=QUEUE) as broker:
            # The requests themselves exist before the baseline: only the waits are counted.
            requests = [
                toolnexus.Request(id=new_id(), kind="input", prompt="bench", data=PAYLOAD)
                for _ in range(waits)
            ]
            before_entries = await stream_entries(url)
            # One wait first: the connections it takes are what any number of waits may take.
            tasks = [asyncio.create_task(broker.wait_for(requests[0], timeout_s=600))]
            await wait_for_entries(url, before_entries + 1)
            connections_at_one = await redis_clients_of_this_process(url)
            rss0 = settled_rss()
            t0 = time.perf_counter()
            tasks += [
                asyncio.create_task(broker.wait_for(request, timeout_s=600))
                for request in requests[1:]
            ]
            await wait_for_entries(url, before_entries + waits)
            publish_s = time.perf_counter() - t0
            await asyncio.sleep(0.2)
            rss1 = settled_rss()
            connections = await redis_clients_of_this_process(url)
            t1 = time.perf_counter()
            responder.go.set()
            answers = await asyncio.gather(*tasks)
            resolve_s = time.perf_counter() - t1
        failed = [a for a in answers if not a.ok]
        if failed:
            raise RuntimeError(f"{len(failed)} waits ended without an answer: {failed[0]}")
        return CaseResult(
            case="toolnexus",
            variant="concurrent accepts" if concurrent else "default",
            settings="connect(redis) defaults",
            scale=Scale(
                waits=waits,
                rss_before_bytes=rss0,
                rss_delta_bytes=rss1 - rss0,
                per_wait_bytes=(rss1 - rss0) / (waits - 1),
                connections=connections,
                connections_at_one=connections_at_one,
                publish_s=publish_s,
                resolve_s=resolve_s,
            ),
        )

    with Responder(url, start_answering=False, concurrent=concurrent) as responder:
        return asyncio.run(run(responder))
