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

from bench import harness
from bench.common import (
    ANSWER_DATA,
    PAYLOAD,
    SPAWN,
    CaseResult,
    measure_sequential,
    measure_throughput,
    stop_process,
)

NAMESPACE: Final = "bench"
QUEUE: Final = "default"
GROUP: Final = "auto"


# --- responder process -------------------------------------------------------------

RESPONDERS = {
    "loop": "responder accepts one at a time",
    "tasks": "responder accepts each pending in its own task",
    "serve": "responder is toolnexus.serve(broker, worker) with its defaults",
}
"""How the responder process answers: ``loop`` is the README's first example
(``async for pending in responder: await pending.accept(...)``), ``tasks`` starts one
task per pending, ``serve`` is the SDK's ``serve()`` with a ``Worker`` whose ``show()``
accepts (the README's responder SDK example: ``concurrency=100`` and the rest default)."""


def responder_main(
    url: str,
    ready: Any,
    go: Any,
    stop: Any,
    mode: str,
    profile_to: str | None = None,
    signing: dict[str, Any] | None = None,
    loop: str = "asyncio",
) -> None:
    """Entry point of the responder process; answers until ``stop`` is set.

    With ``profile_to``, the process runs under cProfile (a ``.prof`` path: pstats
    dump) or pyinstrument (any other path: text profile), written on exit.
    """
    main = _responder(url, ready, go, stop, mode, signing or {})
    if profile_to is None:
        harness.run(main, loop)
        return
    if profile_to.endswith(".prof"):
        import cProfile

        cprofiler = cProfile.Profile(time.process_time)  # CPU time
        cprofiler.enable()
        try:
            harness.run(main, loop)
        finally:
            cprofiler.disable()
            cprofiler.dump_stats(profile_to)
        return
    from pyinstrument import Profiler

    profiler = Profiler(interval=0.001)
    profiler.start()
    try:
        harness.run(main, loop)
    finally:
        profiler.stop()
        with open(profile_to, "w") as f:
            f.write(profiler.output_text(unicode=True, color=False))


async def _responder(
    url: str, ready: Any, go: Any, stop: Any, mode: str, signing: dict[str, Any]
) -> None:
    import toolnexus

    class AutoAccept(toolnexus.Worker):
        group = GROUP

        async def show(self, pending: toolnexus.Pending) -> None:
            await pending.accept(ANSWER_DATA)

    async with toolnexus.connect(url, namespace=NAMESPACE, queue=QUEUE, **signing) as broker:
        ready.set()
        await asyncio.to_thread(go.wait)

        async def answer_all() -> None:
            if mode == "serve":
                await toolnexus.serve(broker, AutoAccept(), handle_signals=False)
                return
            async with broker.responder(GROUP) as responder:
                if mode == "loop":
                    async for pending in responder:
                        await pending.accept(ANSWER_DATA)
                    return
                tasks: set[asyncio.Task[Any]] = set()
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
        mode: str = "loop",
        profile_to: str | None = None,
        signing: dict[str, Any] | None = None,
        loop: str = "asyncio",
    ) -> None:
        self.ready = SPAWN.Event()
        self.go = SPAWN.Event()
        self.stop = SPAWN.Event()
        if start_answering:
            self.go.set()
        self.profile_to = profile_to
        self.proc = SPAWN.Process(
            target=responder_main,
            args=(url, self.ready, self.go, self.stop, mode, profile_to, signing, loop),
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

    from toolnexus.security import SigningKey

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


def _loop_suffix(loop: str) -> str:
    return "" if loop == "asyncio" else f", {loop}"


def latency_case(url: str, params: dict[str, Any]) -> CaseResult:
    import tempfile

    import toolnexus

    signed = params.get("variant") == "signed"
    loop = str(params.get("loop", "asyncio"))
    keys = tempfile.TemporaryDirectory(prefix="toolnexus-bench-keys-")
    agent_options, responder_options = signing_options(keys.name) if signed else ({}, {})

    async def run() -> CaseResult:
        async with toolnexus.connect(url, namespace=NAMESPACE, queue=QUEUE, **agent_options) as b:
            lat, samples = await measure_sequential(round_trip_fn(b), params["warmup"], params["n"])
        return CaseResult(
            case="toolnexus",
            variant=("signed" if signed else "default") + _loop_suffix(loop),
            settings=(
                "Ed25519 signatures required on both sides; " + RESPONDERS["loop"]
                if signed
                else "connect(redis) defaults; " + RESPONDERS["loop"]
            ),
            latency=lat,
            samples_ms=[s / 1e6 for s in samples],
        )

    with keys, Responder(url, signing=responder_options, loop=loop):
        return harness.run(run(), loop)


THROUGHPUT_VARIANTS = {"loop": "default", "tasks": "concurrent accepts", "serve": "serve"}


def throughput_case(url: str, params: dict[str, Any]) -> CaseResult:
    import toolnexus

    mode = str(params.get("responder", "loop"))
    loop = str(params.get("loop", "asyncio"))

    async def run() -> CaseResult:
        async with toolnexus.connect(url, namespace=NAMESPACE, queue=QUEUE) as broker:
            round_trip = round_trip_fn(broker)
            rows = [await measure_throughput(round_trip, c, w, n) for c, w, n in params["levels"]]
        return CaseResult(
            case="toolnexus",
            variant=THROUGHPUT_VARIANTS[mode] + _loop_suffix(loop),
            settings=("connect(redis) defaults; " if mode == "loop" else "") + RESPONDERS[mode],
            throughput=rows,
        )

    with Responder(url, mode=mode, loop=loop):
        return harness.run(run(), loop)


def scale_case(url: str, params: dict[str, Any]) -> CaseResult:
    """``waits`` pending at once; the responder starts answering only once all are published."""
    import toolnexus
    from toolnexus.models import new_id

    waits = int(params["waits"])

    async def run(responder: Responder) -> CaseResult:
        async with toolnexus.connect(url, namespace=NAMESPACE, queue=QUEUE) as broker:
            requests = [  # before the baseline, as the floor's
                toolnexus.Request(id=new_id(), kind="input", prompt="bench", data=PAYLOAD)
                for _ in range(waits)
            ]
            scale, answers = await harness.measure_scale(
                url,
                requests,
                lambda request: broker.wait_for(request, timeout_s=600),
                responder.go.set,
            )
        failed = [a for a in answers if not a.ok]
        if failed:
            raise RuntimeError(f"{len(failed)} waits ended without an answer: {failed[0]}")
        return CaseResult(
            case="toolnexus",
            variant="default",
            settings="connect(redis) defaults",
            scale=scale,
        )

    with Responder(url, start_answering=False) as responder:
        return asyncio.run(run(responder))


NOBODY: Final = ["bench-nobody"]
"""The allow-list of the wake-up case's pending waits: the responder acknowledges them
without showing them, so they stay pending until cancelled."""


def wakeup_case(url: str, params: dict[str, Any]) -> CaseResult:
    """Sequential round trips alone, then with ``pending`` other waits nobody answers."""
    import toolnexus
    from toolnexus.models import new_id

    async def run() -> CaseResult:
        async with toolnexus.connect(url, namespace=NAMESPACE, queue=QUEUE) as broker:

            async def hold() -> Any:
                request = toolnexus.Request(id=new_id(), kind="input", prompt="hold", data=PAYLOAD)
                return await broker.wait_for(request, timeout_s=600, allow=NOBODY)

            wakeup = await harness.measure_wakeup(
                url,
                round_trip_fn(broker),
                hold,
                int(params["pending"]),
                int(params["warmup"]),
                int(params["n"]),
            )
        return CaseResult(
            case="toolnexus",
            variant="default",
            settings="connect(redis) defaults; " + RESPONDERS["loop"],
            wakeup=wakeup,
        )

    with Responder(url):
        return asyncio.run(run())
